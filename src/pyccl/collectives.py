"""Collectives on torch tensors: ``pyccl.all_reduce``, ``all_gather``,
``reduce_scatter``, ``all_to_all`` and ``broadcast``.

Each call runs on the current CUDA stream (host mode: on CPU threads, and
returns when done) and can be captured in a CUDA graph. Every rank of the
group must make the same calls in the same order, as with NCCL. The first
collective on a communicator is itself collective: it allocates and maps the
scratch buffers.

    import torch.distributed as dist, pyccl
    dist.init_process_group("gloo")       # or nccl: pyccl only needs its store
    torch.cuda.set_device(rank)
    y = pyccl.all_reduce(x)               # x: float32/float16/bfloat16 on cuda
    g = pyccl.all_gather(x)               # any dtype; shape (world * x.shape[0], ...)

Tensors must be contiguous (a non-contiguous tensor raises; pass
``x.contiguous()``). Reductions take float32, float16 and bfloat16 (16-bit
values are reduced in fp32); data movement takes every dtype.
"""

from __future__ import annotations

import threading
import weakref
from typing import Dict, Optional, Tuple

import torch
import torch.distributed as dist

from . import _C, _env, across_nodes, registry, tuning
from ._logging import logger
from .communicator import Communicator
from .errors import ClosedError, InvalidArgumentError, UnsupportedError

__all__ = ["all_gather", "all_reduce", "all_to_all", "broadcast", "communicator_for", "reduce_scatter"]

_REDUCE_OPS = ("sum", "avg", "min", "max", "prod")
#: The dtypes the reducing collectives take (data movement takes any dtype).
REDUCIBLE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The algorithms each collective can be forced to (algorithm= or PYCCL_ALGO): those it can be tuned to.
ALGORITHMS: Dict[str, Tuple[str, ...]] = {c: tuning.CANDIDATES[c] for c in tuning.COLLECTIVES}
_lock = threading.Lock()
# (id(group), device) -> (a weak reference to the group, its communicator). The reference tells a live group
# from a new one that took a destroyed group's id.
_communicators: Dict[Tuple[int, torch.device], Tuple[weakref.ref, Communicator]] = {}


def _engine(comm: Communicator) -> "_C.CollectiveEngine":
    engine = getattr(comm, "_engine", None)
    if engine is None:
        if comm._collectives_error is not None:
            raise UnsupportedError(comm._collectives_error)
        if comm.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise InvalidArgumentError(
                f"communicator {comm.name} was made with collectives=False and cannot set them up while a CUDA "
                "graph is being captured; make it with collectives=True (the default) before capturing")
        engine = new_engine(comm._comm, comm.device, comm.world_size)  # UnsupportedError where it cannot run
        comm._engine = engine
        logger.info("communicator %s: collective engine ready", comm.name)
    return engine


def _op_name(op) -> str:
    if isinstance(op, str):
        name = op.lower()
    elif isinstance(op, dist.ReduceOp) or type(op).__name__ == "RedOpType":
        name = str(op).split(".")[-1].lower()
        name = {"product": "prod"}.get(name, name)
    else:
        raise InvalidArgumentError(f"invalid argument 'op': expected a string or torch.distributed.ReduceOp, got {op!r}")
    if name not in _REDUCE_OPS:
        raise InvalidArgumentError(f"invalid argument 'op': {op!r} is not one of {', '.join(_REDUCE_OPS)}")
    return name


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


