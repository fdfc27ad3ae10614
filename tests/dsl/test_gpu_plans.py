"""The plan interpreter kernel on GPUs: every library plan, run and checked."""

import random

import pytest

import ranks_plans as rp
from conftest import gpu_worlds, requires_gpus
from pyccl._spawn import run_ranks


@requires_gpus(2)
@pytest.mark.parametrize("world", gpu_worlds(2, 4, 6, 8))
def test_library_plans_run_on_gpus(world):
    seed = random.randrange(1 << 20)
    for bad, record in run_ranks(rp.library_plans, world, args=(True, seed, 6, 200_000), timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"


@requires_gpus(3)
def test_library_plans_take_the_any_shape_packet_ops_on_gpus_when_told():
    seed = random.randrange(1 << 20)
    for bad, record in run_ranks(rp.library_plans, 3, args=(True, seed, 4, 200_000),
                                 env={"PYCCL_PLAN_GENERIC_PACKETS": "1"}, timeout=300):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"


@requires_gpus(2)
def test_a_plan_of_more_ops_than_shared_memory_holds_runs_on_gpus():
    # 130 ops on one thread block: the kernel runs them through a one-op window.
    seed = random.randrange(1 << 20)
    for bad in run_ranks(rp.long_plan, 2, args=(True, seed), timeout=300):
        assert bad == [], f"seed {seed}: {bad}"


@requires_gpus(2)
def test_tuning_table_plans_join_the_automatic_choice_on_gpus(tmp_path):
    import json

    path = tmp_path / "table.json"
    path.write_text(json.dumps(dict(rp.TUNED_TABLE, world=2)))
    seed = random.randrange(1 << 20)
    for bad in run_ranks(rp.tuned_plans, 2, args=(True, seed), env={"PYCCL_TUNING_FILE": str(path)}, timeout=180):
        assert bad == [], f"seed {seed}: {bad}"


@requires_gpus(2)
def test_a_plan_wider_than_the_gpu_is_refused_when_made():
    seed = random.randrange(1 << 20)
    for message, ok in run_ranks(rp.too_wide, 2, args=(seed,), timeout=180):
        assert message is not None and "must all be resident at once" in message and "1000 thread blocks" in message
        assert ok, f"seed {seed}: the plan that fits gave a wrong result"
