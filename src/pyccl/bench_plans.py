"""The library's DSL plans as bench candidates: ``pyccl.bench --plans`` and
``pyccl.tune`` (which puts a plan in the table where it beats the kernels
and NCCL).

Each plan of :data:`pyccl.tuning.PLANS` runs through the plan interpreter at
every launch shape of :data:`pyccl.tuning.PLAN_SHAPES` and every size of the
bench whose input it splits into whole chunks. Its best time per size goes to
the row under ``plan:<name>``, with the shape under ``plan:<name>:shape``.
Every result is checked against ProcessGroupNCCL's before it is timed.
"""

from __future__ import annotations

from typing import Callable, Dict, List

import torch

from . import tuning
from .plans import PlanRunner
from .registry import library_plan

# LL plans past this multiple of the engine's LL limit are slow and say nothing
# new (the 2PA LL kernel column stops at the same point).
_LL_LIMIT_FACTOR = 4


def time_library_plans(comm, collective: str, rows: List[dict], make_tensors: Callable, reference: Callable,
                       check: Callable, time_graph: Callable, ll_max_bytes: int) -> None:
    """Adds the plan columns to `rows` (one per size, with "bytes"), in place.

    make_tensors(nbytes) -> (input, output); reference(input, output) -> the
    expected output; check(label, got, expected, nbytes) raises on a wrong
    result; time_graph(fn) -> µs per call."""
    world = comm.world_size
    # Every plan and shape runs on the same tensors per size, checked against one reference.
    cases: Dict[int, tuple] = {}
    for row in rows:
        x, out = make_tensors(row["bytes"])
        cases[row["bytes"]] = (row, x, out, reference(x, out))
    for name in tuning.PLANS.get(collective, ()):
        label = tuning.plan_column(name)
        for instances, threads in tuning.PLAN_SHAPES:
            plan = library_plan(name, world, instances)
            limit = _LL_LIMIT_FACTOR * world * ll_max_bytes if plan.protocol == "ll" else None
            todo = [case for nbytes, case in cases.items() if (limit is None or nbytes <= limit)
                    and case[1].numel() % plan.buffers["input"] == 0]
            if not todo:
                continue
            max_input = max(x.numel() * x.element_size() for _, x, _, _ in todo)
            runner = PlanRunner(plan, comm, max_bytes=max_input, threads=threads)
            try:
                for row, x, out, expected in todo:
                    runner(x, out=out)
                    check(f"{label} ({instances} x {threads})", out, expected, row["bytes"])
                    t = time_graph(lambda: runner(x, out=out))
                    if row.get(label) is None or t < row[label]:
                        row[label] = t
                        row[label + ":shape"] = [instances, threads]
            finally:
                torch.cuda.synchronize()
                runner.close()
