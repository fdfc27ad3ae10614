"""The README's examples run as written: its runtime example at several
world sizes in host mode (one process per rank, as torchrun starts them)."""

import os
import re
import subprocess
import sys

import pytest

from pyccl._spawn import free_port

README = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "README.md")


def _block_under(heading: str) -> str:
    """The first python code block after `heading` in the README."""
    text = open(README).read()
    start = text.index(heading)
    match = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert match, f"no python block under {heading!r}"
    return match.group(1)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_runtime_example_runs_at_any_world_size(world):
    """Every rank stores into the next rank's buffer and signals it; each
    pair makes its semaphore on both sides (the example once made only one
    side's, which hangs from 3 ranks on)."""
    code = _block_under("## Using the runtime from Python")
    port = str(free_port())
    env = {**os.environ, "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
           "CUDA_VISIBLE_DEVICES": ""}  # host mode on any machine
    procs = [subprocess.Popen([sys.executable, "-c", code], env={**env, "RANK": str(rank)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(world)]
    outputs = []
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=120)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for rank, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {rank} of {world}:\n{out}"
