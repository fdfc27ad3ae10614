"""Creating and destroying communicators leaks nothing; closed objects fail loudly."""

import ranks
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
