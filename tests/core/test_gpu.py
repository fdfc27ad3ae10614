"""GPU tests: registration, peer writes, semaphores and timeouts on real GPUs.

They run where this build has CUDA and enough GPUs are visible, and skip with
the reason elsewhere (CI has no GPU; run `bash scripts/test.sh` on a GPU machine).
"""

import random

import pytest

import ranks
import ranks_gpu
from conftest import gpu_worlds, requires_gpus
from pyccl._spawn import run_ranks

WORLDS = gpu_worlds(2, 3, 4, 6, 8)
EXPANDABLE = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


@requires_gpus(2)
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("allocator,env,kind", [
    ("torch.empty", {}, "cuda_ipc"),
    ("expandable", EXPANDABLE, "cumem"),
    ("pyccl.empty", {}, "cumem"),
])
def test_peer_writes_into_registered_gpu_memory(world, allocator, env, kind):
    words = 16 << 20 if allocator == "expandable" else (1 << 20) + 7  # 64 MiB per rank slot
    infos = run_ranks(ranks_gpu.peer_writes, world, args=(words, allocator, random.randrange(1 << 30)),
                      env=env, timeout=240)
    for info in infos:
        assert info["wrong"] == 0
        assert info["kind"] == kind
        assert info["peer_kinds"] == [kind]
        assert all(all(row) for row in info["p2p"]), info["p2p"]
        if allocator == "expandable":
            # A large tensor in expandable segments spans several physical chunks.
            assert info["chunks"] > 1, info


@requires_gpus(2)
@pytest.mark.parametrize("world", WORLDS)
def test_device_semaphores_order_peer_writes(world):
    seeds = [random.randrange(1 << 31) for _ in range(20)]
    for per_seed in run_ranks(ranks_gpu.device_selftest, world, args=((1 << 18) + 3, seeds), timeout=240):
        assert [(m, f) for m, f, _ in per_seed] == [(0, 0)] * len(seeds)


@requires_gpus(1)
def test_ranks_sharing_a_gpu_are_refused_unless_allowed():
    # As NCCL refuses a duplicate GPU: two ranks on one GPU is most often a missing set_device.
    for message, _ in run_ranks(ranks_gpu.ranks_on_one_gpu, 3, env={"PYCCL_ALLOW_SHARED_GPU": "0"}, timeout=120):
        assert message is not None and "'device'" in message and "ranks 0 and 1 are on the same GPU" in message
        assert "PYCCL_ALLOW_SHARED_GPU=1" in message and "set_device" in message, message
    # Allowed, for testing: the GPU time-slices between the ranks, and results are right.
    assert run_ranks(ranks_gpu.ranks_on_one_gpu, 2, env={"PYCCL_ALLOW_SHARED_GPU": "1"}, timeout=120) == \
        [(None, True)] * 2


@requires_gpus(2)
def test_host_semaphores_on_gpu_memory():
    rounds = 100
    for bad, received in run_ranks(ranks_gpu.host_semaphores_on_gpu, 2, args=(rounds,), timeout=240):
        assert bad == 0 and received == rounds


@requires_gpus(2)
def test_device_wait_times_out_and_names_the_peer():
    failures, record, took = run_ranks(ranks.selftest_peer_absent, 2, args=(True,), timeout=120)[0]
    assert failures >= 1
    assert record["status"] == "timeout" and record["peer"] == 1
    assert 1.9 <= took <= 15, took


@requires_gpus(2)
def test_bad_gpu_registrations_name_the_argument():
    for messages in run_ranks(ranks_gpu.gpu_bad_input, 2, timeout=120):
        for label, message in messages.items():
            assert message is not None and "'tensor'" in message, (label, message)


@requires_gpus(2, own=True)  # it measures the whole GPU's memory, which ranks sharing it allocate in turn
def test_gpu_create_destroy_cycles_leak_nothing():
    for before, after in run_ranks(ranks_gpu.gpu_create_destroy_cycles, 2, args=(20,), timeout=300):
        assert after["fds"] == before["fds"] and after["threads"] == before["threads"], (before, after)
        # Device memory comes back (allow for the driver's own bookkeeping pages).
        assert after["gpu_used_mib"] - before["gpu_used_mib"] <= 8, (before, after)


@requires_gpus(2)
def test_first_launches_of_two_communicators_in_crossed_order_complete():
    # With lazy module loading, a kernel's first launch may wait for the kernels
    # running on the device: each rank's second launch would wait for its first
    # collective, which waits for the peer stuck the same way, until the timeout.
    # pyccl loads its kernels when a communicator is made (core/kernel_loading.hpp).
    seed = random.randrange(1 << 30)
    for wrong, errors, hung, seconds in run_ranks(ranks_gpu.crossed_first_launches, 2, args=(seed,), timeout=180):
        assert not hung and errors == [], errors
        assert wrong == []
        assert seconds < 10, f"took {seconds:.1f} s: a launch waited for the other communicator's kernel"
