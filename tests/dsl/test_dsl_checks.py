"""The DSL's and the plans' checks: errors that point at the user's line,
arguments named, races, deadlocks and wrong results found by the simulator,
and plan files (round trip, fuzzed, hand-edited) refused with clear errors."""

import copy
import json
import os
import random

import pytest

import pyccl.algorithms as algorithms
from pyccl.dsl import (AllGather, AllReduce, DSLError, MemoryChannel, Plan, PlanError, PortChannel, Program,
                       SendRecv, SimulationError, load_plan, simulate, verify)


def _line_of(marker: str) -> str:
    with open(__file__) as f:
        for i, text in enumerate(f, 1):
            if marker in text and "_line_of" not in text:
                return f"{os.path.basename(__file__)}:{i}"
    raise AssertionError(marker)


def test_errors_point_at_the_users_line():
    with Program("unmatched", AllReduce(2)) as p:
        ch = MemoryChannel(1, 0)
        ch.signal(tb=0)  # marker:unmatched
    with pytest.raises(DSLError, match="signal has no matching wait") as e:
        p.lower()
    assert _line_of("marker:unmatched") in str(e.value)

    with Program("two tbs", AllReduce(2)) as p:
        ch = MemoryChannel(1, 0)
        ch.put(p.scratch(1, 2)[0], p.input(0)[0], tb=0)
        ch.put(p.scratch(1, 2)[1], p.input(0)[1], tb=1)  # marker:twotbs
    with pytest.raises(DSLError, match="one thread block") as e:
        p.lower()
    assert _line_of("marker:twotbs") in str(e.value)

    with Program("overlap", AllReduce(2, chunks=4)) as p:
        with pytest.raises(DSLError, match="overlapping"):
            p.input(0)[0:2].copy(p.input(0)[1:3], tb=0)
            p.lower()
    with Program("range", AllReduce(2, chunks=4)) as p:
        with pytest.raises(DSLError, match="out of range") as e:
            p.input(0)[3:5]  # marker:range
        assert _line_of("marker:range") in str(e.value)
        with pytest.raises(DSLError, match="not a rank"):
            MemoryChannel(2, 0)
        with pytest.raises(DSLError, match="own rank"):
            p.input(0)[0].copy(p.input(1)[0], tb=0)
        with pytest.raises(DSLError, match="must be on rank 1"):
            MemoryChannel(1, 0).put(p.input(0)[0], p.input(0)[1], tb=0)
    with Program("barrier", AllReduce(2)) as p:
        p.barrier(0, [0, 1])
        p.barrier(0, [0, 1])
        p.input(0)[0].copy(p.scratch(0, 1)[0], tb=1)
    plan = p.lower()
    assert plan.count_ops("barrier") == 4
    with pytest.raises(DSLError, match="do not nest"):
        with Program("a", AllReduce(2)):
            with Program("b", AllReduce(2)):
                pass
    with pytest.raises(DSLError, match="no DSL program is active"):
        MemoryChannel(1, 0)


@pytest.mark.parametrize("kwargs, arg", [
    ({"name": ""}, "name"), ({"name": 7}, "name"), ({"collective": "allreduce"}, "collective"),
    ({"collective": 4}, "collective"), ({"protocol": "simple"}, "protocol"), ({"instances": 0}, "instances"),
    ({"instances": True}, "instances"), ({"instances": 2.0}, "instances")])
def test_bad_program_arguments_are_named(kwargs, arg):
    args = {"name": "p", "collective": AllReduce(2), **kwargs}
    with pytest.raises(DSLError, match=f"invalid argument '{arg}'"):
        Program(**args)


@pytest.mark.parametrize("sizes", [-5, "1K", (1024,), (1024, 512), (-1, 10), (1.0, 2.0), (True, 4), [1, 2, 3]])
def test_lower_names_bad_sizes(sizes):
    prog = algorithms.allreduce_1pa_ll(2)
    with pytest.raises(DSLError, match="invalid argument 'sizes'"):
        prog.lower(sizes)
    assert prog.lower([0, 4096]).sizes == [0, 4096] and prog.lower((64, 64)).sizes == [64, 64]


