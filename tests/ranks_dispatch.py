"""Per-rank bodies of the selector's tests (host mode)."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

import pyccl
from pyccl import algorithms


def every_entry_point(rank, world, store, scenario, table_path, seed):
    """One "cpu:pyccl" group, the scenario's source of the choice set before
    the group is made; an all-reduce through each entry point, each checked
    against a float64 sum. Returns the failures and the group selector's trace."""
    if scenario == "PYCCL_ALGO":
        os.environ["PYCCL_ALGO"] = "all_reduce=2pa_ll"
    elif scenario == "tuning file":
        os.environ["PYCCL_TUNING_FILE"] = table_path
    plan = None
    if scenario == "registered plan":
        plan = pyccl.register_algorithm(algorithms.allreduce_ring(world), "all_reduce", 0, 1 << 20, world)
    dist.init_process_group("cpu:pyccl", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    bad = []
    gen = torch.Generator().manual_seed(seed)
    n = 2 * world * 999  # whole chunks of the ring
    group_name = dist.group.WORLD.group_name
    calls = {
        "dist.all_reduce": lambda x: (dist.all_reduce(x), x)[1],
        "pyccl.all_reduce": lambda x: pyccl.all_reduce(x),
        "torch.ops.pyccl.all_reduce": lambda x: torch.ops.pyccl.all_reduce(x, "sum", group_name),
    }
    for name, call in calls.items():
        inputs = [torch.randn(n, generator=gen) for _ in range(world)]
        got = call(inputs[rank].clone())
        ref = sum(t.double() for t in inputs)
        if not torch.allclose(got.double(), ref, rtol=1e-5, atol=1e-5):
            bad.append((name, (got.double() - ref).abs().max().item()))
    trace = pyccl.communicator_for(device=torch.device("cpu"))._selector.trace()
    dist.destroy_process_group()
    if plan is not None:
        pyccl.unregister_algorithm(plan)
    return bad, trace
