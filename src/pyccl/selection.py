"""How a collective call is resolved before it runs, on the Python side:
the communicator, the tensor's checks, and one question to the
communicator's selector (``csrc/dispatch/selector.hpp``), which alone chooses
what runs the call: a forced algorithm (``algorithm=`` or ``PYCCL_ALGO``), a
plan registered with :func:`pyccl.register_algorithm`, the collectives run
across nodes, the tuning table of the call's dtype, or the defaults (a kernel
by size, or NCCL through the torch group from ``NCCL_MIN_BYTES``). The
selector reads the environment and the tables once, when the communicator is
made; every entry point (this one, ``torch.ops.pyccl.*``, the "pyccl" process
group) asks the same one.

This module builds what a selector is made from (:func:`selector_config`):
the tuning tables of the device and world size per dtype (``pyccl.tuning``),
with the input chunks of the library plans they name, and the NCCL
thresholds.
"""

from __future__ import annotations

import threading
from typing import Dict, Optional, Tuple

import torch
import torch.distributed as dist

from . import _C, _env, across_nodes, registry, tuning
from .communicator import Communicator
from .errors import ClosedError, InvalidArgumentError, UnsupportedError
from .group_communicators import communicator_for

# The algorithms each collective can be forced to (algorithm= or PYCCL_ALGO) and tuned to: the selector's.
ALGORITHMS: Dict[str, Tuple[str, ...]] = {c: tuning.CANDIDATES[c] for c in tuning.COLLECTIVES}


_tables: Dict[Tuple[torch.device, int, torch.dtype], Optional[dict]] = {}
# Its own lock: communicator_for holds _lock while a new communicator's engine looks its table up.
_tables_lock = threading.Lock()


def table_for(device: torch.device, world: int, dtype: Optional[torch.dtype]) -> Optional[dict]:
    """The tuning table the automatic choice uses on `device`, or None where no
    table matches (see pyccl.tuning). In host mode, only the one
    ``PYCCL_TUNING_FILE`` names: the shipped tables are measured on GPUs.
    Looked up once per key: every collective call asks."""
    if device.type != "cuda" and not _env.get("PYCCL_TUNING_FILE"):
        return None
    key = (device, world, dtype)
    table = _tables.get(key, _tables)  # _tables itself: not looked up yet (no lock for a table looked up)
    if table is not _tables:
        return table
    with _tables_lock:
        if key not in _tables:
            gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "host"
            _tables[key] = tuning.load_table(gpu, world, None if dtype is None else str(dtype).split(".")[-1])
        return _tables[key]


# What a selector reads from the environment when it is made (with the tables PYCCL_TUNING_FILE names). Ranks
# that differ would run different algorithms and wait on each other: new engines check that they agree.
SHARED_ENV = ("PYCCL_ALGO", "PYCCL_NCCL_MIN_BYTES", "PYCCL_TUNING_FILE")


def new_engine(native: "_C.Communicator", device: torch.device, world: int) -> "_C.CollectiveEngine":
    """A collective engine for `native` whose own automatic choice (the one the
    fused all-reduce + RMSNorm and the symmetric fallback use) follows the
    tuning table's kernel entries where a table matches. The environment
    variables that steer the choice of every call must be the same on every
    rank: the engine checks them with its options (else ValueError naming one)."""
    settings = {f"{name} (environment)": _env.get(name) or "" for name in SHARED_ENV}
    return _C.CollectiveEngine(native, kernel_choices=tuning.kernel_choices(table_for(device, world, torch.bfloat16)),
                               agreed_settings=settings)


# The dtypes a selector keeps a table for, in the order of its TableDtype; "other" (data movement of any other
# dtype) takes the table load_table finds without a dtype.
_TABLE_DTYPES = (("float32", torch.float32), ("float16", torch.float16), ("bfloat16", torch.bfloat16),
                 ("other", None))


# The selector's table dtypes (TableDtype, in _TABLE_DTYPES' order) by torch dtype: every call passes one.
_TABLE_DTYPE = {dtype: i for i, (_, dtype) in enumerate(_TABLE_DTYPES) if dtype is not None}
_OTHER_DTYPE = len(_TABLE_DTYPES) - 1


def _route_entry(entry: dict, world: int) -> tuple:
    """A table entry as the selector takes it: (max_bytes, route, algorithm, instances, threads, input_chunks)."""
    algorithm = entry["algorithm"]
    if algorithm == "plan":
        # The selector gives a library plan only the inputs it splits into whole chunks.
        plan = registry.library_plan(entry["plan"], world, entry["instances"])
        return (entry["max_bytes"], "plan", entry["plan"], entry["instances"], entry["threads"],
                plan.buffers["input"])
    return (entry["max_bytes"], "nccl" if algorithm == "nccl" else "kernel", algorithm, 0, 0, 1)


def selector_config(device: torch.device, world: int, across: bool = False) -> dict:
    """What a selector of a communicator on `device` with `world` ranks is
    made from: the tuning tables of the device and world size (per dtype;
    host mode: only ``PYCCL_TUNING_FILE``'s), the NCCL thresholds where no
    table decides (``NCCL_MIN_BYTES``), and whether the ranks span nodes."""
    tables = {}
    for name, dtype in _TABLE_DTYPES:
        table = table_for(device, world, dtype)
        if table:
            tables[name] = {c: [_route_entry(e, world) for e in entries]
                            for c, entries in table.get("collectives", {}).items()}
    return {"world": world, "across_nodes": across, "tables": tables,
            "nccl_min_bytes": [NCCL_MIN_BYTES[c] for c in tuning.COLLECTIVES]}


