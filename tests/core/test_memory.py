"""Registered memory mapped across processes: shared host memory (host mode),
and GPU memory of each allocator (torch's, expandable segments, pyccl.empty)
written by peers on real GPUs."""

import random

import pytest
import torch

import pyccl
import ranks
import ranks_gpu
from conftest import gpu_worlds, requires_gpus
from pyccl._spawn import run_ranks

EXPANDABLE = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


@pytest.mark.parametrize("world", [2, 3, 4])
def test_each_rank_writes_into_every_peer(world):
    results = run_ranks(ranks.host_registration, world, args=(4096,))
    for ok, kinds, sizes in results:
        assert ok
        assert kinds == {"host_shared"}
        assert sizes == {world * 4096 * 8}


def test_descriptor_import_point_to_point():
    results = run_ranks(ranks.serialized_import, 2)
    rank, is_local, seen = results[1]
    assert rank == 0 and not is_local
    assert seen == [i * 0.5 for i in range(64)]


@pytest.mark.parametrize("world", [2, 4])
def test_selftest_exchange_host_threads(world):
    for per_seed in run_ranks(ranks.host_selftest, world, args=(20000,)):
        assert per_seed == [(0, 0)] * 3


def test_empty_is_shared_and_zeroed():
    before = pyccl._C.num_host_shared_allocations()
    t = pyccl.empty(3, 5, dtype=torch.float64)
    assert t.shape == (3, 5) and t.dtype == torch.float64 and t.device.type == "cpu"
    assert torch.count_nonzero(t) == 0
    t.copy_(torch.randn(3, 5, dtype=torch.float64))
    assert pyccl._C.num_host_shared_allocations() == before + 1
    del t
    assert pyccl._C.num_host_shared_allocations() == before


@requires_gpus(2)
@pytest.mark.parametrize("world", gpu_worlds(2, 3, 4, 6, 8))
@pytest.mark.parametrize("allocator,env,kind", [
    ("torch.empty", {}, "cuda_ipc"),
    ("expandable", EXPANDABLE, "cumem"),
    ("pyccl.empty", {}, "cumem"),
])
def test_peer_writes_into_registered_gpu_memory(world, allocator, env, kind):
    words = 16 << 20 if allocator == "expandable" else (1 << 20) + 7  # 64 MiB per rank slot
    infos = run_ranks(ranks_gpu.peer_writes, world, args=(words, allocator, random.randrange(1 << 30)),
                      env=env, timeout=240)
    for info in infos:
        assert info["wrong"] == 0
        assert info["kind"] == kind
        assert info["peer_kinds"] == [kind]
        assert all(all(row) for row in info["p2p"]), info["p2p"]
        if allocator == "expandable":
            # A large tensor in expandable segments spans several physical chunks.
            assert info["chunks"] > 1, info


@requires_gpus(2)
def test_bad_gpu_registrations_name_the_argument():
    for messages in run_ranks(ranks_gpu.gpu_bad_input, 2, timeout=120):
        for label, message in messages.items():
            assert message is not None and "'tensor'" in message, (label, message)


@requires_gpus(1)
def test_ranks_sharing_a_gpu_are_refused_unless_allowed():
    # As NCCL refuses a duplicate GPU: two ranks on one GPU is most often a missing set_device.
    for message, _ in run_ranks(ranks_gpu.ranks_on_one_gpu, 3, env={"PYCCL_ALLOW_SHARED_GPU": "0"}, timeout=120):
        assert message is not None and "'device'" in message and "ranks 0 and 1 are on the same GPU" in message
        assert "PYCCL_ALLOW_SHARED_GPU=1" in message and "set_device" in message, message
    # Allowed, for testing: the GPU time-slices between the ranks, and results are right.
    assert run_ranks(ranks_gpu.ranks_on_one_gpu, 2, env={"PYCCL_ALLOW_SHARED_GPU": "1"}, timeout=120) == \
        [(None, True)] * 2
