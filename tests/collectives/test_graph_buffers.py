"""Graph buffers (pyccl.graph_capture). In host mode (CPU processes): the
block's rules, and the batched memory exchange its exit uses. On GPUs, where
CUDA graphs capture: zero-copy all-reduces captured on plain tensors, against
float64 and bitwise equal across ranks over many replays with new inputs; the
staged path outside the block; the errors."""

import random

import pytest

import ranks_graph_buffers as rgb
from conftest import gpu_count, gpu_worlds, requires_gpus
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


@requires_gpus(2)
@pytest.mark.parametrize("world", gpu_worlds(2, 4))
def test_captured_all_reduces_on_graph_buffers_match_float64(world):
    seed = random.randrange(1 << 20)
    # No tuning table, so the engine's thresholds decide the calls left to the automatic choice.
    for bad, calls, expected, record in run_ranks(rgb.captured_cases, world,
                                                  args=(seed, 24, 1_500_000, 30, 2 << 20), timeout=300,
                                                  env={"PYCCL_TUNING_FILE": "none"}):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"
        assert calls == expected > 0, f"seed {seed}: {calls} calls on graph buffers, expected {expected}"


@requires_gpus(2)
def test_ranks_that_reuse_tensors_differently_read_each_calls_tensors():
    seed = random.randrange(1 << 20)
    for bad, calls in run_ranks(rgb.addresses_differ, min(gpu_count(), 4), args=(seed, 10), timeout=180):
        assert bad == [], f"seed {seed}: {bad}"
        assert calls == 3


@requires_gpus(2)
def test_graph_capture_outside_the_block_and_mismatched_captures():
    for result in run_ranks(rgb.outside_and_mismatch, min(gpu_count(), 4), timeout=180):
        assert result["outside"] == [] and result["eager"] == []
        assert result["calls_so_far"] == 0
        assert "captured different numbers" in result["mismatch"]
        assert not result["capturing_after"]


@requires_gpus(2)
def test_replay_before_registration_breaks_the_communicator_clearly():
    for messages in run_ranks(rgb.replay_before_exit, 2, timeout=180):
        assert "before its buffers were registered" in messages["next_call"]
        assert "exit" in messages and messages["unchanged"]


@requires_gpus(2)
def test_process_group_all_reduce_takes_graph_buffers():
    for bad, lines in run_ranks(rgb.backend_graph_capture, 2, args=(20,), timeout=180,
                                env={"PYCCL_TUNING_FILE": "none"}):
        assert bad == []
        assert any(": 1 captured all-reduce(s) on graph buffers" in line for line in lines), lines