def communicator_for(group: Optional[dist.ProcessGroup] = None, device: Optional[torch.device] = None) -> Communicator:
    """The pyccl communicator of a torch process group on ``device`` (made on
    first use, collectively, over the group's store). A group destroyed
    (``dist.destroy_process_group``) has its communicators closed when the
    next one is made, and a new group never gets them."""
    pg = group if group is not None else dist.group.WORLD  # None before init_process_group: never a key
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    key = (id(pg), device)
    # Every eager collective asks: a live communicator is read without the lock
    # (one dict read, atomic in CPython); making one takes it.
    entry = _communicators.get(key)
    # _comm.closed, the native flag: the property would add a call per collective.
    if entry is not None and entry[0]() is pg and not entry[1]._comm.closed:
        return entry[1]
    if not dist.is_initialized():
        raise InvalidArgumentError(
            "invalid argument 'group': torch.distributed is not initialized; call init_process_group "
            "first, or pass comm= (a pyccl.Communicator)")
    with _lock:
        entry = _communicators.get(key)
        if entry is not None and entry[0]() is pg and not entry[1].closed:
            return entry[1]
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise InvalidArgumentError(
                "invalid argument 'group': pyccl has no communicator for this group yet, and cannot make one "
                "while a CUDA graph is being captured; call pyccl.communicator_for(group) (or any pyccl "
                "collective) on the group once before capturing")
        _close_communicators_of_destroyed_groups()
        # The name must be the same on every rank (device indices differ).
        comm = Communicator(_group_store(group), dist.get_rank(pg), dist.get_world_size(pg), device=device,
                            name=f"pyccl_{pg.group_name}_{device.type}")
        _communicators[key] = (weakref.ref(pg), comm)
    return comm


def _close_communicators_of_destroyed_groups() -> None:
    """Closes and forgets the communicators of groups that are gone or
    destroyed; with _lock held. Every rank makes a group's communicators at
    the same calls, so they close theirs at the same point too (closing is
    local: it waits for this rank's kernels only)."""
    try:
        registered = dist.distributed_c10d._world.pg_map
    except AttributeError:  # a torch without the registry: only groups that are gone
        registered = None
    for key, (ref, comm) in list(_communicators.items()):
        pg = ref()
        if pg is not None and (registered is None or pg in registered) and not comm.closed:
            continue
        del _communicators[key]
        if not comm.closed:
            logger.info("communicator %s: closed, its torch process group was destroyed", comm.name)
            comm.close()


def _group_store(group: Optional[dist.ProcessGroup]):
    store = dist.distributed_c10d._get_default_store()
    if group is not None:
        store = dist.PrefixStore(f"pyccl/{dist.get_process_group_ranks(group)}", store)
    return store


_nccl_made: Dict[str, int] = {}


def _direct_nccl(comm: Communicator, group: Optional[dist.ProcessGroup], device: torch.device):
    """The NCCL communicator pyccl calls directly for `comm`'s group (as vLLM's
    pynccl does), made collectively on the first out-of-place hand-off and
    closed with `comm`. None while a CUDA graph is being captured before it
    exists (NCCL cannot be set up then) or where libnccl cannot be used: the
    caller then copies and calls the group's backend."""
    nccl = getattr(comm, "_nccl_direct", None)
    if nccl is not None or getattr(comm, "_nccl_direct_failed", False):
        return nccl
    if torch.cuda.is_current_stream_capturing():
        return None
    from ._nccl import NcclComm

    with _lock:
        # Every rank makes its communicators for a group in the same order: the
        # count makes each one's key new on the store.
        _nccl_made[comm.name] = _nccl_made.get(comm.name, 0) + 1
        key = f"pyccl_nccl_direct/{comm.name}/{_nccl_made[comm.name]}"
    try:
        nccl = NcclComm(_group_store(group), comm.rank, comm.world_size, device.index, key=key)
    except (OSError, RuntimeError) as e:
        logger.warning("NCCL cannot be called directly (%s); out-of-place all-reduces handed to NCCL "
                       "copy and call the group's backend", e)
        comm._nccl_direct_failed = True
        return None
    comm._nccl_direct = nccl
    return nccl


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


def new_engine(native: "_C.Communicator", device: torch.device, world: int) -> "_C.CollectiveEngine":
    """A collective engine for `native` whose own automatic choice (the one the
    fused all-reduce + RMSNorm and the symmetric fallback use) follows the
    tuning table's kernel entries where a table matches."""
    return _C.CollectiveEngine(native, kernel_choices=tuning.kernel_choices(table_for(device, world, torch.bfloat16)))


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
        if not isinstance(tensor, torch.Tensor):
            raise InvalidArgumentError(
                f"invalid argument 'tensor': expected a torch.Tensor, got {type(tensor).__name__}")
        device = tensor.device
        from_group = self.from_group = comm is None
        if from_group:
            comm = communicator_for(group, device)  # never a closed one
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


