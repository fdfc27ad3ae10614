"""Sends and receives, in host mode (CPU processes: the protocol's logic, in CI)
and on GPUs: bit-for-bit delivery, transfers run together, size mismatches,
CUDA-graph replays and bad arguments."""

import random

import pytest

import ranks_p2p as rp2p
from conftest import gpu_count, gpu_worlds, host_and_gpu, host_and_gpu_worlds, on_gpus, on_host, requires_gpus
from pyccl._spawn import run_ranks


def _random_transfers_arrive(gpu: bool, world: int, cases: int, max_bytes: int, options=None) -> None:
    seed = random.randrange(1 << 20)
    args = (gpu, seed, cases, max_bytes) + ((options,) if options is not None else ())
    results = run_ranks(rp2p.random_transfers, world, args=args, timeout=300)
    assert sum(n for _, n in results) == len(rp2p.schedule(seed, world, cases, max_bytes))
    for bad, _ in results:
        assert bad == [], f"seed {seed} {options}: {bad}"


@pytest.mark.parametrize("gpu, world", host_and_gpu_worlds((2, 3, 4), (2, 4, 8)))
def test_random_transfers_arrive_bit_for_bit(gpu, world):
    # Host mode buffers 32 KiB per (peer, direction), GPUs 8 MiB: sizes up to 200 KB and 20 MB make most
    # large sends wait for their receives, in many steps.
    _random_transfers_arrive(gpu, world, *((60, 20_000_000) if gpu else (40, 200_000)))


@requires_gpus(2)
@pytest.mark.parametrize("world", gpu_worlds(2, 4))
def test_packet_sized_transfers_arrive_bit_for_bit_on_gpus(world):
    # Up to 300 KB: most go as LL packets (up to 256 KiB, on 1 to 64 lanes), the rest in HB slots, on the same rings.
    _random_transfers_arrive(True, world, 80, 300_000)


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


@pytest.mark.parametrize("gpu, world", host_and_gpu_worlds((2, 4), (2, 4)))
def test_send_recv_runs_its_transfers_together(gpu, world):
    seed = random.randrange(1 << 20)
    max_bytes = 12_000_000 if gpu else 100_000
    for bad in run_ranks(rp2p.ring_and_all_to_all, world, args=(gpu, seed, max_bytes), timeout=300):
        assert bad == [], f"seed {seed}: {bad}"


# Host mode sends up to 2 KiB as LL packets, GPUs up to 256 KiB, more in HB slots: 1000 and 8000 bytes meet
# across protocols in host mode, 1000 and 1 MiB on GPUs.
@pytest.mark.parametrize("gpu, sent, received", [
    *(on_host(sent, received, id=f"host-{sent}-{received}".replace(" ", ""))
      for sent, received in [(1000, 2000), (100, 0), (0, 64), (1000, 8000), (8000, 1000), ([1000, 8000], 8000),
                             ([8000, 1000], 1000)]),
    *(on_gpus(sent, received, id=f"gpu-{sent}-{received}".replace(" ", ""))
      for sent, received in [(1000, 2000), (1000, 1 << 20), (1 << 20, 1000), ([1000, 1 << 20], 1 << 20)])])
def test_a_receive_that_meets_a_send_of_another_size_raises(gpu, sent, received):
    # Empty transfers meet too: an empty receive never takes a later message's place. A send of another protocol
    # is named by its size; so is one whose next send (in the other protocol) has already arrived. The kernel
    # records it, and the next call raises it.
    sender, receiver = run_ranks(rp2p.size_mismatch, 2, args=(sent, received, gpu), timeout=180 if gpu else 120)
    assert sender == {"sent": True}
    kind, message = receiver["recv"]
    first = sent[0] if isinstance(sent, list) else sent
    assert kind == "RemoteError", message
    assert f"receive of {received} bytes from rank 0 met a send of {first} bytes" in message
    if not gpu:
        assert "send_recv call 1" in message
    assert "broken" in receiver["after"]
    # Found when the pair meets, not at the 30 s timeout: a receive of more lanes than the send stops its
    # other lanes once one has met the send.
    assert receiver["recv_s"] < 10, receiver["recv_s"]


def test_a_receive_without_its_send_times_out_naming_call_and_peer():
    _, (kind, message) = run_ranks(rp2p.missing_sender, 2, timeout=120)
    assert kind == "PycclTimeoutError", message
    assert "send_recv call 1" in message and "rank 0" in message


@requires_gpus(2)
def test_send_recv_in_cuda_graph_replays():
    for bad in run_ranks(rp2p.graph_replays, min(gpu_count(), 4), args=(20,), timeout=300):
        assert bad == []


@pytest.mark.parametrize("gpu", host_and_gpu())
def test_bad_arguments_raise_naming_them(gpu):
    for messages in run_ranks(rp2p.bad_arguments, 2, args=(gpu,), timeout=120):
        assert "'dst'" in messages["self"] and "'tensor'" in messages["overlap"]
        assert messages["after"] == [3.0] * 5
        if gpu:
            assert "'tensor'" in messages["device"] and "cuda" in messages["device"]
            continue
        for name in ("self", "range", "bool"):
            assert "'dst'" in messages[name], (name, messages[name])
        assert "'src'" in messages["negative"]
        assert "'tensor'" in messages["not_tensor"]
        assert "'tensor'" in messages["non_contiguous"] and "contiguous" in messages["non_contiguous"]
        assert "overlaps" in messages["overlap"]
        assert "'sends'" in messages["pair"]


@pytest.mark.parametrize("gpu", host_and_gpu())
def test_bad_engine_options_raise_naming_them(gpu):
    # On GPUs p2p_ll_lane_bytes' default is made from p2p_threads: a bad p2p_threads is named, not that default.
    for messages in run_ranks(rp2p.bad_engine_options, 2, args=(gpu,), timeout=120):
        assert "'p2p_threads'" in messages["threads"], messages["threads"]
        assert "'p2p_ll_lane_bytes'" in messages["lane"]
        if gpu:
            assert messages["default"] == 256 << 10
            continue
        assert "multiple of 8" in messages["lane"]
        assert "'p2p_ll_max_bytes'" in messages["max"] and "16 MiB" in messages["max"]
        assert messages["default"] == 2048
