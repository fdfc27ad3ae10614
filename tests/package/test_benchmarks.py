"""The benchmark scripts run, in host mode and (``python -m pyccl.bench``) on
GPUs: a smoke test, not a timing. On GPUs every collective and column runs,
each result checked against NCCL's inside the benchmark, in graph and eager
mode (on one GPU with ``--world 1``, where the times measure nothing)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import requires_gpus
from gpu_sharing import physical_gpu_count

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_channel_bench_runs_in_host_mode(tmp_path):
    out_json = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "channel_bench.py"), "--host", "--trials", "1",
         "--max-bytes", str(2 << 20), "--out", str(out_json)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for needle in ("MemoryChannel GB/s", "PortChannel GB/s", "signal", "ll16", "port_signal"):
        assert needle in proc.stdout, proc.stdout
    assert out_json.exists() and "rows" in out_json.read_text()


def test_e2e_decode_model_runs_on_cpu():
    """The end-to-end benchmark's model (one layer of an 8-way shard) on CPU with
    a local stand-in for the all-reduce: decode and prefill give finite rows of
    the right shape, the decode writes its token's K/V into the cache, and the
    decode attention (query heads grouped per KV head) matches a per-head reference."""
    import torch

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import e2e_decode as e2e

    class LocalReducer:
        def buffer(self, rows):
            return torch.empty(rows, e2e.HIDDEN, dtype=torch.bfloat16)

        def reduce_add_norm(self, partial, residual, weight):
            residual.add_(partial)
            return torch.nn.functional.rms_norm(residual, (e2e.HIDDEN,), weight, e2e.EPS), residual

    model = e2e.Model(torch, 1, 8, torch.device("cpu"), 3, 2, 8)
    layer = model.layers[0]
    before = layer["k_cache"].clone()
    x = torch.randn(2, e2e.HIDDEN).bfloat16()
    h = model.decode(x, LocalReducer(), 6)
    assert h.shape == (2, e2e.HIDDEN) and bool(torch.isfinite(h.float()).all())
    changed = (layer["k_cache"] != before).any(-1)  # (batch, kv heads, ctx)
    assert bool(changed[:, :, 5].all()) and not bool(changed[:, :, :5].any()) and not bool(changed[:, :, 6:].any())
    p = model.prefill(torch.randn(5, e2e.HIDDEN).bfloat16(), LocalReducer())
    assert p.shape == (5, e2e.HIDDEN) and bool(torch.isfinite(p.float()).all())
    # The grouped-query decode attention against one head at a time, in float64.
    q, kc, vc = torch.randn(2, model.q, 1, 128), torch.randn(2, model.kv, 6, 128), torch.randn(2, model.kv, 6, 128)
    grouped = torch.nn.functional.scaled_dot_product_attention(q.view(2, model.kv, model.q // model.kv, 128), kc, vc)
    group = model.q // model.kv
    for head in range(model.q):
        ref = torch.softmax(q[:, head].double() @ kc[:, head // group].double().transpose(-1, -2) / 128 ** 0.5, -1)
        ref = ref @ vc[:, head // group].double()
        got = grouped[:, head // group, head % group].double()
        assert torch.allclose(got, ref[:, 0], atol=1e-4), head


def test_host_overhead_bench_runs_in_host_mode(tmp_path):
    """Every entry point is checked against a float64 reference, then timed."""
    out_json = tmp_path / "host.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "host_overhead.py"), "--host", "--world", "2",
         "--sizes", "1K", "--calls", "3", "--trials", "2", "--out", str(out_json)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for needle in ("torch copy_", "pyccl.all_reduce (group)", "torch.ops.pyccl.all_reduce", "dist.all_reduce (pyccl)",
                   "engine (C++)"):
        assert needle in proc.stdout, proc.stdout
    import json

    rows = json.loads(out_json.read_text())["rows"]
    assert rows[0]["bytes"] == 1024 and all(r["host_us"] > 0 for r in rows[0]["results"].values())


def test_bench_in_place_forms_are_nccl_tests_ones():
    """pyccl.bench's in-place calls: the output is the input (all-gather: the
    input is this rank's part of the output; reduce-scatter: the output is
    this rank's part of the input); none for NCCL's all-to-all."""
    import torch

    from pyccl import bench

    calls = []

    class Lib:  # records (collective, input, output) as pyccl's functions and NcclComm's methods take them
        def __init__(self, nccl):
            if nccl:
                self.comm = object()

        def all_reduce(self, x, out=None):
            calls.append(("all_reduce", x, x if out is None else out))

        def all_gather(self, x, out):
            calls.append(("all_gather", x, out))

        def broadcast(self, x, src_or_out, out=None):
            calls.append(("broadcast", x, out if out is not None else src_or_out))

        def all_to_all(self, x, out):
            calls.append(("all_to_all", x, out))

        def reduce_scatter(self, x, out):
            calls.append(("reduce_scatter", x, out))

    x, out = torch.randn(6), torch.empty(18)
    for nccl in (False, True):
        lib = Lib(nccl)
        assert (bench._in_place(lib, "all_to_all", x, out, 1) is None) == nccl
        assert bench._in_place(lib, "send_recv", x, out, 1) is None  # nccl-tests' sendrecv has none
        fn, result, prepare = bench._in_place(lib, "reduce_scatter", torch.randn(18), torch.empty(6), 1)
        prepare()
        fn()
        name, given, into = calls[-1]
        assert name == "reduce_scatter" and into.data_ptr() == result.data_ptr() and result.numel() == 6
        assert given.numel() == 18 and result.data_ptr() == given.data_ptr() + 6 * given.element_size()
        for collective in ("all_reduce", "broadcast", "all_gather") + (() if nccl else ("all_to_all",)):
            fn, result, prepare = bench._in_place(lib, collective, x, out, 1)
            prepare()
            fn()
            name, given, into = calls[-1]
            assert name == collective and into.data_ptr() == result.data_ptr()
            if collective == "all_gather":
                assert result.numel() == 18 and given.data_ptr() == result.data_ptr() + 6 * result.element_size()
            else:
                assert given.data_ptr() == result.data_ptr()
            assert torch.equal(given, x)  # this rank's input, put in place before the call


def test_bench_send_recv_is_nccl_tests_sendrecv():
    """send_recv: each rank sends its whole buffer ("bytes" is one rank's send)
    to the next rank and receives the previous rank's, whose input is drawn
    from that rank's seed (the reference); busbw is algbw."""
    import torch

    from pyccl import bench

    assert [bench._ring_peers(r, 3) for r in range(3)] == [(1, 2), (2, 0), (0, 1)]
    assert bench._ring_peers(0, 2) == (1, 1) and bench._ring_peers(1, 2) == (0, 0)  # 2 ranks: one peer both ways
    x, out = bench._tensors("send_recv", 4096, 4, torch.float32, "cpu", 2)
    assert x.numel() == out.numel() == 1024 and x.abs().sum() > 0
    assert torch.equal(x, bench._tensors("send_recv", 4096, 4, torch.float32, "cpu", 2)[0])
    assert not torch.equal(x, bench._tensors("send_recv", 4096, 4, torch.float32, "cpu", 1)[0])
    assert bench._BUS_FACTOR["send_recv"](8) == 1.0


def test_bench_sizes_are_nccl_tests_b_e_f():
    from pyccl import bench_timing

    assert bench_timing.doubling_sizes(1024, 8192) == [1024, 2048, 4096, 8192]
    assert bench_timing.doubling_sizes(1024, 1 << 20, 4) == [1024, 4096, 16384, 65536, 262144, 1 << 20]
    assert bench_timing.doubling_sizes(1000, 5000, 3) == [1000, 3000]
    assert bench_timing.doubling_sizes(4096, 4096) == [4096]
    assert [bench_timing.parse_bytes(t) for t in ("1K", "256M", "4KiB", "3000")] == [1024, 256 << 20, 4096, 3000]
    for bad in ((0, 10, 2), (2048, 1024, 2), (1024, 4096, 1)):
        with pytest.raises(ValueError, match="sizes"):
            bench_timing.doubling_sizes(*bad)


@pytest.mark.parametrize("argv, needle", [
    (["-b", "4K", "-e", "1K"], "-b/-e/-f"),
    (["-f", "1"], "-b/-e/-f"),
    (["-b", "lots"], "-b/-e/-f"),
    (["--iters", "0"], "--iters"),
    (["--world", "0"], "--world"),
    (["--collectives", "all_reduce,gather"], "--collectives"),
    (["--world", "1", "--collectives", "send_recv"], "send_recv: needs --world 2"),
    (["--engine", "{bad"], "--engine: not JSON"),
    (["--engine", "[1, 2]"], "--engine: expected a JSON object"),
    (["--timeout", "0"], "--timeout"),
    (["--out", "/nonexistent-folder/results.json"], "--out /nonexistent-folder/results.json: the folder"),
    (["--csv", "/"], "--csv /: is a folder"),
    (["--plot", "/nonexistent-folder/plot.png"], "--plot"),
])
def test_bench_rejects_bad_arguments_before_it_looks_for_gpus(argv, needle, capsys):
    """A bad argument is named at once, on any machine."""
    from pyccl import bench

    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("world, needle", [(1, "needs a GPU, and this machine has none visible"),
                                           (2, "needs at least 2 GPUs, and this machine has none visible")])
def test_bench_without_gpus_says_what_it_needs(world, needle, monkeypatch, capsys):
    """No contradiction: --world 1 needs one GPU, other runs two."""
    from pyccl import bench

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--world", str(world)]) == 2
    err = capsys.readouterr().err
    assert needle in err and ("--world 1 runs" in err) == (world != 1), err


@pytest.mark.parametrize("argv, needle", [
    (["-b", "4K", "-e", "1K"], "-b/-e/-f"), (["-f", "0"], "-b/-e/-f"), (["-e", "many"], "-b/-e/-f"),
    (["--world", "1"], "--world must be at least 2"), (["--trials", "0"], "--trials"),
    (["--timeout", "-1"], "--timeout"), (["--out", "/nonexistent-folder/table.json"], "--out"),
])
def test_tune_rejects_bad_arguments_before_it_looks_for_gpus(argv, needle, capsys):
    """A tune runs for many minutes: a bad flag or an output it could not
    write is named before it starts."""
    from pyccl import tune

    with pytest.raises(SystemExit) as e:
        tune.main(argv)
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


def test_plot_without_matplotlib_is_refused_before_the_run(monkeypatch, tmp_path, capsys):
    import importlib.util

    from pyccl import bench

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a))
    with pytest.raises(SystemExit) as e:
        bench.main(["--plot", str(tmp_path / "p.png")])
    assert e.value.code == 2 and "needs matplotlib" in capsys.readouterr().err


