"""The Primitive API, in host mode (CPU processes) and on GPUs: MemoryChannel
(HB and LL) and PortChannel (FIFO + proxy; the copy engine on GPUs) across
processes, their ordering, timeouts and shutdown."""

import random

import pytest

import ranks_channels as rc
from conftest import host_and_gpu, host_and_gpu_worlds, on_gpus, on_host, requires_gpus, shared_rounds, slowed
from pyccl._spawn import run_ranks


@pytest.mark.parametrize("gpu, blocks", [on_host(1, id="host-1"), on_host(3, id="host-3"),
                                         on_gpus(1, id="gpu-1"), on_gpus(8, id="gpu-8")])
def test_random_transfers_all_protocols_bitwise(gpu, blocks):
    seed = random.randrange(1 << 20)
    cases, max_bytes, timeout = (60, 1 << 20, slowed(150)) if gpu else (40, 1 << 16, 240)
    for bad in run_ranks(rc.transfers, 2, args=(gpu, seed, cases, max_bytes, blocks), timeout=timeout):
        assert bad == [], f"seed {seed}: {bad}"


@requires_gpus(2, own=True)  # time-sliced on a shared GPU, a million rounds would take about half an hour
def test_one_million_signal_rounds_no_lost_or_early_wakeups():
    # Every message carries its round number, written to the peer before the
    # signal: an early wake-up reads the previous round's value (a mismatch),
    # a lost signal leaves a wait to time out (a failure).
    for failures, mismatches, done, _, record in run_ranks(rc.pingpong, 2, args=(True, 1_000_000, "signal"),
                                                           timeout=slowed(150)):
        assert (failures, mismatches, done) == (0, 0, 1_000_000), record


# On GPUs "signal" has the million rounds above.
@pytest.mark.parametrize("gpu, kind", [
    *(on_host(kind, id=f"host-{kind}") for kind in ("signal", "relaxed_signal", "ll8", "ll16", "port_signal")),
    *(on_gpus(kind, id=f"gpu-{kind}") for kind in ("relaxed_signal", "ll8", "ll16", "port_signal"))])
def test_pingpong_carries_every_round(gpu, kind):
    if gpu:
        rounds = shared_rounds(100_000 if kind != "port_signal" else 20_000)
    else:
        rounds = 2000 if kind != "port_signal" else 500
    for failures, mismatches, done, _, record in run_ranks(rc.pingpong, 2, args=(gpu, rounds, kind),
                                                           timeout=slowed(150) if gpu else 240):
        assert (failures, mismatches, done) == (0, 0, rounds), record


@pytest.mark.parametrize("gpu", host_and_gpu())
@pytest.mark.parametrize("kind", ["signal", "ll", "port"])
def test_op_runner_pingpong_rounds(gpu, kind):
    rounds = shared_rounds(20000) if gpu else 500
    for failures, _, record in run_ranks(rc.op_runner_pingpong, 2, args=(gpu, rounds, kind),
                                         timeout=slowed(150) if gpu else 240):
        assert failures == 0, record


def test_pingpong_rejects_bad_arguments():
    out = run_ranks(rc.pingpong_bad_arguments, 2, timeout=120)
    for messages in out:
        assert "mode" in messages["mode"]
        assert "rounds" in messages["rounds"]
        assert "flag_base" in messages["flag_base"]
        assert "packet buffer" in messages["no_packets"]
        assert "port_channel" in messages["no_port"]


@pytest.mark.parametrize("gpu", host_and_gpu())
def test_fifo_wraps_around_under_load(gpu):
    count = shared_rounds(100_000) if gpu else 100_000
    results = run_ranks(rc.port_flood, 2, args=(gpu, count), timeout=slowed(150) if gpu else 400)
    assert [r[0] for r in results] == [0, 0]
    assert results[0][1] == count + 1  # every trigger (and the flush) executed by rank 0's proxy
    assert results[1][2] is True    # the puts landed


