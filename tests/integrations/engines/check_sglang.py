"""pyccl.integrations.sglang against the installed SGLang, on CPUs: run with
the Python of .venv-engines/sglang (tests/integrations/test_engine_interfaces.py does).
Prints one JSON object: what is wrong ("problems"), and the per-rank results
of SGLang's real GroupCoordinator with the plugin loaded."""

import inspect
import os

import torch
import torch.distributed as dist

import engine_check
from engine_check import params


def interface_problems() -> list:
    import sglang
    from sglang.srt.distributed.parallel_state import GroupCoordinator
    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    import pyccl.integrations.sglang as ps

    problems = []
    if sglang.__version__ != ps.SGLANG_VERSION:
        problems.append(f"SGLang {sglang.__version__} installed, the adapter is for {ps.SGLANG_VERSION}")
    # The hooks' positional parameters after (original, self) are the wrapped methods' own.
    expect = {"all_gather": ps._around_all_gather, "reduce_scatter_along_dim": ps._around_reduce_scatter,
              "all_gather_into_tensor": ps._around_all_gather_into_tensor,
              "reduce_scatter_tensor": ps._around_reduce_scatter_tensor}
    for method, hook in expect.items():
        theirs = [p for p in params(getattr(GroupCoordinator, method))[1:]]
        ours = params(hook)[2:]
        if theirs != ours:
            problems.append(f"GroupCoordinator.{method} takes {theirs}, the hook {ours}")
    from sglang.srt.layers import flashinfer_comm_fusion

    fusion = getattr(flashinfer_comm_fusion, ps._FUSION_FUNCTION)
    if params(fusion) != params(ps._around_fused_norm)[1:]:
        problems.append(f"{ps._FUSION_FUNCTION} takes {params(fusion)}, the hook {params(ps._around_fused_norm)[1:]}")
    for kind in ("AFTER", "AROUND"):
        if not hasattr(HookType, kind):
            problems.append(f"HookType has no {kind}")
    if [p[0] for p in params(HookRegistry.register)[:3]] != ["target", "hook", "hook_type"]:
        problems.append(f"HookRegistry.register takes {params(HookRegistry.register)}")
    # The attributes the adapter reads from a coordinator, set by __init__.
    init_src = inspect.getsource(GroupCoordinator.__init__)
    for attr in ("self.unique_name", "self.device", "self.cpu_group", "self.device_group", "self.world_size",
                 "self.ca_comm"):
        if attr + " =" not in init_src and attr + ":" not in init_src:
            problems.append(f"GroupCoordinator.__init__ no longer sets {attr}")
    # What the coordinator asks of ca_comm, in the methods that ask it.
    src = inspect.getsource(GroupCoordinator)
    for use in ("ca_comm.should_custom_ar(", "ca_comm.custom_all_reduce(", "ca_comm.capture()",
                "ca_comm.fused_allreduce_rmsnorm(", ".disabled"):
        if use not in src:
            problems.append(f"GroupCoordinator no longer calls {use}")
    os.environ.pop("SGLANG_PLUGINS", None)
    found = load_plugins_by_group(GENERAL_PLUGINS_GROUP)
    if "pyccl" not in found or found["pyccl"][0] is not ps.plugin:
        problems.append(f"SGLang's plugin loader does not find pyccl's entry point: {sorted(found)}")
    return problems


def coordinator_rank(rank: int, world: int, store, seed: int) -> dict:
    """SGLang's GroupCoordinator for a "tp" group on CPU (host mode), the plugin
    loaded by SGLang's loader; its collectives against float64."""
    os.environ["PYCCL_SGLANG"] = "1"
    from sglang.srt.distributed import parallel_state
    from sglang.srt.plugins import load_plugins

    import pyccl.integrations.sglang as ps
    from ranks_integrations import _close, _inputs

    parallel_state.is_cuda_alike = lambda: False  # a CPU device: pyccl's host mode
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    load_plugins()
    coord = parallel_state.GroupCoordinator(
        group_ranks=[list(range(world))], local_rank=rank, torch_distributed_backend="gloo", use_pynccl=False,
        use_mscclpp=False, use_custom_allreduce=False, use_torch_symm_mem_all_reduce=False,
        use_hpu_communicator=False, use_xpu_communicator=False, group_name="tp")
    res = {"installed": isinstance(coord.ca_comm, ps.PycclCustomAllreduce), "bad": []}
    xs = _inputs(seed, 1, world, (4, 96), torch.bfloat16)
    mine = xs[rank]
    exact = torch.stack([x.double() for x in xs]).sum(0)
    scale = torch.stack([x.double().abs() for x in xs]).sum(0)
    res["method"] = coord._resolve_outplace_all_reduce_method(mine)
    if not _close(coord._all_reduce_out_place(mine, "auto"), exact, scale, torch.bfloat16):
        res["bad"].append("all-reduce through SGLang's dispatch")
    if not torch.equal(coord.all_gather(mine, dim=1), torch.cat(xs, 1)):
        res["bad"].append("all_gather")
    part = coord.reduce_scatter_along_dim(mine, dim=0)
    if not _close(part, exact.chunk(world, 0)[rank], scale.chunk(world, 0)[rank], torch.bfloat16):
        res["bad"].append("reduce_scatter_along_dim")
    gathered = torch.empty((world * 4, 96), dtype=torch.bfloat16)
    coord.all_gather_into_tensor(gathered, mine)
    if not torch.equal(gathered, torch.cat(xs, 0)):
        res["bad"].append("all_gather_into_tensor")
    scattered = torch.empty((4 // world, 96), dtype=torch.bfloat16)
    coord.reduce_scatter_tensor(scattered, mine)
    if not _close(scattered, exact.chunk(world, 0)[rank], scale.chunk(world, 0)[rank], torch.bfloat16):
        res["bad"].append("reduce_scatter_tensor")
    residual = _inputs(seed, 2, 1, (4, 96), torch.bfloat16)[0]
    weight = (1 + 0.1 * _inputs(seed, 3, 1, (96,), torch.float64)[0]).to(torch.bfloat16)
    fused = coord.fused_allreduce_rmsnorm(mine, residual, weight, 1e-5)
    # SGLang's fused all-reduce + RMSNorm on NVIDIA GPUs (FlashInfer's, hooked), for the TP group.
    from sglang.srt.layers import flashinfer_comm_fusion
    from sglang.srt.runtime_context import get_parallel

    with get_parallel().override(tp_group=coord, attn_tp_size=world):
        hooked = flashinfer_comm_fusion.flashinfer_allreduce_residual_rmsnorm(
            input_tensor=mine, residual=residual, weight=weight, eps=1e-5, max_token_num=2048, use_attn_tp_group=True)
    res["fusion_hook_matches"] = hooked[0] is not None and torch.equal(hooked[0], fused[0]) and \
        torch.equal(hooked[1], fused[1])
    ref_res = exact + residual.double()
    ref_norm = torch.nn.functional.rms_norm(ref_res.to(torch.bfloat16).double(), (96,), weight.double(), 1e-5)
    if fused is None or not _close(fused[1], ref_res, scale + residual.double().abs(), torch.bfloat16) or \
            not torch.allclose(fused[0].double(), ref_norm, rtol=2e-2, atol=2e-2):
        res["bad"].append("fused_allreduce_rmsnorm")
    coord.ca_comm.close()
    dist.destroy_process_group()
    return res


if __name__ == "__main__":
    engine_check.main(interface_problems, coordinator_rank)
