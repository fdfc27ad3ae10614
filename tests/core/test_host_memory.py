"""Host-mode registration: shared host memory mapped across processes."""

import pytest
import torch

import pyccl
import ranks
from pyccl._spawn import run_ranks


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
