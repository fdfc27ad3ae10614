"""Running DSL plans: :class:`PlanRunner` packs a plan (``pyccl.dsl.Plan``)
into the interpreter's binary form (``csrc/executor/plan_format.hpp``) and
runs it on torch tensors, on GPUs or in host mode on CPU processes::

    plan = pyccl.algorithms.allreduce_2pa_hb_pull(world).lower()
    run = PlanRunner(plan, comm, max_bytes=1 << 20)   # collective
    y = run(x)                                         # on the current stream

A call is one interpreter kernel (one CUDA block per plan thread block).
Where the plan lets peers reach a rank's input or output, that buffer lives in
the executor's registered staging, and the call copies the input in and the
output out; otherwise the plan works on the user's tensors
(:func:`buffer_placement`). The input size must be a multiple of the plan's
input chunk count times the element size.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import torch

from . import _C
from .dsl import plan_format as fmt
from .dsl.plan import PACKET_READS, Plan
from .errors import InvalidArgumentError

if TYPE_CHECKING:  # plans sit below the communicator: they run on any communicator's native one
    from .communicator import Communicator

__all__ = ["COLLECTIVE_OF", "PlanRunner", "buffer_placement", "pack_plan"]

#: The collectives pyccl calls by name, by the DSL's name of each (``Plan.collective["name"]``).
COLLECTIVE_OF = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
                  "alltoall": "all_to_all"}

_REDUCING = ("reduce", "reduce_packets", "reduce_put_packets", "channel_reduce", "multi_reduce", "reduce_put",
             "switch_reduce")
_PACKET_WRITES = ("put_packets", "multi_put_packets")  # dst or dsts are packets (reduce_put_packets: dsts)


def _op_words(kind: str, reduce_op=None, srcs=(), dsts=(), channels=(), ordinals=()) -> List[int]:
    """One interpreter op in plan_format's word layout (peers and per-call
    counts left 0: the executor fills them from its channel tables)."""
    for what, items in (("sources", srcs), ("destinations", dsts), ("channels", channels)):
        if len(items) > fmt.MAX_OPERANDS:
            raise InvalidArgumentError(f"invalid argument 'plan': an op has {len(items)} {what}; the interpreter "
                                       f"takes up to {fmt.MAX_OPERANDS}")
    words = [0] * fmt.OP_WORDS
    at = fmt.OP_OFFSET
    words[at["kind"]] = fmt.OP_CODE[kind]
    words[at["reduce_op"]] = fmt.REDUCE_CODE[reduce_op]
    words[at["num_srcs"]], words[at["num_dsts"]], words[at["num_channels"]] = len(srcs), len(dsts), len(channels)
    words[at["ordinals"]:at["ordinals"] + len(ordinals)] = ordinals
    words[at["channels"]:at["channels"] + len(channels)] = channels
    for field, chunks in (("srcs", srcs), ("dsts", dsts)):
        for i, c in enumerate(chunks):
            first = at[field] + fmt.CHUNK_WORDS * i
            words[first:first + fmt.CHUNK_WORDS] = [c[0], fmt.BUFFER_CODE[c[1]], c[2], c[3]]
    return words


def _chunks_touched(op: dict) -> List[Tuple[list, bool]]:
    """(chunk, written) for every chunk an op names; packet chunks are marked
    by the buffer name "packets"."""
    kind = op["op"]

    def named(c: list, packets: bool) -> list:
        return [c[0], "packets", c[2], c[3]] if packets else c

    packet_dsts = kind in _PACKET_WRITES or kind == "reduce_put_packets"
    out = [(named(c, kind in _PACKET_WRITES), True) for c in ([op["dst"]] if "dst" in op else [])]
    out += [(named(c, packet_dsts), True) for c in op.get("dsts", [])]
    out += [(c, True) for c in op.get("copy_to", [])]
    for i, c in enumerate(op.get("srcs", [])):
        # reduce_put's srcs[0] gets the result (and, with an init, is not read).
        out.append((named(c, kind in PACKET_READS), kind == "reduce_put" and i == 0))
    if "init" in op:
        out.append((op["init"], False))
    return out


def buffer_placement(plan: Plan) -> dict:
    """Where each rank's buffers live and whether the ranks must meet at the
    start of every call.

    - ``stage_input[r]``: a peer reads or writes rank r's input (for an
      in-place collective, the one buffer), or an out-of-place plan writes
      it; calls then copy the input into registered staging.
    - ``stage_output[r]``: a peer reaches rank r's output; the plan then
      writes staging that is copied out at the end of the call.
    - ``entry_barrier``: needed unless (1) every rank waits, within a call, on
      every peer whose memory it reaches (a signal or LL packets from it), and
      (2) every access to a peer's staged input comes after a wait on that
      peer in the same thread block. With staging double-buffered by call
      parity, (1) means a peer has finished the call before last (whose phase
      is being reused) and (2) that it has copied this call's input in.
    """
    n = plan.num_ranks
    in_place = bool(plan.collective.get("in_place"))
    kind_of = (lambda b: "input" if b == "output" else b) if in_place else (lambda b: b)
    remote = {(r, b): False for r in range(n) for b in ("input", "output")}
    writes_input = [False] * n
    # rank -> [(first packet slot, end, the rank that puts packets there)]: ranges, so that the work is by op,
    # never by chunk (a plan may name 2^32 chunks).
    senders: Dict[int, List[Tuple[int, int, int]]] = defaultdict(list)
    for r in range(n):
        for tb in plan.threadblocks(r):
            for op in tb["ops"]:
                for c, written in _chunks_touched(op):
                    b = kind_of(c[1])
                    if c[0] != r and b in ("input", "output"):
                        remote[(c[0], b)] = True
                    if c[0] == r and b == "input" and written:
                        writes_input[r] = True
                    if b == "packets" and written:
                        senders[c[0]].append((c[2], c[2] + c[3], r))
    stage_input = [remote[(r, "input")] or (not in_place and writes_input[r]) for r in range(n)]
    stage_output = [stage_input[r] if in_place else remote[(r, "output")] for r in range(n)]

    def waited_on(op: dict) -> set:
        if op["op"] in ("wait", "multi_wait"):
            return {plan.channels[c]["src"] for c in (op.get("channels") or [op["channel"]])}
        if op["op"] in PACKET_READS:
            return {s for c in op["srcs"] for lo, hi, s in senders[c[0]] if lo < c[2] + c[3] and c[2] < hi}
        return set()

    entry_barrier = False
    for r in range(n):
        touched, waited = set(), set()
        for tb in plan.threadblocks(r):
            so_far = set()
            for op in tb["ops"]:
                for c, _ in _chunks_touched(op):
                    if c[0] == r:
                        continue
                    touched.add(c[0])
                    if kind_of(c[1]) == "input" and stage_input[c[0]] and c[0] not in so_far:
                        entry_barrier = True
                so_far |= waited_on(op)
            waited |= so_far
        if not touched <= waited:
            entry_barrier = True
    return {"stage_input": stage_input, "stage_output": stage_output, "entry_barrier": entry_barrier}


def _next_ordinals(counts: Dict[int, int], chans: List[int]) -> List[int]:
    """The ordinal within the call of this signal or wait on each channel (from 1), counted in `counts`."""
    ords = []
    for c in chans:
        counts[c] += 1
        ords.append(counts[c])
    return ords


def pack_plan(plan: Plan, rank: int) -> dict:
    """The PlanExecutor arguments of `rank`'s part of `plan`."""
    signals: Dict[int, int] = defaultdict(int)
    signallers: Dict[int, set] = defaultdict(set)  # channel -> (rank, thread block) that signal it
    for rank_index, r in enumerate(plan.ranks):
        for t, tb in enumerate(r["threadblocks"]):
            for op in tb["ops"]:
                chans = []
                if op["op"] in ("signal", "put_with_signal"):
                    chans = [op["channel"]]
                elif op["op"] == "multi_signal":
                    chans = op["channels"]
                for c in chans:
                    signals[c] += 1
                    signallers[c].add((rank_index, t))
    # A signal stores the count its waits expect (call x signals per call +
    # ordinal), as one writer's flag; two thread blocks would race for it.
    for c, who in signallers.items():
        if len(who) > 1:
            raise InvalidArgumentError(f"invalid argument 'plan': channel {c} is signalled from {len(who)} thread "
                                       f"blocks (rank, block: {sorted(who)}); a channel's signals must come from "
                                       "one thread block")
    groups: Dict[tuple, int] = {}
    per_tb_barriers: Dict[Tuple[tuple, int], int] = defaultdict(int)
    tbs = plan.threadblocks(rank)
    for t, tb in enumerate(tbs):
        for op in tb["ops"]:
            if op["op"] == "barrier":
                key = tuple(op["tbs"])
                groups.setdefault(key, len(groups))
                per_tb_barriers[(key, t)] += 1
    words: List[int] = []
    offsets = [0]
    reduces = False
    for t, tb in enumerate(tbs):
        waits: Dict[int, int] = defaultdict(int)
        sent: Dict[int, int] = defaultdict(int)
        barriers: Dict[tuple, int] = defaultdict(int)
        count = 0
        for op in tb["ops"]:
            kind = op["op"]
            reduces = reduces or kind in _REDUCING
            srcs, red = op.get("srcs", []), op.get("reduce_op")
            dst = [op["dst"]] if "dst" in op else []
            out: List[List[int]] = []
            if kind in ("copy", "put", "get", "switch_broadcast", "put_with_signal"):
                out.append(_op_words("put", srcs=srcs, dsts=dst))
                if kind == "put_with_signal":
                    chans = [op["channel"]]
                    out.append(_op_words("signal", channels=chans, ordinals=_next_ordinals(sent, chans)))
            elif kind in ("multi_put", "multi_get", "multi_copy"):  # several sources: pairs
                out.append(_op_words("put", srcs=srcs, dsts=op["dsts"]))
            elif kind == "multi_put_packets":
                out.append(_op_words("put_packets", srcs=srcs, dsts=op["dsts"]))
            elif kind == "multi_unpack":
                out.append(_op_words("unpack", srcs=srcs, dsts=op["dsts"]))
            elif kind in ("reduce", "channel_reduce", "multi_reduce", "reduce_put") and "init" in op:
                # Starts from init, stores only: the local result (reduce_put: srcs[0]) first, then the rest.
                local, sources = (srcs[:1], srcs[1:]) if kind == "reduce_put" else ([], srcs)
                out.append(_op_words("reduce_to", red, srcs=[op["init"]] + sources,
                                     dsts=local + dst + op.get("dsts", []) + op.get("copy_to", [])))
            elif kind in ("reduce", "channel_reduce", "multi_reduce"):  # copy_to: more destinations
                out.append(_op_words("reduce", red, srcs=srcs, dsts=dst + op.get("copy_to", [])))
            elif kind == "reduce_packets":  # init: a second entry, where the reduction starts
                out.append(_op_words(kind, red, srcs=srcs, dsts=dst + ([op["init"]] if "init" in op else [])))
            elif kind == "reduce_put_packets":  # where it starts, then the packets; dst, then the packets' dsts
                out.append(_op_words(kind, red, srcs=[op.get("init", op["dst"])] + srcs, dsts=dst + op["dsts"]))
            elif kind == "reduce_put":  # the result to srcs[0], dst, every dsts and every copy_to
                out.append(_op_words(kind, red, srcs=srcs, dsts=dst + op.get("dsts", []) + op.get("copy_to", [])))
            elif kind in ("unpack", "put_packets", "switch_reduce"):
                out.append(_op_words(kind, red, srcs=srcs, dsts=dst))
            elif kind in ("signal", "multi_signal"):
                chans = op.get("channels") or [op["channel"]]
                out.append(_op_words("signal", channels=chans, ordinals=_next_ordinals(sent, chans)))
            elif kind in ("wait", "multi_wait"):
                chans = op.get("channels") or [op["channel"]]
                out.append(_op_words("wait", channels=chans, ordinals=_next_ordinals(waits, chans)))
            elif kind == "barrier":
                key = tuple(op["tbs"])
                barriers[key] += 1
                out.append(_op_words("barrier", ordinals=[groups[key], barriers[key], len(key)]))
            else:  # flush, sync
                out.append(_op_words(kind))
            for w in out:
                words += w
            count += len(out)
        offsets.append(offsets[-1] + count)
    num_channels = len(plan.channels)
    signals_per_call = [signals[c] for c in range(num_channels)]
    for key in sorted(groups, key=groups.get):
        signals_per_call.append(per_tb_barriers[(key, key[0])] * len(key))
    width = fmt.OP_WORDS
    ops = torch.tensor(words, dtype=torch.int32).reshape(-1, width) if words else torch.zeros((0, width),
                                                                                               dtype=torch.int32)
    placement = buffer_placement(plan)
    return {
        "ops": ops, "tb_offsets": offsets,
        "stage_input": placement["stage_input"][rank], "stage_output": placement["stage_output"][rank],
        "entry_barrier": placement["entry_barrier"],
        "channel_src": [c.get("src", -1) for c in plan.channels],
        "channel_dst": [c.get("dst", -1) for c in plan.channels],
        "signals_per_call": signals_per_call,
        "input_chunks": plan.buffers["input"], "output_chunks": plan.buffers["output"],
        "scratch_chunks": plan.buffers["scratch"], "in_place": bool(plan.collective.get("in_place")),
        "reduces": reduces,
    }


