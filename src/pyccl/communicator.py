"""The Python face of a pyccl communicator."""

from __future__ import annotations

import datetime
import itertools
import threading
import weakref
from typing import List, Optional, Sequence, Union

import torch
import torch.distributed as dist

from . import _C, calls
from ._logging import logger
from .across_nodes import layout_of
from .dispatch import new_engine, new_selector
from .errors import InvalidArgumentError, UnsupportedError

DeviceLike = Union[str, int, torch.device, None]

#: ProcessGroupNCCL's default timeout.
DEFAULT_TIMEOUT = datetime.timedelta(minutes=10)

# Per-store counters that name communicators created without a name. Every rank
# creates its communicators over one store in the same order, so the n-th one
# gets the same name everywhere (as torch names its process groups).
_name_lock = threading.Lock()
_name_counters: "weakref.WeakKeyDictionary[dist.Store, itertools.count]" = weakref.WeakKeyDictionary()


# The Python communicators over lanes of "pyccl" process groups (Communicator._adopt), by id of the lane's
# native communicator.
_adopted_lock = threading.Lock()
_adopted: "weakref.WeakValueDictionary[int, Communicator]" = weakref.WeakValueDictionary()


def _next_name(store: dist.Store) -> str:
    with _name_lock:
        counter = _name_counters.setdefault(store, itertools.count())
        return f"comm{next(counter)}"


def _parse_device(device: DeviceLike) -> int:
    """-1 for host mode, else the CUDA ordinal."""
    if device is None:
        return torch.cuda.current_device() if _C.cuda_built() and _C.device_count() > 0 else -1
    if isinstance(device, int):
        if device < 0:
            raise InvalidArgumentError(f"invalid argument 'device': {device} is negative")
        return device
    dev = torch.device(device)
    if dev.type == "cpu":
        return -1
    if dev.type != "cuda":
        raise InvalidArgumentError(
            f"invalid argument 'device': must be 'cpu' (host mode) or a CUDA device, got {device!r}"
        )
    return dev.index if dev.index is not None else torch.cuda.current_device()