def test_sizes_in_bytes_are_parsed_or_named():
    from pyccl.bench_timing import parse_bytes

    assert [parse_bytes(t) for t in ("1k", "2MiB", "1G", "0.5K", " 64 ")] == [1024, 2 << 20, 1 << 30, 512, 64]
    for bad in ("lots", "", "K", "nan", "infK", "1KK"):
        with pytest.raises(ValueError, match=f"{bad!r} is not a size in bytes"):
            parse_bytes(bad)


def test_results_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """An earlier file survives a write that fails partway; the new file gets
    the permissions open() would give it; no temporary file is left behind."""
    import os

    from pyccl.bench_args import write_atomically

    path = tmp_path / "table.json"
    path.write_text("old")
    old_umask = os.umask(0o027)
    try:
        write_atomically(str(path), "new")
    finally:
        os.umask(old_umask)
    assert path.read_text() == "new" and (path.stat().st_mode & 0o777) == 0o640

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_atomically(str(path), "newer")
    assert path.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["table.json"]


def test_bench_plot_draws_every_collective_and_names_the_mode(monkeypatch, tmp_path):
    """pyccl.bench_plot on a stand-in matplotlib (an optional dependency, not
    installed for the tests): one row of axes per collective, latency points
    up to 1 MiB and bandwidth from 1 MiB, and a title that says graph or eager."""
    import types

    from pyccl import bench_plot

    drawn = {"titles": [], "points": 0, "saved": None, "ticks": []}

    class Axes:
        def plot(self, xs, ys, **kwargs):
            drawn["points"] += len(xs)

        def set(self, **kwargs):
            drawn["titles"].append(kwargs.get("title"))

        def grid(self, *args, **kwargs):
            pass

        def set_xticks(self, ticks, labels, **kwargs):
            drawn["ticks"].append(list(labels))

        def minorticks_off(self):
            pass

        def legend(self, **kwargs):
            pass

    class Figure:
        def suptitle(self, text):
            drawn["suptitle"] = text

        def tight_layout(self):
            pass

        def savefig(self, path, **kwargs):
            drawn["saved"] = path

    def subplots(rows, cols, **kwargs):
        return Figure(), [[Axes() for _ in range(cols)] for _ in range(rows)]

    pyplot = types.SimpleNamespace(subplots=subplots)
    matplotlib = types.ModuleType("matplotlib")
    matplotlib.use = lambda backend: None
    matplotlib.pyplot = pyplot
    monkeypatch.setitem(sys.modules, "matplotlib", matplotlib)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", pyplot)
    # A run's JSON as pyccl.bench --eager --out writes it (the figures of one H100 run).
    row = {"count": 512, "pyccl": 8.48, "pyccl_kernels": 7.35, "pyccl_sym": 9.47, "pyccl_algo": "1pa_ll",
           "nccl": 16.37, "nccl_direct": 11.43, "pyccl_inplace": 7.98, "nccl_direct_inplace": 6.71,
           "pyccl_pg": 10.19, "symm_one_shot": 8.64, "symm_two_shot": 6.18}
    results = {"gpu": "NVIDIA H100 80GB HBM3", "world": 1, "dtype": "bfloat16", "date": "2026-11-23",
               "mode": "eager", "iters": 20, "trials": 7, "symm_error": None,
               "tables": {"all_reduce": [dict(row, bytes=n) for n in (1 << 10, 1 << 14, 1 << 18, 1 << 20)]}}
    bench_plot.plot(results, str(tmp_path / "eager.png"))
    assert drawn["saved"] == str(tmp_path / "eager.png") and "eager calls" in drawn["suptitle"]
    assert drawn["titles"][:2] == ["all_reduce: latency", "all_reduce: bus bandwidth"]
    assert drawn["points"] > 0
    assert drawn["ticks"][:2] == [["1 KiB", "16 KiB", "256 KiB", "1 MiB"], ["1 MiB"]], drawn["ticks"]
    del results["mode"]  # a run from before the eager mode
    bench_plot.plot(results, str(tmp_path / "graph.png"))
    assert "CUDA graphs" in drawn["suptitle"]


