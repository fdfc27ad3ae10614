"""Tuning tables: built from measurements, checked, looked up."""

import json

import pytest

import torch

from pyccl import _C, dispatch, tuning
from pyccl.errors import InvalidArgumentError

NONE = (1 << 64) - 1  # the selector's nccl_from where no size goes to NCCL


def _nccl_from(table, collective, world=4):
    """Where a selector made from `table` (bf16) hands every size of `collective` to NCCL."""
    entries = {c: [dispatch._route_entry(e, world) for e in es] for c, es in table.get("collectives", {}).items()}
    config = {"world": world, "tables": {"bfloat16": entries},
              "nccl_min_bytes": [dispatch.NCCL_MIN_BYTES[c] for c in tuning.COLLECTIVES]}
    return _C.Selector(config).nccl_from(collective, torch.bfloat16)


def _rows():
    # all_reduce times (µs) at 4 sizes: LL wins small, HB in the middle, NCCL at the top.
    return {"all_reduce": [
        {"bytes": 1024, "pyccl_1pa_ll": 3.0, "pyccl_2pa_ll": 6.0, "pyccl_2pa_hb": 14.0, "nccl": 12.0},
        {"bytes": 2048, "pyccl_1pa_ll": 3.1, "pyccl_2pa_ll": 6.1, "pyccl_2pa_hb": 14.1, "nccl": 12.1},
        {"bytes": 4096, "pyccl_2pa_ll": 9.0, "pyccl_2pa_hb": 8.0, "nccl": 12.5},
        {"bytes": 8192, "pyccl_2pa_hb": 30.0, "nccl": 20.0},
    ]}


def test_build_merges_runs_of_the_same_winner():
    table = tuning.build_table(_rows(), gpu="H200", world=4, dtype="bfloat16", date="d", command="c")
    assert table["collectives"]["all_reduce"] == [
        {"max_bytes": 2048, "algorithm": "1pa_ll"},
        {"max_bytes": 4096, "algorithm": "2pa_hb"},
        {"max_bytes": None, "algorithm": "nccl"},
    ]
    assert tuning.select(table, "all_reduce", 1500) == "1pa_ll"
    assert tuning.select(table, "all_reduce", 4096) == "2pa_hb"
    assert tuning.select(table, "all_reduce", 1 << 30) == "nccl"
    assert tuning.select(table, "all_gather", 10) is None
    assert _nccl_from(table, "all_reduce") == 4097
    assert _nccl_from(table, "all_gather") == dispatch.NCCL_MIN_BYTES["all_gather"]  # no entries: the default


def test_a_table_without_nccl_keeps_every_size_off_nccl():
    # The 2-GPU table runs 2PA HB up to 256 MiB and more: the process group's
    # hand-off must not fall back to the built-in 16 MiB rule.
    table = {"collectives": {"all_reduce": [{"max_bytes": 1 << 20, "algorithm": "1pa_ll"},
                                            {"max_bytes": None, "algorithm": "2pa_hb"}]}}
    assert _nccl_from(table, "all_reduce") == NONE
    assert _nccl_from(table, "all_gather") == dispatch.NCCL_MIN_BYTES["all_gather"]


def test_zero_copy_column_gives_the_symmetric_entries():
    rows = _rows()
    for r, zero_copy in zip(rows["all_reduce"], (15.0, 4.0, 5.0, 10.0)):
        r["pyccl_sym_2pa_hb"] = zero_copy
    table = tuning.build_table(rows, gpu="H200", world=4, dtype="bfloat16", date="d", command="c")
    # Plain tensors: as before; symmetric buffers: zero-copy from 4 KiB, where it beats every other column.
    assert tuning.select(table, "all_reduce", 8192) == "nccl"
    assert table["collectives"]["all_reduce_symmetric"] == [
        {"max_bytes": 2048, "algorithm": "1pa_ll"},
        {"max_bytes": None, "algorithm": "2pa_hb"},
    ]
    tuning.check_table(table, "symmetric")
    assert "all_reduce_symmetric" not in tuning.COLLECTIVES


