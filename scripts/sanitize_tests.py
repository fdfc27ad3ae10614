"""compute-sanitizer (memcheck, then synccheck) over GPU tests, one sanitizer run per test.

Each test runs alone under each tool, following the rank processes it starts,
with its own time limit, so that one slow or hung test neither stops the sweep
nor hides another's findings. The visible GPUs are split into groups of
--gpus-per-job and each group runs one job at a time: two sanitized jobs on one
GPU slow each other down enough for the proxy-driven (port channel) tests to run
out of their waits. A finding is an ERROR SUMMARY with errors; a test that fails
with no finding (a timeout tuned for full speed, say) is listed apart.

    python scripts/sanitize_tests.py [--budget-s S] [--job-s S] [--out DIR] [-k EXPR] [-m MARKERS] [--resume] FILE...

Results go to DIR/results.txt (one line per job) and DIR/logs/. With --resume,
the jobs already in DIR/results.txt are skipped, so a sweep can go on where a
bounded run stopped. Exits 1 when any job has a finding.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Tuple

TOOLS = ("memcheck", "synccheck")
# Sanitizer-API failures made on purpose (cuMemRetainAllocationHandle on cudaMalloc
# memory tells it from cuMem memory) are not memory errors: not reported.
SANITIZER_FLAGS = ["--report-api-errors", "no", "--target-processes", "all", "--print-limit", "20"]


def collect(files: List[str], k: Optional[str], markers: Optional[str], gpus: str) -> List[str]:
    """The test ids as a job sees them: with its GPUs visible, so that tests
    parametrized by the GPU count are collected as they will run (a world size
    larger than a job's GPUs is not collected at all)."""
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files]
    if k:
        cmd += ["-k", k]
    if markers:
        cmd += ["-m", markers]
    out = subprocess.run(cmd, capture_output=True, text=True, env=_job_env(gpus)).stdout
    return [line.strip() for line in out.splitlines() if "::" in line and not line.startswith(" ")]


def gpu_groups(per_job: int) -> List[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [d for d in visible.split(",") if d.strip()]
    else:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
        ids = [str(i) for i in range(len(listing.strip().splitlines()))]
    groups = [",".join(ids[i:i + per_job]) for i in range(0, len(ids) - per_job + 1, per_job)]
    if not groups:
        raise SystemExit(f"sanitize_tests: {len(ids)} GPU(s) visible, {per_job} needed per job")
    return groups


def summarize(log: str) -> Tuple[str, str]:
    errors = re.findall(r"ERROR SUMMARY: (\d+) error", log)
    outcome = re.findall(r"=+ (\d+ (?:passed|failed|skipped|error).*?) in [\d.]+s", log)
    return ",".join(errors) or "?", (outcome[-1] if outcome else "no pytest summary").replace(" ", "_")


def _job_env(gpus: str) -> dict:
    """The test's environment: its GPUs, and waits bounded 10x longer (unless set),
    since proxy copies run far slower under a sanitizer than the tests' timeouts allow."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpus)
    env.setdefault("PYCCL_TEST_SLOWDOWN", "10")
    return env


class Job:
    def __init__(self, tool: str, test: str, gpus: str, sanitizer: str, logs: str) -> None:
        self.tool, self.test, self.started = tool, test, time.time()
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", test.split("::", 1)[-1])[:100]
        self.log_path = os.path.join(logs, f"{tool}_{name}.log")
        cmd = [sanitizer, "--tool", tool, *SANITIZER_FLAGS, "--error-exitcode", "9",
               sys.executable, "-m", "pytest", "-v", "-rfs", "-p", "no:cacheprovider", test]
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         env=_job_env(gpus))

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("-k", default=os.environ.get("PYCCL_SANITIZE_K", "not one_million"),
                        help="pytest -k expression selecting the tests (default: PYCCL_SANITIZE_K, else all "
                             "but the million-round signal test, hours under a sanitizer)")
    parser.add_argument("-m", dest="markers", default=None,
                        help="pytest -m expression selecting the tests (e.g. gpu: the GPU tests of modules that "
                             "run in host mode too)")
    parser.add_argument("--out", default="sanitize-logs")
    parser.add_argument("--budget-s", type=float, default=3600, help="no job starts or runs past this")
    parser.add_argument("--job-s", type=float, default=300, help="limit for one test under one tool")
    parser.add_argument("--gpus-per-job", type=int, default=2)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--sanitizer", default=shutil.which("compute-sanitizer")
                        or "/usr/local/cuda/bin/compute-sanitizer")
    args = parser.parse_args()

    deadline = time.time() + args.budget_s
    logs = os.path.join(args.out, "logs")
    os.makedirs(logs, exist_ok=True)
    results_path = os.path.join(args.out, "results.txt")
    done = set()
    if args.resume and os.path.exists(results_path):
        done = {tuple(line.split()[1:3]) for line in open(results_path) if len(line.split()) > 2}
    groups = gpu_groups(args.gpus_per_job)
    tests = collect(args.files, args.k, args.markers, groups[0])
    todo = [(tool, test) for test in tests for tool in TOOLS if (tool, test) not in done]
    print(f"{len(tests)} tests on {args.gpus_per_job} GPU(s) each, {len(todo)} sanitizer runs to do", flush=True)
    running: Dict[str, Optional[Job]] = {g: None for g in groups}
    findings = 0

    def record(job: Job, status: str) -> None:
        nonlocal findings
        errors, outcome = summarize(open(job.log_path, errors="replace").read())
        if errors not in ("?",) and any(int(e) for e in errors.split(",")):
            findings += 1
        line = f"{status} {job.tool} {job.test} errors={errors} {outcome} {time.time() - job.started:.0f}s"
        with open(results_path, "a") as f:
            f.write(line + "\n")
        print(line, flush=True)

    while todo or any(running.values()):
        now = time.time()
        for gpus, job in running.items():
            if job is not None and job.proc.poll() is not None:
                record(job, f"rc={job.proc.returncode}")
                running[gpus] = job = None
            if job is not None and now - job.started > args.job_s:
                job.kill()
                record(job, "over_job_limit")
                running[gpus] = job = None
            if job is not None and now > deadline:
                job.kill()  # not recorded: a --resume run does it again
                print(f"stopped at the budget: {job.tool} {job.test}", flush=True)
                running[gpus] = job = None
            if job is None and todo and deadline - now > min(args.job_s, 60):
                running[gpus] = Job(*todo.pop(0), gpus, args.sanitizer, logs)
        if not any(running.values()) and todo and deadline - time.time() <= min(args.job_s, 60):
            break
        time.sleep(1)
    print(f"{len(todo)} sanitizer runs left for a --resume run; {findings} with findings", flush=True)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