def new_selector(comm: Communicator, engine: Optional["_C.CollectiveEngine"]) -> "_C.Selector":
    """The selector of a communicator made in Python (the "pyccl" process
    group's lanes have theirs, made in C++ from the same config). Reads
    PYCCL_ALGO and PYCCL_NCCL_MIN_BYTES now (a bad value raises here)."""
    try:
        across = across_nodes.node_layout(comm) is not None
    except UnsupportedError:  # a layout across nodes that pyccl.across_nodes refuses, at the call
        across = True
    return _C.Selector(selector_config(comm.device, comm.world_size, across), engine)


class _Call:
    """What every collective resolves first: the communicator, the call's
    facts, and the selector's choice for them (``route``: "kernel", "plan",
    "nccl" or "across_nodes")."""

    __slots__ = ("from_group", "comm", "group", "nbytes", "route", "algorithm", "symmetric", "registered_plan",
                 "tuned_plan", "source", "nccl_here", "_question")

    def __init__(self, collective: str, tensor: torch.Tensor, group, comm: Optional[Communicator],
                 algorithm: Optional[str], gathers: bool = False) -> None:
        if not isinstance(tensor, torch.Tensor) or tensor.layout is not torch.strided:
            raise InvalidArgumentError(
                f"invalid argument 'tensor': expected a dense torch.Tensor, got "
                f"{tensor.layout if isinstance(tensor, torch.Tensor) else type(tensor).__name__}")
        from_group = self.from_group = comm is None
        if from_group:
            comm = communicator_for(group, tensor.device)  # never a closed one
        elif not isinstance(comm, Communicator):
            raise InvalidArgumentError(f"invalid argument 'comm': expected a pyccl.Communicator, got "
                                       f"{type(comm).__name__}; a torch ProcessGroup goes in 'group'")
        elif comm._comm.closed:
            raise ClosedError(f"{collective}: communicator '{comm.name}' is closed")
        if algorithm is not None and not isinstance(algorithm, str):
            raise InvalidArgumentError(f"invalid argument 'algorithm': expected a string or None, got "
                                       f"{type(algorithm).__name__}")
        self.comm = comm
        self.group = group
        nbytes = tensor.numel() * tensor.element_size()
        if gathers:
            nbytes *= comm.world_size
        self.nbytes = nbytes
        nccl_here = self.nccl_here = from_group and tensor.is_cuda and _group_has_nccl(comm, group)
        question = self._question = (collective, _TABLE_DTYPE.get(tensor.dtype, _OTHER_DTYPE), nbytes, tensor.numel(),
                                     algorithm, nccl_here)
        self._take(comm._selector.select(*question, True))

    def _take(self, choice: tuple) -> None:
        route, algorithm, symmetric, plan, entry, self.source = choice
        self.route, self.algorithm, self.symmetric = route, algorithm or None, symmetric or None
        self.registered_plan, self.tuned_plan = plan, entry

    def without_plans(self) -> None:
        """The choice again, plans left out: the one chosen could not be set up
        now (its first use during a CUDA-graph capture)."""
        self._take(self.comm._selector.select(*self._question, False))

    @property
    def forced(self) -> bool:
        return self.source in ("argument", "PYCCL_ALGO")

    @property
    def use_nccl(self) -> bool:
        return self.route == "nccl"

    @property
    def spans_nodes(self) -> bool:
        return self.route == "across_nodes"

    @property
    def kernel_algorithm(self) -> Optional[str]:
        return self.algorithm if self.route == "kernel" else None


# From these sizes (bytes of the whole buffer) NCCL through the torch group is
# at least as fast as pyccl's kernels on 4 x H200 NVLink (benchmarks/RESULTS.md).
NCCL_MIN_BYTES = {
    "all_reduce": 16 << 20,
    "all_gather": 64 << 20,
    "reduce_scatter": 32 << 20,
    "all_to_all": 64 << 20,
    "broadcast": 4 << 20,
}


# pyccl.integrations.GroupCommunicator's own limits (whether pyccl takes an engine's call at all) read these;
# the choice of every call pyccl runs is the selector's.
def _nccl_min_bytes(collective: str = "all_reduce", table: Optional[dict] = None) -> int:
    """Messages from here on go to NCCL when the group has it: PYCCL_NCCL_MIN_BYTES
    (one size for every collective) if set, else where `table` hands every size
    to NCCL, else NCCL_MIN_BYTES[collective]."""
    return _nccl_min_bytes_from(_env.get("PYCCL_NCCL_MIN_BYTES"), collective, table)


def _nccl_min_sources(collective: str) -> tuple:
    """What _nccl_min_bytes reads that may change between calls (a table is
    read once per key): a memo of a choice made from it keys on this."""
    return _env.raw("PYCCL_NCCL_MIN_BYTES"), NCCL_MIN_BYTES.get(collective)


def _nccl_min_bytes_from(text: Optional[str], collective: str, table: Optional[dict]) -> int:
    """_nccl_min_bytes with PYCCL_NCCL_MIN_BYTES already read (`text`)."""
    if not text:
        tuned = tuning.nccl_from(table, collective)
        return tuned if tuned is not None else NCCL_MIN_BYTES[collective]
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidArgumentError(f"invalid PYCCL_NCCL_MIN_BYTES {text!r}: expected a byte count >= 0")
    return value


def _group_has_nccl(comm: Communicator, group) -> bool:
    """_has_nccl(group) for the group whose communicator `comm` is
    (communicator_for's), asked once per communicator: a group's backend does
    not change."""
    has = comm.__dict__.get("_group_has_nccl")
    if has is None:
        has = comm._group_has_nccl = _has_nccl(group)
    return has


def _has_nccl(group) -> bool:
    try:
        backend = dist.get_backend(group)
    except Exception:
        return False
    return "nccl" in str(backend).lower()