def test_library_plans_compete_with_their_launch_shape():
    rows = _rows()
    rows["all_reduce"][1]["plan:allreduce_2pa_hb_pull"] = 2.9  # beats 1PA LL's 3.1 at 2 KiB
    rows["all_reduce"][1]["plan:allreduce_2pa_hb_pull:shape"] = [32, 512]
    rows["all_reduce"][2]["plan:allreduce_2pa_hb_pull"] = 7.5  # and 2PA HB's 8.0 at 4 KiB
    rows["all_reduce"][2]["plan:allreduce_2pa_hb_pull:shape"] = [32, 512]
    rows["all_reduce"][3]["plan:allreduce_2pa_hb_pull"] = 25.0  # loses to NCCL's 20.0
    rows["all_reduce"][3]["plan:allreduce_2pa_hb_pull:shape"] = [128, 512]
    rows["all_gather"] = [
        {"bytes": 1024, "pyccl_ll": 4.0, "nccl": 9.0, "plan:allgather_ring": 3.0,
         "plan:allgather_ring:shape": [8, 256]},
        {"bytes": 2048, "pyccl_ll": 4.0, "nccl": 9.0, "plan:allgather_ring": 3.5,
         "plan:allgather_ring:shape": [8, 256]},
        {"bytes": 4096, "pyccl_ll": 4.0, "nccl": 9.0, "plan:allgather_ring": 3.6,
         "plan:allgather_ring:shape": [32, 256]}]
    for r, zero_copy in zip(rows["all_reduce"], (15.0, 15.0, 15.0, 15.0)):
        r["pyccl_sym_2pa_hb"] = zero_copy
    table = tuning.build_table(rows, gpu="H200", world=4, dtype="bfloat16", date="d", command="c")
    tuning.check_table(table, "with plans")
    plan = {"algorithm": "plan", "plan": "allreduce_2pa_hb_pull", "instances": 32, "threads": 512}
    # Each plan entry names the fastest kernel of its size: what runs where the plan cannot.
    assert table["collectives"]["all_reduce"][1:3] == [
        {"max_bytes": 2048, **plan, "kernel": "1pa_ll"}, {"max_bytes": 4096, **plan, "kernel": "2pa_hb"}]
    assert tuning.select(table, "all_reduce", 3000) == "plan"
    assert tuning.select_entry(table, "all_reduce", 8192)["algorithm"] == "nccl"
    # Runs of one plan merge only at the same launch shape, and a plan that leads at one size alone gives way.
    assert [(e["max_bytes"], e.get("instances")) for e in table["collectives"]["all_gather"]] == [(2048, 8),
                                                                                                 (None, None)]
    # Symmetric buffers: kernels and NCCL only (the plans do not run zero-copy).
    assert all(e["algorithm"] != "plan" for e in table["collectives"]["all_reduce_symmetric"])


def _noisy_rows():
    # Two kernels within 1-2% of each other at every size, the lead changing
    # hands; a plan 1% ahead at 4 KiB, and 10% ahead at 8 and 16 KiB.
    rows = [{"bytes": 1024, "pyccl_1pa_ll": 3.00, "pyccl_2pa_ll": 3.05},
            {"bytes": 2048, "pyccl_1pa_ll": 3.05, "pyccl_2pa_ll": 3.00},
            {"bytes": 4096, "pyccl_1pa_ll": 3.10, "pyccl_2pa_ll": 3.08, "plan:allreduce_1pa_ll": 3.05,
             "plan:allreduce_1pa_ll:shape": [8, 512]},
            {"bytes": 8192, "pyccl_1pa_ll": 3.30, "pyccl_2pa_ll": 3.50, "plan:allreduce_1pa_ll": 3.00,
             "plan:allreduce_1pa_ll:shape": [8, 512]},
            {"bytes": 16384, "pyccl_1pa_ll": 3.60, "pyccl_2pa_ll": 3.90, "plan:allreduce_1pa_ll": 3.20,
             "plan:allreduce_1pa_ll:shape": [8, 512]},
            {"bytes": 32768, "pyccl_1pa_ll": 4.00, "pyccl_2pa_ll": 3.20}]
    return {"all_reduce": rows}


