"""The plan interpreter, in host mode (CPU processes) and as its GPU kernel: every library plan, run and
checked; long and too wide plans; plans in the automatic choice."""

import random

import pytest

import pyccl.algorithms

import ranks_plans as rp
from conftest import host_and_gpu, host_and_gpu_worlds, on_gpus, on_host, requires_gpus
from pyccl._spawn import run_ranks


@pytest.mark.parametrize("gpu, world", host_and_gpu_worlds((2, 3, 4), (2, 4, 6, 8)))
def test_library_plans_run(gpu, world):
    seed = random.randrange(1 << 20)
    max_count = 200_000 if gpu else 3000
    for bad, record in run_ranks(rp.library_plans, world, args=(gpu, seed, 6, max_count), timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"


@pytest.mark.parametrize("gpu", host_and_gpu(gpus=3))
def test_library_plans_take_the_any_shape_packet_ops_when_told(gpu):
    # Up to 5 ranks the LL plans' packet ops take their one-batch form; this
    # runs the form that ops over several chunks or more operands take.
    seed = random.randrange(1 << 20)
    for bad, record in run_ranks(rp.library_plans, 3, args=(gpu, seed, 4, 200_000 if gpu else 3000),
                                 env={"PYCCL_PLAN_GENERIC_PACKETS": "1"}, timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"


@pytest.mark.parametrize("gpu", host_and_gpu())
def test_a_plan_of_many_ops_per_thread_block_runs(gpu):
    # 130 ops on one thread block: on GPUs the kernel runs them through a one-op window of shared memory.
    seed = random.randrange(1 << 20)
    for bad in run_ranks(rp.long_plan, 2, args=(gpu, seed), timeout=300):
        assert bad == [], f"seed {seed}: {bad}"


@requires_gpus(2)
def test_a_plan_wider_than_the_gpu_is_refused_when_made():
    seed = random.randrange(1 << 20)
    for message, ok in run_ranks(rp.too_wide, 2, args=(seed,), timeout=180):
        assert message is not None and "must all be resident at once" in message and "1000 thread blocks" in message
        assert ok, f"seed {seed}: the plan that fits gave a wrong result"


@pytest.mark.parametrize("world,gpus_per_node", [(2, 1), (4, 2), (6, 3), (6, 2), (8, 4)])
def test_hierarchical_plans_run_in_host_mode(world, gpus_per_node):
    # Host mode: every "node" on this machine, the PortChannels through the host proxy.
    seed = random.randrange(1 << 20)
    args = (False, seed, 4 if world <= 4 else 2, 3000 if world <= 4 else 800, gpus_per_node)
    for bad, record in run_ranks(rp.hierarchical_plans, world, args=args, timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"


@pytest.mark.parametrize("world,gpus_per_node", [(2, 1), (4, 2), (6, 3), (8, 4)])
def test_hierarchical_plans_across_nodes_over_sockets(world, gpus_per_node):
    # Each group of gpus_per_node ranks is its own node (PYCCL_NODE_ID): no
    # P2P between nodes, so the interpreter's puts and signals to another
    # node go through the proxy and the socket transport.
    seed = random.randrange(1 << 20)
    args = (False, seed, 3 if world <= 4 else 2, 3000 if world <= 4 else 800, gpus_per_node, True)
    for bad, record in run_ranks(rp.hierarchical_plans, world, args=args, timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"


@pytest.mark.parametrize("world,gpus_per_node", [(2, 1), (4, 2)])
def test_put_only_library_plans_run_across_nodes(world, gpus_per_node):
    seed = random.randrange(1 << 20)
    results = run_ranks(rp.library_plans_across_nodes, world, args=(False, seed, 3, 2000, gpus_per_node), timeout=300)
    for rank, (bad, refused) in enumerate(results):
        assert bad == [], f"seed {seed}: {bad}"
        odd = {"one_rank_gets"} if world >= 3 else set()
        assert set(refused) == set(pyccl.algorithms.LIBRARY) - set(rp.PUT_ONLY_PLANS) | odd
        for name, message in refused.items():
            assert message is not None and "'plan'" in message and "another node" in message, (name, message)
        if odd:
            # Only rank 1 breaks the rule; every rank refuses (none waits for it), the others with its reason.
            assert (" refuses it: " in refused["one_rank_gets"]) == (rank != 1), (rank, refused["one_rank_gets"])


def test_library_plans_on_eight_ranks():
    seed = random.randrange(1 << 20)
    for bad, record in run_ranks(rp.library_plans, 8, args=(False, seed, 2, 800), timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"


def test_plan_calls_reject_bad_arguments():
    for m in run_ranks(rp.plan_errors, 2, timeout=120):
        assert "'tensor'" in m["size"] and "multiple of" in m["size"]
        assert "'tensor'" in m["too big"]
        assert "'op'" in m["bogus op"] and m["avg"] == "mean"
        assert "'out'" in m["out"]
        assert "'out'" in m["out list"] and "list" in m["out list"]
        assert "'comm'" in m["comm"]
        assert "'plan'" in m["world"]
        assert "'out'" in m["overlap"] and "partly overlaps" in m["overlap"]
        assert "'plan'" in m["pairs"] and "pairs" in m["pairs"] and "destinations" in m["pairs"]
        assert "'plan'" in m["packets"] and "writes packets outside the scratch buffer" in m["packets"], m["packets"]
        assert "'plan'" in m["ordinal"] and "ordinal 99" in m["ordinal"], m["ordinal"]
        assert "'plan'" in m["two signallers"] and "one thread block" in m["two signallers"], m["two signallers"]
        # The pushing 2PA HB's reduce_put packs as a reduction from the input chunk (buffer 0) into the
        # output chunk (buffer 1) and the peer: 2 ranks, so one slot beside the init, two destinations.
        rank = m["rank"]
        assert m["reduce_to"] == {"srcs": 2, "dsts": 2, "start": [rank, 0, rank, 1],
                                  "first_dst": [rank, 1, rank, 1]}, m["reduce_to"]
        assert "'plan'" in m["no start"] and "needs a source and a destination" in m["no start"], m["no start"]
        assert m["sum_ok"]


def test_calls_run_on_whole_warps_for_their_largest_op():
    got = run_ranks(rp.call_threads, 2, timeout=120)[0]
    ll = "allreduce_1pa_ll"
    # 1PA LL puts and reduces the whole input as 8-byte LL packets: one thread per packet.
    assert got[(ll, 1, 512, 256)] == 32
    assert got[(ll, 1, 512, 1024)] == 128
    assert got[(ll, 1, 512, 4096)] == 512  # 512 packets
    assert got[(ll, 1, 512, 64 << 10)] == 512  # never more than the runner's threads
    assert got[(ll, 1, 1024, 64 << 10)] == 1024
    assert got[(ll, 2, 512, 1024)] == 64  # two instances: each block has half the packets
    # 2PA HB (pull) at 2 ranks copies its 2 chunks of input into staging in one op: 16-byte vectors.
    assert got[("allreduce_2pa_hb_pull", 1, 512, 256)] == 32
    assert got[("allreduce_2pa_hb_pull", 1, 512, 1 << 20)] == 512
    assert got[("allreduce_2pa_ll", 4, 256, 1 << 20)] == 256
    assert got[("allreduce_2pa_ll", 4, 256, 96)] == 32
    assert got["error"] is not None and "'nbytes'" in got["error"]


def test_a_missing_peer_times_out_and_breaks_the_communicator():
    result = run_ranks(rp.missing_peer, 2, timeout=120)[0]
    assert result[0] == "timeout", result
    assert result[1] < 10 and "plan call 2 " in result[2] and "rank 1" in result[2]
    assert result[3] == "PycclTimeoutError"  # fails fast: the communicator is broken


def test_registered_algorithms_join_the_automatic_choice():
    for bad, messages in run_ranks(rp.registered, 3, timeout=120):
        assert bad == []
        assert "'collective'" in messages["collective"] and "allgather" in messages["collective"]
        assert "'world_size'" in messages["world"]
        assert "'max_bytes'" in messages["range"]


def test_notebook_algorithm_runs_in_host_mode_within_a_minute():
    import time

    start = time.monotonic()
    for bad in run_ranks(rp.notebook_example, 4, timeout=60):
        assert bad == []
    assert time.monotonic() - start < 60


@pytest.mark.parametrize("gpu, world", [on_host(2, id="host-2"), on_host(3, id="host-3"), on_gpus(2, id="gpu-2")])
def test_tuning_table_plans_join_the_automatic_choice(gpu, world, tmp_path):
    import json

    path = tmp_path / "table.json"
    path.write_text(json.dumps(dict(rp.TUNED_TABLE, world=world)))
    seed = random.randrange(1 << 20)
    for bad in run_ranks(rp.tuned_plans, world, args=(gpu, seed), env={"PYCCL_TUNING_FILE": str(path)},
                         timeout=180):
        assert bad == [], f"seed {seed}: {bad}"
