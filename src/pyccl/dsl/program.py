"""Programs, buffers and chunks: the global view of a DSL algorithm.

A :class:`Program` records, for every rank and thread block, the operations
an algorithm performs, in the order the Python code issues them::

    with Program("allpairs", AllReduce(4), protocol="hb") as p:
        for r in range(4):
            ...

Buffers are per rank and divided into chunks; a chunk range is a slice of a
buffer (``p.input(r)[2:4]``). Operations take chunk ranges and name the thread
block (``tb``) that runs them; lowering (:mod:`pyccl.dsl.lowering`) turns the
record into a plan. Every recorded operation remembers the user's source line,
so that checks can point at it.
"""

from __future__ import annotations

import inspect
import os
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ..errors import InvalidArgumentError

__all__ = ["Buffer", "ChunkRange", "DSLError", "Op", "Program", "current_program"]

BUFFER_KINDS = ("input", "output", "scratch")
PROTOCOLS = ("ll", "hb")
#: The reductions an op of a program or a plan may name.
OP_REDUCTIONS = ("sum", "min", "max", "prod")

_state = threading.local()


class DSLError(InvalidArgumentError):
    """A DSL program is wrong; the message names the user's source line."""


def _user_line() -> str:
    """file:line of the first frame outside pyccl.dsl (the user's call)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for frame in inspect.stack()[2:]:
        if os.path.dirname(os.path.abspath(frame.filename)) != here:
            return f"{os.path.basename(frame.filename)}:{frame.lineno}"
    return "?"


def current_program() -> "Program":
    prog = getattr(_state, "program", None)
    if prog is None:
        raise DSLError("no DSL program is active: use the operations inside 'with Program(...):'")
    return prog


@dataclass(frozen=True)
class ChunkRange:
    """Chunks [index, index + count) of one rank's buffer."""

    rank: int
    buffer: str
    index: int
    count: int

    @property
    def end(self) -> int:
        return self.index + self.count

    def overlaps(self, other: "ChunkRange") -> bool:
        return (self.rank == other.rank and self.buffer == other.buffer and self.index < other.end
                and other.index < self.end)

    def __str__(self) -> str:
        return f"rank {self.rank} {self.buffer}[{self.index}:{self.end}]"

    # -- local operations (run on this chunk's rank) ---------------------------
    def copy(self, src: "ChunkRange", tb: int) -> None:
        """Copies `src` (on this rank) into these chunks."""
        current_program()._local("copy", self, [src], tb)

    def reduce(self, *srcs: "ChunkRange", tb: int, op: Optional[str] = None) -> None:
        """These chunks become themselves reduced with `srcs` (on this rank), by
        `op`, or by the reduction the collective is called with (None)."""
        current_program()._local("reduce", self, list(srcs), tb, reduce_op=op)

    def unpack(self, packets: "ChunkRange", tb: int) -> None:
        """Copies LL packets that a peer put into `packets` (this rank's
        scratch) into these chunks, waiting for each to arrive."""
        _check_packets("unpack", packets)
        current_program()._local("unpack", self, [packets], tb)

    def reduce_packets(self, packets: "ChunkRange", tb: int, op: Optional[str] = None) -> None:
        """Reduces arriving LL packets in `packets` (this rank's scratch) into these chunks."""
        _check_packets("reduce_packets", packets)
        current_program()._local("reduce_packets", self, [packets], tb, reduce_op=op)


def _check_packets(what: str, packets: "ChunkRange") -> None:
    """Packets land in scratch buffers (put_packets sends them there)."""
    if isinstance(packets, ChunkRange) and packets.buffer != "scratch":
        raise DSLError(f"{_user_line()}: {what} reads LL packets from this rank's scratch buffer, got {packets}")