def test_simulator_arguments_are_named():
    program = algorithms.allreduce_1pa_ll(2)
    plan = program.lower()
    for call, arg in [(lambda: verify(plan, interleavings=0), "interleavings"),
                      (lambda: verify(plan, interleavings="5"), "interleavings"),
                      (lambda: verify(program), "plan"), (lambda: simulate(None), "plan"),
                      (lambda: simulate(plan, seed="x"), "seed"), (lambda: simulate(plan, seed=-1), "seed"),
                      (lambda: simulate(plan, elements=0), "elements"),
                      (lambda: verify(plan, reduce_op="avg"), "reduce_op")]:
        with pytest.raises(DSLError, match=f"invalid argument '{arg}'"):
            call()
    with pytest.raises(DSLError, match="program.lower()"):
        verify(program)
    assert simulate(plan, seed=3, elements=1).ok


def _two_rank_exchange(wait_first: bool, reduce_before_wait: bool):
    with Program("exchange", AllReduce(2, chunks=2)) as p:
        ch = {(0, 1): MemoryChannel(0, 1), (1, 0): MemoryChannel(1, 0)}
        for r in range(2):
            q = 1 - r
            if wait_first:
                ch[(r, q)].wait(tb=0)
            ch[(q, r)].put(p.scratch(q, 2)[r], p.input(r)[q], tb=0)
            ch[(q, r)].signal(tb=0)
            if reduce_before_wait:
                p.input(r)[r].reduce(p.scratch(r, 2)[q], tb=0)
            if not wait_first:
                ch[(r, q)].wait(tb=0)
            if not reduce_before_wait:
                p.input(r)[r].reduce(p.scratch(r, 2)[q], tb=0)
            ch[(q, r)].put(p.output(q)[r], p.input(r)[r], tb=0)
            ch[(q, r)].signal(tb=0)
            ch[(r, q)].wait(tb=0)
    return p.lower()


def test_simulator_finds_races_deadlocks_and_wrong_results():
    verify(_two_rank_exchange(False, False), interleavings=20)
    racy = _two_rank_exchange(False, True)
    reports = [simulate(racy, s) for s in range(10)]
    assert all(r.races for r in reports)
    assert any("reads rank 1 scratch[0]" in x for r in reports for x in r.races)
    with pytest.raises(SimulationError, match="race"):
        verify(racy, interleavings=3)
    stuck = simulate(_two_rank_exchange(True, False), 0)
    assert len(stuck.deadlock) == 2 and "wait" in stuck.deadlock[0]
    # A PortChannel source overwritten before its flush.
    with Program("no flush", SendRecv(2)) as p:
        ch = {r: PortChannel(1 - r, r) for r in range(2)}
        for r in range(2):
            ch[r].put(p.output(1 - r)[0], p.input(r)[0], tb=0)
            ch[r].signal(tb=0)
            p.input(r)[0].copy(p.scratch(r, 1)[0], tb=0)
            ch[1 - r].wait(tb=0)
    reports = [simulate(p.lower(), s) for s in range(10)]
    assert all(r.races for r in reports) and any(r.wrong for r in reports)
    assert any("proxy" in x for r in reports for x in r.races)
    # Packets never sent: the unpack blocks.
    with Program("no packets", AllGather(2)) as p:
        p.output(0)[0].unpack(p.scratch(0, 1)[0], tb=0)
    assert "unpack" in simulate(p.lower(), 0).deadlock[0]


def test_plan_json_round_trip(tmp_path):
    plan = algorithms.reduce_scatter_ring(4, instances=2).lower(sizes=(1024, 1 << 20))
    path = tmp_path / "rs.json"
    plan.save(str(path))
    back = load_plan(str(path))
    assert back.to_dict() == plan.to_dict() and back.sizes == [1024, 1 << 20]
    verify(back, interleavings=2)


