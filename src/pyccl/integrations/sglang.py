"""pyccl inside SGLang: the tensor-parallel GroupCoordinator's collectives through pyccl.

Written for SGLang 0.5.23 (the release built against torch 2.14); the steps
are in ``examples/sglang/README.md``. Another SGLang version works as far as
its interfaces are the same; a warning names the versions when the hooks go
in.

SGLang's ``GroupCoordinator`` picks an all-reduce per call from the
communicators it holds; the first it asks is the custom all-reduce,
``ca_comm`` (``disabled``, ``should_custom_ar``, ``custom_all_reduce``,
``capture``, and ``fused_allreduce_rmsnorm`` where the communicator has one).
:class:`PycclCustomAllreduce` fills that slot for the tensor-parallel group:
pyccl takes what :meth:`GroupCommunicator.should_use` accepts, and SGLang's
own custom all-reduce (kept inside it) or its later choices take the rest. The
group's ``all_gather``, ``reduce_scatter_along_dim``, ``all_gather_into_tensor``
and ``reduce_scatter_tensor`` go through pyccl the same way, outside
torch.compile tracing. So does SGLang's fused all-reduce +
residual add + RMSNorm, which on NVIDIA GPUs it sends to FlashInfer
(``flashinfer_allreduce_residual_rmsnorm``, with
``--enable-flashinfer-allreduce-fusion``): for the attention's tensor-parallel
group, messages up to 1 MiB run ``pyccl.fused_all_reduce_rmsnorm`` instead.

Two ways to install it, in every SGLang process:

* the general plugin: pyccl's package declares the ``sglang.srt.plugins``
  entry point ``pyccl``; with ``PYCCL_SGLANG=1`` it registers the hooks with
  SGLang's ``HookRegistry``, which SGLang applies in every process;
* :func:`patch`, for processes you start yourself (it patches the class).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Optional, Tuple

import torch

from .. import _env
from .._logging import logger
from ..graphs import graph_capture
from .group import GroupCommunicator, warn_if_untested

__all__ = ["PycclCustomAllreduce", "SGLANG_VERSION", "enabled", "install", "patch", "plugin"]

#: The SGLang release this adapter is written and tested for.
SGLANG_VERSION = "0.5.23"
#: The environment variable that turns the plugin on.
ENABLE_ENV = "PYCCL_SGLANG"
_COORDINATOR = "sglang.srt.distributed.parallel_state.GroupCoordinator"
_FUSION_MODULE = "sglang.srt.layers.flashinfer_comm_fusion"
_FUSION_FUNCTION = "flashinfer_allreduce_residual_rmsnorm"


def enabled() -> bool:
    """Whether ``PYCCL_SGLANG`` asks for pyccl: ``1``, ``true``, ``yes`` or ``on`` (any case) do; unset, ``0``,
    ``false``, ``no`` and ``off`` do not; anything else raises InvalidArgumentError naming the variable."""
    return _env.flag(ENABLE_ENV, False)


class PycclCustomAllreduce:
    """SGLang's custom all-reduce interface over pyccl, with the coordinator's
    previous ``ca_comm`` (if any) behind it for the calls pyccl leaves.

    Args:
        group: the pyccl side (a :class:`GroupCommunicator` of the group).
        previous: the ``ca_comm`` the coordinator had, or None.
    """

    def __init__(self, group: GroupCommunicator, previous: Optional[Any] = None) -> None:
        self.group = group
        self.previous = previous if previous is not None and not getattr(previous, "disabled", True) else None

    @property
    def disabled(self) -> bool:
        """True once closed, or when the group has a single rank."""
        return self.group.disabled and self.previous is None

    def _pyccl_takes(self, inp: torch.Tensor) -> bool:
        return self.group.should_use(inp, "all_reduce")

    def should_custom_ar(self, inp: torch.Tensor) -> bool:
        """Whether this slot takes the all-reduce of ``inp`` (pyccl's, or the previous custom one's)."""
        return self._pyccl_takes(inp) or (self.previous is not None and self.previous.should_custom_ar(inp))

    def custom_all_reduce(self, input: torch.Tensor) -> Optional[torch.Tensor]:  # noqa: A002 (SGLang's name)
        """The sum over the ranks in a new tensor, on the current stream (CUDA-graph capturable)."""
        if self._pyccl_takes(input):
            return self.group.all_reduce(input)
        return self.previous.custom_all_reduce(input) if self.previous is not None else None

    def fused_allreduce_rmsnorm(self, input_: torch.Tensor, residual_inp_: torch.Tensor, weight_: torch.Tensor,
                                eps: float) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """All-reduce + residual add + RMSNorm in one pyccl kernel: (normed, new residual), or None where
        pyccl does not take the call (SGLang then runs its unfused path)."""
        if not self.group.should_fuse(input_, residual_inp_, weight_):
            return None
        return self.group.fused_all_reduce_rmsnorm(input_, residual_inp_, weight_, eps)

    @contextlib.contextmanager
    def capture(self):
        """The coordinator's graph-capture context: pyccl's (:func:`pyccl.graph_capture`, so that captured
        all-reduces run zero-copy where the size calls for it) and the previous communicator's, if any."""
        with graph_capture(comm=self.group.comm):
            with (self.previous.capture() if self.previous is not None else contextlib.nullcontext()):
                yield

    def close(self) -> None:
        """Closes pyccl's communicator and the previous one; the slot is disabled after."""
        self.group.destroy()
        previous, self.previous = self.previous, None
        if previous is not None and hasattr(previous, "close"):
            previous.close()


