"""The DSL: lowering (fusion, synchronization, buffer placement), the
simulator on every library algorithm, and the collectives' definitions. Its
checks and the plan files' are in test_dsl_checks.py."""

import json
import random

import pytest

import pyccl.algorithms as algorithms
from pyccl.dsl import (AllGather, AllReduce, DSLError, MemoryChannel, Plan, PlanError, Program, ReduceScatter,
                       all_pairs_memory_channels, signal_and_wait, simulate, verify)


@pytest.mark.parametrize("name", sorted(algorithms.LIBRARY))
@pytest.mark.parametrize("world", range(2, 9))
def test_library_algorithms_pass_the_simulator(name, world):
    plan = algorithms.LIBRARY[name](world).lower()
    verify(plan, interleavings=12 if world <= 4 else 4, seed=random.randrange(1 << 20))


@pytest.mark.parametrize("name", sorted(algorithms.LIBRARY))
def test_replicated_instances_pass_the_simulator(name):
    one = algorithms.LIBRARY[name](3).lower()
    two = algorithms.LIBRARY[name](3, instances=2).lower()
    assert len(two.channels) == 2 * len(one.channels)
    assert len(two.threadblocks(0)) == 2 * len(one.threadblocks(0))
    assert two.buffers["input"] == 2 * one.buffers["input"]
    verify(two, interleavings=6, seed=random.randrange(1 << 20))


@pytest.mark.parametrize("name", sorted(algorithms.HIERARCHICAL))
@pytest.mark.parametrize("layout", [(2, 1), (2, 2), (2, 4), (3, 2), (4, 2), (2, 3), (8, 1), (4, 4)])
@pytest.mark.parametrize("instances", [1, 2])
def test_hierarchical_algorithms_pass_the_simulator(name, layout, instances):
    nodes, gpus = layout
    plan = algorithms.HIERARCHICAL[name](nodes, gpus, instances=instances).lower()
    assert plan.num_ranks == nodes * gpus
    verify(plan, interleavings=8 if nodes * gpus <= 8 else 3, seed=random.randrange(1 << 20))
    for op in ("max", "prod"):
        verify(plan, interleavings=2, reduce_op=op)


@pytest.mark.parametrize("layout", [(2, 2), (3, 2), (4, 2), (3, 3)])
def test_2ph_ll_pipelines_over_any_number_of_pieces(layout):
    """Every piece count from one (no pipeline) to one per chunk of a part."""
    nodes, gpus = layout
    ops = []
    for pipeline in range(1, nodes + 1):
        plan = algorithms.HIERARCHICAL["allreduce_2ph_ll"](nodes, gpus, pipeline=pipeline).lower()
        verify(plan, interleavings=4, seed=random.randrange(1 << 20))
        ops.append(len(plan.threadblocks(0)[0]["ops"]))
    assert ops == sorted(ops) and ops[0] < ops[-1], ops  # each piece adds its own ops


def test_2ph_ll_pipeline_is_checked():
    for bad in (0, 3, 1.5):
        with pytest.raises(DSLError, match="'pipeline'"):
            algorithms.HIERARCHICAL["allreduce_2ph_ll"](2, 2, pipeline=bad)


def test_hierarchical_algorithms_check_their_layout():
    for name, build in algorithms.HIERARCHICAL.items():
        with pytest.raises(DSLError, match="'num_nodes'"):
            build(1, 4)
        with pytest.raises(DSLError, match="'gpus_per_node'"):
            build(2, 0)


def test_replication_keeps_one_pair_per_channel_in_multi_peer_ops():
    # Gets of two-chunk ranges split into one op per chunk under replication;
    # they must not fuse into a multi-peer op that names one channel twice.
    with Program("two_chunk_gets", AllReduce(2, chunks=4, in_place=False), instances=2) as p:
        ch = {(0, 1): MemoryChannel(0, 1), (1, 0): MemoryChannel(1, 0)}
        for r in range(2):
            q = 1 - r
            p.output(r)[2 * r:2 * r + 2].copy(p.input(r)[2 * r:2 * r + 2], tb=0)
            p.output(r)[2 * r:2 * r + 2].reduce(p.input(r)[2 * r:2 * r + 2], tb=0)
            ch[(q, r)].signal(tb=0)
            ch[(r, q)].wait(tb=0)
            ch[(q, r)].get(p.output(r)[2 * q:2 * q + 2], p.input(q)[2 * q:2 * q + 2], tb=0)
    plan = Plan.from_dict(json.loads(json.dumps(p.lower().to_dict())))
    for rank in range(2):
        for tb in plan.threadblocks(rank):
            for op in tb["ops"]:
                assert len(op.get("channels", [])) == len(set(op.get("channels", []))), op


