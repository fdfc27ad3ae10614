"""Symmetric buffers on GPUs: the zero-copy all-reduce against float64,
bitwise agreement across ranks, and CUDA-graph replays."""

import random

import pytest

import ranks_symmetric as rsym
from conftest import gpu_count, gpu_worlds, requires_gpus
from pyccl._spawn import run_ranks


@requires_gpus(2)
@pytest.mark.parametrize("world", gpu_worlds(2, 3, 4, 6, 8))
def test_zero_copy_all_reduce_matches_float64_reference(world):
    seed = random.randrange(1 << 20)
    # No tuning table: the engine's zero-copy thresholds decide, so the test knows the count.
    # Up to 12 MB: the larger float32 cases take the pushing staged path.
    options = {"zero_copy_max_bytes": 4 << 20}
    for bad, calls, expected, record in run_ranks(rsym.symmetric_cases, world,
                                                  args=(True, seed, 60, 3_000_000, 64 << 10, options), timeout=300,
                                                  env={"PYCCL_TUNING_FILE": "none"}):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"
        assert calls == expected > 0


@requires_gpus(2)
def test_register_symmetric_errors_on_gpus():
    for messages in run_ranks(rsym.registration_errors, min(gpu_count(), 4), args=(True,), timeout=120):
        assert "same size on every rank" in messages["size"] and "overlaps" in messages["overlap"]
        assert messages["sum_ok"] and messages["zero_copy_calls"] == 1


@requires_gpus(2)
def test_zero_copy_all_reduce_in_cuda_graph_replays():
    for bad in run_ranks(rsym.graph_replays, min(gpu_count(), 4), args=(20,), timeout=300):
        assert bad == []