def test_bench_plot_labels_sizes_and_names_a_bad_file(tmp_path, capsys):
    from pyccl import bench_plot
    from pyccl.bench_timing import size_label

    assert [size_label(n) for n in (512, 1024, 3 << 20, 1 << 30, 1536)] == [
        "512 B", "1 KiB", "3 MiB", "1 GiB", "1536 B"]
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    for argv, needle in (([], "required"), ([str(tmp_path / "missing.json"), "x.png"], "missing.json"),
                         ([str(bad), "x.png"], "not a file python -m pyccl.bench --out wrote")):
        with pytest.raises(SystemExit) as e:
            bench_plot.main(argv)
        assert e.value.code == 2 and needle in capsys.readouterr().err


def test_host_parts_bench_runs_in_host_mode(tmp_path):
    """Every part is timed; the ops' calls go to the engine, but for the first
    one, which sets the group's communicator up through Python."""
    import json

    from pyccl._spawn import free_port

    out_json = tmp_path / "parts.json"
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "host_parts.py"), "--calls", "3", "--trials", "2",
           "--port", str(free_port()), "--out", str(out_json)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})  # host mode wherever it runs
    assert proc.returncode == 0, proc.stderr[-3000:]
    for needle in ("torch.ops.pyccl.all_reduce", "torch.ops.aten.alias", "dist.all_reduce (fake)",
                   "backend.allreduce (pyccl)", "engine (C++)", "torch.ops.pyccl.all_gather",
                   "torch.ops.pyccl.reduce_scatter", "torch.ops.pyccl.fused_all_reduce_rmsnorm"):
        assert needle in proc.stdout, proc.stdout
    result = json.loads(out_json.read_text())
    calls = result["op_calls"]
    # Warm-up and trials, 20 + 2 * 3 calls, and all_reduce's checked first call (Python: the group's first).
    assert calls["all_reduce"] == {"engine": 26, "python": 1}, calls
    for op in ("all_gather", "reduce_scatter", "fused_all_reduce_rmsnorm"):
        assert calls[op] == {"engine": 26, "python": 0}, (op, calls)
    assert all(len(t) == 2 and min(t) > 0 for t in result["loops_us"].values())


