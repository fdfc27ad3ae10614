"""The fused all-reduce + residual add + RMSNorm on GPUs: numerics against
float64, bitwise agreement across ranks, thread-block clusters, CUDA graphs."""

import random

import pytest

import ranks_fused as rf
import ranks_ops as ro
from conftest import gpu_count, gpu_worlds, requires_gpus
from pyccl._spawn import run_ranks


@requires_gpus(2)
@pytest.mark.parametrize("world", gpu_worlds(2, 3, 4, 6, 8))
def test_fused_random_cases_match_float64_reference(world):
    seed = random.randrange(1 << 20)
    for bad, record in run_ranks(rf.fused_cases, world, args=(True, seed, 45, 16384), timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"


@requires_gpus(2)
@pytest.mark.parametrize("options", [{"fused_segments": 1}, {"fused_segments": 3, "fused_threads": 128},
                                     {"fused_threads": 512, "fused_two_shot_bytes": 1}],
                         ids=["one-block-per-row", "clusters-of-3", "two-shot-from-1-byte"])
def test_fused_launch_shapes(options):
    # The automatic choice among the one-kernel algorithms only (GPUs default to two kernels).
    options = dict(options, fused_two_kernel_min_bytes=1 << 40)
    seed = random.randrange(1 << 20)
    for bad, record in run_ranks(rf.fused_cases, min(gpu_count(), 4), args=(True, seed, 24, 8192, options),
                                 timeout=300):
        assert bad == [], f"seed {seed} {options}: {bad} (device record {record})"


@requires_gpus(2)
def test_fused_in_cuda_graph_replays():
    for bad in run_ranks(rf.fused_graph_replays, min(gpu_count(), 4), args=(10,), timeout=300):
        assert bad == []


@requires_gpus(2, own=True)
def test_fused_op_passes_opcheck_on_gpus():
    for bad in run_ranks(ro.opcheck_fused, 2, args=(True,), timeout=300):
        assert bad == {}
