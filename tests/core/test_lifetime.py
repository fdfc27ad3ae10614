"""Creating and destroying communicators leaks nothing, in host mode and on
GPUs; closed objects fail loudly; a new communicator's first launches never
wait on another's kernels."""

import random

import ranks
import ranks_gpu
from conftest import requires_gpus
from pyccl._spawn import run_ranks


def test_fifty_communicators_leak_nothing():
    for before, after in run_ranks(ranks.create_destroy_cycles, 2, args=(50,), timeout=300):
        assert after == before, f"resources grew over 50 create/destroy cycles: {before} -> {after}"


def test_closed_communicator_raises_closed_error():
    for errors, mem_valid, sem_valid in run_ranks(ranks.closed_communicator_errors, 2):
        for op, message in errors.items():
            assert message is not None, f"{op} on a closed communicator must raise ClosedError"
        assert "destroyed" in errors["barrier"]
        assert not mem_valid and not sem_valid


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
