"""The Primitive API on GPUs: MemoryChannel and PortChannel (copy engine)."""

import random

import pytest

import ranks_channels as rc
from conftest import gpu_worlds, requires_gpus, shared_rounds, slowed
from pyccl._spawn import run_ranks


@requires_gpus(2)
@pytest.mark.parametrize("blocks", [1, 8])
def test_random_transfers_all_protocols_bitwise(blocks):
    seed = random.randrange(1 << 20)
    for bad in run_ranks(rc.transfers, 2, args=(True, seed, 60, 1 << 20, blocks), timeout=slowed(150)):
        assert bad == [], f"seed {seed}: {bad}"


@requires_gpus(2, own=True)  # time-sliced on a shared GPU, a million rounds would take about half an hour
def test_one_million_signal_rounds_no_lost_or_early_wakeups():
    # Every message carries its round number, written to the peer before the
    # signal: an early wake-up reads the previous round's value (a mismatch),
    # a lost signal leaves a wait to time out (a failure).
    for failures, mismatches, done, _, record in run_ranks(rc.pingpong, 2, args=(True, 1_000_000, "signal"),
                                                           timeout=slowed(150)):
        assert (failures, mismatches, done) == (0, 0, 1_000_000), record


@requires_gpus(2)
@pytest.mark.parametrize("kind", ["relaxed_signal", "ll8", "ll16", "port_signal"])
def test_pingpong_carries_every_round(kind):
    rounds = shared_rounds(100_000 if kind != "port_signal" else 20_000)
    for failures, mismatches, done, _, record in run_ranks(rc.pingpong, 2, args=(True, rounds, kind),
                                                           timeout=slowed(150)):
        assert (failures, mismatches, done) == (0, 0, rounds), record


@requires_gpus(2)
@pytest.mark.parametrize("kind", ["signal", "ll", "port"])
def test_op_runner_pingpong_rounds(kind):
    rounds = shared_rounds(20000)
    for failures, _, record in run_ranks(rc.op_runner_pingpong, 2, args=(True, rounds, kind), timeout=slowed(150)):
        assert failures == 0, record


@requires_gpus(2)
def test_fifo_wraps_around_under_load():
    count = shared_rounds(100_000)
    results = run_ranks(rc.port_flood, 2, args=(True, count), timeout=slowed(150))
    assert [r[0] for r in results] == [0, 0]
    assert results[0][1] == count + 1
    assert results[1][2] is True


@requires_gpus(2)
def test_flush_lets_the_source_be_reused():
    for wrong in run_ranks(rc.flush_ordering, 2, args=(True, 64 << 20, 10), timeout=slowed(150)):
        assert wrong == 0


@requires_gpus(2)
def test_waits_on_a_silent_peer_give_up_at_the_timeout():
    rc.check_silent_peer_waits(run_ranks(rc.silent_peer_waits, 2, args=(True,), timeout=slowed(120))[0], 15)


@requires_gpus(3)
@pytest.mark.parametrize("world", gpu_worlds(3, 4, 6, 8, least=3))
def test_all_pairs_at_once(world):
    for wrong in run_ranks(rc.all_pairs, world, args=(True, (1 << 20) + 3, random.randrange(1 << 20)),
                           timeout=slowed(150)):
        assert wrong == 0