class PlanRunner:
    """A plan set up on a communicator (collective: every rank, the same plan
    and max_bytes), callable on tensors.

    `threads` is the most threads per block: a call runs on as many whole
    warps as its largest op has work for, up to it (see :meth:`threads_for`)."""

    def __init__(self, plan: Plan, comm: "Communicator", max_bytes: int, threads: int = 512) -> None:
        if not isinstance(plan, Plan):
            raise InvalidArgumentError(f"invalid argument 'plan': expected a pyccl.dsl.Plan, got {type(plan).__name__}")
        if not isinstance(getattr(comm, "_comm", None), _C.Communicator):
            raise InvalidArgumentError(f"invalid argument 'comm': expected a pyccl.Communicator, got "
                                       f"{type(comm).__name__}")
        if plan.num_ranks != comm.world_size:
            raise InvalidArgumentError(f"invalid argument 'plan': it is for {plan.num_ranks} ranks, the communicator "
                                       f"has {comm.world_size}")
        if not isinstance(max_bytes, int) or max_bytes <= 0:
            raise InvalidArgumentError(f"invalid argument 'max_bytes': a positive byte count, got {max_bytes!r}")
        args = pack_plan(plan, comm.rank)
        self.plan, self.comm = plan, comm
        self._reduces = args.pop("reduces")
        self._out_chunks = args["input_chunks"] if args["in_place"] else args["output_chunks"]
        self._in_chunks = args["input_chunks"]
        max_chunk = -(-max_bytes // args["input_chunks"])
        self._executor = _C.PlanExecutor(comm._comm, max_chunk_bytes=max_chunk, threads=threads, name=plan.name,
                                         **args)
        self._collective = COLLECTIVE_OF.get(plan.collective.get("name"))

    @property
    def calls(self) -> int:
        """Calls run so far, from every entry point (this object, pyccl.<collective>, torch.ops.pyccl)."""
        return self._executor.calls

    def __call__(self, tensor: torch.Tensor, out: Optional[torch.Tensor] = None, op: str = "sum",
                 collective: Optional[str] = None) -> torch.Tensor:
        """Runs the plan on `tensor` into `out` (a new tensor where None) with reduction `op` (avg: the sum,
        then divided by the world size), on the current stream. `out` may lie against `tensor` as the plan's
        collective allows (`collective`, a pyccl name such as "all_gather", overrides the plan's)."""
        if not isinstance(tensor, torch.Tensor):
            raise InvalidArgumentError(f"invalid argument 'tensor': expected a torch.Tensor, got {type(tensor).__name__}")
        if out is None:
            n = tensor.numel() // self._in_chunks * self._out_chunks
            out = torch.empty(n, dtype=tensor.dtype, device=tensor.device)
        elif not isinstance(out, torch.Tensor):
            raise InvalidArgumentError(f"invalid argument 'out': expected a torch.Tensor or None, got "
                                       f"{type(out).__name__}")
        self._executor.run(self.comm._comm, collective or self._collective, tensor, out, op, self._reduces)
        return out

    def threads_for(self, nbytes: int) -> int:
        """Threads per block that a GPU call with `nbytes` of input runs on:
        whole warps for the largest op's work items (LL packets, 16-byte
        vectors), at most the runner's `threads`."""
        if not isinstance(nbytes, int) or nbytes <= 0:
            raise InvalidArgumentError(f"invalid argument 'nbytes': a positive byte count, got {nbytes!r}")
        return self._executor.threads_for(nbytes)

    def keep_in(self, plans: "_C.PlanRunners", key: str) -> None:
        """Adds this runner to the plan table `plans` under the selector's slot `key`, so that the C++ entry
        points (the call runtime, torch.ops.pyccl's kernels, the "pyccl" process group) run it too."""
        plans.add(key, self._executor, self._reduces, self._in_chunks, self._out_chunks)

    def close(self) -> None:
        self._executor.close()
