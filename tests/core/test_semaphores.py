"""Host-mode semaphores across processes: ordering, timeouts, abort."""

import pytest

import ranks
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


def test_kernel_side_wait_gives_up_and_names_the_peer():
    failures, record, took = run_ranks(ranks.selftest_peer_absent, 2, args=(False,), timeout=60)[0]
    assert failures == 1
    assert record == {"status": "timeout", "peer": 1, "expected": 1, "observed": 0, "peers": [1],
                      "call": "a wait outside pyccl's collectives (a channel or semaphore)"}
    assert 1.9 <= took <= 8.0, took
