"""``python -m pyccl.bench`` on GPUs: every collective and column runs, each
result checked against NCCL's inside the benchmark, in graph and eager mode.
A check that the benchmark works, not a timing (on one GPU it runs with
``--world 1``, where the times measure nothing)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import requires_gpus
from gpu_sharing import physical_gpu_count

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