class Communicator:
    """A communicator over ``world_size`` ranks, one per process and device.

    Collective: every rank calls it with the same ``store`` contents, ``world_size``
    and ``name``. ``device="cpu"`` selects host mode (shared host memory, CPU
    threads in place of kernels); a CUDA device selects GPU mode.

    Args:
        store: a ``torch.distributed.Store`` (e.g. the one ``init_process_group`` made).
        rank: this process's rank in ``[0, world_size)``.
        world_size: number of ranks.
        device: ``"cpu"``, ``"cuda:N"``, an ordinal, or None for the current CUDA
            device (host mode when there is none).
        name: namespace of the communicator's store keys, one communicator's per
            store (a name taken before raises ``InvalidArgumentError``); by default
            the n-th communicator created over ``store`` in this process is ``comm<n>``.
        timeout: bound of every wait (default: ProcessGroupNCCL's, 10 minutes).
        collectives: set the collectives' engine up now (default), else at the first collective.
        engine_options: ``pyccl._C.CollectiveEngine`` keywords that replace its settings (experiments and
            benchmarks; every rank passes the same).
    """

    # Every attribute is set by this class: other modules call its methods.
    __slots__ = ("_device", "_group_owned", "name", "_comm", "_world_size", "_engine", "_engine_options",
                 "_collectives_error", "_selector", "_runtime", "_engine_selectors", "_plan_runners", "_plans", "_nccl_direct",
                 "_nccl_direct_failed", "_nccl_direct_captured", "_node_layout", "__weakref__")

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        world_size: int,
        device: DeviceLike = None,
        name: Optional[str] = None,
        timeout: Union[datetime.timedelta, float] = DEFAULT_TIMEOUT,
        collectives: bool = True,
        engine_options: Optional[dict] = None,
    ) -> None:
        if not isinstance(store, dist.Store):
            raise InvalidArgumentError(
                f"invalid argument 'store': expected a torch.distributed.Store, got {type(store).__name__}"
            )
        for arg, value in (("rank", rank), ("world_size", world_size)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidArgumentError(f"invalid argument '{arg}': expected an int, got {value!r}")
        if isinstance(timeout, datetime.timedelta):
            timeout_ms = int(timeout.total_seconds() * 1000)
        else:
            timeout_ms = int(float(timeout) * 1000)
        if timeout_ms <= 0:
            raise InvalidArgumentError(f"invalid argument 'timeout': must be positive, got {timeout!r}")
        if name is not None and (not isinstance(name, str) or not name):
            raise InvalidArgumentError(f"invalid argument 'name': expected a non-empty string or None, got {name!r}")
        self._device = _parse_device(device)
        self._group_owned = False
        self.name = name if name is not None else _next_name(store)
        self._comm = _C.Communicator(store, rank, world_size, self._device, self.name, timeout_ms)
        self._world_size = world_size  # every collective call reads it: no call into the module
        logger.info("communicator %s: rank %d of %d on %s", self.name, rank, world_size, self.device)
        # The collectives' scratch is set up now, while no CUDA graph is being
        # captured, so that a graph may capture the very first collective.
        self._init_state()
        self._engine_options = dict(engine_options) if engine_options else None
        try:
            self._node_layout = layout_of(self.name, [r["node"] for r in self._comm.topology()["ranks"]])
            if collectives:
                try:
                    self._engine = new_engine(self._comm, self.device, world_size, self._engine_options)
                except UnsupportedError as e:  # e.g. peers on other nodes: channels still work
                    self._collectives_error = str(e)
            # What runs each collective call (csrc/dispatch/selector.hpp); it reads the environment now.
            self._run_on(self._engine, new_selector(self.device, world_size, self._node_layout is not None,
                                                    self._engine))
        except BaseException:  # e.g. ranks that disagree: no communicator, and nothing of it left open
            if self._engine is not None:
                self._engine.close()
            self._comm.close()
            raise

    def _init_state(self) -> None:
        """What the communicator's calls set up later, empty."""
        self._engine: Optional["_C.CollectiveEngine"] = None
        self._engine_options: Optional[dict] = None
        self._collectives_error: Optional[str] = None
        self._selector: Optional["_C.Selector"] = None
        self._runtime: Optional["_C.CallRuntime"] = None  # _run_on's
        self._engine_selectors: dict = {}  # _use_engine's, by id of the engine
        self._plan_runners: dict = {}  # pyccl.registry's runners, by their slot's key; closed with the communicator
        self._plans = _C.PlanRunners()  # their executors, for the C++ paths (the call runtime, torch.ops)
        self._nccl_direct = None  # the NCCL communicator pyccl calls directly for the group (calls.direct_nccl)
        self._nccl_direct_failed = False
        self._nccl_direct_captured = False

    @classmethod
    def _adopt(cls, native: "_C.Communicator", engine: Optional["_C.CollectiveEngine"] = None,
               selector: Optional["_C.Selector"] = None, plans: Optional["_C.PlanRunners"] = None) -> "Communicator":
        """A Python communicator over one made in C++: a lane of a "pyccl"
        process group, running on the lane's collective engine (None: the
        group's ranks span nodes, where the engine's kernels cannot run),
        choosing with the lane's selector, and keeping its plans in the lane's
        table (which the group's ops run them from). The group owns them:
        :meth:`close` releases only what was made through this object, and
        destroying the group closes the lane."""
        with _adopted_lock:
            self = _adopted.get(id(native))
            if self is not None and self._comm is native:  # one Python face per lane, whoever asks first
                if plans is not None and plans is not self._plans:
                    self._share_plans(plans)
                if self._selector is None:
                    self._run_on(engine, selector)
                    self._collectives_error = None if engine is not None else self._collectives_error
                return self
            self = cls.__new__(cls)
            self._init_state()
            self._device = native.device
            self.name = native.name
            self._comm = native
            self._world_size = native.world_size
            if plans is not None:
                self._plans = plans
            self._run_on(engine, selector)
            self._collectives_error = None if engine is not None else (
                "made by the torch backend without a collective engine (the group's ranks span nodes)")
            self._group_owned = True
            self._node_layout = layout_of(self.name, [r["node"] for r in native.topology()["ranks"]])
            _adopted[id(native)] = self  # holds `native` while it lives: the id stays its own
        return self

    # -- identity -----------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._comm.rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def device(self) -> torch.device:
        return torch.device("cpu") if self._device < 0 else torch.device("cuda", self._device)

    @property
    def host_mode(self) -> bool:
        return self._device < 0

    @property
    def timeout(self) -> datetime.timedelta:
        return datetime.timedelta(milliseconds=self._comm.timeout_ms)

    @property
    def closed(self) -> bool:
        return self._comm.closed

    def topology(self) -> dict:
        """Per rank: host, node, device, and whether this rank reaches it by P2P
        (established by a real write-and-check probe at creation)."""
        return self._comm.topology()

    def can_access_peer(self, peer: int) -> bool:
        return self._comm.can_access_peer(peer)

    # -- host-side collectives over the store --------------------------------
    def all_gather_bytes(self, data: bytes) -> list:
        return self._comm.all_gather_bytes(data)

    def barrier(self) -> None:
        self._comm.barrier()

    def send_bytes(self, peer: int, tag: int, data: bytes) -> None:
        self._comm.send_bytes(peer, tag, data)

    def recv_bytes(self, peer: int, tag: int) -> bytes:
        return self._comm.recv_bytes(peer, tag)

    # -- memory ---------------------------------------------------------------
    def register(self, tensor: torch.Tensor) -> "_C.RegisteredMemory":
        """Registers a contiguous tensor so peers can map it; holds a reference
        to the tensor until the registration is released or the communicator closes.

        On GPU, tensors from torch's allocator (cudaMalloc or expandable
        segments) and from :func:`pyccl.empty` can be registered; in host mode
        only tensors from ``pyccl.empty(..., device="cpu")``.
        """
        if not isinstance(tensor, torch.Tensor):
            raise InvalidArgumentError(
                f"invalid argument 'tensor': expected a torch.Tensor, got {type(tensor).__name__}"
            )
        return self._comm.register_tensor(tensor)

    def import_memory(self, descriptor: bytes) -> "_C.RegisteredMemory":
        """Maps memory a peer registered, from its ``serialize()`` bytes."""
        return self._comm.import_memory(descriptor)

    def exchange(self, memory: "_C.RegisteredMemory") -> list:
        """Collective: every rank's registration, mapped here, indexed by rank
        (None for ranks this rank cannot reach by P2P)."""
        return self._comm.exchange_memory(memory)

    def exchange_many(self, memories: Sequence["_C.RegisteredMemory"]) -> list:
        """Collective: :meth:`exchange` for several registrations in one round
        trip; entry i lists every rank's i-th registration. Every rank passes
        as many (else InvalidArgumentError on every rank, naming the counts)."""
        return self._comm.exchange_memories(list(memories))

    def tensor(self, memory: "_C.RegisteredMemory", dtype: torch.dtype,
               shape: Optional[Sequence[int]] = None) -> torch.Tensor:
        """A tensor viewing registered memory (a peer's mapping too) on this device."""
        return _C.tensor_of(memory, dtype, list(shape or []), self._device)

    # -- semaphores -------------------------------------------------------------
    def create_semaphore(self, peer: int) -> "_C.Semaphore":
        """Pairwise: this rank and ``peer`` both call it (in matching order)."""
        return self._comm.create_semaphore(peer)

    # -- channels ---------------------------------------------------------------
    def memory_channel(self, peer: int, memory: "_C.RegisteredMemory",
                       packets: Optional["_C.RegisteredMemory"] = None) -> "_C.MemoryChannel":
        """Pairwise: a load/store channel between ``memory`` (registered here)
        and the buffer ``peer`` passes. ``packets`` (registered here) is the
        buffer the peer's LL puts land in; both sides give one or neither."""
        return self._comm.create_memory_channel(peer, memory, packets)

    def port_channel(self, peer: int, memory: "_C.RegisteredMemory",
                     transport: str = "auto") -> "_C.PortChannel":
        """Pairwise: a proxy-driven channel between ``memory`` and the peer's
        buffer; ``transport`` is ``auto`` (``cuda_ipc`` on GPUs, ``host`` in host mode)."""
        return self._comm.create_port_channel(peer, memory, transport)

    def switch_channel(self, memory: "_C.RegisteredMemory") -> "_C.SwitchChannel":
        """Collective: NVLink SHARP multicast over ``memory`` (from :func:`pyccl.empty`)
        of every rank. Off unless ``PYCCL_ENABLE_NVLS=1``: raises UnsupportedError."""
        return self._comm.create_switch_channel(memory)

    def proxy_stats(self) -> dict:
        """The proxy's state: running, triggers executed and dropped, its error if it stopped."""
        return self._comm.proxy_stats()

    def device_error(self) -> Optional[dict]:
        """The first failure a device-side wait recorded, if any: status ("timeout" or
        "aborted"), peer, expected, observed, the call ("all_reduce call 12") and the list
        of peers waited on in vain."""
        return self._comm.device_error()

    def history(self) -> List[dict]:
        """The flight recorder: this communicator's last calls (``PYCCL_HISTORY_SIZE``, default 256),
        oldest first, each a dict of seq, op, bytes, dtype (None where the call moves bytes), algorithm,
        captured (into a CUDA graph), enqueued_us (system clock) and state: "enqueued", or, once a wait
        gave up, "failed", "before the failure" or "after the failure". A communicator that breaks logs
        the same list once."""
        return self._comm.history()

    @property
    def failure(self) -> Optional[str]:
        """Why the communicator is broken (the first failure), or None while it is healthy."""
        return self._comm.failure

    @property
    def sequence(self) -> int:
        """Calls started on this communicator so far (the last call's sequence number)."""
        return self._comm.sequence

    # -- lifetime -------------------------------------------------------------------
    def abort(self) -> None:
        """Breaks the communicator: every wait of it (host or device, this rank) gives up at
        once, and every later call raises. Safe from any thread; peers find out by timeout."""
        self._comm.abort()

    def all_reduce(self, tensor: torch.Tensor, op="sum", out: Optional[torch.Tensor] = None,
                   algorithm: Optional[str] = None) -> torch.Tensor:
        """All-reduces ``tensor`` over this communicator; see :func:`pyccl.all_reduce`."""
        return calls.all_reduce(self, None, False, tensor, op, out, algorithm)

    def all_gather(self, tensor: torch.Tensor, out: Optional[torch.Tensor] = None,
                   algorithm: Optional[str] = None) -> torch.Tensor:
        """See :func:`pyccl.all_gather`."""
        return calls.all_gather(self, None, False, tensor, out, algorithm)

    def reduce_scatter(self, tensor: torch.Tensor, op="sum", out: Optional[torch.Tensor] = None,
                       algorithm: Optional[str] = None) -> torch.Tensor:
        """See :func:`pyccl.reduce_scatter`."""
        return calls.reduce_scatter(self, None, False, tensor, op, out, algorithm)

    def all_to_all(self, tensor: torch.Tensor, out: Optional[torch.Tensor] = None,
                   algorithm: Optional[str] = None) -> torch.Tensor:
        """See :func:`pyccl.all_to_all`."""
        return calls.all_to_all(self, None, False, tensor, out, algorithm)

    def broadcast(self, tensor: torch.Tensor, src: int = 0, out: Optional[torch.Tensor] = None,
                  algorithm: Optional[str] = None) -> torch.Tensor:
        """See :func:`pyccl.broadcast`."""
        return calls.broadcast(self, None, False, tensor, src, out, algorithm)

    # -- what the calls set up ------------------------------------------------------
    def _collective_engine(self) -> "_C.CollectiveEngine":
        """The collectives' engine, set up at the first collective where the
        communicator was made with ``collectives=False``."""
        engine = self._engine
        if engine is None:
            if self._collectives_error is not None:
                raise UnsupportedError(self._collectives_error)
            if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise InvalidArgumentError(
                    f"communicator {self.name} was made with collectives=False and cannot set them up while a CUDA "
                    "graph is being captured; make it with collectives=True (the default) before capturing")
            # UnsupportedError where it cannot run
            engine = new_engine(self._comm, self.device, self.world_size, self._engine_options)
            self._use_engine(engine)
            logger.info("communicator %s: collective engine ready", self.name)
        return engine

    def _use_engine(self, engine: "_C.CollectiveEngine") -> None:
        """Runs the collectives on `engine` from now on (experiments with other
        engine settings), with a selector whose defaults are that engine's
        (made once per engine). The communicator closes the engine in use
        when it closes; the caller closes the others."""
        selector = self._engine_selectors.get(id(engine))
        if selector is None or selector[0] is not engine:
            selector = self._engine_selectors[id(engine)] = (
                engine, new_selector(self.device, self.world_size, self._node_layout is not None, engine))
        self._run_on(engine, selector[1])

    def _run_on(self, engine: Optional["_C.CollectiveEngine"], selector: Optional["_C.Selector"]) -> None:
        """Runs the collectives on `engine`, as `selector` chooses (either may
        be None: no engine, or not yet). The call runtime made of both runs
        a kernel choice in one call into C++ (pyccl.calls)."""
        self._engine, self._selector = engine, selector
        self._runtime = (_C.CallRuntime(self._comm, engine, selector, self._plans)
                         if engine is not None and selector is not None else None)

    def _share_plans(self, plans: "_C.PlanRunners") -> None:
        """Keeps the plans in `plans` (a lane's table) from now on, with those set up so far."""
        for key, runner in self._plan_runners.items():
            runner.keep_in(plans, key)
        self._plans = plans
        if self._runtime is not None:
            self._run_on(self._engine, self._selector)

    def _plan_runner(self, key: str):
        """The plan runner set up under the selector's slot `key`, or None."""
        return self._plan_runners.get(key)

    def _add_plan_runner(self, key: str, runner) -> None:
        """Keeps `runner` (a PlanRunner on this communicator) under the slot `key`, for every entry point: the
        Python path, and the C++ ones (the call runtime, torch.ops.pyccl's kernels) through the plan table."""
        self._plan_runners[key] = runner
        runner.keep_in(self._plans, key)

    def _has_direct_nccl(self) -> bool:
        return self._nccl_direct is not None

    def _direct_nccl(self, make):
        """The NCCL communicator pyccl calls directly for this communicator's
        group, made by `make` (collectively) at the first call; None where it
        cannot be made (logged once: the caller then hands calls to the
        group's backend)."""
        if self._nccl_direct is None and not self._nccl_direct_failed:
            try:
                self._nccl_direct = make()
            except (OSError, RuntimeError) as e:
                logger.warning("NCCL cannot be called directly (%s); out-of-place all-reduces handed to NCCL "
                               "copy and call the group's backend", e)
                self._nccl_direct_failed = True
        return self._nccl_direct

    def _nccl_captured(self) -> None:
        """A CUDA graph captured work on the direct NCCL communicator (see close)."""
        self._nccl_direct_captured = True

    def close(self) -> None:
        """Releases every registration, mapping, semaphore, fd and thread. Idempotent.

        A communicator of a "pyccl" process group (:func:`pyccl.communicator_for`)
        is the group's own runtime: this releases what was made through it (its
        plans, its direct NCCL communicator), and the group keeps running;
        ``dist.destroy_process_group`` closes the rest."""
        runners, self._plan_runners = self._plan_runners, {}
        self._plans.clear()
        self._engine_selectors = {}
        for runner in runners.values():  # pyccl.register_algorithm's and the tables' plans
            runner.close()
        engine = self._engine
        if engine is not None and not self._group_owned:
            engine.close()
            self._run_on(None, None)  # the selector holds the engine, for its defaults
        nccl = self._nccl_direct  # pyccl.collectives' NCCL hand-off
        if nccl is not None:
            if self._nccl_direct_captured:
                # ncclCommDestroy waits until every CUDA graph that captured work
                # on the communicator is destroyed, which may be never: leave it
                # to process exit rather than hang here.
                logger.info("communicator '%s': its direct NCCL communicator is left to process exit "
                            "(CUDA graphs captured work on it)", self.name)
            else:
                nccl.close()
            self._nccl_direct = None
        if not self._group_owned:
            self._comm.close()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return (f"<pyccl.Communicator {self.name} rank {self.rank}/{self.world_size} "
                f"on {self.device} ({state})>")
