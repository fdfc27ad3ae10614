"""pyccl inside vLLM: a device communicator and the general plugin that installs it.

Written for vLLM 0.33.0 (the release built against torch 2.14); the steps are
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

The all-reduce + residual add + RMSNorm that ends each row-parallel layer
is fused where vLLM's compiler leaves it unfused. vLLM compiles the model's
graph with a pass manager of its own; ``patch`` adds
:class:`PycclAllReduceRMSNormPass` to it, right after the place of vLLM's own
all-reduce fusion pass (FlashInfer's, where vLLM enables it). Where that pass
fused the pattern, pyccl's finds nothing left; elsewhere (FlashInfer absent or
off, compile ranges it does not cover) it replaces the pair
``tensor_model_parallel_all_reduce`` + ``vllm_ir.fused_add_rms_norm`` (or
``rms_norm``, first layer) by the op
``pyccl_vllm.all_reduce_fused_add_rms_norm``. That op runs
``pyccl.fused_all_reduce_rmsnorm`` where the group's
:meth:`GroupCommunicator.should_use` takes the call and vLLM's own all-reduce
and norm otherwise, so it never raises for a call vLLM could run.

The classes derive from vLLM's, so they are made on first access (module
``__getattr__``): importing this module needs no vLLM, and vLLM finds
``pyccl.integrations.vllm.PycclCudaCommunicator`` by name as usual.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional, Tuple

import torch

from .. import _env
from .._logging import logger
from ..graphs import graph_capture
from .group import GroupCommunicator, warn_if_untested

__all__ = ["COMMUNICATOR_QUALNAME", "FUSED_OP", "VLLM_VERSION", "CustomAllreduceSlot", "enabled", "general_plugin",
           "patch"]

#: The vLLM release this adapter is written and tested for.
VLLM_VERSION = "0.33.0"
COMMUNICATOR_QUALNAME = "pyccl.integrations.vllm.PycclCudaCommunicator"
#: The environment variable that turns the general plugin on.
ENABLE_ENV = "PYCCL_VLLM"
#: The op that PycclAllReduceRMSNormPass puts in vLLM's graphs: (input, residual, weight, epsilon, group_name) ->
#: (normed, new residual), vLLM's group by its unique name.
FUSED_OP = "pyccl_vllm::all_reduce_fused_add_rms_norm"
#: The epsilons the pass matches (vLLM's own all-reduce fusion matches the same two).
FUSED_EPSILONS = (1e-5, 1e-6)

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
    process, and vLLM's compiler add :class:`PycclAllReduceRMSNormPass` (for
    processes you start yourself; vLLM's workers need the plugin)."""
    from vllm.platforms import cuda as vllm_cuda

    vllm_cuda.CudaPlatform.get_device_communicator_cls = classmethod(lambda cls: COMMUNICATOR_QUALNAME)
    logger.info("vLLM's CUDA platform now names %s", COMMUNICATOR_QUALNAME)
    patch_compiler()


def patch_compiler() -> None:
    """Makes vLLM's post-grad pass manager (``PostGradPassManager.configure``) add
    :class:`PycclAllReduceRMSNormPass` where the tensor-parallel group runs pyccl; idempotent."""
    from vllm.compilation.passes.pass_manager import PostGradPassManager

    configure = PostGradPassManager.configure
    if getattr(configure, "_pyccl", False):
        return

    def configure_with_pyccl(self, config) -> None:
        configure(self, config)
        if _tp_pyccl_group() is not None:
            fusion_pass = __getattr__("PycclAllReduceRMSNormPass")(config)
            self.passes.insert(fusion_pass_position(self.passes), fusion_pass)

    configure_with_pyccl._pyccl = True
    PostGradPassManager.configure = configure_with_pyccl
    logger.info("vLLM's compiler now fuses the tensor-parallel all-reduce + RMSNorm with pyccl where it "
                "leaves them unfused")


#: vLLM's passes that run before its all-reduce fusion (PostGradPassManager.configure).
_PASSES_BEFORE_FUSION = ("NoOpEliminationPass", "AddRMSNormFusionPass", "RocmAiterTritonAddRMSNormPadFusionPass")
#: vLLM's own all-reduce + RMSNorm fusion passes.
_VLLM_FUSION_PASSES = ("AllReduceFusionPass", "RocmAiterAllReduceFusionPass")


def fusion_pass_position(passes: list) -> int:
    """Where pyccl's fusion pass goes in vLLM's list of post-grad passes: right after vLLM's own all-reduce
    fusion, so that where vLLM fuses, vLLM's fusion stands; else where that pass would be, before the passes
    that fuse the norm with what follows it (quantization, reshapes)."""
    names = [type(p).__name__ for p in passes]
    for i in range(len(names) - 1, -1, -1):
        if names[i] in _VLLM_FUSION_PASSES:
            return i + 1
    position = 0
    while position < len(names) and names[position] in _PASSES_BEFORE_FUSION:
        position += 1
    return position


def _tp_pyccl_group() -> Optional[GroupCommunicator]:
    """The tensor-parallel group's pyccl communicator in this process, where vLLM's TP group has one."""
    from vllm.distributed import parallel_state

    tp = getattr(parallel_state, "_TP", None)
    device_comm = getattr(tp, "device_communicator", None) if tp is not None else None
    group = getattr(device_comm, "pyccl_comm", None)
    return group if group is not None and not group.disabled else None


