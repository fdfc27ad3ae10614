"""The benchmark scripts run (in host mode here): a smoke test, not a timing."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
