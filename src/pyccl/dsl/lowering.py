"""Lowering a DSL program to a plan.

The passes, in order:

1. **Checks** whose errors name the user's line: a channel used from two
   thread blocks on one side, signals and waits that do not pair up, an op
   whose source and destination chunks overlap, barriers that not every
   listed thread block reaches as often.
2. **Instance replication**: with ``instances=k`` every chunk splits into k
   sub-chunks, thread block t becomes k thread blocks and every channel k
   channels; instance j runs the program on sub-chunk j of every chunk.
3. **Fusion** of consecutive ops of one thread block: a local reduce whose
   result a MemoryChannel put sends next becomes ``reduce_put`` (the result
   goes from registers), and further puts of that result to other peers and a
   local copy of it join the same op (the 2PA HB push: one pass stores the
   reduced chunk locally and into every peer); a PortChannel put followed by a signal on the same
   channel becomes ``put_with_signal``; back-to-back puts of the same chunks
   to several peers, and back-to-back signals or waits on several channels,
   become one multi-peer op; back-to-back puts, packet puts, gets, unpacks
   or local copies of different chunks of one size become one op of
   (source, destination) pairs (``multi_put``, ``multi_put_packets``,
   ``multi_get``, ``multi_unpack``, ``multi_copy``) that issues every pair's
   loads before it stores any, so their latencies overlap; back-to-back reductions into the same chunks
   (MemoryChannel ``reduce`` from several peers, ``reduce_packets`` of several
   peers' packets) become one op that reads every source at once; a local
   copy of a reduction's result right after it becomes a second destination
   of the reduction (``copy_to``: the result is stored twice from registers);
   a local copy into chunks followed by a reduction into them (``reduce``,
   MemoryChannel ``reduce``, ``reduce_packets``) becomes the reduction's
   ``init``: it starts from the copy's source, so the copy is never made (one
   pass and one block sync fewer, as 1PA reduces from its input and the 2PA HB
   push kernel from its own chunk of the input); packet puts of a
   ``reduce_packets`` result right after it become ``reduce_put_packets``
   (the result goes to the peers from registers, with no store and reload
   in between, as in 2PA LL's kernel).
4. **Synchronization**: the threads of a block split each op's data their own
   way, so an op that reads or writes chunks that an earlier op of the same
   block wrote (or reads what it overwrites) needs a ``sync`` first. The data
   dependences are tracked per thread block at chunk granularity (last
   writers and active readers since the last sync). signal, wait and barrier
   synchronize the block themselves, so no sync is placed next to them and
   back-to-back syncs collapse into one. put_with_signal synchronizes only
   after its put: a put of chunks that the op before it wrote needs a sync.
   Packet ops (put_packets, unpack, reduce_packets) split their chunks among
   the threads the same way, so one that reads or writes exactly the chunks
   another packet op wrote or read needs no sync: in 2PA LL the reduced chunk
   goes to the peers with no sync between reduction and put.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Optional, Tuple

from .plan import MAX_OPERANDS, Plan
from .program import ChunkRange, DSLError, Op, Program

__all__ = ["lower"]

_SOURCE_SIDE = ("put", "get", "put_packets", "put_with_signal", "channel_reduce", "reduce_put", "signal", "flush")
_SYNCS_ITSELF = ("signal", "wait", "barrier", "multi_signal", "multi_wait")
_PACKET_OPS = ("put_packets", "multi_put_packets", "unpack", "multi_unpack", "reduce_packets", "reduce_put_packets")
# op kind -> the kind of several of them fused as (source, destination) pairs
_PAIRS = {"put": "multi_put", "put_packets": "multi_put_packets", "get": "multi_get", "unpack": "multi_unpack",
          "copy": "multi_copy"}


def _check(prog: Program) -> None:
    users: Dict[Tuple[int, str], Tuple[int, str]] = {}
    signals: Dict[int, List[Op]] = defaultdict(list)
    waits: Dict[int, List[Op]] = defaultdict(list)
    for op in prog.ops:
        if op.channel is not None and op.kind not in ("switch_reduce", "switch_broadcast"):
            side = "source" if op.kind in _SOURCE_SIDE else "destination"
            first = users.setdefault((op.channel, side), (op.tb, op.line))
            if first[0] != op.tb:
                ch = prog.channels[op.channel]
                raise DSLError(f"{op.line}: {ch!r} is used on its {side} side from thread block {op.tb}, and from "
                               f"thread block {first[0]} at {first[1]}: a channel side belongs to one thread block")
            if op.kind in ("signal", "put_with_signal"):
                signals[op.channel].append(op)
            if op.kind == "wait":
                waits[op.channel].append(op)
        for src in op.srcs:
            if op.dst is not None and src.overlaps(op.dst) and op.kind not in ("switch_reduce",):
                raise DSLError(f"{op.line}: {op.kind} reads {src} and writes the overlapping {op.dst}")
    for cid in set(signals) | set(waits):
        s, w = signals[cid], waits[cid]
        if len(s) != len(w):
            ch = prog.channels[cid]
            extra = (s if len(s) > len(w) else w)[min(len(s), len(w))]
            what = "signal has no matching wait" if len(s) > len(w) else "wait has no matching signal"
            raise DSLError(f"{extra.line}: {ch!r} (made at {ch.line}): {len(s)} signal(s) and {len(w)} wait(s); "
                           f"this {what}")
    counts: Dict[Tuple[int, tuple], Dict[int, int]] = defaultdict(lambda: defaultdict(int))
    lines: Dict[Tuple[int, tuple], str] = {}
    for op in prog.ops:
        if op.kind == "barrier":
            counts[(op.rank, op.barrier_tbs)][op.tb] += 1
            lines[(op.rank, op.barrier_tbs)] = op.line
    for key, per_tb in counts.items():
        if len(set(per_tb.values())) != 1 or set(per_tb) != set(key[1]):
            raise DSLError(f"{lines[key]}: barrier of thread blocks {key[1]} on rank {key[0]} is reached "
                           f"{dict(per_tb)} times by them: it would never complete")


def _replicate(prog: Program) -> Tuple[List[Op], int]:
    """The ops of every instance, and the channel count (channel c of instance j is c * k + j)."""
    k = prog.instances
    if k == 1:
        return list(prog.ops), len(prog.channels)

    def sub(c: ChunkRange, j: int, m: int) -> ChunkRange:
        return ChunkRange(c.rank, c.buffer, (c.index + m) * k + j, 1)

    out: List[Op] = []
    for j in range(k):
        for op in prog.ops:
            base = dict(kind=op.kind, rank=op.rank, tb=op.tb * k + j,
                        channel=None if op.channel is None else op.channel * k + j, reduce_op=op.reduce_op,
                        tb_group=None if op.tb_group is None else tuple(t * k + j for t in op.tb_group),
                        barrier_tbs=None if op.barrier_tbs is None else tuple(t * k + j for t in op.barrier_tbs),
                        line=op.line)
            count = op.dst.count if op.dst is not None else (op.srcs[0].count if op.srcs else 0)
            if count == 0:
                out.append(Op(**base))
                continue
            # Sub-chunk j of each chunk of a range is not contiguous: one op per
            # chunk. A put-with-signal signals once, after its last chunk.
            for m in range(count):
                part = dict(base)
                if op.kind == "put_with_signal" and m < count - 1:
                    part["kind"] = "put"
                out.append(Op(**part, dst=None if op.dst is None else sub(op.dst, j, m),
                              srcs=[sub(s, j, m) for s in op.srcs]))
    return out, len(prog.channels) * k


def _fuse(ops: List[Op], channel_types: List[str]) -> List[Op]:
    out: List[Op] = []
    for op in ops:
        prev = out[-1] if out else None
        if prev is not None and _fused(prev, op, channel_types, out):
            continue
        out.append(op)
    return out


def _fused_pair(prev: Op, op: Op, channel_types: List[str], out: List[Op]) -> bool:
    """Merges `op` into `prev` as one more (source, destination) pair: back-to-back
    puts, packet puts, gets, unpacks or local copies of different chunks of one size. The
    fused op issues every pair's loads (or packet polls) before it stores any."""
    multi = _PAIRS.get(op.kind)
    if multi is None or op.tb_group is not None or prev.tb_group is not None:
        return False
    if op.channel is not None and channel_types[op.channel] != "memory":
        return False
    if prev.kind == op.kind:
        if prev.channel is not None and channel_types[prev.channel] != "memory":
            return False
        srcs, dsts = [prev.srcs[0]], [prev.dst]
        chans = [prev.channel] if prev.channel is not None else []
    elif prev.kind == multi:
        srcs = prev.srcs * len(prev.dsts) if len(prev.srcs) == 1 else list(prev.srcs)  # a broadcast as pairs
        dsts, chans = list(prev.dsts), list(getattr(prev, "channels", []))
    else:
        return False
    src, dst = op.srcs[0], op.dst
    if len(dsts) >= MAX_OPERANDS or src.count != srcs[0].count:
        return False
    # A multi-peer op has one pair per channel (a range that replication split
    # into several ops on one channel stays several ops).
    if op.channel is not None and op.channel in chans:
        return False
    # Every pair is done at once: no pair may write what another reads or writes.
    if any(dst.overlaps(c) for c in srcs + dsts) or any(src.overlaps(d) for d in dsts):
        return False
    fused = Op(multi, prev.rank, prev.tb, srcs=srcs + [src], line=prev.line)
    fused.dsts = dsts + [dst]
    if op.channel is not None:
        fused.channels = chans + [op.channel]
    out[-1] = fused
    return True


