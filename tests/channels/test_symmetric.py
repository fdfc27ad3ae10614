"""Symmetric buffers and the zero-copy all-reduce, in host mode (CPU processes)
and on GPUs: against float64, bitwise agreement across ranks, registration
errors, CUDA-graph replays and the choice for symmetric buffers."""

import random
import pytest
import torch
import torch.distributed as dist

import pyccl

import ranks_symmetric as rsym
from conftest import gpu_count, gpu_worlds, host_and_gpu, on_gpus, on_host, requires_gpus
from pyccl._spawn import run_ranks


@pytest.mark.parametrize("gpu, world, options", [
    on_host(2, None, id="host-2"), on_host(3, {"zero_copy_bytes_per_block": 4096}, id="host-3-bytes-per-block"),
    on_host(4, {"zero_copy_max_bytes": 40_000}, id="host-4-max-bytes"),
    # Up to 12 MB: the larger float32 cases take the pushing staged path.
    *(on_gpus(w, {"zero_copy_max_bytes": 4 << 20}, id=f"gpu-{w}") for w in gpu_worlds(2, 3, 4, 6, 8))])
def test_zero_copy_all_reduce_matches_float64_reference(gpu, world, options):
    # With bytes per block, zero-copy calls run on grids of 1 to all HB blocks,
    # between calls of the other algorithms that use all of them. Above
    # zero_copy_max_bytes symmetric buffers take the staged (pushing) path. No
    # tuning table: the engine's zero-copy thresholds decide, so the test knows the count.
    seed = random.randrange(1 << 20)
    args = (True, seed, 60, 3_000_000, 64 << 10, options) if gpu else (False, seed, 40, 30_000, 4096, options)
    for bad, calls, expected, record in run_ranks(rsym.symmetric_cases, world, args=args, timeout=300,
                                                  env={"PYCCL_TUNING_FILE": "none"} if gpu else None):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"
        assert calls == expected > 0, f"seed {seed}: {calls} zero-copy calls, expected {expected}"


@pytest.mark.parametrize("gpu", host_and_gpu())
def test_register_symmetric_refuses_mismatched_and_overlapping_buffers(gpu):
    world = min(gpu_count(), 4) if gpu else 3
    for messages in run_ranks(rsym.registration_errors, world, args=(gpu,), timeout=120):
        assert "same size on every rank" in messages["size"] and "overlaps" in messages["overlap"]
        if not gpu:
            assert "'tensor'" in messages["size"] and "'tensor'" in messages["overlap"]
        assert messages["sum_ok"] and messages["zero_copy_calls"] == 1


@requires_gpus(2)
def test_zero_copy_all_reduce_in_cuda_graph_replays():
    for bad in run_ranks(rsym.graph_replays, min(gpu_count(), 4), args=(20,), timeout=300):
        assert bad == []


@pytest.mark.parametrize("nccl_here", [True, False])
def test_symmetric_choice_follows_the_table(monkeypatch, nccl_here):
    from pyccl import _C

    monkeypatch.delenv("PYCCL_NCCL_MIN_BYTES", raising=False)
    monkeypatch.delenv("PYCCL_ALGO", raising=False)
    symmetric = [(1024, "kernel", "1pa_ll", 0, 0, 1, None), (1 << 20, "kernel", "2pa_hb", 0, 0, 1, None),
                 (None, "nccl", "nccl", 0, 0, 1, None)]

    def choose(selector, nbytes):
        route, algorithm, chosen, *_ = selector.select("all_reduce", torch.float32, nbytes, nbytes // 4, None,
                                                       nccl_here)
        return chosen

    config = {"world": 4, "nccl_min_bytes": [1 << 40] * 5, "tables": {"float32": {"all_reduce_symmetric": symmetric}}}
    selector = _C.Selector(config)
    assert choose(selector, 512) == "1pa_ll"
    assert choose(selector, 1 << 20) == "2pa_hb"
    # NCCL where the table says so and the group has it; zero-copy where it has not.
    assert choose(selector, 4 << 20) == ("nccl" if nccl_here else "2pa_hb")
    # Another dtype, which has no table: the engine's own choice for symmetric buffers.
    comm = pyccl.Communicator(dist.HashStore(), 0, 1, device="cpu")
    try:
        selector = _C.Selector(config, comm._engine)
        for nbytes in (2048, 1 << 20):
            got = selector.select("all_reduce", torch.bfloat16, nbytes, nbytes // 2, None, nccl_here)[2]
            assert got == comm._engine.select(nbytes, True)
    finally:
        comm.close()