def test_the_margin_keeps_noise_out_of_the_table():
    """A candidate displaces the size below's choice only by more than the
    margin, and a plan the kernels only by more than the margin: runs of the
    same medians one or two percent apart give one entry, not one per size."""
    table = tuning.build_table(_noisy_rows(), gpu="H200", world=4, dtype="bfloat16", date="d", command="c")
    assert table["collectives"]["all_reduce"] == [
        {"max_bytes": 4096, "algorithm": "1pa_ll"},  # 2PA LL's 1.6% lead at 2 KiB and the plan's at 4 KiB: noise
        {"max_bytes": 16384, "algorithm": "plan", "plan": "allreduce_1pa_ll", "instances": 8, "threads": 512,
         "kernel": "1pa_ll"},  # 10% ahead at two sizes in a row
        {"max_bytes": None, "algorithm": "2pa_ll"},  # 25% ahead
    ]
    # Without a margin every lead counts (the plan's fallback kernel changes at 8 KiB too).
    exact = tuning.build_table(_noisy_rows(), gpu="H200", world=4, dtype="bfloat16", date="d", command="c",
                               margin=0)
    assert [(e["algorithm"], e.get("kernel")) for e in exact["collectives"]["all_reduce"]] == [
        ("1pa_ll", None), ("2pa_ll", None), ("plan", "2pa_ll"), ("plan", "1pa_ll"), ("2pa_ll", None)]
    # A plan that leads at one size alone gives way to the kernels.
    one = _noisy_rows()
    del one["all_reduce"][3]["plan:allreduce_1pa_ll"], one["all_reduce"][4]["plan:allreduce_1pa_ll"]
    one["all_reduce"][2]["plan:allreduce_1pa_ll"] = 2.0
    assert [e["algorithm"] for e in tuning.build_table(one, gpu="H200", world=4, dtype="bfloat16", date="d",
                                                       command="c")["collectives"]["all_reduce"]] == ["1pa_ll",
                                                                                                     "2pa_ll"]
    with pytest.raises(InvalidArgumentError, match="margin"):
        tuning.build_table(_noisy_rows(), gpu="H200", world=4, dtype="bfloat16", date="d", command="c", margin=1.5)


def test_a_plan_entry_gives_the_engine_its_kernel():
    """Where a plan wins, the engine (which runs no plans) takes the fastest
    kernel of those sizes, not the next kernel entry's, which can be twice as slow."""
    table = tuning.build_table(_noisy_rows(), gpu="H200", world=4, dtype="bfloat16", date="d", command="c")
    assert tuning.kernel_choices(table)["all_reduce"] == [(4096, "1pa_ll"), (16384, "1pa_ll"), (None, "2pa_ll")]
    # A table written before plan entries had a kernel: the plan's sizes take the next kernel entry, as before.
    for e in table["collectives"]["all_reduce"]:
        e.pop("kernel", None)
    assert tuning.kernel_choices(table)["all_reduce"] == [(4096, "1pa_ll"), (None, "2pa_ll")]
    entry = {"max_bytes": None, "algorithm": "plan", "plan": "allreduce_1pa_ll", "instances": 8, "threads": 256}
    for kernel in ("nccl", "ll", 3):
        with pytest.raises(InvalidArgumentError, match=f"has kernel {kernel!r}"):
            tuning.check_table({"version": 1, "collectives": {"all_reduce": [dict(entry, kernel=kernel)]}}, "t")


def test_tune_builds_a_table_again_from_its_measurements(tmp_path, capsys):
    """pyccl.tune keeps what it measured; --from-rows builds a table from it on
    any machine, with another margin, and names a file it cannot use."""
    from pyccl import tune

    rows = tmp_path / "h200_w4_bf16.rows.json"
    rows.write_text(json.dumps({"gpu": "NVIDIA H200", "world": 4, "dtype": "bfloat16", "date": "2026-11-27",
                                "command": "python -m pyccl.tune --world 4", "tables": _noisy_rows()}))
    out = tmp_path / "t.json"
    assert tune.main(["--from-rows", str(rows), "--out", str(out), "--margin", "0"]) == 0
    table = tuning.check_table(json.loads(out.read_text()), "t")
    assert (table["gpu"], table["world"], table["date"]) == ("NVIDIA H200", 4, "2026-11-27")
    assert len(table["collectives"]["all_reduce"]) == 5 and "--margin 0" in table["command"]
    assert tune.main(["--from-rows", str(rows), "--out", str(out)]) == 0
    assert len(json.loads(out.read_text())["collectives"]["all_reduce"]) == 3
    assert "PYCCL_TUNING_FILE" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    for argv, needle in ((["--from-rows", str(bad)], "not a file pyccl.tune wrote"),
                         (["--from-rows", str(tmp_path / "missing.json")], "--from-rows"),
                         (["--from-rows", str(rows), "--margin", "2"], "--margin must be in [0, 1)")):
        with pytest.raises(SystemExit) as e:
            tune.main(argv)
        assert e.value.code == 2 and needle in capsys.readouterr().err