def test_bench_report_prints_each_row_as_it_comes_and_keeps_the_rows_so_far(tmp_path, capsys):
    """pyccl.bench's rank 0 prints a row as soon as it is timed, and with --out rewrites the JSON after each row,
    marked incomplete until the run ends: a run stopped partway keeps what it measured."""
    import json

    from pyccl import bench

    out = tmp_path / "bench.json"
    about = {"world": 2, "dtype": "bfloat16", "date": "2026-11-28", "mode": "graph", "iters": 20, "trials": 15}
    report = bench.Report(about, str(out))
    report.about["gpu"] = "GPU X"
    report.note("torch symmetric memory unavailable: RuntimeError: none here")
    first = {"bytes": 1024, "count": 512, "pyccl": 3.0, "pyccl_kernels": 3.1, "nccl_direct": 9.0, "nccl": 9.5,
             "symm_two_shot": None, "pyccl_algo": "1pa_ll"}
    report.row("all_reduce", first)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "# torch symmetric memory unavailable: RuntimeError: none here"
    assert lines[1].startswith("# pyccl all_reduce, 2 x GPU X, bfloat16, CUDA graph (20 calls/graph")
    assert lines[2].split()[:5] == ["bytes", "pyccl", "us", "pyccl_kernels", "us"] and "symm_two_shot us" in lines[2]
    assert lines[3].split()[:3] == ["1024", "3.00", "3.10"] and lines[3].split()[5:7] == ["-", "1pa_ll"]  # no two-shot figure
    kept = json.loads(out.read_text())
    assert kept["complete"] is False and kept["gpu"] == "GPU X" and kept["tables"]["all_reduce"] == [first]
    assert kept["notes"] == ["torch symmetric memory unavailable: RuntimeError: none here"]

    second = dict(first, bytes=4096, count=2048, pyccl=3.5)
    report.row("all_reduce", second)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].split()[:2] == ["4096", "3.50"]  # the header once per collective
    assert json.loads(out.read_text())["tables"]["all_reduce"] == [first, second]
    report.row("all_gather", dict(first, pyccl_algo="ll"))
    assert capsys.readouterr().out.startswith("# pyccl all_gather")
    report.write(complete=True)
    assert json.loads(out.read_text())["complete"] is True


