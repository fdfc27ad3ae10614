"""pyccl.graph_capture in host mode (CPU processes): the block's rules, and the
batched memory exchange its exit uses. The captured path itself needs CUDA
graphs: tests/collectives/test_gpu_graph_buffers.py."""

import ranks_graph_buffers as rgb
from pyccl._spawn import run_ranks


def test_graph_capture_block_rules_in_host_mode():
    for result in run_ranks(rgb.block_rules, 2, timeout=120):
        assert result["yields_comm"] and result["capturing"]
        assert result["bad"] == []
        assert "do not nest" in result["nested"]
        assert result["raised_through"] and not result["capturing_after_raise"]
        assert result["calls"] == 0  # nothing is captured in host mode
        assert "'comm'" in result["bad_comm"]


def test_exchange_many_maps_every_ranks_buffers():
    for ok, error in run_ranks(rgb.exchange_many, 3, args=((3, 3, 3),), timeout=120):
        assert error is None and ok


def test_exchange_many_refuses_different_counts_on_every_rank():
    for ok, error in run_ranks(rgb.exchange_many, 2, args=((2, 3),), timeout=120):
        assert ok is None
        assert "rank 0: 2, rank 1: 3" in error and "as many registrations" in error
