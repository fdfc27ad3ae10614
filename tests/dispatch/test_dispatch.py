"""The selector (csrc/dispatch/selector.hpp): the one choice of what runs a
collective call, in its order, and every entry point asking the same one."""

import json
import random

import pytest
import torch

import pyccl
import ranks_dispatch as rd
from pyccl import _C, algorithms
from pyccl._spawn import run_ranks
from pyccl.errors import InvalidArgumentError

WORLD = 2
NEVER = 1 << 40


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    monkeypatch.delenv("PYCCL_ALGO", raising=False)
    monkeypatch.delenv("PYCCL_NCCL_MIN_BYTES", raising=False)


def _selector(tables=None, across=False, nccl_min=NEVER, engine=None):
    config = {"world": WORLD, "nccl_min_bytes": [nccl_min] * 5, "across_nodes": across, "tables": tables or {}}
    return _C.Selector(config, engine)


def _route(selector, nbytes, count=None, algorithm=None, nccl=False, plans=True, dtype=torch.float32,
           collective="all_reduce"):
    route, algo, _symmetric, plan, entry, source, _slot = selector.select(collective, dtype, nbytes,
                                                                          nbytes // 4 if count is None else count,
                                                                          algorithm, nccl, plans)
    return route, algo, source, plan, entry


