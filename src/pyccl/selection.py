"""How a collective call is resolved before it runs: a forced algorithm
(``algorithm=`` or ``PYCCL_ALGO``), the tuning table's entry for its size, a
DSL plan the table names, or NCCL through the torch group; memoized per
communicator (``_Call``).

The defaults where no table matches are in ``pyccl.collectives``' docstrings;
the table format in ``pyccl.tuning``.
"""

from __future__ import annotations

import threading
from typing import Dict, Optional, Tuple

import torch
import torch.distributed as dist

from . import _C, _env, across_nodes, tuning
from .communicator import Communicator
from .errors import ClosedError, InvalidArgumentError
from .group_communicators import communicator_for

# The algorithms each collective can be forced to (algorithm= or PYCCL_ALGO): those it can be tuned to.
ALGORITHMS: Dict[str, Tuple[str, ...]] = {c: tuning.CANDIDATES[c] for c in tuning.COLLECTIVES}


def _forced_algorithm(collective: str, algorithm: Optional[str]) -> Optional[str]:
    """The algorithm forced by the argument or by PYCCL_ALGO, checked.

    PYCCL_ALGO is a comma-separated list of ``name`` (every collective that has
    an algorithm of that name takes it; ``nccl`` applies to all) or
    ``collective=name`` entries, e.g. ``all_reduce=2pa_hb,all_gather=ll``.
    """
    allowed = ALGORITHMS[collective]
    if algorithm is not None:
        if algorithm not in allowed:
            raise InvalidArgumentError(f"invalid argument 'algorithm': {algorithm!r} is not an algorithm of "
                                       f"{collective} (expected one of {', '.join(allowed)})")
        return algorithm
    text = (_env.get("PYCCL_ALGO") or "").strip()
    if not text:
        return None
    chosen = None
    for entry in (e.strip() for e in text.split(",") if e.strip()):
        name, _, value = entry.rpartition("=")
        if name:
            if name not in ALGORITHMS:
                raise InvalidArgumentError(f"invalid PYCCL_ALGO entry {entry!r}: {name!r} is not a collective "
                                           f"(expected one of {', '.join(ALGORITHMS)})")
            if value not in ALGORITHMS[name]:
                raise InvalidArgumentError(f"invalid PYCCL_ALGO entry {entry!r}: {name} has "
                                           f"{', '.join(ALGORITHMS[name])}")
            if name == collective:
                chosen = value
        else:
            if not any(value in algos for algos in ALGORITHMS.values()):
                raise InvalidArgumentError(f"invalid PYCCL_ALGO entry {entry!r}: not an algorithm of any collective")
            if value in allowed and chosen is None:
                chosen = value
    return chosen


_tables: Dict[Tuple[torch.device, int, torch.dtype], Optional[dict]] = {}
# Its own lock: communicator_for holds _lock while a new communicator's engine looks its table up.
_tables_lock = threading.Lock()


def table_for(device: torch.device, world: int, dtype: torch.dtype) -> Optional[dict]:
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
            _tables[key] = tuning.load_table(gpu, world, str(dtype).split(".")[-1])
        return _tables[key]


# What every call's choice reads from the environment. Ranks that differ would run different algorithms and wait
# on each other: new engines check that they agree.
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


# The most automatic choices a communicator keeps (_Call): far more sizes than a model calls with.
_CHOICES_KEPT = 4096

# The collectives that run on communicators spanning nodes (pyccl.across_nodes).
_ACROSS_NODES = ("all_reduce", "all_gather", "reduce_scatter")


class _Choice:
    """A memoized automatic choice (see _Call). ``symmetric`` is filled in on
    the first all-reduce that needs it: the choice for input and output in
    symmetric buffers (or captured on graph buffers), which needs the engine."""

    __slots__ = ("algorithm", "forced", "tuned_plan", "spans_nodes", "use_nccl", "nccl_here", "symmetric")

    def __init__(self, algorithm: Optional[str], forced: bool, tuned_plan: Optional[dict], spans_nodes: bool,
                 use_nccl: bool, nccl_here: bool) -> None:
        self.algorithm, self.forced, self.tuned_plan = algorithm, forced, tuned_plan
        self.spans_nodes, self.use_nccl, self.nccl_here = spans_nodes, use_nccl, nccl_here
        self.symmetric: Optional[str] = None


