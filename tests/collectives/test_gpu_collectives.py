"""Collectives on GPUs: numerics against float64, bitwise agreement across
ranks, back-to-back calls and CUDA-graph replays."""

import random

import pytest

import ranks_collectives as rcol
import ranks_engine_choice as rch
import ranks_exchanges as rex
from conftest import gpu_count, gpu_worlds, requires_gpus
from pyccl._spawn import run_ranks


@requires_gpus(2)
@pytest.mark.parametrize("world", gpu_worlds(2, 3, 4, 6, 8))
def test_all_reduce_random_cases_match_float64_reference(world):
    seed = random.randrange(1 << 20)
    for bad, record in run_ranks(rcol.all_reduce_cases, world, args=(True, seed, 60, 3_000_000), timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"


@requires_gpus(2)
@pytest.mark.parametrize("programmatic_launch", [True, False])
def test_all_reduce_back_to_back_without_host_sync(programmatic_launch):
    # Programmatic dependent launch (the default) lets each kernel be scheduled
    # while the one before it runs; both ways must keep the stream's order.
    options = {"programmatic_launch": programmatic_launch}
    for bad in run_ranks(rcol.back_to_back, min(gpu_count(), 4), args=(True, 200, options), timeout=300):
        assert bad == 0


@requires_gpus(2)
def test_all_reduce_in_cuda_graph_replays():
    for bad in run_ranks(rcol.graph_replays, min(gpu_count(), 4), args=(20,), timeout=300):
        assert bad == []


@requires_gpus(2)
@pytest.mark.parametrize("options", [{}, {"hb_push": True}, {"hb_push": False}, {"hb_rounds_per_launch": 1}],
                         ids=["default", "push", "pull", "one-round-per-launch"])
def test_all_reduce_in_pieces(options):
    # GPU HB rounds are 16 MiB: 40 MB of float32 and bf16 take several.
    seed = random.randrange(1 << 20)
    for bad in run_ranks(rcol.large_cases, min(gpu_count(), 4),
                         args=(True, seed, 10_000_003, 20_000_001, options), timeout=300):
        assert bad == [], f"seed {seed}: {bad}"


@requires_gpus(2)
@pytest.mark.parametrize("world", gpu_worlds(2, 3, 4, 6, 8))
def test_all_reduce_push_random_cases(world):
    seed = random.randrange(1 << 20)
    options = {"hb_push": True, "hb_piece_bytes": 1 << 20}
    for bad, record in run_ranks(rcol.all_reduce_cases, world, args=(True, seed, 40, 3_000_000, options),
                                 timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"


@requires_gpus(2, own=True)
def test_all_reduce_on_a_torch_nccl_group():
    # The size rule, not the shipped tuning table: on 2 H200s the table keeps
    # 20 MB on 2PA HB, and this test is about the hand-off to NCCL.
    env = {"PYCCL_NCCL_MIN_BYTES": str(16 << 20)}
    for bad in run_ranks(rcol.group_path, min(gpu_count(), 4), timeout=300, env=env):
        assert bad == []


@requires_gpus(2)
@pytest.mark.parametrize("world", gpu_worlds(2, 3, 4, 6, 8))
def test_exchanges_random_cases(world):
    seed = random.randrange(1 << 20)
    for bad, record in run_ranks(rex.exchange_cases, world, args=(True, seed, 80, 2_000_000), timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"


@requires_gpus(2)
@pytest.mark.parametrize("options", [{"hb_push": True}, {"hb_push": False}, {"hb_push": True, "hb_rounds_per_launch": 1}],
                         ids=["push", "pull", "push-one-round-per-launch"])
def test_exchanges_in_rounds(options):
    # HB rounds of 1 MiB: most HB cases run several rounds, in one launch or one per launch.
    seed = random.randrange(1 << 20)
    options = {**options, "hb_piece_bytes": 1 << 20}
    for bad, record in run_ranks(rex.exchange_cases, min(gpu_count(), 4), args=(True, seed, 60, 2_000_000, options),
                                 timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"


@requires_gpus(2)
def test_exchanges_and_all_reduce_back_to_back():
    # 5000 rounds of two calls each: 10 000 back-to-back collectives of mixed sizes,
    # checked in windows of 250 rounds.
    for bad in run_ranks(rex.mixed_back_to_back, min(gpu_count(), 4), args=(True, 5000, 250), timeout=400):
        assert bad == []


@requires_gpus(2)
def test_every_collective_in_a_graph_captured_before_any_eager_call():
    for bad in run_ranks(rcol.graph_all_collectives, min(gpu_count(), 4), args=(1000,), timeout=400):
        assert bad == []


@requires_gpus(2, own=True)
def test_zeros_infinities_and_nan_as_nccl():
    for bad in run_ranks(rcol.special_values, min(gpu_count(), 4), args=(True,), timeout=300):
        assert bad == [], bad[:3]


@requires_gpus(2)
def test_random_engine_configurations_on_gpus():
    # tests/collectives/test_collectives.py's random configurations, on GPUs, where the
    # options left unset take the GPU defaults (a small ll_max_bytes was once
    # refused there for the 128 KiB 1PA LL threshold, which the user never set).
    seed = random.randrange(1 << 20)
    rng = random.Random(seed)
    for _ in range(2):
        options, world = rcol.random_engine_options(rng), rng.choice(gpu_worlds(2, 3, 4))
        for body, count in ((rcol.all_reduce_cases, 16), (rex.exchange_cases, 16)):
            for bad, record in run_ranks(body, world, args=(True, seed, count, 300_000, options), timeout=300):
                assert bad == [], f"seed {seed} world {world} {options}: {bad} (device record {record})"


@requires_gpus(2)
def test_outputs_overlapping_inputs_are_in_place_or_refused_on_gpus():
    # tests/collectives/test_collectives.py's check on the GPU kernels and plans.
    for refused, wrong in run_ranks(rcol.overlapping_outputs, min(gpu_count(), 4), args=(True,), timeout=300):
        assert wrong == []
        assert len(refused) == 17
        for key, message in refused.items():
            assert "invalid argument 'out'" in message and "overlaps the input" in message, (key, message)


@requires_gpus(2)
def test_engine_options_must_agree_on_every_rank_on_gpus():
    # tests/collectives/test_collectives.py's check, where the GPU engine also caps its send/receive lanes after the agreement.
    world = min(gpu_count(), 4)
    out = run_ranks(rch.engine_options_must_agree, world, args=(True,), timeout=300)
    for errors, bad in out:
        assert errors == out[0][0]
        assert bad == []
    errors = out[0][0]
    assert "'ll_max_bytes'" in errors["scalar"] and f"rank {world - 1} has 8192" in errors["scalar"]
    assert "'all_reduce_by_size'" in errors["table_length"]
    assert all("every rank" in e for e in errors.values()), errors


@requires_gpus(2)
def test_float64_integer_and_bool_reductions_on_gpus_give_nccls_results():
    """As tests/collectives/test_collectives.py's host-mode test, on a GPU communicator without NCCL: the engine gathers,
    ATen reduces on the same stream."""
    seed = random.randrange(1 << 20)
    for bad, refused, usable in run_ranks(rcol.gathered_reductions, 2, args=(seed, 96, False, True), timeout=240):
        assert bad == [], f"seed {seed}: {bad}"
        assert [r[2] for r in refused] == ["InvalidArgumentError", "PycclTypeError"], refused
        assert usable
