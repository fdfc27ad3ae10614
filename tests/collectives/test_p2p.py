"""Sends and receives in host mode (CPU processes): the protocol's logic in CI."""

import random

import pytest

import ranks_p2p as rp2p
from pyccl._spawn import run_ranks


@pytest.mark.parametrize("world", [2, 3, 4])
def test_random_transfers_arrive_bit_for_bit(world):
    # Host mode buffers 32 KiB per (peer, direction): sizes up to 200 KB make
    # most large sends wait for their receives, in many steps.
    seed = random.randrange(1 << 20)
    results = run_ranks(rp2p.random_transfers, world, args=(False, seed, 40, 200_000), timeout=300)
    assert sum(n for _, n in results) == sum(1 for case in rp2p.schedule(seed, world, 40, 200_000))
    for bad, _ in results:
        assert bad == [], f"seed {seed}: {bad}"


@pytest.mark.parametrize("options", [
    # One slot per ring and 48-byte slices: every step of an HB send waits for the receive to hand its slot back.
    {"p2p_slots": 1, "p2p_slice_bytes": 48, "p2p_blocks": 3},
    # LL up to 6000 bytes on lanes of 64 (so spread over all 3), one slot: every LL send waits for its slot too.
    {"p2p_slots": 1, "p2p_blocks": 3, "p2p_ll_max_bytes": 6000, "p2p_ll_lane_bytes": 64},
    # No LL but for empty transfers.
    {"p2p_ll_max_bytes": 0},
])
def test_small_rings_and_slots(options):
    seed = random.randrange(1 << 20)
    for bad, _ in run_ranks(rp2p.random_transfers, 3, args=(False, seed, 30, 8000, options), timeout=300):
        assert bad == [], f"seed {seed} {options}: {bad}"


@pytest.mark.parametrize("world", [2, 4])
def test_send_recv_runs_its_transfers_together(world):
    seed = random.randrange(1 << 20)
    for bad in run_ranks(rp2p.ring_and_all_to_all, world, args=(False, seed, 100_000), timeout=300):
        assert bad == [], f"seed {seed}: {bad}"


# Host mode sends up to 2 KiB as LL packets, more in HB slots: 1000 and 8000 bytes meet across protocols.
@pytest.mark.parametrize("sent,received", [(1000, 2000), (100, 0), (0, 64), (1000, 8000), (8000, 1000),
                                           ([1000, 8000], 8000), ([8000, 1000], 1000)])
def test_a_receive_that_meets_a_send_of_another_size_raises(sent, received):
    # Empty transfers meet too: an empty receive never takes a later message's place. A send of another protocol
    # is named by its size; so is one whose next send (in the other protocol) has already arrived.
    sender, receiver = run_ranks(rp2p.size_mismatch, 2, args=(sent, received), timeout=120)
    assert sender == {"sent": True}
    kind, message = receiver["recv"]
    first = sent[0] if isinstance(sent, list) else sent
    assert kind == "RemoteError", message
    assert f"receive of {received} bytes from rank 0 met a send of {first} bytes" in message
    assert "send_recv call 1" in message
    assert "broken" in receiver["after"]
    # Found when the pair meets, not at the 30 s timeout: a receive of more lanes than the send stops its
    # other lanes once one has met the send.
    assert receiver["recv_s"] < 10, receiver["recv_s"]


def test_a_receive_without_its_send_times_out_naming_call_and_peer():
    _, (kind, message) = run_ranks(rp2p.missing_sender, 2, timeout=120)
    assert kind == "PycclTimeoutError", message
    assert "send_recv call 1" in message and "rank 0" in message


def test_bad_arguments_raise_naming_them():
    for rank, messages in enumerate(run_ranks(rp2p.bad_arguments, 2, args=(False,), timeout=120)):
        for name in ("self", "range", "bool"):
            assert "'dst'" in messages[name], (name, messages[name])
        assert "'src'" in messages["negative"]
        assert "'tensor'" in messages["not_tensor"]
        assert "'tensor'" in messages["non_contiguous"] and "contiguous" in messages["non_contiguous"]
        assert "'tensor'" in messages["overlap"] and "overlaps" in messages["overlap"]
        assert "'sends'" in messages["pair"]
        assert messages["after"] == [3.0] * 5


def test_bad_engine_options_raise_naming_them():
    for messages in run_ranks(rp2p.bad_engine_options, 2, timeout=120):
        assert "'p2p_ll_lane_bytes'" in messages["lane"] and "multiple of 8" in messages["lane"]
        assert "'p2p_ll_max_bytes'" in messages["max"] and "16 MiB" in messages["max"]
        assert "'p2p_threads'" in messages["threads"]
        assert messages["default"] == 2048