def test_other_reduce_ops_pass_the_simulator():
    plan = algorithms.allreduce_2pa_hb_pull(4).lower()
    for op in ("max", "min", "prod"):
        verify(plan, interleavings=3, reduce_op=op)


def _kinds(plan, rank=0, tb=0):
    return [op["op"] for op in plan.threadblocks(rank)[tb]["ops"]]


def _push_allreduce(n: int) -> Program:
    """2PA HB pushing instead of pulling: reduce-scatter by puts into the
    owners' scratch, all-gather by puts of the result into every output."""
    with Program("push", AllReduce(n, chunks=n), protocol="hb") as p:
        chans = {(q, r): MemoryChannel(q, r) for r in range(n) for q in range(n) if q != r}
        for r in range(n):
            peers = [(r + k) % n for k in range(1, n)]
            for q in peers:
                chans[(q, r)].put(p.scratch(q, n)[r], p.input(r)[q], tb=0)
            for q in peers:
                chans[(q, r)].signal(tb=0)
            for q in peers:
                chans[(r, q)].wait(tb=0)
            p.input(r)[r].reduce(*[p.scratch(r, n)[q] for q in peers], tb=0)
            for q in peers:
                chans[(q, r)].put(p.output(q)[r], p.input(r)[r], tb=0)
            for q in peers:
                chans[(q, r)].signal(tb=0)
            for q in peers:
                chans[(r, q)].wait(tb=0)
    return p


