"""pyccl.integrations.vllm against the installed vLLM, on CPUs: run with the
Python of .venv-engines/vllm (tests/integrations/test_engine_interfaces.py does). Prints
one JSON object: what is wrong ("problems"), and the per-rank results of
vLLM's real CudaCommunicator with pyccl in front, in pyccl's host mode."""

import inspect
import os

import torch
import torch.distributed as dist

import engine_check
from engine_check import params


def interface_problems() -> list:
    import vllm
    from vllm.distributed.device_communicators.base_device_communicator import DeviceCommunicatorBase
    from vllm.distributed.device_communicators.cuda_communicator import CudaCommunicator
    from vllm.distributed.parallel_state import GroupCoordinator
    from vllm.platforms import interface
    from vllm.plugins import load_plugins_by_group

    import pyccl.integrations.vllm as pv
    from pyccl.integrations.group import GroupCommunicator

    problems = []
    if vllm.__version__ != pv.VLLM_VERSION:
        problems.append(f"vLLM {vllm.__version__} installed, the adapter is for {pv.VLLM_VERSION}")
    ours = pv.PycclCudaCommunicator
    if not issubclass(ours, CudaCommunicator):
        problems.append("PycclCudaCommunicator does not derive from vLLM's CudaCommunicator")
    for name in ("all_reduce", "all_gather", "reduce_scatter", "destroy"):
        if params(getattr(ours, name)) != params(getattr(CudaCommunicator, name)):
            problems.append(f"{name}: ours takes {params(getattr(ours, name))}, "
                            f"CudaCommunicator's {params(getattr(CudaCommunicator, name))}")
    # The engine-neutral class takes what vLLM's interface passes (self aside).
    for name in ("all_reduce", "all_gather", "reduce_scatter", "send", "recv", "destroy"):
        theirs, mine = params(getattr(DeviceCommunicatorBase, name))[1:], params(getattr(GroupCommunicator, name))[1:]
        if theirs != mine:
            problems.append(f"GroupCommunicator.{name} takes {mine}, DeviceCommunicatorBase.{name} {theirs}")
    init = inspect.signature(CudaCommunicator.__init__).parameters
    for arg in ("cpu_group", "device", "device_group", "unique_name"):
        if arg not in init:
            problems.append(f"CudaCommunicator.__init__ has no '{arg}'")
    src = inspect.getsource(GroupCoordinator.__init__)
    if "get_device_communicator_cls()" not in src or "device_comm_cls(" not in src:
        problems.append("GroupCoordinator no longer builds the platform's device communicator class")
    # pyccl's graph buffers come in through the communicator's ca_comm.capture().
    src = inspect.getsource(GroupCoordinator.graph_capture)
    if "device_communicator.ca_comm" not in src or "ca_comm.capture()" not in src:
        problems.append("GroupCoordinator.graph_capture no longer enters the device communicator's ca_comm.capture()")
    if not isinstance(inspect.getattr_static(interface.Platform, "get_device_communicator_cls"), classmethod):
        problems.append("Platform.get_device_communicator_cls is no longer a classmethod")
    found = load_plugins_by_group("vllm.general_plugins")
    if found.get("pyccl") is not pv.general_plugin:
        problems.append(f"vLLM's plugin loader does not find pyccl's general plugin: {sorted(found)}")
    if "pyccl" in load_plugins_by_group("vllm.platform_plugins"):
        problems.append("pyccl still declares a platform plugin (vLLM activates only one)")
    # No GPU here: with PYCCL_VLLM set, the plugin still stays out (vLLM's current platform is not CUDA).
    os.environ[pv.ENABLE_ENV] = "1"
    if pv.general_plugin() is not False:
        problems.append("the general plugin patched vLLM without its CUDA platform")
    # --disable-custom-all-reduce reaches the communicator through this switch.
    from vllm.distributed import parallel_state

    if not hasattr(parallel_state, "_ENABLE_CUSTOM_ALL_REDUCE") or not hasattr(parallel_state,
                                                                            "set_custom_all_reduce"):
        problems.append("vLLM's parallel_state has no _ENABLE_CUSTOM_ALL_REDUCE / set_custom_all_reduce")
    return problems