class _Call:
    """What every collective resolves first: the communicator, the algorithm, NCCL or not.

    Every eager call pays for this on the host, so the choice is memoized per
    communicator, keyed by everything it depends on that can change between
    calls: the collective, dtype, size and device, the algorithm argument,
    whether the call came through a group, ``PYCCL_ALGO`` and
    ``PYCCL_NCCL_MIN_BYTES`` (their raw values: a change takes effect at the
    next call), ``NCCL_MIN_BYTES[collective]``, and in host mode
    ``PYCCL_TUNING_FILE``. What it does not key on is read once per process
    or communicator anyway: the tuning table of a (device, world size, dtype),
    whether the group has NCCL, the nodes the communicator spans. A call that
    raises memoizes nothing."""

    __slots__ = ("from_group", "comm", "group", "algorithm", "forced", "nbytes", "tuned_plan", "spans_nodes",
                 "use_nccl", "nccl_here", "choice")

    def __init__(self, collective: str, tensor: torch.Tensor, group, comm: Optional[Communicator],
                 algorithm: Optional[str], gathers: bool = False) -> None:
        if not isinstance(tensor, torch.Tensor) or tensor.layout is not torch.strided:
            raise InvalidArgumentError(
                f"invalid argument 'tensor': expected a dense torch.Tensor, got "
                f"{tensor.layout if isinstance(tensor, torch.Tensor) else type(tensor).__name__}")
        device = tensor.device
        from_group = self.from_group = comm is None
        if from_group:
            comm = communicator_for(group, device)  # never a closed one
        elif not isinstance(comm, Communicator):
            raise InvalidArgumentError(f"invalid argument 'comm': expected a pyccl.Communicator, got "
                                       f"{type(comm).__name__}; a torch ProcessGroup goes in 'group'")
        elif comm._comm.closed:
            raise ClosedError(f"{collective}: communicator '{comm.name}' is closed")
        self.comm = comm
        self.group = group
        nbytes = tensor.numel() * tensor.element_size()
        if gathers:
            nbytes *= comm.world_size
        self.nbytes = nbytes
        if algorithm is not None and algorithm not in ALGORITHMS[collective]:
            _forced_algorithm(collective, algorithm)  # raises, naming the argument (and never an unhashable key)
        # Host mode looks a tuning table up only while PYCCL_TUNING_FILE is set (table_for).
        # (tensor.is_cuda: device.type makes a new string at every call.)
        tuning_file = None if tensor.is_cuda else _env.raw("PYCCL_TUNING_FILE")
        key = (collective, tensor.dtype, nbytes, device, algorithm, from_group, _env.raw("PYCCL_ALGO"),
               _nccl_min_sources(collective), tuning_file)
        choices = comm.__dict__.get("_call_choices")
        if choices is None:
            choices = comm.__dict__.setdefault("_call_choices", {})
        choice = choices.get(key)
        if choice is None:
            choice = self._choose(collective, tensor, group, comm, algorithm, device, nbytes)
            if len(choices) >= _CHOICES_KEPT:
                choices.clear()  # sizes seen in turn beyond the bound: start again rather than grow
            choices[key] = choice
        self.choice = choice
        self.algorithm, self.forced, self.tuned_plan = choice.algorithm, choice.forced, choice.tuned_plan
        self.spans_nodes, self.use_nccl, self.nccl_here = choice.spans_nodes, choice.use_nccl, choice.nccl_here

    def _choose(self, collective: str, tensor: torch.Tensor, group, comm: Communicator, algorithm: Optional[str],
                device: torch.device, nbytes: int) -> _Choice:
        """The choice, from the sources the memo keys on."""
        algorithm = _forced_algorithm(collective, algorithm)
        forced = algorithm is not None
        nccl_here = self.from_group and device.type == "cuda" and _group_has_nccl(comm, group)
        tuned_plan: Optional[dict] = None  # a table entry naming a library plan
        # The shipped tables are for ranks of one node.
        spans_nodes = collective in _ACROSS_NODES and across_nodes.node_layout(comm) is not None
        nccl_min_text = _env.get("PYCCL_NCCL_MIN_BYTES")
        if nccl_min_text:  # set, it turns the table off for every call: a bad value is named wherever it is
            _nccl_min_bytes_from(nccl_min_text, collective, None)
        if algorithm is None and not spans_nodes and not nccl_min_text:
            # The measured table for this GPU and world size, where there is one.
            entry = tuning.select_entry(table_for(device, comm.world_size, tensor.dtype), collective, nbytes)
            tuned = None if entry is None else entry["algorithm"]
            if tuned == "plan":
                tuned_plan = entry
            elif tuned is not None and (tuned != "nccl" or nccl_here):
                algorithm = tuned
        use_nccl = False
        if nccl_here:
            use_nccl = algorithm == "nccl" or (
                algorithm is None and tuned_plan is None
                and nbytes >= _nccl_min_bytes_from(nccl_min_text, collective, None))
        if algorithm == "nccl" and not use_nccl:
            raise InvalidArgumentError("invalid argument 'algorithm': 'nccl' needs a CUDA tensor and a torch "
                                       "group with an NCCL backend")
        return _Choice(algorithm, forced, tuned_plan, spans_nodes, use_nccl, nccl_here)

    def symmetric_algorithm(self, engine, tensor: torch.Tensor) -> str:
        """The all-reduce's choice where input and output lie in symmetric
        buffers (or are captured on graph buffers): memoized with the rest."""
        chosen = self.choice.symmetric
        if chosen is None:
            chosen = self.choice.symmetric = _symmetric_choice(self, engine, tensor)
        return chosen

    @property
    def kernel_algorithm(self) -> Optional[str]:
        return None if self.algorithm == "nccl" else self.algorithm


def _symmetric_choice(call: _Call, engine, tensor: torch.Tensor) -> str:
    """The automatic choice for an all-reduce whose input and output lie in
    symmetric buffers, where 2PA HB runs zero-copy: the table's
    ``all_reduce_symmetric`` entries where it has them, else zero-copy from the
    engine's threshold (and NCCL from PYCCL_NCCL_MIN_BYTES, if set)."""
    nbytes = call.nbytes
    chosen = None
    if not _env.get("PYCCL_NCCL_MIN_BYTES"):
        chosen = tuning.select(table_for(tensor.device, call.comm.world_size, tensor.dtype),
                               "all_reduce_symmetric", nbytes)
    elif call.nccl_here and nbytes >= _nccl_min_bytes("all_reduce"):
        chosen = "nccl"
    if chosen is None:
        chosen = "2pa_hb" if nbytes >= engine.zero_copy_threshold_bytes else engine.select(nbytes)
    if chosen == "nccl" and not call.nccl_here:
        chosen = "2pa_hb"
    return chosen


# From these sizes (bytes of the whole buffer) NCCL through the torch group is
# at least as fast as pyccl's kernels on 4 x H200 NVLink (benchmarks/RESULTS.md).
NCCL_MIN_BYTES = {
    "all_reduce": 16 << 20,
    "all_gather": 64 << 20,
    "reduce_scatter": 32 << 20,
    "all_to_all": 64 << 20,
    "broadcast": 4 << 20,
}


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
