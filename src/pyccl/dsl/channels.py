"""Channels of the DSL's global view (Figure 5 of the MSCCL++ paper).

A channel connects a source rank to a destination rank. Its data operations
and ``signal`` run on the source rank, on the thread block they name;
``wait`` runs on the destination rank and returns once the source's matching
``signal`` has arrived, with everything the signalling thread block did before
it visible.

- :class:`MemoryChannel`: the source's threads load and store the peer's
  memory. A put (or a get, which pulls the peer's chunks) is complete when
  the op ends (its source may be reused at once); the peer sees a put after
  a signal/wait. ``put_packets`` sends LL
  packets that carry their own flags: the receiver ``unpack``s them without a
  wait.
- :class:`PortChannel`: a proxy moves the data (copy engine or NIC). A put
  only starts the transfer; ``signal`` reaches the peer after the puts before
  it, and the source chunks may be overwritten only after ``flush``.
- :class:`SwitchChannel`: NVLink SHARP multicast over one buffer of every
  member rank: ``reduce`` reads the same chunks of every member, ``broadcast``
  writes them.
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Sequence

from .program import OP_REDUCTIONS, ChunkRange, DSLError, Op, _user_line, current_program

__all__ = ["MemoryChannel", "PortChannel", "SwitchChannel", "ThreadBlockGroup"]


class ThreadBlockGroup:
    """Thread blocks meant to share one MemoryChannel operation, each doing a
    part. The plan records the group, but the simulator and the interpreter
    still run the op whole on the thread block that issued it
    (docs/plans.md, "Not yet")."""

    def __init__(self, tbs: Iterable[int]) -> None:
        self.tbs = tuple(sorted(set(int(t) for t in tbs)))
        if not self.tbs or min(self.tbs) < 0:
            raise DSLError(f"{_user_line()}: a ThreadBlockGroup needs thread block indices >= 0, got {tbs!r}")


def _chunks(x, what: str) -> ChunkRange:
    if not isinstance(x, ChunkRange):
        raise DSLError(f"{_user_line()}: {what} must be chunks (a buffer slice), got {x!r}")
    return x


class _PairChannel:
    kind = ""

    def __init__(self, dst: int, src: int) -> None:
        prog = current_program()
        self.dst = prog._rank(dst, "dst")
        self.src = prog._rank(src, "src")
        if self.dst == self.src:
            raise DSLError(f"{_user_line()}: a {type(self).__name__} connects two different ranks, got {src} -> {dst}")
        self.id = prog._add_channel(self)
        self.line = _user_line()

    def _transfer(self, kind: str, dst, src, tb: int, extra: Sequence[ChunkRange] = (), tb_group=None,
                  reduce_op: Optional[str] = None) -> Op:
        prog = current_program()
        dst, src = _chunks(dst, "dst"), _chunks(src, "src")
        remote_read = kind in ("channel_reduce", "get")  # reads the peer, writes here
        want_dst, want_src = (self.src, self.dst) if remote_read else (self.dst, self.src)
        if dst.rank != want_dst:
            raise DSLError(f"{_user_line()}: {kind} on the channel {self.src} -> {self.dst} writes {dst}, "
                           f"which must be on rank {want_dst}")
        if src.rank != want_src:
            raise DSLError(f"{_user_line()}: {kind} on the channel {self.src} -> {self.dst} reads {src}, "
                           f"which must be on rank {want_src}")
        for e in extra:
            if _chunks(e, "chunks").rank != self.src or e.count != src.count:
                raise DSLError(f"{_user_line()}: {kind} reduces {e}: it must be {src.count} chunks on rank {self.src}")
        if dst.count != src.count:
            raise DSLError(f"{_user_line()}: {kind} of {src.count} chunks into {dst.count} chunks")
        group = None
        if tb_group is not None:
            if not isinstance(tb_group, ThreadBlockGroup):
                raise DSLError(f"{_user_line()}: tb_group must be a ThreadBlockGroup, got {tb_group!r}")
            if tb not in tb_group.tbs:
                raise DSLError(f"{_user_line()}: tb {tb} is not in its tb_group {tb_group.tbs}")
            group = tb_group.tbs
        if reduce_op is not None and reduce_op not in OP_REDUCTIONS:
            raise DSLError(f"{_user_line()}: reduce op {reduce_op!r} (expected sum, min, max or prod)")
        srcs = [src, *extra]
        return prog._record(Op(kind, self.src, prog._tb(tb), dst=dst, srcs=srcs, channel=self.id,
                               tb_group=group, reduce_op=reduce_op))

    def signal(self, tb: int) -> None:
        """Source rank: the peer's next wait returns after everything thread
        block `tb` did before this signal."""
        prog = current_program()
        prog._record(Op("signal", self.src, prog._tb(tb), channel=self.id))

    def wait(self, tb: int) -> None:
        """Destination rank: thread block `tb` waits for the source's next signal."""
        prog = current_program()
        prog._record(Op("wait", self.dst, prog._tb(tb), channel=self.id))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.src} -> {self.dst})"