def test_plan_entries_name_library_plans_of_their_collective():
    from pyccl.algorithms import LIBRARY
    from pyccl.dsl import AllGather, AllReduce, ReduceScatter

    kinds = {"all_reduce": AllReduce, "all_gather": AllGather, "reduce_scatter": ReduceScatter}
    for collective, names in tuning.PLANS.items():
        for name in names:
            plan = LIBRARY[name](4).lower()
            assert plan.collective["name"] == kinds[collective](4).to_dict()["name"], (collective, name)
    entry = {"max_bytes": None, "algorithm": "plan", "plan": "allreduce_2pa_hb_pull", "instances": 8, "threads": 256}
    for change, message in (({"plan": "allgather_ring"}, "allgather_ring"), ({"plan": "nope"}, "nope"),
                            ({"instances": 0}, "'instances'"), ({"instances": "8"}, "'instances'"),
                            ({"threads": 100}, "'threads'"), ({"threads": 2048}, "'threads'")):
        table = {"version": 1, "collectives": {"all_reduce": [dict(entry, **change)]}}
        with pytest.raises(InvalidArgumentError, match=message) as info:
            tuning.check_table(table, "t.json")
        assert "t.json" in str(info.value) and "all_reduce entry 0" in str(info.value)
    with pytest.raises(InvalidArgumentError, match="all_to_all entry 0 has algorithm 'plan'"):
        tuning.check_table({"version": 1, "collectives": {"all_to_all": [dict(entry, plan="x")]}}, "t")
    tuning.check_table({"version": 1, "collectives": {"all_reduce": [entry]}}, "t")


def test_check_rejects_malformed_tables():
    good = tuning.build_table(_rows(), gpu="H200", world=4, dtype="bfloat16", date="d", command="c")
    tuning.check_table(good, "good")
    bad_algo = json.loads(json.dumps(good))
    bad_algo["collectives"]["all_reduce"][0]["algorithm"] = "ring"
    with pytest.raises(InvalidArgumentError, match="ring"):
        tuning.check_table(bad_algo, "x")
    bad_order = json.loads(json.dumps(good))
    bad_order["collectives"]["all_reduce"][1]["max_bytes"] = 1
    with pytest.raises(InvalidArgumentError, match="grow"):
        tuning.check_table(bad_order, "x")
    with pytest.raises(InvalidArgumentError, match="version"):
        tuning.check_table({"version": 99}, "x")


def test_shipped_table_is_found_for_its_gpu_and_world(monkeypatch):
    monkeypatch.delenv("PYCCL_TUNING_FILE", raising=False)
    table = tuning.load_table("NVIDIA H200", 4, "bfloat16")
    assert table is not None and table["world"] == 4
    assert tuning.select(table, "all_reduce", 1024) == "1pa_ll"
    assert tuning.load_table("NVIDIA H200", 3) is None
    eight = tuning.load_table("NVIDIA H200", 8, "bfloat16")
    assert eight is not None and eight["world"] == 8
    # On 8 GPUs the kernel beat NCCL at 16 MiB, not from 32 MiB (docs/performance.md#history).
    assert tuning.select(eight, "all_reduce", 16 << 20) == "2pa_hb"
    assert _nccl_from(eight, "all_reduce", 8) == (16 << 20) + 1
    assert _nccl_from(eight, "broadcast", 8) == dispatch.NCCL_MIN_BYTES["broadcast"]  # not measured: the defaults


def test_h100_tables_are_found_for_the_sxm_card_only(monkeypatch):
    monkeypatch.delenv("PYCCL_TUNING_FILE", raising=False)
    for world in (2, 4):
        table = tuning.load_table("NVIDIA H100 80GB HBM3", world, "bfloat16")
        assert table is not None and table["world"] == world and "H100" in table["gpu"], table
        # On H100 NVLink the kernels beat NCCL at every all-reduce size (docs/performance.md).
        assert tuning.select(table, "all_reduce", 1 << 30) == "2pa_hb"
    # Measured over NVLink between SXM cards: neither a PCIe H100 nor an H200 takes them.
    assert tuning.load_table("NVIDIA H100 PCIe", 2) is None
    assert "H100" not in tuning.load_table("NVIDIA H200", 2)["gpu"]