def test_bench_stopped_partway_says_so_and_where_the_rows_are(tmp_path, monkeypatch, capsys):
    from pyccl import _spawn, bench

    def stopped(*args, **kwargs):
        raise _spawn.RankFailure("rank(s) [1] hung past the 5 s timeout")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(_spawn, "run_ranks", stopped)
    out = tmp_path / "b.json"
    assert bench.main(["--world", "2", "--timeout", "5", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "pyccl.bench stopped: rank(s) [1] hung past the 5 s timeout" in err
    assert f"The rows above were measured before it stopped; they are in {out}" in err


COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


@requires_gpus(1)
@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_bench_runs_every_collective_and_column(mode, tmp_path):
    world = min(physical_gpu_count(), 2)
    out = tmp_path / "bench.json"
    csv = tmp_path / "bench.csv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYCCL_ALLOW_SHARED_GPU", "PYCCL_NCCL_DELEGATE")}
    proc = subprocess.run(
        [sys.executable, "-m", "pyccl.bench", "--world", str(world), "--collectives", "all", "-b", "1K", "-e", "256K",
         "-f", "16", "--iters", "3", "--trials", "2", "--out", str(out), "--csv", str(csv)]
        + (["--eager"] if mode == "eager" else []),
        capture_output=True, text=True, timeout=540, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    res = json.loads(out.read_text())
    assert res["mode"] == mode and res["world"] == world
    # send_recv needs a peer: "all" leaves it out at --world 1.
    assert sorted(res["tables"]) == sorted(COLLECTIVES + (("send_recv",) if world > 1 else ()))
    for collective, rows in res["tables"].items():
        assert [r["bytes"] for r in rows] == [1024, 16384, 262144], collective
        for r in rows:
            expected = {"pyccl", "pyccl_pg", "pyccl_kernels", "nccl", "nccl_direct"}
            if collective != "send_recv":
                expected.add("pyccl_inplace")
            if collective not in ("all_to_all", "send_recv"):
                expected.add("nccl_direct_inplace")
            if collective == "all_reduce":
                expected |= {"pyccl_sym"} | ({"pyccl_graph"} if mode == "graph" else set())
            missing = {c for c in expected if not (isinstance(r.get(c), float) and r[c] > 0)}
            assert not missing, f"{collective} at {r['bytes']} B: no time for {sorted(missing)}"
            if mode == "eager":
                assert "pyccl_graph" not in r
    header = "eager (3 calls in a row" if mode == "eager" else "CUDA graph (3 calls/graph"
    assert header in proc.stdout
    lines = csv.read_text().splitlines()
    assert lines[0].startswith("collective,implementation,world,size,count,type,redop,time_us")
    assert any(line.startswith("reduce_scatter,pyccl_inplace,") for line in lines)