class MemoryChannel(_PairChannel):
    kind = "memory"

    def put(self, dst: ChunkRange, src: ChunkRange, tb: int, tb_group: Optional[ThreadBlockGroup] = None) -> None:
        """Stores `src` (source rank) into `dst` (destination rank)."""
        self._transfer("put", dst, src, tb, tb_group=tb_group)

    def get(self, dst: ChunkRange, src: ChunkRange, tb: int, tb_group: Optional[ThreadBlockGroup] = None) -> None:
        """Source rank: loads the peer's `src` into its own `dst` (a pull; the
        peer must have signalled that `src` is ready)."""
        self._transfer("get", dst, src, tb, tb_group=tb_group)

    def put_packets(self, dst: ChunkRange, src: ChunkRange, tb: int,
                    tb_group: Optional[ThreadBlockGroup] = None) -> None:
        """Sends `src` as LL packets into `dst` (the destination's scratch);
        the destination reads them with ``unpack`` / ``reduce_packets``."""
        if isinstance(dst, ChunkRange) and dst.buffer != "scratch":
            raise DSLError(f"{_user_line()}: put_packets lands in the destination's scratch buffer, got {dst}")
        self._transfer("put_packets", dst, src, tb, tb_group=tb_group)

    def reduce(self, dst: ChunkRange, src: ChunkRange, tb: int, op: Optional[str] = None,
               tb_group: Optional[ThreadBlockGroup] = None) -> None:
        """Source rank: `dst` (its own chunks) becomes itself reduced with the
        peer's `src`, read over the channel."""
        self._transfer("channel_reduce", dst, src, tb, tb_group=tb_group, reduce_op=op)

    def reduce_put(self, dst: ChunkRange, src: ChunkRange, others: List[ChunkRange], tb: int, op: Optional[str] = None,
                   tb_group: Optional[ThreadBlockGroup] = None) -> None:
        """`src` becomes itself reduced with `others` (source rank), and the
        result is stored into the peer's `dst` from registers."""
        self._transfer("reduce_put", dst, src, tb, extra=others, tb_group=tb_group, reduce_op=op)

    def flush(self, tb: int) -> None:
        """Nothing to wait for on a MemoryChannel (puts complete in the op); kept for symmetry."""
        prog = current_program()
        prog._record(Op("flush", self.src, prog._tb(tb), channel=self.id))


def all_pairs_memory_channels(num_ranks: int) -> dict:
    """A MemoryChannel for every ordered pair of ranks, keyed (dst, src): the
    one rank `src` uses to reach `dst`. Made in the program's current scope."""
    return {(q, r): MemoryChannel(q, r) for r in range(num_ranks) for q in range(num_ranks) if q != r}


def signal_and_wait(channels: dict, rank: int, peers, tb: int) -> None:
    """`rank` signals each of `peers`, then waits for each peer's signal, over
    `channels` keyed (dst, src) as all_pairs_memory_channels makes them: what
    `rank` wrote before is visible to the peers after, and theirs to it."""
    for q in peers:
        channels[(q, rank)].signal(tb=tb)
    for q in peers:
        channels[(rank, q)].wait(tb=tb)


class PortChannel(_PairChannel):
    kind = "port"

    def put(self, dst: ChunkRange, src: ChunkRange, tb: int) -> None:
        """Starts a transfer of `src` into the peer's `dst` (asynchronous)."""
        self._transfer("put", dst, src, tb)

    def put_with_signal(self, dst: ChunkRange, src: ChunkRange, tb: int) -> None:
        """A put followed by a signal, as one request to the proxy."""
        self._transfer("put_with_signal", dst, src, tb)

    def flush(self, tb: int) -> None:
        """Source rank: waits until every transfer this channel started has
        read its source (the chunks may then be overwritten)."""
        prog = current_program()
        prog._record(Op("flush", self.src, prog._tb(tb), channel=self.id))


class SwitchChannel:
    """Multicast over chunks of `buffer` ("input", "output" or "scratch") of
    every rank in `ranks`."""

    kind = "switch"

    def __init__(self, ranks: Sequence[int], buffer: str = "scratch") -> None:
        prog = current_program()
        self.ranks = tuple(sorted(set(prog._rank(r) for r in ranks)))
        if len(self.ranks) < 2:
            raise DSLError(f"{_user_line()}: a SwitchChannel needs at least two ranks, got {ranks!r}")
        if buffer not in ("input", "output", "scratch"):
            raise DSLError(f"{_user_line()}: buffer must be input, output or scratch, got {buffer!r}")
        self.buffer = buffer
        self.id = prog._add_channel(self)
        self.line = _user_line()
        self.src = self.dst = None

    def _member(self, rank: int) -> None:
        if rank not in self.ranks:
            raise DSLError(f"{_user_line()}: rank {rank} is not a member of this SwitchChannel {self.ranks}")

    def _region(self, rank: int, index: int, count: int) -> ChunkRange:
        prog = current_program()
        buf = prog.output(rank) if self.buffer == "output" else (
            prog.input(rank) if self.buffer == "input" else prog.scratch(rank, index + count))
        return buf[index:index + count]

    def reduce(self, dst: ChunkRange, index: int, tb: int, op: Optional[str] = None) -> None:
        """On `dst`'s rank: `dst` becomes the reduction of chunks [index, index +
        dst.count) of the buffer on every member rank."""
        prog = current_program()
        dst = _chunks(dst, "dst")
        self._member(dst.rank)
        srcs = [self._region(r, index, dst.count) for r in self.ranks]
        prog._record(Op("switch_reduce", dst.rank, prog._tb(tb), dst=dst, srcs=srcs, channel=self.id, reduce_op=op))

    def broadcast(self, index: int, src: ChunkRange, tb: int) -> None:
        """On `src`'s rank: writes `src` into chunks [index, index + src.count) of
        the buffer on every member rank."""
        prog = current_program()
        src = _chunks(src, "src")
        self._member(src.rank)
        for r in self.ranks:
            prog._record(Op("switch_broadcast", src.rank, prog._tb(tb), dst=self._region(r, index, src.count),
                            srcs=[src], channel=self.id))

    def __repr__(self) -> str:
        return f"SwitchChannel({self.ranks}, {self.buffer})"