def test_tuning_file_overrides(monkeypatch, tmp_path):
    path = tmp_path / "t.json"
    table = tuning.build_table(_rows(), gpu="X", world=2, dtype="float32", date="d", command="c")
    path.write_text(json.dumps(table))
    monkeypatch.setenv("PYCCL_TUNING_FILE", str(path))
    assert tuning.load_table("anything", 8)["gpu"] == "X"
    monkeypatch.setenv("PYCCL_TUNING_FILE", "none")
    assert tuning.load_table("NVIDIA H200", 4) is None
    monkeypatch.setenv("PYCCL_TUNING_FILE", str(tmp_path / "missing.json"))
    with pytest.raises(InvalidArgumentError, match="PYCCL_TUNING_FILE"):
        tuning.load_table("NVIDIA H200", 4)
    for name, content in (("cut.json", json.dumps(table)[:-7].encode()), ("binary.json", b"\xff\xfe{\x00")):
        (tmp_path / name).write_bytes(content)
        monkeypatch.setenv("PYCCL_TUNING_FILE", str(tmp_path / name))
        with pytest.raises(InvalidArgumentError, match=f"PYCCL_TUNING_FILE '.*{name}': not a JSON tuning table"):
            tuning.load_table("NVIDIA H200", 4)
    # JSON, but not a table: the table's own check speaks, not the JSON error.
    bad = json.loads(json.dumps(table))
    next(iter(bad["collectives"].values()))[0]["algorithm"] = "zzz"
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    monkeypatch.setenv("PYCCL_TUNING_FILE", str(tmp_path / "bad.json"))
    with pytest.raises(InvalidArgumentError) as e:
        tuning.load_table("NVIDIA H200", 4)
    assert "not a JSON tuning table" not in str(e.value) and "'zzz'" in str(e.value)


def test_bench_csv_has_nccl_tests_columns(tmp_path):
    import csv

    from pyccl import bench

    path = tmp_path / "b.csv"
    bench._write_csv(str(path), {"all_gather": [{"bytes": 4096, "count": 2048, "pyccl": 4.0, "nccl": 10.0}]},
                     4, "bfloat16")
    rows = list(csv.DictReader(open(path)))
    assert [r["implementation"] for r in rows] == ["pyccl", "nccl"]
    assert rows[0]["size"] == "4096" and rows[0]["redop"] == "none" and rows[0]["wrong"] == "0"
    algbw = 4096 / 4e-6 / 1e9
    assert abs(float(rows[0]["algbw_GBps"]) - algbw) < 0.01
    assert abs(float(rows[0]["busbw_GBps"]) - algbw * 3 / 4) < 0.01


def test_kernel_choices_leave_nccl_and_plans_to_the_caller():
    # What the process group's engine chooses from: the kernel entries only, in order (the C++ reader's rule).
    table = {"version": 1, "gpu": "host", "world": 2, "dtype": "bfloat16", "date": "d", "command": "c",
             "collectives": {
        "all_reduce": [{"max_bytes": 4096, "algorithm": "1pa_ll"},
                       {"max_bytes": 65536, "algorithm": "plan", "plan": "allreduce_1pa_ll", "instances": 8,
                        "threads": 256},
                       {"max_bytes": 8 << 20, "algorithm": "1pa_hb"},
                       {"max_bytes": None, "algorithm": "nccl"}],
        "all_gather": [{"max_bytes": None, "algorithm": "hb"}],
        "reduce_scatter": [{"max_bytes": None, "algorithm": "nccl"}],
        "all_reduce_symmetric": [{"max_bytes": None, "algorithm": "2pa_hb"}],
    }}
    assert tuning.kernel_choices(table) == {"all_reduce": [(4096, "1pa_ll"), (8 << 20, "1pa_hb")],
                                            "all_reduce_symmetric": [(None, "2pa_hb")],
                                            "all_gather": [(None, "hb")]}
    assert tuning.kernel_choices(None) == {}


def test_the_plans_former_names_point_to_their_new_ones():
    import pyccl.algorithms as algorithms

    for old, new in tuning.FORMER_NAMES.items():
        assert new in algorithms.LIBRARY and new in tuning.PLANS["all_reduce"], new
        with pytest.warns(DeprecationWarning, match=f"pyccl.algorithms.{old} is now pyccl.algorithms.{new}"):
            assert getattr(algorithms, old) is algorithms.LIBRARY[new]
        entry = {"max_bytes": None, "algorithm": "plan", "plan": old, "instances": 8, "threads": 256}
        with pytest.raises(InvalidArgumentError, match=f"plan '{old}' is now named '{new}'"):
            tuning.check_table({"version": 1, "collectives": {"all_reduce": [entry]}}, "t.json")
    with pytest.raises(AttributeError, match="no_such_plan"):
        algorithms.no_such_plan
