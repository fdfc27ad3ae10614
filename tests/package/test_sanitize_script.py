"""scripts/sanitize_tests.py, with a stand-in for compute-sanitizer: one run per
test and tool, findings counted from the ERROR SUMMARY, a per-test limit, and
--resume going on where a bounded run stopped."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import requires_gpus

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "sanitize_tests.py")


def _fake_sanitizer(tmp_path, errors_for: str = "") -> str:
    """Drops the sanitizer's options, runs the command, and reports one error
    for tests whose id contains `errors_for`."""
    path = tmp_path / "fake-sanitizer"
    path.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        while [ "${{1:0:2}}" = "--" ]; do shift 2; done
        "$@"; rc=$?
        n=0; [ -n "{errors_for}" ] && [[ "$*" == *"{errors_for}"* ]] && n=1
        echo "========= ERROR SUMMARY: $n errors"; exit $rc
        """))
    path.chmod(0o755)
    return str(path)


def _tests_file(tmp_path) -> str:
    path = tmp_path / "test_sample.py"
    path.write_text(textwrap.dedent("""\
        import time
        def test_quick(): assert True
        def test_fails(): assert False
        def test_slow(): time.sleep(30)
        """))
    return str(path)


def _run(tmp_path, *args, errors_for=""):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0,1,2,3")
    env.pop("PYCCL_SANITIZE_K", None)
    return subprocess.run([sys.executable, SCRIPT, "--sanitizer", _fake_sanitizer(tmp_path, errors_for),
                           "--out", str(tmp_path / "out"), *args, _tests_file(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=str(tmp_path), env=env)


def _results(tmp_path):
    lines = (tmp_path / "out" / "results.txt").read_text().splitlines()
    return {(line.split()[1], line.split()[2].split("::")[1]): line for line in lines}


def test_every_test_runs_under_both_tools_and_a_finding_fails_the_sweep(tmp_path):
    proc = _run(tmp_path, "--job-s", "8", errors_for="test_fails")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    results = _results(tmp_path)
    assert set(results) == {(tool, test) for tool in ("memcheck", "synccheck")
                            for test in ("test_quick", "test_fails", "test_slow")}
    assert "errors=0 1_passed" in results[("memcheck", "test_quick")]
    assert "errors=1 1_failed" in results[("synccheck", "test_fails")]
    assert results[("memcheck", "test_slow")].startswith("over_job_limit")
    assert "2 with findings" in proc.stdout


def test_a_failure_without_findings_passes_the_sweep_and_resume_skips_done_runs(tmp_path):
    proc = _run(tmp_path, "-k", "quick or fails")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(_results(tmp_path)) == 4
    again = _run(tmp_path, "-k", "quick or fails", "--resume")
    assert again.returncode == 0 and "0 sanitizer runs to do" in again.stdout
    assert len((tmp_path / "out" / "results.txt").read_text().splitlines()) == 4


def test_no_run_starts_past_the_budget(tmp_path):
    proc = _run(tmp_path, "--budget-s", "5")
    assert proc.returncode == 0
    assert "6 sanitizer runs left for a --resume run" in proc.stdout
    assert not (tmp_path / "out" / "results.txt").exists()


_PLANTED_WRITE = textwrap.dedent("""\
    # A rank process (run_ranks' forkserver child) writes far out of bounds.
    import torch
    import triton
    import triton.language as tl

    from pyccl._spawn import run_ranks


    @triton.jit
    def store_out_of_bounds(p):
        tl.store(p + (1 << 34), 1.0)


    def body(rank, world, store):
        torch.cuda.set_device(0)
        x = torch.ones(16, device="cuda")
        store_out_of_bounds[(1,)](x)
        try:
            torch.cuda.synchronize()
        except Exception:
            pass


    if __name__ == "__main__":
        run_ranks(body, 1, timeout=120)
    """)


@requires_gpus(1)
@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="compute-sanitizer is not on the PATH")
def test_the_sanitizer_sees_a_bad_write_in_a_rank_process(tmp_path):
    # The sweeps' findings come from the rank processes, which run_ranks forks
    # from its forkserver: the sanitizer must follow them and count their
    # errors in the one ERROR SUMMARY it prints.
    pytest.importorskip("triton", reason="the planted kernel is written in Triton")
    script = tmp_path / "planted.py"
    script.write_text(_PLANTED_WRITE)
    proc = subprocess.run(["compute-sanitizer", "--tool", "memcheck", "--report-api-errors", "no",
                           "--target-processes", "all", sys.executable, str(script)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    log = proc.stdout + proc.stderr
    assert "Invalid __global__ write" in log, log[-2000:]
    assert "ERROR SUMMARY: 1 error" in log, log[-2000:]
