"""pyccl inside vLLM: a device communicator and the general plugin that installs it.

Written for vLLM 0.26.0 (the release built against torch 2.11); the steps are
in ``examples/vllm/README.md``. Another vLLM version works as far as its
interfaces are the same; a warning names the versions when it is made.

vLLM builds one device communicator per process group, of the class its
platform names (``Platform.get_device_communicator_cls``), and sends the
tensor-parallel all-reduce, all-gather and reduce-scatter through it (inside
its own custom ops, so torch.compile and CUDA graphs see one opaque call).
:class:`PycclCudaCommunicator` is vLLM's ``CudaCommunicator`` with pyccl in
front: for the tensor-parallel group, a call that
:meth:`GroupCommunicator.should_use` accepts runs pyccl's kernels; the rest
(large messages, odd dtypes, non-contiguous tensors, send/recv) go to
``CudaCommunicator`` as before. pyccl is one of the custom all-reduces vLLM
chooses from, so ``--disable-custom-all-reduce`` turns it off too.

vLLM captures its CUDA graphs inside ``GroupCoordinator.graph_capture``, which
enters the device communicator's ``ca_comm.capture()``. The TP group's
``ca_comm`` is therefore a :class:`CustomAllreduceSlot`: vLLM's custom
all-reduce (or none) with :func:`pyccl.graph_capture` entered beside it, so the
all-reduces pyccl takes in those graphs run zero-copy on the graph's own
tensors where the size calls for it, as vLLM's custom all-reduce does.

Two ways to install it, in every vLLM process:

* the general plugin: pyccl's package declares the ``vllm.general_plugins``
  entry point ``pyccl``, which vLLM calls in every process it starts (the API
  server, the engine core, each worker); with ``PYCCL_VLLM=1`` in the
  environment, where vLLM's CUDA platform is the current one, it makes that
  platform name this communicator (:func:`patch`). A general plugin, unlike
  a platform plugin (vLLM activates at most one), leaves the platform vLLM
  chose alone;
* :func:`patch`, for processes you start yourself.

The classes derive from vLLM's, so they are made on first access (module
``__getattr__``): importing this module needs no vLLM, and vLLM finds
``pyccl.integrations.vllm.PycclCudaCommunicator`` by name as usual.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

from .. import _env
from .._logging import logger
from ..graphs import graph_capture
from .group import GroupCommunicator, warn_if_untested

__all__ = ["COMMUNICATOR_QUALNAME", "VLLM_VERSION", "CustomAllreduceSlot", "enabled", "general_plugin", "patch"]

#: The vLLM release this adapter is written and tested for.
VLLM_VERSION = "0.26.0"
COMMUNICATOR_QUALNAME = "pyccl.integrations.vllm.PycclCudaCommunicator"
#: The environment variable that turns the general plugin on.
ENABLE_ENV = "PYCCL_VLLM"

_made: dict = {}


def enabled() -> bool:
    """Whether ``PYCCL_VLLM`` asks for pyccl: ``1``, ``true``, ``yes`` or ``on`` (any case) do; unset, ``0``,
    ``false``, ``no`` and ``off`` do not; anything else raises InvalidArgumentError naming the variable."""
    return _env.flag(ENABLE_ENV, False)


def general_plugin() -> bool:
    """vLLM's ``vllm.general_plugins`` entry point, called by vLLM in every
    process it starts: with ``PYCCL_VLLM`` set and vLLM's CUDA platform the
    current one, :func:`patch`; otherwise nothing (vLLM then runs as without
    pyccl). Returns whether it patched (vLLM ignores the value). Safe to call
    more than once, as vLLM may."""
    if not enabled():
        return False
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        logger.info("%s is set, but vLLM's current platform is not CUDA: pyccl stays out", ENABLE_ENV)
        return False
    patch()
    return True


def patch() -> None:
    """Makes vLLM's CUDA platform name :class:`PycclCudaCommunicator` in this
    process (for processes you start yourself; vLLM's workers need the plugin)."""
    from vllm.platforms import cuda as vllm_cuda

    vllm_cuda.CudaPlatform.get_device_communicator_cls = classmethod(lambda cls: COMMUNICATOR_QUALNAME)
    logger.info("vLLM's CUDA platform now names %s", COMMUNICATOR_QUALNAME)


def _custom_all_reduce_enabled() -> bool:
    """vLLM's switch of its custom all-reduces (off with ``--disable-custom-all-reduce``), as it reads it when it
    builds a device communicator."""
    from vllm.distributed import parallel_state

    return bool(getattr(parallel_state, "_ENABLE_CUSTOM_ALL_REDUCE", True))


class CustomAllreduceSlot:
    """The TP communicator's ``ca_comm``: vLLM's custom all-reduce (``custom``,
    or None where vLLM made none) with pyccl's graph buffers beside it.

    ``capture()`` is what ``GroupCoordinator.graph_capture`` enters around the
    capture of vLLM's CUDA graphs: :func:`pyccl.graph_capture` on the group's
    communicator, then the custom all-reduce's own capture. Everything else is
    the custom all-reduce's (``disabled`` where there is none, so vLLM's
    dispatch passes over the slot).
    """

    def __init__(self, group: GroupCommunicator, custom: Optional[Any] = None) -> None:
        self.group = group
        self.custom = custom

    @property
    def disabled(self) -> bool:
        """Whether vLLM's dispatch skips the custom all-reduce (none, or its own ``disabled``)."""
        return self.custom is None or bool(self.custom.disabled)

    def should_custom_ar(self, inp: Any) -> bool:
        """The custom all-reduce's answer; False where there is none."""
        return self.custom is not None and self.custom.should_custom_ar(inp)

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        """Collective, around the capture of CUDA graphs: pyccl's all-reduces
        captured inside run on graph buffers (registered on exit, on every
        rank), and so do the custom all-reduce's."""
        pyccl_side = contextlib.nullcontext()
        if not self.group.disabled and not self.group.comm.closed:
            pyccl_side = graph_capture(comm=self.group.comm)
        with pyccl_side, (self.custom.capture() if self.custom is not None else contextlib.nullcontext()):
            yield

    def __getattr__(self, name: str) -> Any:
        custom = self.__dict__.get("custom")
        if custom is None:
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r} (vLLM made no custom all-reduce)")
        return getattr(custom, name)