def _pyccl_of(coordinator: Any) -> Optional[GroupCommunicator]:
    ca = getattr(coordinator, "ca_comm", None)
    return ca.group if isinstance(ca, PycclCustomAllreduce) else None


def install(coordinator: Any) -> bool:
    """Puts pyccl into ``coordinator`` (a GroupCoordinator) if it is a
    tensor-parallel group of 2+ ranks; returns whether it did (on a CPU
    device, pyccl runs in host mode).
    Collective: every rank of the group calls it at the same point."""
    name = str(getattr(coordinator, "unique_name", ""))
    device = getattr(coordinator, "device", None)
    if (name.split(":")[0] != "tp" or getattr(coordinator, "world_size", 1) < 2 or not isinstance(device, torch.device)
            or _pyccl_of(coordinator) is not None):
        return False
    group = GroupCommunicator(coordinator.cpu_group, device, coordinator.device_group)
    coordinator.ca_comm = PycclCustomAllreduce(group, getattr(coordinator, "ca_comm", None))
    logger.info("SGLang group %s: all-reduce, all-gather and reduce-scatter through pyccl", name)
    return True


def _after_init(result: Any, coordinator: Any, *args: Any, **kwargs: Any) -> None:
    install(coordinator)
    return None


def _around_all_gather(original, coordinator, input_, dim=-1, output_tensor_list=None):
    group = _pyccl_of(coordinator)
    if (group is not None and output_tensor_list is None and not torch.compiler.is_compiling()
            and group.should_use(input_, "all_gather")):
        return group.all_gather(input_, dim)
    return original(coordinator, input_, dim, output_tensor_list)


def _around_reduce_scatter(original, coordinator, input_, dim=-1):
    group = _pyccl_of(coordinator)
    if group is not None and not torch.compiler.is_compiling() and group.should_use(input_, "reduce_scatter"):
        return group.reduce_scatter(input_, dim)
    return original(coordinator, input_, dim)


def _into_tensor_group(coordinator, output, input_, collective: str) -> Optional[GroupCommunicator]:
    """pyccl's side of ``coordinator`` where it takes the ``*_into_tensor`` call of ``output`` and ``input_``
    (should_use on the input; an output of the input's dtype and device, contiguous, of the size the collective
    gives); else None."""
    group = _pyccl_of(coordinator)
    if group is None or torch.compiler.is_compiling() or not group.should_use(input_, collective):
        return None
    want = input_.numel() * group.world_size if collective == "all_gather" else input_.numel() // group.world_size
    if not (isinstance(output, torch.Tensor) and output.dtype == input_.dtype and output.device == input_.device
            and output.is_contiguous() and output.numel() == want
            and (collective == "all_gather" or input_.numel() % group.world_size == 0)):
        return None
    return group


def _into_tensor_hook(collective: str, run: str):
    """The around-hook of GroupCoordinator's ``<collective>`` into a tensor: GroupCommunicator.<run> where pyccl
    takes the call (_into_tensor_group), else SGLang's own method."""

    def hook(original, coordinator, output, input):  # noqa: A002 - SGLang's names
        group = _into_tensor_group(coordinator, output, input, collective)
        if group is None:
            return original(coordinator, output, input)
        getattr(group, run)(output, input)
        return None

    return hook