def _fused_reduce_put_packets(prev: Op, op: Op, channel_types: List[str], out: List[Op]) -> bool:
    """Merges packet puts of a ``reduce_packets`` result (the whole destination,
    over memory channels) into the reduction as ``reduce_put_packets``. The
    interpreter's op holds the chunk it starts from beside the packet sources,
    and its destination beside the packet destinations: up to
    MAX_OPERANDS - 1 of each."""
    if prev.kind not in ("reduce_packets", "reduce_put_packets") or prev.tb_group is not None:
        return False
    if op.kind == "put_packets":
        chans, dsts = [op.channel], [op.dst]
    elif op.kind == "multi_put_packets":
        chans, dsts = list(op.channels), list(op.dsts)
    else:
        return False
    if op.tb_group is not None or op.srcs != [prev.dst] or any(channel_types[c] != "memory" for c in chans):
        return False
    have = _fused_list(prev, "dsts")
    if len(prev.srcs) > MAX_OPERANDS - 1 or len(have) + len(dsts) > MAX_OPERANDS - 1:
        return False
    fused = Op("reduce_put_packets", prev.rank, prev.tb, dst=prev.dst, srcs=list(prev.srcs), reduce_op=prev.reduce_op,
               line=prev.line, init=prev.init)
    fused.channels = _fused_list(prev, "channels") + chans
    fused.dsts = have + dsts
    out[-1] = fused
    return True


