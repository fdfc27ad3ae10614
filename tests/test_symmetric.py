"""Symmetric buffers and the zero-copy all-reduce in host mode (CPU processes)."""

import random
from types import SimpleNamespace

import pytest
import torch

from pyccl import selection

import ranks_symmetric as rsym
from pyccl._spawn import run_ranks


@pytest.mark.parametrize("world,options", [(2, None), (3, {"zero_copy_bytes_per_block": 4096}),
                                           (4, {"zero_copy_max_bytes": 40_000})])
def test_zero_copy_all_reduce_matches_float64_reference(world, options):
    # With bytes per block, zero-copy calls run on grids of 1 to all HB blocks,
    # between calls of the other algorithms that use all of them. Above
    # zero_copy_max_bytes symmetric buffers take the staged (pushing) path.
    seed = random.randrange(1 << 20)
    for bad, calls, expected, record in run_ranks(rsym.symmetric_cases, world,
                                                  args=(False, seed, 40, 30_000, 4096, options), timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"
        assert calls == expected > 0, f"seed {seed}: {calls} zero-copy calls, expected {expected}"


def test_register_symmetric_refuses_mismatched_and_overlapping_buffers():
    for messages in run_ranks(rsym.registration_errors, 3, args=(False,), timeout=120):
        assert "'tensor'" in messages["size"] and "same size on every rank" in messages["size"]
        assert "'tensor'" in messages["overlap"] and "overlaps" in messages["overlap"]
        assert messages["sum_ok"] and messages["zero_copy_calls"] == 1


@pytest.mark.parametrize("nccl_here", [True, False])
def test_symmetric_choice_follows_the_table(monkeypatch, nccl_here):
    table = {"collectives": {"all_reduce_symmetric": [
        {"max_bytes": 1024, "algorithm": "1pa_ll"},
        {"max_bytes": 1 << 20, "algorithm": "2pa_hb"},
        {"max_bytes": None, "algorithm": "nccl"}]}}
    monkeypatch.setattr(selection, "table_for", lambda *args: table)
    monkeypatch.delenv("PYCCL_NCCL_MIN_BYTES", raising=False)
    engine = SimpleNamespace(zero_copy_threshold_bytes=4096, select=lambda n: "2pa_ll")

    def choose(nbytes):
        call = SimpleNamespace(comm=SimpleNamespace(world_size=4), nccl_here=nccl_here, nbytes=nbytes)
        chosen = selection._symmetric_choice(call, engine, torch.empty(nbytes // 4))
        return chosen, chosen == "nccl"

    assert choose(512) == ("1pa_ll", False)
    assert choose(1 << 20) == ("2pa_hb", False)
    # NCCL where the table says so and the group has it; zero-copy where it has not.
    assert choose(4 << 20) == (("nccl", True) if nccl_here else ("2pa_hb", False))
    # No table: the engine's threshold.
    monkeypatch.setattr(selection, "table_for", lambda *args: None)
    assert choose(2048) == ("2pa_ll", False) and choose(8192) == ("2pa_hb", False)