def _mutate(d, rng):
    """One random change somewhere in the JSON tree."""
    node, path = d, []
    while isinstance(node, (dict, list)) and node and rng.random() < 0.8:
        key = rng.choice(list(node.keys()) if isinstance(node, dict) else range(len(node)))
        path.append((node, key))
        node = node[key]
    if not path:
        return
    parent, key = path[-1]
    choice = rng.randrange(6)
    if choice == 0:
        del parent[key]
    elif choice == 1:
        parent[key] = rng.choice([None, -1, 1 << 50, "x", [], {}, 2.5, True])
    elif choice == 2 and isinstance(parent[key], int):
        parent[key] += rng.choice([-1, 1, 1000])
    elif choice == 3:
        parent[key] = [parent[key]]
    elif choice == 4 and isinstance(parent, list):
        parent.append(copy.deepcopy(parent[key]))
    else:
        parent[key] = "put"


def test_fuzzed_plan_files_give_clear_errors(tmp_path):
    # 2PA HB has copy_to and multi_get, its pushing form reduce_put with an
    # init, 1PA LL init on packets, 2PA LL pairs of packet
    # puts and multi_unpack: those fields get mutated too.
    good = [algorithms.allreduce_2pa_hb_pull(3).lower().to_dict(),
            algorithms.allreduce_2pa_hb(3).lower().to_dict(),
            algorithms.allreduce_1pa_ll(3).lower().to_dict(),
            algorithms.allreduce_2pa_ll(3).lower().to_dict()]
    rng = random.Random(random.randrange(1 << 20))
    outcomes = {"ok": 0, "error": 0}
    for i in range(400):
        d = copy.deepcopy(good[i % len(good)])
        for _ in range(rng.randrange(1, 4)):
            _mutate(d, rng)
        path = tmp_path / f"p{i}.json"
        path.write_text(json.dumps(d))
        try:
            plan = load_plan(str(path))
        except PlanError as e:
            assert str(e).startswith(f"plan {str(path)!r}"), e
            outcomes["error"] += 1
            continue
        outcomes["ok"] += 1
        simulate(plan, 0)  # a valid plan, even if wrong, runs to a report
    assert outcomes["error"] > 100
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(PlanError, match="not JSON"):
        load_plan(str(tmp_path / "bad.json"))
    with pytest.raises(PlanError, match="version"):
        Plan.from_dict({"version": 99})


def test_plan_checks_reduction_init():
    good = algorithms.allreduce_1pa_ll(2).lower().to_dict()
    Plan.from_dict(good)

    def with_op(change):
        d = copy.deepcopy(good)
        op = d["ranks"][0]["threadblocks"][0]["ops"][-1]
        assert op["op"] == "reduce_packets"
        change(op, d["ranks"][0]["threadblocks"][0]["ops"])
        return d

    cases = [
        (lambda op, ops: op.update(init=[1, "input", 0, 1]), "must be rank 0's"),
        (lambda op, ops: op.update(init=[0, "input", 0, 2]), "init chunk|fit|range"),
        (lambda op, ops: op.update(init="input"), "chunk"),
        (lambda op, ops: ops[0].update(init=[0, "input", 0, 1]), "init belongs to reduce, "),
    ]
    for change, message in cases:
        with pytest.raises(PlanError, match=message):
            Plan.from_dict(with_op(change))
    # An init that partly overlaps the destination would race with its stores.
    with Program("overlap", AllReduce(2, chunks=2, in_place=True), protocol="ll") as p:
        for r in range(2):
            q = 1 - r
            MemoryChannel(q, r).put_packets(p.scratch(q, 2)[0:2], p.input(r)[0:2], tb=0)
            p.input(r)[0:2].reduce_packets(p.scratch(r, 2)[0:2], tb=0)
    d = p.lower().to_dict()
    d["ranks"][0]["threadblocks"][0]["ops"][-1]["init"] = [0, "input", 1, 2]
    d["buffers"]["input"] = 3
    with pytest.raises(PlanError, match="overlaps|fit|range|size"):
        Plan.from_dict(d)