def _result_slots(op: Op) -> int:
    """The chunks a ``reduce_put`` stores its result to, as the interpreter holds
    them: dst, dsts and copy_to, and srcs[0] apart from the sources where the
    reduction starts from an init (packed with its destinations)."""
    return 1 + len(_fused_list(op, "dsts")) + len(op.copy_to) + (op.init is not None)


def _fused_list(op: Op, name: str) -> list:
    """A copy of the "dsts" or "channels" list that fusion gave `op`, empty where it gave none."""
    return list(getattr(op, name, None) or [])


def _fused(prev: Op, op: Op, channel_types: List[str], out: List[Op]) -> bool:
    """Merges `op` into `prev` (the last op of its thread block) where allowed."""
    if prev.copy_to:
        return False  # a reduction already fused with a copy takes nothing more
    if (prev.kind == "reduce" and op.kind == "put" and channel_types[op.channel] == "memory"
            and op.srcs[0] == prev.dst and op.tb_group is None):
        out[-1] = Op("reduce_put", op.rank, op.tb, dst=op.dst, srcs=[prev.dst, *prev.srcs], channel=op.channel,
                     reduce_op=prev.reduce_op, line=op.line, init=prev.init)
        return True
    if (prev.kind == "reduce_put" and op.kind == "put" and channel_types[op.channel] == "memory"
            and prev.tb_group is None and op.tb_group is None and op.srcs[0] == prev.srcs[0]
            and _result_slots(prev) < MAX_OPERANDS):
        # One more peer for the result, stored from registers in the same pass.
        prev.dsts = _fused_list(prev, "dsts") + [op.dst]
        prev.channels = _fused_list(prev, "channels") + [op.channel]
        return True
    if (prev.kind in ("reduce", "channel_reduce", "multi_reduce", "reduce_put") and op.kind == "copy"
            and prev.tb_group is None and op.tb_group is None):
        # reduce_put keeps its result in srcs[0] and stores it to dst and dsts too.
        result = prev.srcs[0] if prev.kind == "reduce_put" else prev.dst
        room = prev.kind != "reduce_put" or _result_slots(prev) < MAX_OPERANDS
        read = [result, *prev.srcs] + ([prev.init] if prev.init is not None else [])
        if room and op.srcs[0] == result and op.dst.rank == prev.rank and not any(op.dst.overlaps(c) for c in read):
            prev.copy_to.append(op.dst)
            return True
    if (prev.kind == "copy" and op.kind in ("reduce_packets", "reduce", "channel_reduce") and prev.dst == op.dst
            and prev.tb_group is None and op.tb_group is None and not prev.srcs[0].overlaps(prev.dst)
            and len(op.srcs) < MAX_OPERANDS):
        out[-1] = Op(op.kind, op.rank, op.tb, dst=op.dst, srcs=list(op.srcs), channel=op.channel,
                     reduce_op=op.reduce_op, line=op.line, init=prev.srcs[0])
        return True
    if _fused_reduce_put_packets(prev, op, channel_types, out):
        return True
    if (prev.kind == "put" and op.kind == "signal" and prev.channel == op.channel
            and channel_types[op.channel] == "port"):
        out[-1] = Op("put_with_signal", op.rank, op.tb, dst=prev.dst, srcs=prev.srcs, channel=op.channel,
                     line=prev.line)
        return True
    for single, multi in (("put", "multi_put"), ("put_packets", "multi_put_packets")):
        if (op.kind == single and channel_types[op.channel] == "memory" and op.tb_group is None
                and prev.kind in (single, multi) and prev.tb_group is None and prev.srcs == op.srcs
                and (prev.kind == multi or channel_types[prev.channel] == "memory")):
            if prev.kind == single:
                prev = Op(multi, prev.rank, prev.tb, srcs=prev.srcs, line=prev.line)
                prev.channels, prev.dsts = [out[-1].channel], [out[-1].dst]
                out[-1] = prev
            prev.channels.append(op.channel)
            prev.dsts.append(op.dst)
            return True
    if _fused_pair(prev, op, channel_types, out):
        return True
    if (op.kind == "channel_reduce" and channel_types[op.channel] == "memory" and op.tb_group is None
            and prev.kind in ("channel_reduce", "multi_reduce") and prev.tb_group is None and prev.dst == op.dst
            and prev.reduce_op == op.reduce_op and len(prev.srcs) + (prev.init is not None) < MAX_OPERANDS
            and (prev.kind == "multi_reduce" or channel_types[prev.channel] == "memory")):
        if prev.kind == "channel_reduce":
            prev = Op("multi_reduce", prev.rank, prev.tb, dst=prev.dst, srcs=list(prev.srcs), reduce_op=prev.reduce_op,
                      line=prev.line, init=prev.init)
            prev.channels = [out[-1].channel]
            out[-1] = prev
        prev.channels.append(op.channel)
        prev.srcs.append(op.srcs[0])
        return True
    if (op.kind == "reduce_packets" and prev.kind == "reduce_packets" and prev.dst == op.dst
            and prev.reduce_op == op.reduce_op):
        out[-1] = Op("reduce_packets", prev.rank, prev.tb, dst=prev.dst, srcs=[*prev.srcs, *op.srcs],
                     reduce_op=prev.reduce_op, line=prev.line, init=prev.init)
        return True
    for single, multi in (("signal", "multi_signal"), ("wait", "multi_wait")):
        if op.kind == single and prev.kind in (single, multi) and channel_types[op.channel] == "memory":
            if prev.kind == single:
                if channel_types[prev.channel] != "memory":
                    return False
                prev = Op(multi, prev.rank, prev.tb, line=prev.line)
                prev.channels = [out[-1].channel]
                out[-1] = prev
            prev.channels.append(op.channel)
            return True
    return False