def communicator_rank(rank: int, world: int, store, seed: int) -> dict:
    """vLLM's CudaCommunicator with pyccl in front, on CPU: pyccl (host mode)
    for what should_use accepts, vLLM's path (gloo here) for the rest."""
    import pyccl.integrations.vllm as pv
    from ranks_integrations import _close, _inputs

    # No GPU: vLLM's NCCL wrapper must find no libnccl (as on a machine without NCCL) and disable itself.
    os.environ["VLLM_NCCL_SO_PATH"] = "/nonexistent/libnccl.so.2"
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    group = dist.new_group(list(range(world)), backend="gloo")
    comm = pv.PycclCudaCommunicator(cpu_group=group, device=torch.device("cpu"), device_group=group,
                                    unique_name="tp:0")
    res = {"has_pyccl": comm.pyccl_comm is not None, "bad": []}
    res["slot"] = type(comm.ca_comm).__name__
    with comm.ca_comm.capture():  # as GroupCoordinator.graph_capture enters it (host mode: nothing to capture)
        pass
    comm.pyccl_comm._max_bytes = 8 << 10  # both routes at small sizes
    for label, shape in (("pyccl", (4, 64)), ("vllm", (64, 96))):
        xs = _inputs(seed, len(label), world, shape, torch.float32)
        mine = xs[rank]
        res[label + "_routed_to_pyccl"] = comm.pyccl_comm.should_use(mine)
        exact = torch.stack([x.double() for x in xs]).sum(0)
        scale = torch.stack([x.double().abs() for x in xs]).sum(0)
        if not _close(comm.all_reduce(mine), exact, scale, torch.float32):
            res["bad"].append(f"all_reduce {label}")
        if label == "pyccl":  # vLLM's own all-gather/reduce-scatter need NCCL
            if not torch.equal(comm.all_gather(mine, -1), torch.cat(xs, -1)):
                res["bad"].append("all_gather")
            part = comm.reduce_scatter(mine, 0)
            if not _close(part, exact.chunk(world, 0)[rank], scale.chunk(world, 0)[rank], torch.float32):
                res["bad"].append("reduce_scatter")
    pyccl_comm = comm.pyccl_comm.comm
    comm.destroy()
    res["closed"] = pyccl_comm.closed
    # vLLM's --disable-custom-all-reduce (EngineArgs sets it through set_custom_all_reduce): pyccl stays out too.
    from vllm.distributed.parallel_state import set_custom_all_reduce

    set_custom_all_reduce(False)
    off = pv.PycclCudaCommunicator(cpu_group=group, device=torch.device("cpu"), device_group=group,
                                   unique_name="tp:1")
    res["disabled_has_pyccl"] = off.pyccl_comm is not None
    off.destroy()
    set_custom_all_reduce(True)
    res.update(fusion_check(rank, world, seed))
    dist.destroy_process_group()
    return res