class Buffer:
    """One rank's buffer of `size` chunks; slicing gives a :class:`ChunkRange`."""

    def __init__(self, rank: int, kind: str, size: int) -> None:
        self.rank, self.kind, self.size = rank, kind, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key) -> ChunkRange:
        if isinstance(key, int):
            key = slice(key, key + 1 if key != -1 else None)
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise DSLError(f"{_user_line()}: chunks of a buffer are contiguous slices, got {key!r}")
        start, stop, _ = key.indices(self.size)
        if not (isinstance(key.start, (int, type(None))) and isinstance(key.stop, (int, type(None)))):
            raise DSLError(f"{_user_line()}: chunk indices must be integers, got {key!r}")
        raw_start = key.start if key.start is not None else 0
        raw_stop = key.stop if key.stop is not None else self.size
        if raw_start < -self.size or raw_stop > self.size or start >= stop:
            raise DSLError(f"{_user_line()}: chunks [{key.start}:{key.stop}] are out of range for rank "
                           f"{self.rank}'s {self.kind} buffer of {self.size} chunks")
        return ChunkRange(self.rank, self.kind, start, stop - start)

    def __repr__(self) -> str:
        return f"Buffer(rank={self.rank}, {self.kind}, {self.size} chunks)"


@dataclass
class Op:
    """One recorded operation, run by thread block `tb` of `rank`."""

    kind: str
    rank: int
    tb: int
    dst: Optional[ChunkRange] = None
    srcs: List[ChunkRange] = field(default_factory=list)
    channel: Optional[int] = None  # index into Program.channels
    reduce_op: Optional[str] = None
    tb_group: Optional[Tuple[int, ...]] = None  # thread blocks sharing the op (MemoryChannel)
    barrier_tbs: Optional[Tuple[int, ...]] = None  # for "barrier"
    line: str = "?"
    # Local chunks that also get a reduction's result (fusion of a copy of it).
    copy_to: List[ChunkRange] = field(default_factory=list)
    # Reductions only: the local chunk the reduction starts from instead of its
    # destination (reduce_put: srcs[0]), from fusion of a copy into it before.
    init: Optional[ChunkRange] = None

    def reads(self) -> List[ChunkRange]:
        """The chunks this op reads (a reduce also reads its destination, or its init)."""
        if self.init is not None:
            return list(self.srcs) + [self.init]
        reducing = ("reduce", "reduce_packets", "reduce_put_packets", "channel_reduce", "multi_reduce")
        extra = [self.dst] if self.kind in reducing and self.dst else []
        return list(self.srcs) + extra

    def writes(self) -> List[ChunkRange]:
        return ([self.dst] if self.dst is not None else []) + list(self.copy_to)