def _chunks_of(op: Op) -> Tuple[List[ChunkRange], List[ChunkRange]]:
    reads = op.reads()
    writes = op.writes() + _fused_list(op, "dsts")
    if op.kind == "reduce_put":
        writes.append(op.srcs[0])  # the local result is stored too
    return reads, writes


def _conflicts(earlier: Tuple[ChunkRange, bool], later: ChunkRange, by_packets: bool) -> bool:
    """Whether an access to `later` must wait for the block's earlier access
    (range, made by a packet op) of the same chunks. Packet ops give packet p of
    their chunks to thread p mod threads (interpreter.hpp), so two packet ops
    on exactly the same chunks touch each byte from the same thread."""
    chunk, earlier_by_packets = earlier
    if by_packets and earlier_by_packets and chunk == later:
        return False
    return chunk.overlaps(later)


def _insert_syncs(ops: List[Op]) -> List[Op]:
    out: List[Op] = []
    written: List[Tuple[ChunkRange, bool]] = []
    read: List[Tuple[ChunkRange, bool]] = []
    for op in ops:
        if op.kind in _SYNCS_ITSELF:
            if out and out[-1].kind == "sync":
                out.pop()  # the op synchronizes the block itself
            out.append(op)
            written, read = [], []
            continue
        reads, writes = _chunks_of(op)
        by_packets = op.kind in _PACKET_OPS
        conflict = any(_conflicts(w, r, by_packets) for r in reads for w in written) or \
            any(_conflicts(x, w, by_packets) for w in writes for x in written + read)
        if conflict and out and out[-1].kind not in ("sync", "wait", "barrier", "multi_wait", "put_with_signal"):
            out.append(Op("sync", op.rank, op.tb, line=op.line))
            written, read = [], []
        out.append(op)
        if op.kind == "put_with_signal":  # its signal synchronizes the block after the put
            written, read = [], []
        else:
            written += [(w, by_packets) for w in writes]
            read += [(r, by_packets) for r in reads]
    return out


