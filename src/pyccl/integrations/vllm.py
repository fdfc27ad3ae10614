"""pyccl inside vLLM: a device communicator and the platform plugin that installs it.

Written for vLLM 0.26.0 (the release built against torch 2.11); the steps are
in ``examples/vllm/README.md``.

vLLM builds one device communicator per process group, of the class its
platform names (``Platform.get_device_communicator_cls``), and sends the
tensor-parallel all-reduce, all-gather and reduce-scatter through it (inside
its own custom ops, so torch.compile and CUDA graphs see one opaque call).
:class:`PycclCudaCommunicator` is vLLM's ``CudaCommunicator`` with pyccl in
front: for the tensor-parallel group, a call that
:meth:`GroupCommunicator.should_use` accepts runs pyccl's kernels; the rest
(large messages, odd dtypes, non-contiguous tensors, send/recv) go to
``CudaCommunicator`` as before.

vLLM captures its CUDA graphs inside ``GroupCoordinator.graph_capture``, which
enters the device communicator's ``ca_comm.capture()``. The TP group's
``ca_comm`` is therefore a :class:`CustomAllreduceSlot`: vLLM's custom
all-reduce (or none) with :func:`pyccl.graph_capture` entered beside it, so the
all-reduces pyccl takes in those graphs run zero-copy on the graph's own
tensors where the size calls for it, as vLLM's custom all-reduce does.

Two ways to install it, in every vLLM process:

* the platform plugin: pyccl's package declares the ``vllm.platform_plugins``
  entry point ``pyccl``; with ``PYCCL_VLLM=1`` in the environment it
  activates :class:`PycclCudaPlatform` (vLLM's CUDA platform naming this
  communicator) wherever vLLM's own CUDA platform would be active;
* :func:`patch`, for processes you start yourself: it makes vLLM's CUDA
  platform name this communicator.

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
from .group import GroupCommunicator

__all__ = ["COMMUNICATOR_QUALNAME", "PLATFORM_QUALNAME", "VLLM_VERSION", "CustomAllreduceSlot", "enabled", "patch",
           "platform_plugin"]

#: The vLLM release this adapter is written and tested for.
VLLM_VERSION = "0.26.0"
COMMUNICATOR_QUALNAME = "pyccl.integrations.vllm.PycclCudaCommunicator"
PLATFORM_QUALNAME = "pyccl.integrations.vllm.PycclCudaPlatform"
#: The environment variable that turns the platform plugin on.
ENABLE_ENV = "PYCCL_VLLM"

_made: dict = {}


def enabled() -> bool:
    """Whether ``PYCCL_VLLM`` asks for pyccl: ``1``, ``true``, ``yes`` or ``on`` (any case) do; unset, ``0``,
    ``false``, ``no`` and ``off`` do not; anything else raises InvalidArgumentError naming the variable."""
    return _env.flag(ENABLE_ENV, False)


def platform_plugin() -> Optional[str]:
    """vLLM's ``vllm.platform_plugins`` entry point: the qualified name of
    :class:`PycclCudaPlatform` when ``PYCCL_VLLM`` is set and vLLM's own CUDA
    platform would be active (its detection, through NVML, initializes no CUDA
    context), else None (vLLM then picks its platform as without pyccl)."""
    if not enabled():
        return None
    from vllm.platforms import cuda_platform_plugin

    if cuda_platform_plugin() is None:
        logger.info("%s is set, but vLLM's CUDA platform is not active here: pyccl stays out", ENABLE_ENV)
        return None
    return PLATFORM_QUALNAME


def patch() -> None:
    """Makes vLLM's CUDA platform name :class:`PycclCudaCommunicator` in this
    process (for processes you start yourself; vLLM's workers need the plugin)."""
    from vllm.platforms import cuda as vllm_cuda

    vllm_cuda.CudaPlatform.get_device_communicator_cls = classmethod(lambda cls: COMMUNICATOR_QUALNAME)
    logger.info("vLLM's CUDA platform now names %s", COMMUNICATOR_QUALNAME)


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
    from vllm.distributed.device_communicators.cuda_communicator import CudaCommunicator

    class PycclCudaCommunicator(CudaCommunicator):
        """vLLM's CudaCommunicator with pyccl's collectives in front, for the
        tensor-parallel group (the groups whose unique name starts ``tp``)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.pyccl_comm: Optional[GroupCommunicator] = None
            is_tp = self.unique_name.split(":")[0] == "tp"
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


def _make_platform_cls() -> type:
    from vllm.platforms.cuda import CudaPlatform

    class PycclCudaPlatform(CudaPlatform):
        """vLLM's CUDA platform, naming pyccl's device communicator."""

        @classmethod
        def get_device_communicator_cls(cls) -> str:
            return COMMUNICATOR_QUALNAME

    PycclCudaPlatform.__module__ = __name__
    return PycclCudaPlatform


_MAKERS = {"PycclCudaCommunicator": _make_communicator_cls, "PycclCudaPlatform": _make_platform_cls}


def __getattr__(name: str) -> type:
    maker = _MAKERS.get(name)
    if maker is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _made:
        _made[name] = maker()
    return _made[name]
