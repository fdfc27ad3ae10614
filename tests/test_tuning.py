"""Tuning tables: built from measurements, checked, looked up."""

import json

import pytest

from pyccl import tuning
from pyccl.errors import InvalidArgumentError


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
    assert tuning.nccl_from(table, "all_reduce") == 4097


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