def test_fusion_and_synchronization():
    hb = algorithms.allreduce_2pa_hb_pull(4).lower()
    kinds = _kinds(hb)
    # Signals and waits on every peer become one op each; reductions reading
    # the three peers become one multi_reduce; the pulls of the three peers'
    # chunks become one multi_get of pairs.
    assert kinds.count("multi_signal") == 2 and kinds.count("multi_wait") == 2
    assert kinds.count("multi_reduce") == 1 and kinds.count("get") == 0 and kinds.count("multi_get") == 1
    gets = hb.threadblocks(0)[0]["ops"][kinds.index("multi_get")]
    assert [d[2] for d in gets["dsts"]] == [1, 2, 3] and [s[0] for s in gets["srcs"]] == [1, 2, 3]
    reduce_op = hb.threadblocks(0)[0]["ops"][kinds.index("multi_reduce")]
    assert sorted(c[0] for c in reduce_op["srcs"]) == [1, 2, 3] and len(reduce_op["channels"]) == 3
    # The copy of the reduced chunk into the output is a second destination of
    # the reduction (stored from registers), not an op of its own.
    assert reduce_op["copy_to"] == [[0, "output", 0, 1]] and "copy" in kinds[:1] and kinds.count("copy") == 1
    # A copy that does not take the reduction's result stays a copy.
    with Program("no_copy_to", AllReduce(2, chunks=2, in_place=False), protocol="hb") as p:
        for r in range(2):
            p.output(r)[0:2].copy(p.input(r)[0:2], tb=0)
            p.output(r)[0].reduce(p.input(r)[1], tb=0)
            p.output(r)[1].copy(p.input(r)[0], tb=0)
    assert "copy_to" not in p.lower().threadblocks(0)[0]["ops"][2] and _kinds(p.lower())[-1] == "copy"
    # A reduce whose result is put next becomes reduce_put; puts of one chunk
    # to several peers become multi_put.
    push = _push_allreduce(4).lower()
    verify(push, interleavings=4)
    assert "reduce_put" in _kinds(push) and "multi_put" in _kinds(push)
    # The library's pushing 2PA HB: the copy of the own input chunk into the
    # output is the reduction's init (never made), and the reduction and the
    # puts of its result to every peer are one reduce_put, one pass, as the
    # pushing kernel does it.
    hb_push = algorithms.allreduce_2pa_hb(4).lower()
    assert _kinds(hb_push) == ["multi_put", "multi_signal", "multi_wait", "reduce_put", "multi_signal",
                               "multi_wait", "multi_copy"]
    rp = hb_push.threadblocks(2)[0]["ops"][3]
    assert rp["init"] == [2, "input", 2, 1] and rp["srcs"][0] == [2, "output", 2, 1] and "copy_to" not in rp
    assert sorted(s[2] for s in rp["srcs"][1:]) == [0, 1, 3]
    assert sorted(d[0] for d in [rp["dst"], *rp["dsts"]]) == [0, 1, 3] and len(rp["channels"]) == 2
    verify(hb_push, interleavings=4)
    # 1PA HB: one put of the whole input to every peer, one signal round, and
    # the reduction of the peers' copies starting from the input (the copy
    # into the output never made), at world 8 too.
    for world in (4, 8):
        hb1 = algorithms.allreduce_1pa_hb(world).lower()
        assert _kinds(hb1) == ["multi_put", "multi_signal", "multi_wait", "reduce"], world
        red = hb1.threadblocks(1)[0]["ops"][3]
        assert red["init"] == [1, "input", 0, 1] and red["dst"] == [1, "output", 0, 1]
        assert sorted(s[2] for s in red["srcs"]) == [q for q in range(world) if q != 1]
        assert all(s[:2] == [1, "scratch"] for s in red["srcs"])
        verify(hb1, interleavings=4)
    # Seven peers and the output chunk are the interpreter's eight
    # destinations, the init and seven slots its eight sources: at world 8 it
    # all still fits one op.
    assert _kinds(algorithms.allreduce_2pa_hb(8).lower()).count("reduce_put") == 1
    ring = algorithms.allgather_ring(4).lower()
    assert "put_with_signal" in _kinds(ring) and "signal" not in _kinds(ring)
    # The first put sends the chunk the copy before it wrote: the block syncs
    # between (put_with_signal syncs only before its signal).
    assert _kinds(ring)[:3] == ["copy", "sync", "put_with_signal"]
    # 1PA LL: one packet put to every peer, and one reduction of every peer's
    # packets that starts from the input (the copy into the output fused in:
    # no copy, no sync).
    ll = algorithms.allreduce_1pa_ll(4).lower()
    assert _kinds(ll) == ["multi_put_packets", "reduce_packets"]
    last = ll.threadblocks(0)[0]["ops"][-1]
    assert len(last["srcs"]) == 3 and last["init"] == [0, "input", 0, 1] and last["dst"] == [0, "output", 0, 1]
    # A copy with another op between it and the reduction stays a copy (here
    # with that other copy: back-to-back local copies are one multi_copy).
    with Program("no_init", AllReduce(2, chunks=1, in_place=False), protocol="ll") as p:
        for r in range(2):
            q = 1 - r
            MemoryChannel(q, r).put_packets(p.scratch(q, 2)[0], p.input(r)[0], tb=0)
            p.output(r)[0].copy(p.input(r)[0], tb=0)
            p.scratch(r, 2)[1].copy(p.input(r)[0], tb=0)
            p.output(r)[0].reduce_packets(p.scratch(r, 2)[0], tb=0)
    ops = p.lower().threadblocks(0)[0]["ops"]
    assert all("init" not in op for op in ops) and _kinds(p.lower()) == ["put_packets", "multi_copy", "sync",
                                                                         "reduce_packets"]
    assert len(ops[1]["srcs"]) == 2 and len(ops[1]["dsts"]) == 2
    # With instances, 2PA HB's staging copy becomes one copy per chunk's
    # sub-chunk: they are one multi_copy (every chunk's loads in flight at once).
    hb2 = algorithms.allreduce_2pa_hb_pull(4, instances=2).lower()
    assert _kinds(hb2)[0] == "multi_copy" and len(hb2.threadblocks(0)[1]["ops"][0]["dsts"]) == 4, _kinds(hb2)
    # 2PA LL: chunk q to rank q for every q is one multi_put_packets of pairs;
    # the reduction of the peers' packets and the packet puts of its result are
    # one reduce_put_packets (the result goes from registers); the three
    # results are one multi_unpack. Packet ops split chunks among threads
    # alike, so none needs a sync; a packet put of part of the reduced chunks
    # stays apart and, like a plain copy of them, syncs first.
    ll2 = algorithms.allreduce_2pa_ll(4).lower()
    assert _kinds(ll2) == ["multi_put_packets", "reduce_put_packets", "multi_unpack"], _kinds(ll2)
    first, reduced, unpack = ll2.threadblocks(0)[0]["ops"]
    assert len(first["srcs"]) == 3 and len(reduced["srcs"]) == 3 and len(reduced["dsts"]) == 3
    assert reduced["init"] == [0, "input", 0, 1] and reduced["dst"] == [0, "output", 0, 1]
    assert [d[0] for d in reduced["dsts"]] == [1, 2, 3] and len(reduced["channels"]) == 3
    assert len(unpack["srcs"]) == 3 and len(unpack["dsts"]) == 3
    # On 8 ranks it takes the seven peers' packets and sends to seven peers;
    # an op of the interpreter holds at most 8 of each, one being the start
    # (or the destination).
    assert _kinds(algorithms.allreduce_2pa_ll(8).lower()) == ["multi_put_packets", "reduce_put_packets",
                                                                    "multi_unpack"]
    # Pairs that would touch each other's chunks stay apart.
    with Program("two_gets", AllGather(2), protocol="hb") as p:
        for r in range(2):
            q = 1 - r
            MemoryChannel(q, r).get(p.output(r)[q], p.output(q)[q], tb=0)
            MemoryChannel(q, r).get(p.scratch(r, 1)[0], p.output(q)[q], tb=0)
    assert _kinds(p.lower()) == ["multi_get"]
    with Program("overlapping_unpacks", AllReduce(2, chunks=2, in_place=False), protocol="ll") as p:
        for r in range(2):
            q = 1 - r
            MemoryChannel(q, r).put_packets(p.scratch(q, 4)[0:2], p.input(r)[0:2], tb=0)
            p.output(r)[0].unpack(p.scratch(r, 4)[0], tb=0)
            p.output(r)[0].unpack(p.scratch(r, 4)[1], tb=0)
    assert "multi_unpack" not in _kinds(p.lower()), _kinds(p.lower())
    for n, expect_sync in ((2, False), (1, True)):
        with Program("packets_then_put", AllReduce(2, chunks=2, in_place=False), protocol="ll") as p:
            for r in range(2):
                q = 1 - r
                MemoryChannel(q, r).put_packets(p.scratch(q, 4)[0:2], p.input(r)[0:2], tb=0)
                p.output(r)[0:2].reduce_packets(p.scratch(r, 4)[0:2], tb=0)
                MemoryChannel(q, r).put_packets(p.scratch(q, 4)[2:2 + n], p.output(r)[0:n], tb=0)
        assert ("sync" in _kinds(p.lower())) == expect_sync, (n, _kinds(p.lower()))
        assert ("reduce_put_packets" in _kinds(p.lower())) == (not expect_sync), (n, _kinds(p.lower()))
    with Program("packets_then_copy", AllReduce(2, chunks=2, in_place=False), protocol="ll") as p:
        for r in range(2):
            q = 1 - r
            MemoryChannel(q, r).put_packets(p.scratch(q, 4)[0:2], p.input(r)[0:2], tb=0)
            p.output(r)[0:2].reduce_packets(p.scratch(r, 4)[0:2], tb=0)
            p.input(r)[0:2].copy(p.output(r)[0:2], tb=0)
    assert _kinds(p.lower())[-2:] == ["sync", "copy"], _kinds(p.lower())
    for plan in (hb, push, ring, ll, ll2, algorithms.reduce_scatter_ring(4).lower()):
        for r in range(plan.num_ranks):
            for tb in plan.threadblocks(r):
                ks = [op["op"] for op in tb["ops"]]
                for a, b in zip(ks, ks[1:]):
                    assert not (a == "sync" and b in ("sync", "signal", "multi_signal", "barrier")), ks
                    assert not (a in ("wait", "multi_wait", "barrier") and b == "sync"), ks


