"""The main job's demo (python -m pyccl.demo): where it runs, and a run in host mode."""

import os
import subprocess
import sys

import pytest

from pyccl.demo import choose_ranks


def test_the_demo_runs_on_gpus_only_where_two_or_more_are_visible():
    assert choose_ranks(False, 0, 4) == (False, 4, None)
    assert choose_ranks(False, 2, 4) == (False, 2, None)
    assert choose_ranks(True, 0, 4) == (True, 4, None)
    assert choose_ranks(True, 3, 0) == (True, 3, None)
    host, world, why = choose_ranks(False, 0, 0)
    assert (host, world) == (True, 4) and "no GPU" in why
    host, world, why = choose_ranks(False, 0, 1)
    assert (host, world) == (True, 4) and "one GPU" in why


@pytest.mark.parametrize("host,world,gpus,message", [
    (False, 1, 4, "--world-size must be"),
    (True, -2, 0, "--world-size must be"),
    (False, 3, 2, "needs 3 GPUs; 2 visible"),
    (False, 2, 1, "needs 2 GPUs; 1 visible"),
])
def test_the_demo_refuses_a_world_it_cannot_run(host, world, gpus, message):
    with pytest.raises(ValueError, match=message):
        choose_ranks(host, world, gpus)


def _demo(*args):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, "-m", "pyccl.demo", *args], capture_output=True, text=True, env=env,
                          timeout=240)


def test_the_demo_passes_in_host_mode():
    run = _demo("--world-size", "3", "--words", "5000")
    assert run.returncode == 0, run.stderr
    assert "3 ranks, host mode (CPU)" in run.stdout and "RESULT: PASS" in run.stdout
    assert "no GPU visible" in run.stderr


@pytest.mark.parametrize("args,message", [(["--world-size", "1"], "--world-size must be"),
                                          (["--words", "0"], "--words must be at least 1")])
def test_the_demo_names_a_bad_argument(args, message):
    run = _demo(*args)
    assert run.returncode == 2 and message in run.stderr, run.stderr
