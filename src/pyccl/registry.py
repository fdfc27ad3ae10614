"""User algorithms in the automatic choice: ``pyccl.register_algorithm``.

    prog = pyccl.algorithms.allreduce_ring(4)         # any pyccl.dsl.Program (or its Plan)
    pyccl.register_algorithm(prog, "all_reduce", min_bytes=1 << 20, max_bytes=64 << 20, world_size=4)
    y = pyccl.all_reduce(x)                           # 1-64 MiB on 4 ranks: the plan

A registered plan takes precedence over pyccl's kernels, the tuning table and
NCCL for its collective, world size and byte range (the whole buffer, as
nccl-tests counts it), unless the call forces an algorithm: every
communicator's selector (``csrc/dispatch/selector.hpp``) sees the registry. The plan runs
through the interpreter (:class:`pyccl.plans.PlanRunner`), set up on the
communicator at the first call that takes it. Every rank must register the
same algorithms in the same order, as every rank must make the same calls.
Sizes that the plan cannot split into whole chunks fall back to the usual
choice. So does a first use during CUDA-graph capture, because setting up a
plan allocates: make one eager call first.

A tuning table (``pyccl.tuning``) may also name a plan of pyccl's own library
(``pyccl.algorithms``) for a size range: :func:`library_runner` sets it up the
same way, at the table's instances and threads.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Dict, List

import torch

from . import _C
from .dsl import Plan, Program
from .errors import InvalidArgumentError
from .plans import COLLECTIVE_OF, PlanRunner

__all__ = ["RegisteredAlgorithm", "chosen_runner", "library_plan", "library_runner", "register_algorithm",
           "registered_runner", "run",
           "registered_algorithms", "unregister_algorithm"]

# pyccl function -> the DSL collective's name
_COLLECTIVES = {name: dsl for dsl, name in COLLECTIVE_OF.items()}


@dataclass(frozen=True)
class RegisteredAlgorithm:
    plan: Plan
    collective: str
    min_bytes: int
    max_bytes: int
    world_size: int
    id: int  # the selector's registry's


_lock = threading.Lock()
_registry: List[RegisteredAlgorithm] = []


def register_algorithm(program, collective: str, min_bytes: int, max_bytes: int,
                       world_size: int) -> RegisteredAlgorithm:
    """Puts a DSL program (lowered here) or plan into the automatic choice of
    `collective` ("all_reduce", "all_gather", "reduce_scatter" or
    "all_to_all") for messages of [min_bytes, max_bytes] on `world_size` ranks.
    Returns a handle for :func:`unregister_algorithm`."""
    for name, value in (("min_bytes", min_bytes), ("max_bytes", max_bytes), ("world_size", world_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < (1 if name != "min_bytes" else 0):
            raise InvalidArgumentError(f"invalid argument '{name}': expected an integer >= "
                                       f"{1 if name != 'min_bytes' else 0}, got {value!r}")
    if max_bytes < min_bytes:
        raise InvalidArgumentError(f"invalid argument 'max_bytes': {max_bytes} is below min_bytes {min_bytes}")
    if isinstance(program, Program):
        plan = program.lower(sizes=(min_bytes, max_bytes))
    elif isinstance(program, Plan):
        plan = program
    else:
        raise InvalidArgumentError(f"invalid argument 'program': expected a pyccl.dsl.Program or Plan, got "
                                   f"{type(program).__name__}")
    if collective not in _COLLECTIVES:
        raise InvalidArgumentError(f"invalid argument 'collective': {collective!r} (expected one of "
                                   f"{', '.join(_COLLECTIVES)})")
    if plan.collective["name"] != _COLLECTIVES[collective]:
        raise InvalidArgumentError(f"invalid argument 'collective': the plan implements "
                                   f"{plan.collective['name']}, not {collective}")
    if plan.num_ranks != world_size:
        raise InvalidArgumentError(f"invalid argument 'world_size': the plan is for {plan.num_ranks} ranks, "
                                   f"not {world_size}")
    with _lock:
        entry = RegisteredAlgorithm(plan, collective, min_bytes, max_bytes, world_size,
                                    _C.register_plan(collective, min_bytes, max_bytes, world_size,
                                                     plan.buffers["input"]))
        _registry.append(entry)
    return entry


def unregister_algorithm(entry: RegisteredAlgorithm) -> None:
    """Takes a registered algorithm out of the choice (communicators keep their
    set-up runners until they close)."""
    with _lock:
        if entry not in _registry:
            raise InvalidArgumentError("invalid argument 'entry': not a registered algorithm")
        _C.unregister_plan(entry.id)
        _registry.remove(entry)


def registered_algorithms() -> List[RegisteredAlgorithm]:
    with _lock:
        return list(_registry)


def registered_runner(comm, plan_id: int, key: str, tensor: torch.Tensor):
    """The runner of the registered plan `plan_id` (the selector's choice) on
    `comm`, kept under `key`, set up at first use; None where it cannot be
    now (a CUDA-graph capture) or the plan was unregistered since."""
    with _lock:
        entry = next((e for e in _registry if e.id == plan_id), None)
    if entry is None:
        return None
    return _runner(comm, key, tensor, lambda: entry.plan, max_bytes=entry.max_bytes)


def chosen_runner(comm, plan_id: int, entry, slot, tensor: torch.Tensor):
    """The runner of the plan a selector chose for a call: the registered plan
    `plan_id` (>= 0), else the library plan of the table entry `entry`, kept
    on `comm` under the selector's `slot` (key, input byte limit); None where
    it cannot be set up now (see registered_runner, library_runner)."""
    key, input_limit = slot
    if plan_id >= 0:
        return registered_runner(comm, plan_id, key, tensor)
    return library_runner(comm, entry, key, input_limit, tensor)


def run(runner, collective: str, tensor: torch.Tensor, out: torch.Tensor, op: str) -> None:
    """Runs `runner` on `tensor` into `out` as a call of `collective` (its
    output placed as the collective allows; avg: the sum, then divided)."""
    runner(tensor, out=out, op=op, collective=collective)


def _takes(plan: Plan, tensor: torch.Tensor) -> bool:
    """Whether the plan splits this input into whole chunks."""
    return tensor.numel() * tensor.element_size() % (plan.buffers["input"] * tensor.element_size()) == 0


def _runner(comm, key: str, tensor: torch.Tensor, make_plan, max_bytes: int, threads: int = 512):
    """The communicator's runner under `key`, set up at first use (None while a
    CUDA graph is being captured: setting up allocates). Closed with the communicator."""
    runner = comm._plan_runner(key)
    if runner is None:
        if tensor.is_cuda and torch.cuda.is_current_stream_capturing():
            return None
        runner = PlanRunner(make_plan(), comm, max_bytes=max_bytes, threads=threads)
        comm._add_plan_runner(key, runner)
    return runner


_library_plans: Dict[tuple, Plan] = {}


def cached_plan(key: tuple, make: Callable[[], Plan]) -> Plan:
    """The plan lowered by `make`, once per process per `key`."""
    with _lock:
        plan = _library_plans.get(key)
    if plan is None:
        plan = make()
        with _lock:
            _library_plans[key] = plan
    return plan


def library_plan(name: str, world: int, instances: int) -> Plan:
    """Library plan `name` of pyccl.algorithms for `world` ranks at `instances`,
    lowered once per process."""
    from .algorithms import LIBRARY

    return cached_plan((name, world, instances), lambda: LIBRARY[name](world, instances=instances).lower())


def library_runner(comm, entry: dict, key: str, input_limit: int, tensor: torch.Tensor):
    """The runner for a tuning-table entry naming a library plan (``{"plan",
    "instances", "threads", "max_bytes"}``), kept under `key` and set up for
    inputs of up to `input_limit` bytes (the selector's slot: one runner per
    entry, or per power of two where the entry has no limit); None where the
    plan cannot take the call: an input it cannot split into whole chunks, or
    a first use during CUDA-graph capture."""
    plan = library_plan(entry["plan"], comm.world_size, entry["instances"])
    if not _takes(plan, tensor):
        return None
    return _runner(comm, key, tensor, lambda: plan, max_bytes=input_limit, threads=entry["threads"])
