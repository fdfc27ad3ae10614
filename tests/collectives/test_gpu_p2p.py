"""Sends and receives on GPUs: bit-for-bit delivery, transfers run together,
CUDA-graph replays."""

import random

import pytest

import ranks_p2p as rp2p
from conftest import gpu_count, gpu_worlds, requires_gpus
from pyccl._spawn import run_ranks


def _random_transfers_arrive(world: int, cases: int, max_bytes: int) -> None:
    seed = random.randrange(1 << 20)
    results = run_ranks(rp2p.random_transfers, world, args=(True, seed, cases, max_bytes), timeout=300)
    assert sum(n for _, n in results) == len(rp2p.schedule(seed, world, cases, max_bytes))
    for bad, _ in results:
        assert bad == [], f"seed {seed}: {bad}"


@requires_gpus(2)
@pytest.mark.parametrize("world", gpu_worlds(2, 4, 8))
def test_random_transfers_arrive_bit_for_bit_on_gpus(world):
    # GPUs buffer up to 8 MiB per (peer, direction): sizes up to 20 MB make many sends wait for their receives.
    _random_transfers_arrive(world, 60, 20_000_000)


@requires_gpus(2)
@pytest.mark.parametrize("world", gpu_worlds(2, 4))
def test_packet_sized_transfers_arrive_bit_for_bit_on_gpus(world):
    # Up to 300 KB: most go as LL packets (up to 256 KiB, on 1 to 64 lanes), the rest in HB slots, on the same rings.
    _random_transfers_arrive(world, 80, 300_000)


@requires_gpus(2)
@pytest.mark.parametrize("sent,received", [(1000, 2000), (1000, 1 << 20), (1 << 20, 1000), ([1000, 1 << 20], 1 << 20)])
def test_a_receive_that_meets_a_send_of_another_size_raises_on_gpus(sent, received):
    # Within and across protocols (LL up to 256 KiB); the kernel records it, and the next call raises it.
    sender, receiver = run_ranks(rp2p.size_mismatch, 2, args=(sent, received, True), timeout=180)
    assert sender == {"sent": True}
    kind, message = receiver["recv"]
    first = sent[0] if isinstance(sent, list) else sent
    assert kind == "RemoteError", message
    assert f"receive of {received} bytes from rank 0 met a send of {first} bytes" in message
    assert "broken" in receiver["after"]
    # Found when the pair meets, not at the 30 s timeout: a receive of more lanes than the send stops its
    # other lanes once one has met the send.
    assert receiver["recv_s"] < 10, receiver["recv_s"]


@requires_gpus(2)
@pytest.mark.parametrize("world", gpu_worlds(2, 4))
def test_send_recv_runs_its_transfers_together_on_gpus(world):
    seed = random.randrange(1 << 20)
    for bad in run_ranks(rp2p.ring_and_all_to_all, world, args=(True, seed, 12_000_000), timeout=300):
        assert bad == [], f"seed {seed}: {bad}"


@requires_gpus(2)
def test_send_recv_in_cuda_graph_replays():
    for bad in run_ranks(rp2p.graph_replays, min(gpu_count(), 4), args=(20,), timeout=300):
        assert bad == []


@requires_gpus(2)
def test_bad_arguments_raise_naming_them_on_gpus():
    for messages in run_ranks(rp2p.bad_arguments, 2, args=(True,), timeout=120):
        assert "'tensor'" in messages["device"] and "cuda" in messages["device"]
        assert "'dst'" in messages["self"] and "'tensor'" in messages["overlap"]
        assert messages["after"] == [3.0] * 5


@requires_gpus(2)
def test_bad_engine_options_raise_naming_them_on_gpus():
    # On GPUs p2p_ll_lane_bytes' default is made from p2p_threads: a bad p2p_threads is named, not that default.
    for messages in run_ranks(rp2p.bad_engine_options, 2, args=(True,), timeout=120):
        assert "'p2p_threads'" in messages["threads"], messages["threads"]
        assert "'p2p_ll_lane_bytes'" in messages["lane"]
        assert messages["default"] == 256 << 10