def _run_plan(call: _Call, collective: str, tensor: torch.Tensor, out: torch.Tensor, op: str = "sum") -> bool:
    """Runs the call with a DSL plan, if one applies (never when the call forces
    an algorithm): one from pyccl.register_algorithm first, else the library
    plan the tuning table names for this size. Where the plan cannot take the
    call (see pyccl.registry), the usual choice runs it."""
    if call.forced:
        return False
    runner = registry.find(collective, call.comm, call.nbytes, tensor)
    if runner is None and call.tuned_plan is not None:
        runner = registry.library_runner(call.comm, call.tuned_plan, collective, call.nbytes, tensor)
    if runner is None:
        return False
    if op == "avg":
        runner(tensor, out=out, op="sum")
        out.div_(call.comm.world_size)
    else:
        runner(tensor, out=out, op=op)
    return True


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


def all_reduce(tensor: torch.Tensor, op="sum", group: Optional[dist.ProcessGroup] = None,
               out: Optional[torch.Tensor] = None, *, comm: Optional[Communicator] = None,
               algorithm: Optional[str] = None) -> torch.Tensor:
    """All-reduces ``tensor`` over the ranks of ``group`` (or of ``comm``).

    Args:
        tensor: contiguous float32, float16 or bfloat16, on the communicator's device.
        op: "sum", "avg", "min", "max", "prod", or a ``torch.distributed.ReduceOp``.
        group: a torch process group (default: the world).
        out: where the result goes (may be ``tensor`` itself); a new tensor if None.
        comm: a pyccl Communicator to use instead of ``group``.
        algorithm: "1pa_ll", "2pa_ll", "1pa_hb", "2pa_hb" or "nccl" to force one (default: ``PYCCL_ALGO``,
            else by size on GPUs: the tuning table for the GPU and world size, or 1PA LL up to
            128 KiB, 2PA LL up to 1 MiB (2 ranks: 1PA HB up to 8 MiB), 2PA HB above, and from ``NCCL_MIN_BYTES`` (16 MiB;
            ``PYCCL_NCCL_MIN_BYTES``) the group's NCCL backend when it has one). When ``tensor``
            and ``out`` both lie in symmetric buffers (:func:`pyccl.symmetric_empty`), 2PA HB
            reads and writes the peers' buffers directly (no scratch), and is the default from
            the engine's ``zero_copy_threshold_bytes`` on. Captured in a CUDA graph inside
            :func:`pyccl.graph_capture`, plain tensors are chosen (and run) as symmetric buffers are.

    Returns the result tensor. 16-bit inputs are reduced in fp32; results are
    bitwise identical on every rank.
    """
    call = _Call("all_reduce", tensor, group, comm, algorithm)
    op_name = _op_name(op)
    if out is None:
        out = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    if _run_plan(call, "all_reduce", tensor, out, op_name):
        return out
    engine = getattr(call.comm, "_engine", None)
    # Symmetric buffers, and plain tensors captured on graph buffers (pyccl.graph_capture), are chosen alike. The
    # engine tells them apart at the launch, given their choice; only a choice that may leave the engine (NCCL
    # for one kind of call) is settled here, by asking.
    symmetric = None
    if not call.forced and engine is not None:
        symmetric = call.symmetric_algorithm(engine, tensor)
        if call.use_nccl or symmetric == "nccl":
            if ((engine.is_symmetric(tensor) and engine.is_symmetric(out))
                    or (engine.graph_capturing and tensor.is_cuda and torch.cuda.is_current_stream_capturing())):
                call.algorithm, call.use_nccl = symmetric, symmetric == "nccl"
            symmetric = None
    if call.use_nccl:
        # Large messages: NCCL's ring is faster than the 2PA kernel here (see
        # benchmarks/RESULTS.md), so hand them to NCCL: in place, the group's
        # backend; out of place, NCCL called directly (ProcessGroupNCCL would
        # need a copy first, 12% of the time at 256 MiB).
        in_place = out.data_ptr() == tensor.data_ptr()
        direct = None if in_place else _direct_nccl(call.comm, group, tensor.device)
        if direct is not None:
            if torch.cuda.is_current_stream_capturing():
                call.comm._nccl_direct_captured = True  # see Communicator.close
            direct.all_reduce(tensor, out, op_name)
            return out
        if not in_place:
            out.copy_(tensor)
        dist.all_reduce(out, op=_DIST_OPS[op_name], group=group)
        return out
    if call.spans_nodes and not call.forced:
        def nccl() -> None:
            out.copy_(tensor)
            dist.all_reduce(out, op=_DIST_OPS[op_name], group=group)

        across_nodes.run(call.comm, "all_reduce", tensor, out, op_name, nccl if call.nccl_here else None)
        return out
    _engine(call.comm).all_reduce(call.comm._comm, tensor, out, op_name, call.kernel_algorithm, symmetric)
    return out