def _make_communicator_cls() -> type:
    import vllm
    from vllm.distributed.device_communicators.cuda_communicator import CudaCommunicator

    warn_if_untested("vLLM", getattr(vllm, "__version__", "unknown"), VLLM_VERSION)

    class PycclCudaCommunicator(CudaCommunicator):
        """vLLM's CudaCommunicator with pyccl's collectives in front, for the
        tensor-parallel group (the groups whose unique name starts ``tp``)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.pyccl_comm: Optional[GroupCommunicator] = None
            is_tp = self.unique_name.split(":")[0] == "tp"
            if is_tp and self.world_size > 1 and not _custom_all_reduce_enabled():
                logger.info("vLLM's custom all-reduce is disabled (--disable-custom-all-reduce): pyccl stays out "
                            "of group %s", self.unique_name)
                is_tp = False
            if is_tp and self.world_size > 1:  # (a CPU device runs pyccl's host mode)
                self.pyccl_comm = GroupCommunicator(self.cpu_group, self.device, self.device_group)
                # vLLM's graph_capture enters ca_comm.capture(): pyccl's graph buffers come with it.
                self.ca_comm = CustomAllreduceSlot(self.pyccl_comm, getattr(self, "ca_comm", None))

        def _pyccl_for(self, tensor, collective: str) -> Optional[GroupCommunicator]:
            comm = self.pyccl_comm
            return comm if comm is not None and comm.should_use(tensor, collective) else None

        def all_reduce(self, input_):
            comm = self._pyccl_for(input_, "all_reduce")
            return comm.all_reduce(input_) if comm is not None else super().all_reduce(input_)

        def all_gather(self, input_, dim: int = -1):
            comm = self._pyccl_for(input_, "all_gather")
            return comm.all_gather(input_, dim) if comm is not None else super().all_gather(input_, dim)

        def reduce_scatter(self, input_, dim: int = -1):
            comm = self._pyccl_for(input_, "reduce_scatter")
            return comm.reduce_scatter(input_, dim) if comm is not None else super().reduce_scatter(input_, dim)

        def destroy(self):
            if self.pyccl_comm is not None:
                self.pyccl_comm.destroy()
                self.pyccl_comm = None
            super().destroy()

    PycclCudaCommunicator.__module__ = __name__
    return PycclCudaCommunicator


_MAKERS = {"PycclCudaCommunicator": _make_communicator_cls}


def __getattr__(name: str) -> type:
    maker = _MAKERS.get(name)
    if maker is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _made:
        _made[name] = maker()
    return _made[name]
