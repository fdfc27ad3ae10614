"""Symmetric buffers and the zero-copy all-reduce in host mode (CPU processes)."""

import random
import pytest
import torch
import torch.distributed as dist

import pyccl

import ranks_symmetric as rsym
from pyccl._spawn import run_ranks


@pytest.mark.parametrize("world,options", [(2, None), (3, {"zero_copy_bytes_per_block": 4096}),
                                           (4, {"zero_copy_max_bytes": 40_000})])
def test_zero_copy_all_reduce_matches_float64_reference(world, options):
    # With bytes per block, zero-copy calls run on grids of 1 to all HB blocks,
    # between calls of the other algorithms that use all of them. Above
    # zero_copy_max_bytes symmetric buffers take the staged (pushing) path.
    seed = random.randrange(1 << 20)
    for bad, calls, expected, record in run_ranks(rsym.symmetric_cases, world,
                                                  args=(False, seed, 40, 30_000, 4096, options), timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"
        assert calls == expected > 0, f"seed {seed}: {calls} zero-copy calls, expected {expected}"


def test_register_symmetric_refuses_mismatched_and_overlapping_buffers():
    for messages in run_ranks(rsym.registration_errors, 3, args=(False,), timeout=120):
        assert "'tensor'" in messages["size"] and "same size on every rank" in messages["size"]
        assert "'tensor'" in messages["overlap"] and "overlaps" in messages["overlap"]
        assert messages["sum_ok"] and messages["zero_copy_calls"] == 1


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