def all_gather(tensor: torch.Tensor, group: Optional[dist.ProcessGroup] = None, out: Optional[torch.Tensor] = None,
               *, comm: Optional[Communicator] = None, algorithm: Optional[str] = None) -> torch.Tensor:
    """Gathers ``tensor`` from every rank, concatenated in rank order along dim 0
    (as ``torch.distributed.all_gather_into_tensor``).

    Args:
        tensor: contiguous, any dtype, on the communicator's device.
        out: world_size * tensor.numel() elements of the same dtype (any shape), or None
            for a new tensor of shape (world_size * tensor.shape[0], *tensor.shape[1:]).
            In place: ``tensor`` may be the rank's slice of ``out``.
        algorithm: "ll", "hb" or "nccl" (default: ``PYCCL_ALGO``, else by size).
    """
    call = _Call("all_gather", tensor, group, comm, algorithm, gathers=True)
    world = call.comm.world_size
    if out is None:
        shape = (world * tensor.shape[0], *tensor.shape[1:]) if tensor.dim() > 0 else (world,)
        out = torch.empty(shape, dtype=tensor.dtype, device=tensor.device)
    if _run_plan(call, "all_gather", tensor, out):
        return out
    if call.use_nccl:
        dist.all_gather_into_tensor(out, tensor, group=group)
        return out
    if call.spans_nodes and not call.forced:
        across_nodes.run(call.comm, "all_gather", tensor, out, fallback=(
            lambda: dist.all_gather_into_tensor(out, tensor, group=group)) if call.nccl_here else None)
        return out
    _engine(call.comm).all_gather(call.comm._comm, tensor, out, call.kernel_algorithm)
    return out