def test_a_copy_into_a_reduction_becomes_its_init():
    # A local reduce: the copy is never made; the reduction starts from its source.
    with Program("local", AllReduce(2, chunks=2, in_place=False), protocol="hb") as p:
        chans = all_pairs_memory_channels(2)
        for r in range(2):
            q = 1 - r
            chans[(q, r)].put(p.scratch(q, 2)[0], p.input(r)[q], tb=0)
            signal_and_wait(chans, r, [q], tb=0)
            p.output(r)[r].copy(p.input(r)[r], tb=0)
            p.output(r)[r].reduce(p.scratch(r, 2)[0], tb=0)
            chans[(q, r)].put(p.scratch(q, 2)[1], p.output(r)[r], tb=0)
            signal_and_wait(chans, r, [q], tb=0)
            p.output(r)[q].copy(p.scratch(r, 2)[1], tb=0)
    plan = p.lower()
    assert _kinds(plan) == ["put", "signal", "wait", "reduce_put", "signal", "wait", "copy"]
    assert plan.threadblocks(1)[0]["ops"][3]["init"] == [1, "input", 1, 1]
    verify(plan, interleavings=8)
    for reduce_op in ("max", "prod"):
        verify(plan, interleavings=2, reduce_op=reduce_op)
    # MemoryChannel reductions from several peers: one multi_reduce that starts from the copy's source.
    with Program("pull", AllReduce(3, chunks=1, in_place=False), protocol="hb") as p:
        chans = all_pairs_memory_channels(3)
        for r in range(3):
            peers = [(r + k) % 3 for k in (1, 2)]
            signal_and_wait(chans, r, peers, tb=0)
            p.output(r)[0].copy(p.input(r)[0], tb=0)
            for q in peers:
                chans[(q, r)].reduce(p.output(r)[0], p.input(q)[0], tb=0)
            signal_and_wait(chans, r, peers, tb=0)
    plan = p.lower()
    assert _kinds(plan) == ["multi_signal", "multi_wait", "multi_reduce", "multi_signal", "multi_wait"]
    reduced = plan.threadblocks(0)[0]["ops"][2]
    assert reduced["init"] == [0, "input", 0, 1] and len(reduced["srcs"]) == 2
    verify(plan, interleavings=8)
    # A copy of the result into chunks that the init's overlap stays an op:
    # lowering adds no destination that touches what the reduction reads.
    with Program("back_into_init", AllReduce(2, chunks=2, in_place=False), protocol="hb") as p:
        for r in range(2):
            p.output(r)[0].copy(p.input(r)[0], tb=0)
            p.output(r)[0].reduce(p.input(r)[1], tb=0)
            p.input(r)[0].copy(p.output(r)[0], tb=0)
    ops = p.lower().threadblocks(0)[0]["ops"]
    assert ops[0]["init"] == [0, "input", 0, 1] and "copy_to" not in ops[0] and _kinds(p.lower())[-1] == "copy"
    # A copy whose source is its destination's neighbour in one range, or an op
    # between the copy and the reduction, keeps the copy.
    with Program("kept", AllReduce(2, chunks=2, in_place=True), protocol="hb") as p:
        for r in range(2):
            p.scratch(r, 3)[0].copy(p.input(r)[0], tb=0)
            p.scratch(r, 3)[2].copy(p.input(r)[1], tb=0)
            p.scratch(r, 3)[0].reduce(p.scratch(r, 3)[2], tb=0)
    assert all("init" not in op for op in p.lower().threadblocks(0)[0]["ops"])


