"""The plan interpreter kernel on GPUs: every library plan, run and checked."""

import random

import pytest

import ranks_plans as rp
from conftest import gpu_worlds, requires_gpus
from pyccl._spawn import run_ranks


@requires_gpus(2)
@pytest.mark.parametrize("world", gpu_worlds(2, 4))
def test_library_plans_run_on_gpus(world):
    seed = random.randrange(1 << 20)
    for bad, record in run_ranks(rp.library_plans, world, args=(True, seed, 6, 200_000), timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"