def reduce_scatter(tensor: torch.Tensor, op="sum", group: Optional[dist.ProcessGroup] = None,
                   out: Optional[torch.Tensor] = None, *, comm: Optional[Communicator] = None,
                   algorithm: Optional[str] = None) -> torch.Tensor:
    """Reduces ``tensor`` over the ranks and leaves rank r with the r-th of
    world_size equal parts (as ``torch.distributed.reduce_scatter_tensor``).

    Args:
        tensor: contiguous float32, float16 or bfloat16; numel a multiple of world_size.
        op: "sum", "avg", "min", "max", "prod", or a ``torch.distributed.ReduceOp``.
        out: tensor.numel() / world_size elements of the same dtype, or None for a new tensor
            (shape (tensor.shape[0] / world_size, ...) when dim 0 divides, else flat).
            In place: ``out`` may be this rank's part of ``tensor``.
        algorithm: "ll", "hb" or "nccl" (default: ``PYCCL_ALGO``, else by size).
    """
    call = _Call("reduce_scatter", tensor, group, comm, algorithm)
    op_name = _op_name(op)
    world = call.comm.world_size
    if tensor.numel() % world != 0:
        raise InvalidArgumentError(f"invalid argument 'tensor': {tensor.numel()} elements do not split into "
                                   f"{world} equal parts")
    if out is None:
        if tensor.dim() > 0 and tensor.shape[0] % world == 0:
            shape = (tensor.shape[0] // world, *tensor.shape[1:])
        else:
            shape = (tensor.numel() // world,)
        out = torch.empty(shape, dtype=tensor.dtype, device=tensor.device)
    if _run_plan(call, "reduce_scatter", tensor, out, op_name):
        return out
    if call.use_nccl:
        dist.reduce_scatter_tensor(out, tensor, op=_DIST_OPS[op_name], group=group)
        return out
    if call.spans_nodes and not call.forced:
        across_nodes.run(call.comm, "reduce_scatter", tensor, out, op_name, fallback=(
            lambda: dist.reduce_scatter_tensor(out, tensor, op=_DIST_OPS[op_name], group=group))
            if call.nccl_here else None)
        return out
    _engine(call.comm).reduce_scatter(call.comm._comm, tensor, out, op_name, call.kernel_algorithm)
    return out


def all_to_all(tensor: torch.Tensor, group: Optional[dist.ProcessGroup] = None, out: Optional[torch.Tensor] = None,
               *, comm: Optional[Communicator] = None, algorithm: Optional[str] = None) -> torch.Tensor:
    """Splits ``tensor`` into world_size equal parts, sends part q to rank q, and
    concatenates what each rank sent in rank order (as
    ``torch.distributed.all_to_all_single`` with equal splits).

    Args:
        tensor: contiguous, any dtype; numel a multiple of world_size.
        out: same numel and dtype (may be ``tensor`` itself), or None for a new tensor.
        algorithm: "ll", "hb" or "nccl" (default: ``PYCCL_ALGO``, else by size).
    """
    call = _Call("all_to_all", tensor, group, comm, algorithm)
    if out is None:
        out = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    if _run_plan(call, "all_to_all", tensor, out):
        return out
    if call.use_nccl:
        if out.data_ptr() == tensor.data_ptr():
            tensor = tensor.clone()
        dist.all_to_all_single(out, tensor, group=group)
        return out
    _engine(call.comm).all_to_all(call.comm._comm, tensor, out, call.kernel_algorithm)
    return out


def broadcast(tensor: torch.Tensor, src: int = 0, group: Optional[dist.ProcessGroup] = None,
              out: Optional[torch.Tensor] = None, *, comm: Optional[Communicator] = None,
              algorithm: Optional[str] = None) -> torch.Tensor:
    """Copies ``tensor`` of rank ``src`` (a rank of the group) to every rank.

    Args:
        tensor: contiguous, any dtype; the source on ``src``, same shape elsewhere.
        out: where the result goes (``tensor`` itself for the in-place form of
            ``torch.distributed.broadcast``), or None for a new tensor.
        algorithm: "ll", "hb" or "nccl" (default: ``PYCCL_ALGO``, else by size).
    """
    call = _Call("broadcast", tensor, group, comm, algorithm)
    if not isinstance(src, int) or not 0 <= src < call.comm.world_size:
        raise InvalidArgumentError(f"invalid argument 'src': must be a rank of the group (0 to "
                                   f"{call.comm.world_size - 1}), got {src!r}")
    if out is None:
        out = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    if call.use_nccl:
        if call.comm.rank == src and out.data_ptr() != tensor.data_ptr():
            out.copy_(tensor)
        pg = group if group is not None else dist.group.WORLD
        dist.broadcast(out, src=dist.get_global_rank(pg, src), group=group)
        return out
    _engine(call.comm).broadcast(call.comm._comm, tensor, out, src, call.kernel_algorithm)
    return out


_DIST_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "min": dist.ReduceOp.MIN,
             "max": dist.ReduceOp.MAX, "prod": dist.ReduceOp.PRODUCT}


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