class Program:
    """A DSL program: collective, ranks, protocol, instances, and the record of
    operations per rank and thread block. Use as a context manager."""

    def __init__(self, name: str, collective, protocol: str = "hb", instances: int = 1) -> None:
        if not isinstance(name, str) or not name.strip():
            raise DSLError(f"invalid argument 'name': expected a non-empty string, got {name!r}")
        from .collectives import Collective  # collectives.py imports this module

        if not isinstance(collective, Collective):
            raise DSLError(f"invalid argument 'collective': expected AllReduce, AllGather, ReduceScatter, AllToAll or "
                           f"SendRecv (pyccl.dsl), got {collective!r}")
        if protocol not in PROTOCOLS:
            raise DSLError(f"invalid argument 'protocol': {protocol!r} (expected one of {', '.join(PROTOCOLS)})")
        if not isinstance(instances, int) or isinstance(instances, bool) or instances < 1:
            raise DSLError(f"invalid argument 'instances': must be an integer >= 1, got {instances!r}")
        self.name = name
        self.collective = collective
        self.num_ranks = collective.num_ranks
        self.protocol = protocol
        self.instances = instances
        self.ops: List[Op] = []
        self.channels: List["object"] = []
        self._buffers: Dict[Tuple[int, str], Buffer] = {}
        self._scratch_size: Dict[int, int] = {}
        for r in range(self.num_ranks):
            self._buffers[(r, "input")] = Buffer(r, "input", collective.input_chunks)
            self._buffers[(r, "output")] = Buffer(r, "output", collective.output_chunks)

    # -- context ----------------------------------------------------------------
    def __enter__(self) -> "Program":
        if getattr(_state, "program", None) is not None:
            raise DSLError("DSL programs do not nest: another Program is active")
        _state.program = self
        return self

    def __exit__(self, *exc) -> None:
        _state.program = None

    # -- buffers ------------------------------------------------------------------
    def _rank(self, rank: int, what: str = "rank") -> int:
        if not isinstance(rank, int) or not 0 <= rank < self.num_ranks:
            raise DSLError(f"{_user_line()}: {what} {rank!r} is not a rank of this program (0 to "
                           f"{self.num_ranks - 1})")
        return rank

    def input(self, rank: int) -> Buffer:
        return self._buffers[(self._rank(rank), "input")]

    def output(self, rank: int) -> Buffer:
        """The output buffer (the input itself for an in-place collective)."""
        kind = "input" if self.collective.in_place else "output"
        return self._buffers[(self._rank(rank), kind)]

    def scratch(self, rank: int, size: int) -> Buffer:
        """Rank `rank`'s scratch buffer, of at least `size` chunks (one per rank,
        growing to the largest size asked for)."""
        self._rank(rank)
        if not isinstance(size, int) or size < 1:
            raise DSLError(f"{_user_line()}: scratch size must be a positive number of chunks, got {size!r}")
        buf = self._buffers.get((rank, "scratch"))
        if buf is None or buf.size < size:
            buf = Buffer(rank, "scratch", size)
            self._buffers[(rank, "scratch")] = buf
        return buf

    def buffer_sizes(self) -> Dict[str, int]:
        """Chunks per buffer kind (scratch: the largest any rank uses)."""
        sizes = {"input": self.collective.input_chunks, "output": self.collective.output_chunks, "scratch": 0}
        for (_, kind), buf in self._buffers.items():
            if kind == "scratch":
                sizes["scratch"] = max(sizes["scratch"], buf.size)
        return sizes

    # -- recording ------------------------------------------------------------------
    def _tb(self, tb) -> int:
        if not isinstance(tb, int) or tb < 0:
            raise DSLError(f"{_user_line()}: tb must be a thread block index >= 0, got {tb!r}")
        return tb

    def _record(self, op: Op) -> Op:
        op.line = _user_line()
        self.ops.append(op)
        return op

    def _local(self, kind: str, dst: ChunkRange, srcs: List[ChunkRange], tb: int, reduce_op: Optional[str] = None):
        for s in srcs:
            if not isinstance(s, ChunkRange):
                raise DSLError(f"{_user_line()}: expected chunks (a buffer slice), got {s!r}")
            if s.rank != dst.rank:
                raise DSLError(f"{_user_line()}: {kind} on rank {dst.rank} reads {s}: a local operation "
                               "reads only its own rank's buffers (use a channel for a peer's)")
            if s.count != dst.count:
                raise DSLError(f"{_user_line()}: {kind} of {dst.count} chunks from {s} ({s.count} chunks)")
        if reduce_op is not None and reduce_op not in OP_REDUCTIONS:
            raise DSLError(f"{_user_line()}: reduce op {reduce_op!r} (expected sum, min, max or prod)")
        self._record(Op(kind, dst.rank, self._tb(tb), dst=dst, srcs=srcs, reduce_op=reduce_op))

    def barrier(self, rank: int, tbs) -> None:
        """A barrier among thread blocks `tbs` of `rank`: what each did before it
        is visible to all of them after it."""
        tbs = tuple(sorted(set(self._tb(t) for t in tbs)))
        if len(tbs) < 2:
            raise DSLError(f"{_user_line()}: a barrier needs at least two thread blocks, got {tbs}")
        for t in tbs:
            self._record(Op("barrier", self._rank(rank), t, barrier_tbs=tbs))

    def _add_channel(self, channel) -> int:
        self.channels.append(channel)
        return len(self.channels) - 1

    def lower(self, sizes=None):
        """The execution plan of this program (:mod:`pyccl.dsl.lowering`)."""
        from .lowering import lower

        return lower(self, sizes)
