"""Semaphores across processes, in host mode and on GPUs: ordering, timeouts,
abort, and the kernel-side waits that give up naming the peer."""

import random

import pytest

import ranks
import ranks_gpu
from conftest import gpu_worlds, host_and_gpu, requires_gpus
from pyccl._spawn import run_ranks


@pytest.mark.parametrize("world", [2, 3, 4])
def test_signal_wait_orders_data(world):
    rounds = 200
    for rank, (bad, received) in enumerate(run_ranks(ranks.semaphore_pingpong, world, args=(rounds,))):
        assert bad == 0
        assert received == {p: 2 * rounds for p in range(world) if p != rank}


def test_wait_on_silent_peer_times_out_inside_the_bound():
    res = run_ranks(ranks.semaphore_wait_timeout, 2, timeout=60)
    status, message, took = res[0]
    assert status == "timeout"
    assert "peer rank 1" in message and "1500 ms" in message, message
    assert 1.4 <= took <= 5.0, took
    assert res[1] == ("signalled",)


def test_abort_unblocks_a_waiting_thread():
    res = run_ranks(ranks.semaphore_abort_unblocks, 2, timeout=60)
    status, message, took, later = res[0]
    assert status == "aborted" and "peer rank 1" in message
    assert 0.9 <= took <= 5.0, took
    assert "was aborted" in later


@pytest.mark.parametrize("gpu", host_and_gpu())
def test_kernel_side_wait_gives_up_and_names_the_peer(gpu):
    failures, record, took = run_ranks(ranks.selftest_peer_absent, 2, args=(gpu,), timeout=120 if gpu else 60)[0]
    if gpu:
        assert failures >= 1
        assert record["status"] == "timeout" and record["peer"] == 1
        assert 1.9 <= took <= 15, took
        return
    assert failures == 1
    assert record == {"status": "timeout", "peer": 1, "expected": 1, "observed": 0, "peers": [1],
                      "call": "a wait outside pyccl's collectives (a channel or semaphore)"}
    assert 1.9 <= took <= 8.0, took


@requires_gpus(2)
@pytest.mark.parametrize("world", gpu_worlds(2, 3, 4, 6, 8))
def test_device_semaphores_order_peer_writes(world):
    seeds = [random.randrange(1 << 31) for _ in range(20)]
    for per_seed in run_ranks(ranks_gpu.device_selftest, world, args=((1 << 18) + 3, seeds), timeout=240):
        assert [(m, f) for m, f, _ in per_seed] == [(0, 0)] * len(seeds)


@requires_gpus(2)
def test_host_semaphores_on_gpu_memory():
    rounds = 100
    for bad, received in run_ranks(ranks_gpu.host_semaphores_on_gpu, 2, args=(rounds,), timeout=240):
        assert bad == 0 and received == rounds