def test_reduce_put_with_init_keeps_to_the_interpreters_operands():
    # World 8 and a further local copy of the result: srcs[0], the seven
    # peers and the copy would be nine destinations, so the copy stays an op.
    n = 8
    with Program("full", AllReduce(n, chunks=n, in_place=False), protocol="hb") as p:
        chans = all_pairs_memory_channels(n)
        for r in range(n):
            peers = [(r + k) % n for k in range(1, n)]
            for q in peers:
                chans[(q, r)].put(p.scratch(q, 2 * n + 1)[r], p.input(r)[q], tb=0)
            signal_and_wait(chans, r, peers, tb=0)
            p.output(r)[r].copy(p.input(r)[r], tb=0)
            p.output(r)[r].reduce(*[p.scratch(r, 2 * n + 1)[q] for q in peers], tb=0)
            for q in peers:
                chans[(q, r)].put(p.scratch(q, 2 * n + 1)[n + r], p.output(r)[r], tb=0)
            p.scratch(r, 2 * n + 1)[2 * n].copy(p.output(r)[r], tb=0)
            signal_and_wait(chans, r, peers, tb=0)
            for q in peers:
                p.output(r)[q].copy(p.scratch(r, 2 * n + 1)[n + q], tb=0)
    plan = p.lower()
    ops = plan.threadblocks(0)[0]["ops"]
    rp = next(op for op in ops if op["op"] == "reduce_put")
    assert "init" in rp and "copy_to" not in rp and 1 + len(rp["dsts"]) == 7
    assert "copy" in _kinds(plan) and "sync" in _kinds(plan)
    verify(plan, interleavings=2)
    # The same limit holds for a hand-edited plan.
    d = plan.to_dict()
    edited = next(op for op in d["ranks"][0]["threadblocks"][0]["ops"] if op["op"] == "reduce_put")
    edited["copy_to"] = [[0, "scratch", 2 * n, 1]]
    with pytest.raises(PlanError, match="at most 8 chunks"):
        Plan.from_dict(d)