def _slot(selector, nbytes, collective="all_reduce", count=None):
    return selector.select(collective, torch.float32, nbytes, nbytes // 4 if count is None else count, None, False)[6]


TABLE = {"float32": {"all_reduce": [(4096, "kernel", "1pa_hb", 0, 0, 1, None),
                                    (1 << 20, "plan", "allreduce_ring", 8, 256, 4, None),
                                    (None, "nccl", "nccl", 0, 0, 1, None)]}}


def test_the_table_of_the_calls_dtype_then_the_defaults():
    selector = _selector(TABLE, nccl_min=1 << 16)
    assert _route(selector, 1024)[:3] == ("kernel", "1pa_hb", "table")
    route, algo, source, plan, entry = _route(selector, 8192)
    assert (route, algo, source, plan) == ("plan", "allreduce_ring", "table", -1)
    assert entry == {"plan": "allreduce_ring", "instances": 8, "threads": 256, "max_bytes": 1 << 20}
    # A plan takes whole chunks only, and none where plans are left out: the defaults' kernel then.
    assert _route(selector, 8192, count=2047)[0:3:2] == ("kernel", "default")
    assert _route(selector, 8192, plans=False)[0:3:2] == ("kernel", "default")
    # The table's NCCL where the caller has NCCL; the defaults' kernel where it has not.
    assert _route(selector, 4 << 20, nccl=True)[:3] == ("nccl", "nccl", "table")
    assert _route(selector, 4 << 20)[0:3:2] == ("kernel", "default")
    # Another dtype has no table here: the defaults, NCCL from its threshold where the caller has it.
    assert _route(selector, 1 << 16, nccl=True, dtype=torch.bfloat16)[:3] == ("nccl", "nccl", "default")
    assert _route(selector, (1 << 16) - 2, nccl=True, dtype=torch.bfloat16)[0:3:2] == ("kernel", "default")


def test_a_plan_entry_that_cannot_run_takes_its_fallback_from_the_calls_dtype_table():
    tables = {"float32": {"all_reduce": [(1 << 20, "plan", "allreduce_ring", 8, 256, 4, "2pa_ll"),
                                         (None, "plan", "allreduce_ring", 8, 256, 4, "nccl")]},
              "bfloat16": {"all_reduce": [(None, "kernel", "1pa_hb", 0, 0, 1, None)]}}
    selector = _selector(tables)
    assert _route(selector, 8192)[:3] == ("plan", "allreduce_ring", "table")
    # Not whole chunks, or a caller without plans: the kernel measured fastest there, not the defaults' (nor the
    # bfloat16 table's, which the engine's own choice follows).
    assert _route(selector, 8192, count=2047)[:3] == ("kernel", "2pa_ll", "table")
    assert _route(selector, 8192, plans=False)[:3] == ("kernel", "2pa_ll", "table")
    # A fallback of NCCL where the caller has it; the defaults' kernel where it has not.
    assert _route(selector, 4 << 20, plans=False, nccl=True)[:3] == ("nccl", "nccl", "table")
    assert _route(selector, 4 << 20, plans=False)[0:3:2] == ("kernel", "default")
    bad = {"float32": {"all_gather": [(None, "plan", "allgather_ring", 8, 256, 4, "2pa_ll")]}}
    with pytest.raises(InvalidArgumentError, match="fallback '2pa_ll' is not an algorithm of all_gather"):
        _selector(bad)
    with pytest.raises(InvalidArgumentError, match="input_chunks, fallback"):
        _selector({"float32": {"all_reduce": [(None, "kernel", "1pa_hb", 0, 0, 1)]}})


def test_reductions_of_the_other_dtypes_take_their_table_and_no_plan():
    """float64, float8, the integers and bool (the "other" table dtype): an all-reduce or reduce-scatter is
    chosen as a float one is, from the "other" table, except that no plan takes it (plans reduce floats only):
    neither a registered plan nor a table's plan entry, whose fallback runs instead. Across nodes they go to the
    caller's NCCL at any size (the collectives across nodes reduce floats only)."""
    tables = {"other": {"all_reduce": [(4096, "kernel", "1pa_ll", 0, 0, 1, None),
                                       (1 << 20, "plan", "allreduce_ring", 8, 256, 4, "2pa_hb"),
                                       (None, "nccl", "nccl", 0, 0, 1, None)]}}
    plan = pyccl.register_algorithm(algorithms.allreduce_ring(WORLD), "all_reduce", 0, 1 << 30, WORLD)
    try:
        selector = _selector(tables)
        for dtype in (torch.float64, torch.int32, torch.uint8, torch.float8_e4m3fn, torch.bool):
            assert _route(selector, 1024, dtype=dtype)[:3] == ("kernel", "1pa_ll", "table")
            assert _route(selector, 1024, nccl=True, dtype=dtype)[:3] == ("kernel", "1pa_ll", "table")
            assert _route(selector, 8192, dtype=dtype)[:3] == ("kernel", "2pa_hb", "table")
            assert _route(selector, 4 << 20, nccl=True, dtype=dtype)[:3] == ("nccl", "nccl", "table")
            assert _route(selector, 4 << 20, dtype=dtype)[0:3:2] == ("kernel", "default")
            # No table for reduce-scatter: the defaults (NCCL's threshold is NEVER here).
            assert _route(selector, 1024, nccl=True, dtype=dtype, collective="reduce_scatter")[0:3:2] == (
                "kernel", "default")
            # Data movement of those dtypes: the defaults (no table, no plan registered for it).
            assert _route(selector, 1024, dtype=dtype, collective="all_gather")[0:3:2] == ("kernel", "default")
        # A forced algorithm still comes first; across nodes, NCCL at any size, else the collectives across
        # nodes (which refuse them).
        assert _route(selector, 1024, algorithm="2pa_ll", dtype=torch.int64)[:3] == ("kernel", "2pa_ll", "argument")
        far = _selector(tables, across=True)
        assert _route(far, 1024, dtype=torch.int64)[0] == "across_nodes"
        assert _route(far, 1024, nccl=True, dtype=torch.int64)[0] == "nccl"
        # float32 takes the plan registered for its sizes.
        assert _route(selector, 1 << 12, dtype=torch.float32, count=plan.plan.buffers["input"] * 8)[2] == (
            "registered plan")
    finally:
        pyccl.unregister_algorithm(plan)


def test_the_defaults_kernel_is_the_engines(monkeypatch):
    comm = pyccl.Communicator(torch.distributed.HashStore(), 0, 1, device="cpu")
    try:
        selector = _selector(engine=comm._engine)
        for nbytes in (64, 1 << 14, 1 << 20):
            assert _route(selector, nbytes)[:3] == ("kernel", comm._engine.select(nbytes), "default")
            got = _route(selector, nbytes, collective="all_gather")[:3]
            assert got == ("kernel", comm._engine.select_exchange("all_gather", nbytes), "default")
    finally:
        comm.close()


def test_forced_algorithms_come_first(monkeypatch):
    selector = _selector(TABLE)
    assert _route(selector, 1024, algorithm="2pa_ll")[:3] == ("kernel", "2pa_ll", "argument")
    with pytest.raises(InvalidArgumentError, match="'algorithm'.*'warp' is not an algorithm of all_reduce"):
        _route(selector, 1024, algorithm="warp")
    with pytest.raises(InvalidArgumentError, match="'algorithm'.*'nccl' needs"):
        _route(selector, 1024, algorithm="nccl")
    assert _route(selector, 1024, algorithm="nccl", nccl=True)[:3] == ("nccl", "nccl", "argument")
    monkeypatch.setenv("PYCCL_ALGO", "all_reduce=2pa_hb")
    selector = _selector(TABLE)
    assert _route(selector, 1024)[:3] == ("kernel", "2pa_hb", "PYCCL_ALGO")
    assert _route(selector, 1024, algorithm="1pa_ll")[:3] == ("kernel", "1pa_ll", "argument")
    assert _route(selector, 1024, collective="all_gather")[0:3:2] == ("kernel", "default")


def test_a_plan_choice_names_the_slot_its_runner_is_kept_in():
    # Where a communicator keeps a plan's runner, which every entry point runs (executor/plan_runners.hpp): one per
    # table entry with a limit, else one per power of two of the call's bytes from 64 KiB; an all-gather's runner
    # is bounded by its input, a world's share of the bytes.
    limited = _selector(TABLE)
    assert _slot(limited, 8192) == ("library allreduce_ring 8 256 1048576", 1 << 20)
    assert _slot(limited, 1 << 19) == _slot(limited, 8192)
    assert _slot(limited, 1024) is None  # a kernel
    open_ended = {"float32": {"all_reduce": [(None, "plan", "allreduce_ring", 4, 512, 4, None)],
                              "all_gather": [(None, "plan", "allgather_allpairs", 1, 512, 1, None)]}}
    selector = _selector(open_ended)
    assert _slot(selector, 4096) == ("library allreduce_ring 4 512 65536", 1 << 16)
    assert _slot(selector, 1 << 16) == _slot(selector, 4096)
    assert _slot(selector, (1 << 16) + 16) == ("library allreduce_ring 4 512 131072", 1 << 17)
    assert _slot(selector, 3 << 20, collective="all_gather") == (
        "library allgather_allpairs 1 512 4194304", (4 << 20) // WORLD)
    plan = pyccl.register_algorithm(algorithms.allreduce_ring(WORLD), "all_reduce", 4096, 1 << 20, WORLD)
    try:
        chunks = plan.plan.buffers["input"]
        assert _slot(selector, 8192, count=chunks * 512) == (f"registered {plan.id}", 0)
    finally:
        pyccl.unregister_algorithm(plan)


def test_registered_plans_come_after_forced_ones_and_before_tables(monkeypatch):
    plan = pyccl.register_algorithm(algorithms.allreduce_ring(WORLD), "all_reduce", 4096, 1 << 20, WORLD)
    try:
        chunks = plan.plan.buffers["input"]
        selector = _selector(TABLE)
        route, _algo, source, plan_id, _entry = _route(selector, 8192, count=chunks * 512)
        assert (route, source, plan_id) == ("plan", "registered plan", plan.id)
        assert _route(selector, 8192, count=chunks * 512 + 1)[2] != "registered plan"  # not whole chunks
        assert _route(selector, 1 << 21)[2] != "registered plan"  # out of its range
        assert _route(selector, 8192, algorithm="2pa_ll")[2] == "argument"
        other_world = _C.Selector({"world": WORLD + 1, "nccl_min_bytes": [NEVER] * 5})
        assert _route(other_world, 8192, count=chunks * 512)[2] != "registered plan"
    finally:
        pyccl.unregister_algorithm(plan)
    assert _route(_selector(TABLE), 8192, count=chunks * 512)[2] == "table"
    with pytest.raises(InvalidArgumentError, match="not a registered algorithm"):
        pyccl.unregister_algorithm(plan)


def test_ranks_across_nodes_run_their_three_collectives_across_nodes_or_on_nccl():
    selector = _selector(TABLE, across=True, nccl_min=1 << 20)
    for collective in ("all_reduce", "all_gather", "reduce_scatter"):
        assert _route(selector, 4096, collective=collective)[0:3:2] == ("across_nodes", "across nodes")
        assert _route(selector, 1 << 20, nccl=True, collective=collective)[0] == "nccl"
    assert _route(selector, 4096, collective="all_to_all")[0] == "kernel"


def test_the_trace_counts_what_was_chosen():
    selector = _selector(TABLE)
    for _ in range(3):
        _route(selector, 1024)
    _route(selector, 1024, algorithm="2pa_ll")
    _route(selector, 8192)
    assert selector.trace() == {"all_reduce kernel 1pa_hb (table)": 3, "all_reduce kernel 2pa_ll (argument)": 1,
                                "all_reduce plan library (table)": 1}


@pytest.mark.parametrize("scenario", ["PYCCL_ALGO", "tuning file", "registered plan"])
def test_every_entry_point_chooses_alike(scenario, tmp_path):
    # pyccl.<collective>, torch.ops.pyccl.<collective> and torch.distributed's on one "cpu:pyccl" group (all-reduce,
    # all-to-all, broadcast): the same selector (the group's), the same choice, counted in its trace.
    table = {"version": 1, "gpu": "host", "world": WORLD, "dtype": "float32", "date": "today", "command": "test",
             "collectives": {"all_reduce": [{"max_bytes": None, "algorithm": "1pa_hb"}]}}
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    seed = random.randrange(1 << 20)
    for bad, trace in run_ranks(rd.every_entry_point, WORLD, args=(scenario, str(path), seed), timeout=180):
        assert bad == [], f"seed {seed}: {bad}"
        expected = {"PYCCL_ALGO": "all_reduce kernel 2pa_ll (PYCCL_ALGO)",
                    "tuning file": "all_reduce kernel 1pa_hb (table)",
                    "registered plan": "all_reduce plan registered (registered plan)"}[scenario]
        all_reduces = {k: v for k, v in trace.items() if k.startswith("all_reduce")}
        assert set(all_reduces) == {expected} and all_reduces[expected] >= 3, trace
        for collective in ("all_to_all", "broadcast"):  # three calls each, through the three entry points
            counted = {k: v for k, v in trace.items() if k.startswith(collective)}
            if scenario == "PYCCL_ALGO":
                assert counted == {f"{collective} kernel hb (PYCCL_ALGO)": 3}, trace
            else:
                assert sum(counted.values()) == 3 and all("(PYCCL_ALGO)" not in k for k in counted), trace


def test_the_call_runtime_runs_kernel_choices_and_hands_back_the_rest():
    # pyccl.<collective>'s and pyccl.fused_all_reduce_rmsnorm's one call into C++ (as
    # torch.ops.pyccl's kernels): it runs what the selector (the engine, for the fused call) gives a kernel, and
    # leaves everything else, unrun, to the Python path.
    seed = random.randrange(1 << 20)
    for bad in run_ranks(rd.call_runtime, WORLD, args=(seed,), timeout=120):
        assert bad == [], f"seed {seed}: {bad}"