@pytest.mark.parametrize("gpu", host_and_gpu())
def test_flush_lets_the_source_be_reused(gpu):
    args, timeout = ((True, 64 << 20, 10), slowed(150)) if gpu else ((False, 1 << 20, 20), 240)
    for wrong in run_ranks(rc.flush_ordering, 2, args=args, timeout=timeout):
        assert wrong == 0


@pytest.mark.parametrize("gpu", host_and_gpu())
def test_waits_on_a_silent_peer_give_up_at_the_timeout(gpu):
    out = run_ranks(rc.silent_peer_waits, 2, args=(gpu,), timeout=slowed(120) if gpu else 120)[0]
    rc.check_silent_peer_waits(out, 15 if gpu else 10)


def test_close_with_proxy_work_pending_returns():
    res = run_ranks(rc.close_with_pending_proxy_work, 2, timeout=120)[0]
    assert res["busy"]["running"] and res["busy"]["executed"] < 3000, res
    assert res["close_s"] < 15, res
    assert res["pusher_done"], res


@pytest.mark.parametrize("gpu, world", host_and_gpu_worlds((3, 4), (3, 4, 6, 8), gpus=3))
def test_all_pairs_at_once(gpu, world):
    nbytes, timeout = ((1 << 20) + 3, slowed(150)) if gpu else (4096 + 3, 240)
    for wrong in run_ranks(rc.all_pairs, world, args=(gpu, nbytes, random.randrange(1 << 20)), timeout=timeout):
        assert wrong == 0


@pytest.mark.parametrize("split_nodes", [False, True])
def test_socket_transport_between_two_processes(split_nodes):
    seed = random.randrange(1 << 20)
    for out in run_ranks(rc.port_transfers, 2, args=(seed, 25, 1 << 18, "socket", split_nodes), timeout=240):
        assert out["transport"] == "socket"
        assert out["bad"] == [], f"seed {seed}: {out['bad']}"
        assert out["flood_failures"] == 0
        assert out["p2p"] is (not split_nodes)
        if split_nodes:
            assert "'peer'" in out["memory_channel_error"] and "not reachable by P2P" in out["memory_channel_error"]


def test_bad_proxy_spin_setting_is_named():
    for message in run_ranks(rc.bad_proxy_spin, 2, timeout=120):
        assert message is not None and "PYCCL_PROXY_SPIN_US" in message and "10ms" in message


def test_rdma_transport_logic_over_a_loopback_nic():
    # No RDMA NIC here: PYCCL_RDMA_LOOPBACK=1 puts memcpy where the NIC's RDMA
    # WRITEs would be, with a 16-deep send queue and 4 KiB messages, so the
    # channel's splitting, send-queue accounting, signal order and flushes run
    # through the proxy as they would on a NIC.
    seed = random.randrange(1 << 20)
    for out in run_ranks(rc.port_transfers, 2, args=(seed, 25, 1 << 18, "rdma"),
                         env={"PYCCL_RDMA_LOOPBACK": "1"}, timeout=240):
        assert out["transport"] == "rdma"
        assert out["bad"] == [], f"seed {seed}: {out['bad']}"
        assert out["flood_failures"] == 0


def test_rdma_work_request_failure_stops_the_proxy_with_a_named_error():
    outs = run_ranks(rc.rdma_loopback_failure, 2,
                     env={"PYCCL_RDMA_LOOPBACK": "1", "PYCCL_RDMA_LOOPBACK_FAIL_AT": "5"}, timeout=120)
    sender, receiver = outs
    # The 6th request (the 3rd round's signal) fails: the sender's proxy stops
    # and its flush gives up; the receiver's wait for that signal gives up too,
    # at its timeout or at once when the sender's verdict reaches it (its
    # communicator then breaks and stops its own proxy as aborted).
    assert sender["failures"] >= 1 and receiver["failures"] >= 1, outs
    assert not sender["proxy"]["running"], sender
    error = sender["proxy"]["error"]
    assert "RDMA transport to rank 1: signal" in error and "transport retry counter exceeded" in error, error
    assert (receiver["proxy"]["running"] and receiver["proxy"]["error"] == "") or \
        "was aborted" in receiver["proxy"]["error"], receiver