def fusion_check(rank: int, world: int, seed: int) -> dict:
    """vLLM's own TP GroupCoordinator with pyccl's communicator, and vLLM's post-grad pass manager as vLLM
    configures it, with pyccl's fusion pass added by patch_compiler: a traced two-layer graph (all-reduce +
    fused_add_rms_norm, then all-reduce + rms_norm and all-reduce + fused_add_rms_norm whose residual is unused)
    loses its all-reduces to pyccl's fused op, and computes the float64 reference's result, once through pyccl's
    fused kernel and once through its fallback (vLLM's all-reduce and norm)."""
    import torch._inductor.pattern_matcher as pm
    import vllm.ir.ops
    from vllm.compilation.passes.inductor_pass import enable_fake_mode
    from vllm.compilation.passes.pass_manager import PostGradPassManager
    from vllm.config import DeviceConfig, VllmConfig
    from vllm.distributed import parallel_state, tensor_model_parallel_all_reduce
    from vllm.platforms import current_platform

    import pyccl.integrations.vllm as pv
    from ranks_integrations import _close, _inputs

    # vLLM's current platform here is not CUDA: make it name pyccl's communicator, as patch() does for CUDA,
    # and send the coordinator's all-reduce through vLLM's custom op, as CudaPlatform.use_custom_op_collectives does.
    type(current_platform).get_device_communicator_cls = classmethod(lambda cls: pv.COMMUNICATOR_QUALNAME)
    tp = parallel_state.GroupCoordinator([list(range(world))], rank, "gloo", True, group_name="tp")
    tp.use_custom_op_call = True
    parallel_state._TP = tp
    res = {"coordinator_has_pyccl": getattr(tp.device_communicator, "pyccl_comm", None) is not None}
    pv.patch_compiler()
    pv.patch_compiler()  # idempotent
    manager = PostGradPassManager()
    manager.configure(VllmConfig(device_config=DeviceConfig(device="cpu")))  # (no GPU: vLLM infers no device)
    res["passes"] = [type(p).__name__ for p in manager.passes]
    fusion = next(p for p in manager.passes if type(p).__name__ == "PycclAllReduceRMSNormPass")
    res["cache_key"] = isinstance(fusion.uuid(), str)  # vLLM's compile cache keys on every pass's uuid

    eps = 1e-6
    def model(x, residual, weight):
        normed, residual = vllm.ir.ops.fused_add_rms_norm(tensor_model_parallel_all_reduce(x), residual, weight, eps)
        reduced = tensor_model_parallel_all_reduce(normed * 2)
        first = vllm.ir.ops.rms_norm(reduced, weight, eps)
        last, _ = vllm.ir.ops.fused_add_rms_norm(tensor_model_parallel_all_reduce(first * 3), residual, weight, eps)
        return last, reduced

    hidden = 64
    xs = _inputs(seed, 7, world, (4, hidden), torch.float32)
    residual, weight = _inputs(seed, 8, 2, (4, hidden), torch.float32)
    weight = weight[0].contiguous()
    @enable_fake_mode  # traced as vLLM traces its patterns: on fake tensors, so that no collective runs
    def trace():
        return pm.fwd_only(model, [torch.empty(4, hidden), torch.empty(4, hidden), torch.empty(hidden)])

    gm = trace()
    fusion(gm.graph)
    gm.recompile()
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    res["fused_ops"] = sum(t.startswith("pyccl_vllm.all_reduce_fused_add_rms_norm") for t in targets)
    res["all_reduces_left"] = sum(t.startswith("vllm.all_reduce") for t in targets)

    def reference():
        def norm(h):
            return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight.double()
        h = torch.stack([x.double() for x in xs]).sum(0) + residual.double()
        reduced = norm(h) * 2 * world
        first = norm(reduced)
        return norm(first * 3 * world + h), reduced

    want = reference()
    group = tp.device_communicator.pyccl_comm
    fused_kernel, kernel_calls = group.fused_all_reduce_rmsnorm, []
    group.fused_all_reduce_rmsnorm = lambda *args: kernel_calls.append(1) or fused_kernel(*args)
    for route in ("fused", "fallback"):
        group._max_bytes = None if route == "fused" else 0
        kernel_calls.clear()
        got = gm(xs[rank], residual, weight)
        res[f"{route}_kernel_calls"] = len(kernel_calls)
        for g, w in zip(got, want):
            if not _close(g, w, w.abs() + 1, torch.float32):
                res["bad"] = res.get("bad", []) + [f"fusion {route}"]
    tp.destroy()
    return res


if __name__ == "__main__":
    engine_check.main(interface_problems, communicator_rank)
