"""Malformed plans: whatever a plan file holds, loading it gives a plan or a
PlanError naming where it is wrong, in bounded time and memory. A seeded,
time-bounded fuzz test mutates library plans; the cases found by hand before
are kept as they were found."""

import copy
import json
import random
import time

import pytest

import pyccl.algorithms as algorithms
from pyccl.dsl import Plan, PlanError, load_plan
from pyccl.plans import buffer_placement, pack_plan

SEED = 20261127
SECONDS = 8.0


def _library_plans():
    return [algorithms.allreduce_2pa_hb_pull(2).lower(), algorithms.allreduce_ring(3).lower(),
            algorithms.allgather_ring(2).lower(), algorithms.allreduce_1pa_ll(4).lower()]


def _paths(node, at=()):
    """Every path (keys and indexes) to a value inside `node`."""
    yield at
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, at + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, at + (i,))


def _junk(rng: random.Random):
    return rng.choice([
        None, True, False, 0, -1, 1, 7, 2 ** 31, 2 ** 40, -(2 ** 63), 1.5, float("nan"), "", "0", "input", "put",
        [], [0], [0, "input", 0, 1], [[0, "input", 0, 1]], ["0", "input", 0, 1], [0, "input", 2 ** 30, 2 ** 30 + 1],
        {}, {"op": "copy"}, [[[]]], "x" * 100,
    ])


_OP_FIELDS = ("dst", "dsts", "srcs", "channel", "channels", "init", "copy_to", "tbs", "reduce_op", "op")


def _mutate(plan: dict, rng: random.Random) -> dict:
    d = copy.deepcopy(plan)
    for _ in range(rng.choice([1, 1, 2, 3])):
        paths = [p for p in _paths(d) if p]
        in_ops = [p for p in paths if "ops" in p]
        path = rng.choice(in_ops if in_ops and rng.random() < 0.8 else paths)  # ops hold most of a plan's shapes
        parent = d
        for k in path[:-1]:
            parent = parent[k]
        last = path[-1]
        action = rng.random()
        if action < 0.25 and isinstance(parent, dict) and "op" in parent:
            # A field the op may or may not take, holding anything.
            parent[rng.choice(_OP_FIELDS)] = _junk(rng)
        elif action < 0.6:
            parent[last] = _junk(rng)
        elif action < 0.75 and isinstance(parent, dict):
            del parent[last]
        elif action < 0.9 and isinstance(parent, list):
            parent.insert(last, copy.deepcopy(parent[last]))
        else:
            parent[last] = copy.deepcopy(rng.choice(paths) and d.get("ranks", [None]))
    return d


def _check(d) -> str:
    """"ok" or "refused"; anything other than a plan or a PlanError fails the test."""
    try:
        plan = Plan.from_dict(d)
    except PlanError as e:
        assert str(e).startswith("plan"), e
        return "refused"
    start = time.monotonic()
    buffer_placement(plan)
    for r in range(plan.num_ranks):
        try:
            pack_plan(plan, r)
        except PlanError:
            pass
        except ValueError as e:  # InvalidArgumentError: a plan the interpreter cannot hold, named
            assert "'plan'" in str(e), e
    assert time.monotonic() - start < 2.0, "packing an accepted plan must take time by its ops, not its chunks"
    return "ok"


def test_mutated_library_plans_load_or_are_refused_by_name():
    rng = random.Random(SEED)
    plans = [p.to_dict() for p in _library_plans()]
    # JSON round trip: what a file would hold.
    plans = [json.loads(json.dumps(p)) for p in plans]
    outcomes = {"ok": 0, "refused": 0}
    deadline = time.monotonic() + SECONDS
    cases = 0
    while time.monotonic() < deadline:
        d = _mutate(rng.choice(plans), rng)
        try:
            outcomes[_check(d)] += 1
        except AssertionError:
            raise
        except Exception as e:  # noqa: BLE001 - any other exception is the failure this test looks for
            pytest.fail(f"case {cases} (seed {SEED}): {type(e).__name__}: {e}\n{json.dumps(d)[:2000]}")
        cases += 1
    assert cases > 200 and outcomes["refused"] > 0, (cases, outcomes)


def _one_op_plan() -> dict:
    return json.loads(json.dumps(algorithms.allreduce_2pa_hb_pull(2).lower().to_dict()))


def _first_op_with(d: dict, key: str) -> dict:
    for r in d["ranks"]:
        for tb in r["threadblocks"]:
            for op in tb["ops"]:
                if key in op:
                    return op
    raise AssertionError(f"no op with {key!r}")


@pytest.mark.parametrize("change", ["int_dst", "string_channel", "string_dsts", "string_src"])
def test_the_shapes_found_by_hand_are_plan_errors_naming_rank_block_and_op(change):
    d = _one_op_plan()
    if change == "int_dst":
        _first_op_with(d, "dst")["dst"] = 3
    elif change == "string_channel":
        _first_op_with(d, "channel")["channel"] = "0"
    elif change == "string_dsts":
        op = _first_op_with(d, "dst")
        op["dsts"] = "abc"
    else:
        _first_op_with(d, "srcs")["srcs"] = ["abc"]
    with pytest.raises(PlanError) as info:
        Plan.from_dict(d)
    assert "rank " in str(info.value) and "thread block " in str(info.value) and " op " in str(info.value), info.value


def test_deeply_nested_and_endless_files_are_refused(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(PlanError, match="nested too deeply|not JSON"):
        load_plan(str(deep))
    start = time.monotonic()
    with pytest.raises(PlanError, match="larger than"):
        load_plan("/dev/zero")
    assert time.monotonic() - start < 10


def test_a_plan_of_huge_chunk_counts_packs_by_its_ops():
    # Within the bounds (buffers of fewer than 2^31 chunks, the interpreter's int32): about 2^30 chunks each.
    d = _one_op_plan()
    scale = (2 ** 31 - 1) // max(d["buffers"].values())
    assert scale >= 2 ** 28
    for k in d["buffers"]:
        d["buffers"][k] *= scale
    for r in d["ranks"]:
        for tb in r["threadblocks"]:
            for op in tb["ops"]:
                for key in ("dst", "init"):
                    if key in op:
                        op[key][2] *= scale
                        op[key][3] *= scale
                for key in ("srcs", "dsts", "copy_to"):
                    for c in op.get(key, []):
                        c[2] *= scale
                        c[3] *= scale
    try:
        plan = Plan.from_dict(d)
    except PlanError:
        return  # refused by name is fine too
    start = time.monotonic()
    buffer_placement(plan)
    for r in range(plan.num_ranks):
        pack_plan(plan, r)
    assert time.monotonic() - start < 2.0