def test_buffer_placement():
    from pyccl.plans import buffer_placement

    def place(plan):
        p = buffer_placement(plan)
        return p["stage_input"][0], p["stage_output"][0], p["entry_barrier"]

    # All-pairs all-reduce: only scratch is shared, every rank waits on every peer.
    for name in ("allreduce_1pa_ll", "allreduce_2pa_ll", "allreduce_1pa_hb", "allreduce_2pa_hb_pull"):
        assert place(algorithms.LIBRARY[name](4, instances=2).lower()) == (False, False, False), name
    # Peers write the output: it is staged. A ring waits on one neighbour only.
    assert place(algorithms.allgather_allpairs(4).lower()) == (False, True, False)
    assert place(algorithms.allgather_ring(4).lower()) == (False, True, True)
    assert place(algorithms.allgather_ring(2).lower()) == (False, True, False)
    # An out-of-place plan that reduces into its input stages it.
    assert place(algorithms.reduce_scatter_ring(4).lower()) == (True, False, True)
    # In place, peers write the buffer: staged. Every such put follows a wait
    # on its peer, so no barrier; moved before the waits, it needs one.
    push = _push_allreduce(3).lower()
    assert place(push) == (True, True, False)
    d = push.to_dict()
    ops = d["ranks"][0]["threadblocks"][0]["ops"]
    late = next(i for i, op in enumerate(ops) if any(c[0] != 0 and c[1] == "input"
                                                     for c in [op.get("dst", [0])] + op.get("dsts", [])))
    ops.insert(0, ops.pop(late))
    assert place(Plan.from_dict(d)) == (True, True, True)


def test_collective_definitions():
    import numpy as np

    x = [np.full((4, 1), float(r + 1)) for r in range(4)]
    assert ReduceScatter(4).reference(x)[2].tolist() == [[10.0]]
    assert AllGather(2, chunks=2).output_chunks == 4
    with pytest.raises(DSLError, match="num_ranks"):
        AllReduce(1)


def test_notebook_example_passes_the_simulator():
    import os
    import runpy

    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "notebooks", "oneshot_allreduce.py")
    oneshot = runpy.run_path(path)["oneshot_allreduce"]
    for n, tbs in ((2, 1), (3, 2), (5, 3), (8, 2)):
        verify(oneshot(n, tbs).lower(), interleavings=5)


def test_switch_channel_all_reduce():
    # NVLink SHARP style (never run on the device machines): rank r reduces
    # chunk r of every rank through the switch and broadcasts the result back.
    from pyccl.dsl import SwitchChannel

    n = 4
    def program(wait_for_peers: bool):
        with Program("switch", AllReduce(n, chunks=n)) as p:
            switch = SwitchChannel(range(n), buffer="input")
            done = {(q, r): MemoryChannel(q, r) for r in range(n) for q in range(n) if q != r}
            for r in range(n):
                switch.reduce(p.scratch(r, 1)[0], r, tb=0)
                switch.broadcast(r, p.scratch(r, 1)[0], tb=0)
                if wait_for_peers:  # every rank's chunk has landed here before this rank returns
                    for q in range(n):
                        if q != r:
                            done[(q, r)].signal(tb=0)
                    for q in range(n):
                        if q != r:
                            done[(r, q)].wait(tb=0)
        return p.lower()

    plan = program(True)
    assert plan.count_ops("switch_reduce") == n and plan.count_ops("switch_broadcast") == n * n
    verify(plan, interleavings=10)
    # Without the final signals a rank may return before its peers' broadcasts land.
    reports = [simulate(program(False), s) for s in range(10)]
    assert any("finished" in x for r in reports for x in r.races)
    with Program("not a member", AllReduce(n, chunks=n)) as p:
        switch = SwitchChannel([0, 1], buffer="input")
        with pytest.raises(DSLError, match="not a member"):
            switch.reduce(p.scratch(2, 1)[0], 0, tb=0)