def test_plan_checks_pairs():
    good = algorithms.allreduce_2pa_ll(3).lower().to_dict()
    hb = algorithms.allreduce_2pa_hb_pull(3).lower().to_dict()
    push = algorithms.allreduce_2pa_hb(3).lower().to_dict()
    Plan.from_dict(good)
    Plan.from_dict(hb)
    Plan.from_dict(push)

    def with_op(plan, kind, change):
        d = copy.deepcopy(plan)
        op = next(o for o in d["ranks"][0]["threadblocks"][0]["ops"] if o["op"] == kind)
        change(op)
        return d

    cases = [
        (good, "multi_unpack", lambda op: op["srcs"].pop(), "one source chunk per dst"),
        (good, "multi_unpack", lambda op: op["dsts"].__setitem__(1, op["dsts"][0]), "overlaps"),
        (good, "multi_unpack", lambda op: op["srcs"].__setitem__(0, [0, "input", 0, 1]), "scratch"),
        (good, "multi_unpack", lambda op: op["dsts"].__setitem__(0, [1, "output", 0, 1]), "rank 0's chunks"),
        (good, "multi_put_packets", lambda op: op["srcs"].append(op["srcs"][0]), "one source chunk per dst"),
        (good, "multi_put_packets", lambda op: op["srcs"].__setitem__(0, [1, "input", 0, 1]), "this rank's"),
        (good, "reduce_put_packets", lambda op: op["dsts"].pop(), "one dst per channel"),
        (good, "reduce_put_packets", lambda op: op["dsts"].__setitem__(0, [1, "output", 0, 1]), "scratch"),
        (good, "reduce_put_packets", lambda op: op["dsts"].__setitem__(0, [2, "scratch", 3, 1]), "channel"),
        (good, "reduce_put_packets", lambda op: op["srcs"].__setitem__(0, [0, "input", 1, 1]), "scratch"),
        (good, "reduce_put_packets", lambda op: op.update(dst=[1, "output", 0, 1]), "rank 0's"),
        (good, "reduce_put_packets", lambda op: op.update(channels=[0, 0]), "twice"),
        (good, "reduce_put_packets", lambda op: op.update(init=[0, "input", 0, 2]), "init chunk|fit|range|size"),
        (hb, "multi_get", lambda op: op["srcs"].pop(), "one source chunk per channel"),
        (hb, "multi_get", lambda op: op["srcs"].__setitem__(0, [0, "scratch", 1, 1]), "channel"),
        (hb, "multi_get", lambda op: op["dsts"].__setitem__(1, op["dsts"][0]), "overlaps"),
        (push, "reduce_put", lambda op: op["dsts"].append(op["dsts"][0]), "one dst per channel"),
        (push, "reduce_put", lambda op: op["dsts"].__setitem__(0, [1, "scratch", 5, 1]), "channel"),
        (push, "reduce_put", lambda op: op.update(channels=[op["channel"]]), "twice"),
        (push, "reduce_put", lambda op: op["dsts"].__setitem__(0, [2, "scratch", 4, 2]), "sizes|fit|range"),
        (push, "reduce_put", lambda op: op.update(copy_to=[[1, "output", 0, 1]]), "rank 0's"),
        (push, "reduce_put", lambda op: op.update(copy_to=[[0, "output", 0, 1]] * 8), "copy_to|at most"),
        # The pushing plan's reduce_put starts from an init, a chunk of this rank of the result's size.
        (push, "reduce_put", lambda op: op.update(init=[0, "output", 0, 2]), "init chunk|size"),
        (push, "reduce_put", lambda op: op.update(init=[1, "input", 0, 1]), "rank 0's"),
    ]
    for plan, kind, change, message in cases:
        with pytest.raises(PlanError, match=message):
            Plan.from_dict(with_op(plan, kind, change))