_around_all_gather_into_tensor = _into_tensor_hook("all_gather", "all_gather_into")
_around_reduce_scatter_tensor = _into_tensor_hook("reduce_scatter", "reduce_scatter_into")


def _fusion_group(use_attn_tp_group: bool, x, residual, weight) -> Optional[GroupCommunicator]:
    """pyccl's side of the TP group, where it reduces over the same ranks as
    the fusion would (the attention's TP group is the whole TP group) and
    takes these tensors; else None."""
    if not use_attn_tp_group or torch.compiler.is_compiling():
        return None
    from sglang.srt.distributed.parallel_state import get_tp_group
    from sglang.srt.runtime_context import get_parallel

    tp = get_tp_group()
    group = _pyccl_of(tp)
    if group is None or get_parallel().attn_tp_size != tp.world_size:
        return None
    return group if group.should_fuse(x, residual, weight) else None


def _around_fused_norm(original, input_tensor, residual, weight, eps=1e-6, max_token_num=2048, use_oneshot=None,
                       trigger_completion_at_end=False, fp32_acc=True, use_attn_tp_group=True):
    group = _fusion_group(use_attn_tp_group, input_tensor, residual, weight)
    if group is not None:
        return group.fused_all_reduce_rmsnorm(input_tensor, residual, weight, eps)
    return original(input_tensor, residual, weight, eps, max_token_num, use_oneshot, trigger_completion_at_end,
                    fp32_acc, use_attn_tp_group)


#: (owner: the GroupCoordinator class or a module, attribute, kind of hook, hook): what the plugin and patch() install.
HOOKS = (
    (_COORDINATOR, "__init__", "after", _after_init),
    (_COORDINATOR, "all_gather", "around", _around_all_gather),
    (_COORDINATOR, "reduce_scatter_along_dim", "around", _around_reduce_scatter),
    (_COORDINATOR, "all_gather_into_tensor", "around", _around_all_gather_into_tensor),
    (_COORDINATOR, "reduce_scatter_tensor", "around", _around_reduce_scatter_tensor),
    (_FUSION_MODULE, _FUSION_FUNCTION, "around", _around_fused_norm),
)


def _check_version() -> None:
    try:
        import sglang
    except ImportError:  # patch(coordinator_cls) on a class of your own, without SGLang
        return
    warn_if_untested("SGLang", getattr(sglang, "__version__", "unknown"), SGLANG_VERSION)


def plugin() -> None:
    """SGLang's ``sglang.srt.plugins`` entry point: with ``PYCCL_SGLANG`` set,
    registers :data:`HOOKS` with SGLang's HookRegistry (applied by SGLang in
    every process); otherwise does nothing."""
    if not enabled():
        return
    _check_version()
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for owner, attribute, kind, hook in HOOKS:
        HookRegistry.register(f"{owner}.{attribute}", hook, HookType[kind.upper()])
    logger.info("pyccl hooks registered for SGLang's GroupCoordinator")


def patch(coordinator_cls: Optional[type] = None) -> None:
    """Installs :data:`HOOKS` directly, for processes you start yourself:
    on SGLang's GroupCoordinator and module functions, or, given
    ``coordinator_cls``, only the coordinator's hooks on that class. Idempotent."""
    import importlib

    _check_version()
    only_coordinator = coordinator_cls is not None
    if coordinator_cls is None:
        from sglang.srt.distributed.parallel_state import GroupCoordinator as coordinator_cls
    for owner_name, attribute, kind, hook in HOOKS:
        if owner_name == _COORDINATOR:
            owner = coordinator_cls
        elif only_coordinator:
            continue
        else:
            owner = importlib.import_module(owner_name)
        original = getattr(owner, attribute)
        if not getattr(original, "_pyccl_hook", False):
            setattr(owner, attribute, _wrap(original, kind, hook))
    logger.info("pyccl patched into %s", coordinator_cls.__qualname__)


def _wrap(original, kind: str, hook):
    if kind == "after":
        @functools.wraps(original)
        def wrapped(*args, **kwargs):
            result = original(*args, **kwargs)
            hooked = hook(result, *args, **kwargs)
            return result if hooked is None else hooked
    else:
        @functools.wraps(original)
        def wrapped(*args, **kwargs):
            return hook(original, *args, **kwargs)
    wrapped._pyccl_hook = True
    return wrapped