def _register_fused_op() -> None:
    """Defines FUSED_OP (once per process): pyccl's fused kernel where the group's communicator takes the call,
    vLLM's all-reduce then its fused_add_rms_norm otherwise."""
    if _made.get("fused_op"):
        return
    import vllm.ir.ops
    from vllm.distributed import parallel_state

    @torch.library.custom_op(FUSED_OP, mutates_args=())
    def all_reduce_fused_add_rms_norm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                                      epsilon: float, group_name: str) -> Tuple[torch.Tensor, torch.Tensor]:
        coordinator = parallel_state._groups[group_name]()
        if coordinator is None:
            raise ValueError(f"{FUSED_OP}: vLLM's group {group_name!r} has been destroyed")
        group = getattr(coordinator.device_communicator, "pyccl_comm", None)
        if group is not None and group.should_fuse(input, residual, weight):
            return group.fused_all_reduce_rmsnorm(input, residual, weight, epsilon)
        reduced = coordinator.device_communicator.all_reduce(input)
        normed, new_residual = vllm.ir.ops.fused_add_rms_norm(reduced, residual, weight, epsilon)
        return normed, new_residual

    @all_reduce_fused_add_rms_norm.register_fake
    def _(input, residual, weight, epsilon, group_name):
        return torch.empty_like(input), torch.empty_like(residual)

    _made["fused_op"] = True


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


def _make_fusion_pass_cls() -> type:
    import torch._inductor.pattern_matcher as pm
    import vllm.ir.ops
    from vllm.compilation.passes.inductor_pass import enable_fake_mode
    from vllm.compilation.passes.vllm_inductor_pass import VllmInductorPass, VllmPatternMatcherPass
    from vllm.distributed import get_tp_group, tensor_model_parallel_all_reduce

    _register_fused_op()
    fused = getattr(torch.ops.pyccl_vllm, FUSED_OP.split("::")[1]).default

    def _norm_has_a_weight(match) -> bool:
        """The matched norm has a weight tensor (vLLM's norms also take none, which pyccl's op does not)."""
        for node in match.nodes:
            if node.target == torch.ops.vllm_ir.fused_add_rms_norm.default:
                return isinstance(node.args[2], torch.fx.Node)
            if node.target == torch.ops.vllm_ir.rms_norm.default:
                return isinstance(node.args[1], torch.fx.Node)
        return True

    def _patterns(eps: float, group_name: str):
        """The patterns of one epsilon: all-reduce + fused_add_rms_norm (both results, or the normed rows
        alone), all-reduce + rms_norm."""

        def add_pattern(residual, input, weight):
            reduced = tensor_model_parallel_all_reduce(input)
            return vllm.ir.ops.fused_add_rms_norm(reduced, residual, weight, eps)

        def add_replacement(residual, input, weight):
            normed, new_residual = fused(input, residual, weight, eps, group_name)
            return normed, new_residual

        def add_pattern_normed(residual, input, weight):
            return add_pattern(residual, input, weight)[0]

        def add_replacement_normed(residual, input, weight):
            return add_replacement(residual, input, weight)[0]

        def norm_pattern(input, weight):
            reduced = tensor_model_parallel_all_reduce(input)
            return vllm.ir.ops.rms_norm(reduced, weight, eps), reduced

        def norm_replacement(input, weight):
            normed, reduced = fused(input, torch.zeros_like(input), weight, eps, group_name)
            return normed, reduced

        # (pattern, replacement, shapes of the example inputs)
        return [(add_pattern, add_replacement, ((5, 16), (5, 16), (16,))),
                # the same where only the normed rows are used (the graph's last layer)
                (add_pattern_normed, add_replacement_normed, ((5, 16), (5, 16), (16,))),
                (norm_pattern, norm_replacement, ((5, 16), (16,)))]

    class PycclAllReduceRMSNormPass(VllmPatternMatcherPass):
        """vLLM post-grad pass: the tensor-parallel all-reduce followed by vLLM's
        ``fused_add_rms_norm`` (or ``rms_norm``, with a zero residual) becomes
        one FUSED_OP call, for the epsilons in FUSED_EPSILONS."""

        def __init__(self, config) -> None:
            super().__init__(config)
            self.patterns = pm.PatternMatcherPass(pass_name="pyccl_all_reduce_rms_norm_pass")
            self.group_name = get_tp_group().unique_name
            self.register_patterns()

        @enable_fake_mode
        def register_patterns(self) -> None:
            dtype = self.model_dtype or torch.bfloat16

            def empty(*shape):
                return torch.empty(*shape, dtype=dtype, device=self.device)

            for eps in FUSED_EPSILONS:
                # Inductor traces every parameter of a pattern as an input: eps is closed over, not a default.
                for pattern, replacement, shapes in _patterns(eps, self.group_name):
                    pm.register_replacement(pattern, replacement, [empty(*shape) for shape in shapes], pm.fwd_only,
                                            self.patterns, extra_check=_norm_has_a_weight)
                # Inductor remembers patterns by their code: the next epsilon's would be skipped as seen.
                pm._seen_patterns.clear()

        @VllmInductorPass.time_and_log
        def __call__(self, graph) -> None:
            self.matched_count = self.patterns.apply(graph)
            logger.debug("pyccl's all-reduce + RMSNorm fusion replaced %d patterns", self.matched_count)

    PycclAllReduceRMSNormPass.__module__ = __name__
    return PycclAllReduceRMSNormPass


_MAKERS = {"PycclCudaCommunicator": _make_communicator_cls, "PycclAllReduceRMSNormPass": _make_fusion_pass_cls}


def __getattr__(name: str) -> type:
    maker = _MAKERS.get(name)
    if maker is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _made:
        _made[name] = maker()
    return _made[name]
