"""The fused all-reduce + residual add + RMSNorm, in host mode (CPU processes)
and on GPUs: numerics against float64, bitwise agreement across ranks,
thread-block clusters, CUDA graphs, the automatic choice and bad arguments."""

import random

import pytest
import torch

import pyccl
import ranks_collectives as rcol
import ranks_fused as rf
import ranks_ops as ro
from conftest import gpu_count, host_and_gpu, host_and_gpu_worlds, requires_gpus
from pyccl._spawn import run_ranks


@pytest.mark.parametrize("gpu, world", host_and_gpu_worlds((2, 3, 4), (2, 3, 4, 6, 8)))
def test_fused_random_cases_match_float64_reference(gpu, world):
    seed = random.randrange(1 << 20)
    cases, max_hidden = (45, 16384) if gpu else (36, 8192)
    for bad, record in run_ranks(rf.fused_cases, world, args=(gpu, seed, cases, max_hidden), timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"


def test_fused_two_shot_pieces_of_every_length():
    # Rows of 32 KiB: a call takes several two-shot pieces, and its last piece,
    # of any length, may run one-shot with the rows it has left (11 rows at 4
    # ranks once overran the one-shot piece's LL regions).
    seed = random.randrange(1 << 20)
    for bad, record in run_ranks(rf.fused_two_shot_row_counts, 4, args=(seed, 8192, list(range(4, 25))), timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"


def test_fused_on_one_block_per_row_and_small_regions():
    # One block per row (no row groups), and LL regions of 2 KiB per block: long
    # rows need every segment, and the calls split into many pieces.
    seed = random.randrange(1 << 20)
    for options in ({"fused_segments": 1}, {"ll_blocks": 4, "ll_max_bytes": 8 << 10}):
        for bad, record in run_ranks(rf.fused_cases, 3, args=(False, seed, 24, 1024, options), timeout=300):
            assert bad == [], f"seed {seed} {options}: {bad} (device record {record})"


def test_fused_on_random_engine_configurations():
    # Block counts, LL region sizes and fused segments as users may set them.
    seed = random.randrange(1 << 20)
    rng = random.Random(seed)
    for _ in range(2):
        options, world = rcol.random_engine_options(rng), rng.choice([2, 3, 4, 5])
        for bad, record in run_ranks(rf.fused_cases, world, args=(False, seed, 16, 4096, options), timeout=300):
            assert bad == [], f"seed {seed} world {world} {options}: {bad} (device record {record})"


@requires_gpus(2)
@pytest.mark.parametrize("options", [{"fused_segments": 1}, {"fused_segments": 3, "fused_threads": 128},
                                     {"fused_threads": 512, "fused_two_shot_bytes": 1}],
                         ids=["one-block-per-row", "clusters-of-3", "two-shot-from-1-byte"])
def test_fused_launch_shapes_on_gpus(options):
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


def test_fused_at_eight_ranks():
    seed = random.randrange(1 << 20)
    for bad, record in run_ranks(rf.fused_cases, 8, args=(False, seed, 9, 2048), timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"


def test_fused_rejects_bad_arguments():
    for out in run_ranks(rf.fused_bad_arguments, 2, timeout=120):
        assert out["dtype"][0] == "PycclTypeError" and "'tensor'" in out["dtype"][1]
        for label, arg in [("residual_shape", "'residual'"), ("residual_dtype", "'residual'"),
                           ("weight_shape", "'weight'"), ("eps", "'eps'"), ("out", "'out'"),
                           ("residual_out", "'residual_out'"), ("contiguous", "'tensor'"),
                           ("algorithm", "'algorithm'"), ("two_shot_rows", "'algorithm'")]:
            kind, text = out[label]
            assert kind == "InvalidArgumentError" and arg in text, (label, kind, text)


@pytest.mark.parametrize("gpu", host_and_gpu(own=True))
def test_fused_op_is_registered_and_passes_opcheck(gpu):
    assert hasattr(torch.ops.pyccl, "fused_all_reduce_rmsnorm")
    for bad in run_ranks(ro.opcheck_fused, 2, args=(gpu,), timeout=300):
        assert bad == {}


def test_fused_op_traces_under_compile():
    assert run_ranks(ro.compiled_fused_layer, 2, args=(False,), timeout=300) == [True, True]


def test_fused_is_exported():
    assert pyccl.fused_all_reduce_rmsnorm is pyccl.fused.fused_all_reduce_rmsnorm


def test_fused_launch_shapes_follow_the_rows():
    # A thread per packet of a block's slice; as many blocks per row as the
    # 64-block grid has room for, one row group per row (one-shot) or per
    # owner's row (two-shot, 4 ranks).
    shapes = run_ranks(rf.launch_shapes, 4, timeout=120)[0]
    assert shapes[(1, 16384, "one_shot")] == (8, 256)
    assert shapes[(8, 16384, "one_shot")] == (8, 256)
    assert shapes[(16, 16384, "one_shot")] == (4, 512)
    assert shapes[(32, 16384, "two_shot")] == (8, 256)
    assert shapes[(64, 16384, "two_shot")] == (4, 512)
    assert shapes[(1, 1 << 17, "one_shot")] == (8, 512)
    assert shapes["max_row"] == 8 * (1 << 20) // 64


def test_fused_automatic_choice_goes_by_size_and_row_length():
    # Two kernels from fused_two_kernel_min_bytes and for rows longer than the
    # one-kernel algorithms take; below, one-shot up to fused_two_shot_bytes or
    # with fewer rows than ranks, two-shot above.
    choices, longest = run_ranks(rf.automatic_choices, 4, timeout=120)[0]
    assert choices[(1, 16384)] == "one_shot"
    assert choices[(3, 1 << 15)] == "one_shot"  # 96 KiB, but fewer rows than ranks
    assert choices[(4, 16384)] == "one_shot"  # 64 KiB
    assert choices[(5, 16384)] == "two_shot"
    assert choices[(16, 16384)] == "two_shot"  # 256 KiB
    assert choices[(17, 16384)] == "two_kernel"
    assert choices[(64, 16384)] == "two_kernel"
    assert choices[(1, longest)] == "one_shot"
    assert choices[(1, longest + 2)] == "two_kernel"
    assert choices[(4, longest + 2)] == "two_kernel"