def _chunk_json(c: ChunkRange) -> list:
    return [c.rank, c.buffer, c.index, c.count]


def _op_json(op: Op) -> dict:
    d = {"op": op.kind}
    if op.dst is not None:
        d["dst"] = _chunk_json(op.dst)
    if op.srcs:
        d["srcs"] = [_chunk_json(s) for s in op.srcs]
    if op.channel is not None:
        d["channel"] = op.channel
    if getattr(op, "channels", None):
        d["channels"] = list(op.channels)
    if getattr(op, "dsts", None):
        d["dsts"] = [_chunk_json(c) for c in op.dsts]
    if op.copy_to:
        d["copy_to"] = [_chunk_json(c) for c in op.copy_to]
    if op.init is not None:
        d["init"] = _chunk_json(op.init)
    if op.reduce_op is not None:
        d["reduce_op"] = op.reduce_op
    if op.tb_group is not None:
        d["tb_group"] = list(op.tb_group)
    if op.barrier_tbs is not None:
        d["tbs"] = list(op.barrier_tbs)
    d["line"] = op.line
    return d


def _check_sizes(sizes) -> Optional[List[int]]:
    """`lower`'s sizes as the plan records them: None, or [min, max] bytes."""
    if sizes is None:
        return None
    ok = (isinstance(sizes, (tuple, list)) and len(sizes) == 2
          and all(isinstance(x, int) and not isinstance(x, bool) for x in sizes) and 0 <= sizes[0] <= sizes[1])
    if not ok:
        raise DSLError(f"invalid argument 'sizes': expected (min_bytes, max_bytes) with 0 <= min_bytes <= "
                       f"max_bytes, or None, got {sizes!r}")
    return [sizes[0], sizes[1]]


def lower(prog: Program, sizes: Optional[Tuple[int, int]] = None) -> Plan:
    """The plan of `prog`. `sizes` (min, max bytes) records the message sizes
    the plan is meant for; chunks are sizes / chunk count at run time."""
    sizes = _check_sizes(sizes)
    _check(prog)
    ops, num_channels = _replicate(prog)
    k = prog.instances
    channels = []
    for cid in range(num_channels):
        ch = prog.channels[cid // k]
        if ch.kind == "switch":
            channels.append({"id": cid, "type": "switch", "ranks": list(ch.ranks), "buffer": ch.buffer})
        else:
            channels.append({"id": cid, "type": ch.kind, "src": ch.src, "dst": ch.dst})
    types = [c["type"] for c in channels]
    per_tb: Dict[Tuple[int, int], List[Op]] = defaultdict(list)
    for op in ops:
        per_tb[(op.rank, op.tb)].append(op)
    ranks = []
    for r in range(prog.num_ranks):
        num_tbs = 1 + max((tb for (rr, tb) in per_tb if rr == r), default=-1)
        tbs = [{"id": t, "ops": [_op_json(o) for o in _insert_syncs(_fuse(per_tb.get((r, t), []), types))]}
               for t in range(num_tbs)]
        ranks.append({"rank": r, "threadblocks": tbs})
    buffers = {kind: n * k for kind, n in prog.buffer_sizes().items()}
    coll = prog.collective.to_dict()
    plan = Plan(prog.name, coll, prog.protocol, k, buffers, channels, ranks, sizes)
    return Plan.from_dict(plan.to_dict(), where=f"plan of {prog.name!r}")
