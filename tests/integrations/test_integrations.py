"""pyccl.integrations, in host mode and on GPUs: the engine-neutral
GroupCommunicator (against float64, in CUDA graphs captured before any eager
call), and the vLLM and SGLang adapters over stand-ins with the engines'
signatures (pyccl for small messages, the NCCL path for large ones). The
engines' real interfaces are checked in tests/integrations/test_engine_interfaces.py."""

import importlib
import logging
import random
import sys

import pytest

import ranks_integrations as ri
from conftest import gpu_count, host_and_gpu, host_and_gpu_worlds, requires_gpus
from pyccl._spawn import run_ranks
from pyccl.errors import InvalidArgumentError


@pytest.mark.parametrize("gpu, world", host_and_gpu_worlds((2, 3), (2, 3, 4, 6, 8)))
def test_group_communicator_collectives_match_float64(gpu, world):
    seed = random.randrange(1 << 20)
    for bad in run_ranks(ri.collective_cases, world, args=(gpu, seed), timeout=300):
        assert bad == [], f"seed {seed}: {bad}"


@requires_gpus(2)
def test_group_communicator_in_cuda_graph():
    seed = random.randrange(1 << 20)
    for bad in run_ranks(ri.graph_replays, min(gpu_count(), 4), args=(seed,), timeout=300):
        assert bad == [], f"seed {seed}: {bad}"


def test_group_communicator_selection_errors_and_destroy():
    outs = run_ranks(ri.selection_and_errors, 2, timeout=120)
    for rank, out in enumerate(outs):
        assert out["fits"] and not out["too_big"]
        assert not out["gather_counts_world"] and out["gather_small"]
        assert not out["int_reduce"] and out["int_gather"]
        assert not out["non_contiguous"] and not out["empty"] and not out["not_a_tensor"]
        assert out["fused_limit"] and out["unsupported"] is None
        assert out["fuse_fits"]
        assert not any(out["fuse_refused"].values()), out["fuse_refused"]
        for label, arg in [("collective", "'collective'"), ("dim", "'dim'"), ("rs_divides", "'input_'"),
                           ("dst", "'dst'"), ("max_bytes", "'max_bytes'")]:
            kind, text = out["errors"][label]
            assert kind == "InvalidArgumentError" and arg in text, (label, kind, text)
        assert out["recv_from"] == float(1 - rank) + 0.5
        assert not out["after_destroy_should_use"]
        assert "closed" in out["after_destroy_call"]


@pytest.mark.parametrize("gpu", host_and_gpu(own=True))
def test_vllm_adapter_routes_by_size_and_falls_back(gpu):
    seed = random.randrange(1 << 20)
    for res in run_ranks(ri.vllm_adapter, 2, args=(gpu, seed), timeout=300):
        assert res["bad"] == [], f"seed {seed}: {res['bad']}"
        # Small messages went to pyccl; the 160 KiB ones to the NCCL path.
        assert res["fallback_calls"] == ["all_reduce", "all_gather", "reduce_scatter"]
        assert res["destroyed"] == (True, True, True)
        assert res["custom_captures"] == 1
        if gpu:
            # Captured inside ca_comm.capture(), as vLLM's graph_capture does: on graph buffers.
            assert res["graph_buffer_calls"] == 1
            continue
        assert not res["pp_has_pyccl"]  # only the tensor-parallel group
        assert res["non_contiguous_to"] == "all_reduce"
        assert res["plugin_patched"] and res["platform_names"] == "pyccl.integrations.vllm.PycclCudaCommunicator"
        assert not res["disabled_has_pyccl"]  # --disable-custom-all-reduce turns pyccl off too
        # The TP group's ca_comm: vLLM's custom all-reduce behind pyccl's graph capture; others' untouched.
        assert res["slot"] == (True, True, True)
        assert res["slot_delegates"] == [True, True, False, True]


def test_vllm_general_plugin_is_opt_in(monkeypatch, caplog):
    mods = ri.vllm_stand_in_modules()
    for name, module in mods.items():
        monkeypatch.setitem(sys.modules, name, module)
    import pyccl.integrations.vllm as pv

    monkeypatch.setattr(pv, "_made", {})
    cuda = mods["vllm.platforms.cuda"].CudaPlatform
    vllms_own = cuda.get_device_communicator_cls()

    monkeypatch.delenv("PYCCL_VLLM", raising=False)
    assert pv.general_plugin() is False
    monkeypatch.setenv("PYCCL_VLLM", "no")
    assert pv.general_plugin() is False
    # Before, any word but 1/true/yes/on read as off without a word.
    monkeypatch.setenv("PYCCL_VLLM", "enabled")
    with pytest.raises(InvalidArgumentError, match="'PYCCL_VLLM'.*'enabled'"):
        pv.general_plugin()
    assert cuda.get_device_communicator_cls() == vllms_own
    monkeypatch.setenv("PYCCL_VLLM", "1")
    monkeypatch.setattr(mods["vllm.platforms"].current_platform, "is_cuda", lambda: False)
    assert pv.general_plugin() is False  # another platform: vLLM runs as without pyccl
    assert cuda.get_device_communicator_cls() == vllms_own
    monkeypatch.setattr(mods["vllm.platforms"].current_platform, "is_cuda", lambda: True)
    assert pv.general_plugin() is True and pv.general_plugin() is True  # vLLM may call it more than once
    # vLLM resolves the name it is given with import_module + getattr.
    assert cuda.get_device_communicator_cls() == pv.COMMUNICATOR_QUALNAME
    # ... and vLLM's compiler configures its passes through pyccl's wrapper, wrapped once however often patched.
    manager_cls = mods["vllm.compilation.passes.pass_manager"].PostGradPassManager
    assert manager_cls.configure._pyccl
    manager = manager_cls()
    manager.configure(None)  # no TP group runs pyccl here: no pass added
    assert manager.passes == []
    module, _, name = pv.COMMUNICATOR_QUALNAME.rpartition(".")
    assert getattr(importlib.import_module(module), name) is pv.PycclCudaCommunicator  # made once
    with pytest.raises(AttributeError, match="NoSuchClass"):
        pv.NoSuchClass


def test_vllm_fusion_pass_goes_after_vllms_own_fusion():
    import pyccl.integrations.vllm as pv

    def passes(*names):
        return [type(name, (), {})() for name in names]

    # vLLM 0.33's order (PostGradPassManager.configure): pyccl's right after vLLM's all-reduce fusion ...
    assert pv.fusion_pass_position(passes("NoOpEliminationPass", "AddRMSNormFusionPass", "AllReduceFusionPass",
                                          "RMSNormReshapeFusionPass", "RMSNormQuantFusionPass")) == 3
    # ... or where it would be, ahead of the passes that fuse the norm with what follows it.
    assert pv.fusion_pass_position(passes("NoOpEliminationPass", "RMSNormQuantFusionPass")) == 1
    assert pv.fusion_pass_position(passes("RMSNormQuantFusionPass")) == 0
    assert pv.fusion_pass_position(passes("NoOpEliminationPass")) == 1
    assert pv.fusion_pass_position([]) == 0


def _topology(nodes, p2p=None):
    ranks = [{"rank": r, "node": n, "same_node": n == nodes[0]} for r, n in enumerate(nodes)]
    world = len(nodes)
    return {"ranks": ranks, "p2p": p2p or [[True] * world for _ in range(world)]}


def test_should_use_stays_out_of_groups_the_kernels_cannot_serve():
    """The facts should_use decides by besides the call (unsupported_reason): one node, peer access between
    every pair of GPUs as the communicator's probe found it, at most 8 ranks. The engine's own path runs
    otherwise, and no call raises."""
    from pyccl.integrations.group import MAX_KERNEL_RANKS, unsupported_reason

    assert unsupported_reason(_topology(["a", "a"]), on_gpu=True) is None
    assert "span 2 nodes" in unsupported_reason(_topology(["a", "a", "b", "b"]), on_gpu=True)
    no_p2p = [[True, False], [False, True]]
    assert "no peer access between the GPUs of ranks 0 and 1" in unsupported_reason(_topology(["a", "a"], no_p2p),
                                                                                    on_gpu=True)
    assert unsupported_reason(_topology(["a", "a"], no_p2p), on_gpu=False) is None  # host mode: no GPUs
    many = ["a"] * (MAX_KERNEL_RANKS + 1)
    assert f"at most {MAX_KERNEL_RANKS}" in unsupported_reason(_topology(many), on_gpu=True)


def test_an_untested_engine_version_is_named_once(caplog):
    from pyccl.integrations.group import warn_if_untested

    with caplog.at_level(logging.WARNING, logger="pyccl"):
        assert not warn_if_untested("vLLM", "0.33.0", "0.33.0")
        assert warn_if_untested("vLLM", "0.99.1", "0.33.0")
        assert warn_if_untested("vLLM", "0.99.1", "0.33.0")
    said = [r.getMessage() for r in caplog.records if "0.99.1" in r.getMessage()]
    assert len(said) == 1 and "tested for vLLM 0.33.0" in said[0] and "vLLM 0.99.1 is installed" in said[0], said


def test_sglang_adapter_installs_into_the_tp_group():
    seed = random.randrange(1 << 20)
    for res in run_ranks(ri.sglang_adapter, 2, args=(seed,), timeout=300):
        assert res["bad"] == [], f"seed {seed}: {res['bad']}"
        assert res["tp_installed"] and not res["other_installed"]
        assert res["big_taken"] and res["previous_calls"] == ["custom_all_reduce"]
        assert not res["big_half_taken"]
        assert res["previous_captures"] == 1
        assert res["native_calls"] == ["all_gather"]  # only the output-list form
        assert res["into_native_calls"] == []  # the *_into_tensor forms through pyccl
        # An output SGLang's path takes (here: of another dtype; and an offset view pyccl takes too).
        assert res["into_native_calls_odd"] == ["reduce_scatter_tensor"], res["into_native_calls_odd"]
        assert res["fused_residual_ok"] and res["fused_norm_ok"] and res["fused_declines_big"]
        assert res["closed"] == (True, True, True)


def test_sglang_plugin_is_opt_in(monkeypatch):
    from pyccl.integrations import sglang as ps

    registered = []
    hooks = type(sys)("sglang.srt.plugins.hook_registry")

    class HookType:
        AFTER, AROUND = "after", "around"

        def __class_getitem__(cls, key):
            return getattr(cls, key)

    class HookRegistry:
        @classmethod
        def register(cls, target, hook, hook_type):
            registered.append((target, hook_type))

    hooks.HookRegistry, hooks.HookType = HookRegistry, HookType
    for name in ("sglang", "sglang.srt", "sglang.srt.plugins"):
        monkeypatch.setitem(sys.modules, name, type(sys)(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.plugins.hook_registry", hooks)
    monkeypatch.delenv("PYCCL_SGLANG", raising=False)
    ps.plugin()
    assert registered == []
    monkeypatch.setenv("PYCCL_SGLANG", "sglang")
    with pytest.raises(InvalidArgumentError, match="'PYCCL_SGLANG'.*'sglang'"):
        ps.plugin()
    assert registered == []
    monkeypatch.setenv("PYCCL_SGLANG", "on")
    ps.plugin()
    base = "sglang.srt.distributed.parallel_state.GroupCoordinator."
    assert registered == [(base + "__init__", "after"), (base + "all_gather", "around"),
                          (base + "reduce_scatter_along_dim", "around"), (base + "all_gather_into_tensor", "around"),
                          (base + "reduce_scatter_tensor", "around"),
                          ("sglang.srt.layers.flashinfer_comm_fusion.flashinfer_allreduce_residual_rmsnorm", "around")]


def test_integration_modules_import_without_engines():
    for name in ("pyccl.integrations", "pyccl.integrations.vllm", "pyccl.integrations.sglang"):
        importlib.import_module(name)
    import pyccl.integrations.vllm as pv
    import pyccl.integrations.sglang as ps
    assert pv.VLLM_VERSION == "0.33.0" and ps.SGLANG_VERSION == "0.5.23"


def test_group_communicator_limit_is_the_selectors(monkeypatch):
    """should_use's size limit is where the communicator's selector hands
    every size to NCCL: NCCL_MIN_BYTES, or PYCCL_NCCL_MIN_BYTES as read when
    the communicator was made (as NCCL reads its environment at init)."""
    import torch
    import torch.distributed as dist

    import pyccl
    from pyccl import dispatch
    from pyccl.integrations.group import GroupCommunicator

    monkeypatch.delenv("PYCCL_NCCL_MIN_BYTES", raising=False)
    monkeypatch.delenv("PYCCL_TUNING_FILE", raising=False)
    store = dist.HashStore()
    comm = pyccl.Communicator(store, 0, 1, device="cpu", name="limits")
    try:
        gc = GroupCommunicator(None, "cpu", comm=comm)
        assert gc.max_bytes("all_reduce", torch.float32) == dispatch.NCCL_MIN_BYTES["all_reduce"] - 1
        assert gc.max_bytes("all_gather", torch.bfloat16) == dispatch.NCCL_MIN_BYTES["all_gather"] - 1
        monkeypatch.setenv("PYCCL_NCCL_MIN_BYTES", "4096")
        assert gc.max_bytes("all_reduce", torch.float32) == dispatch.NCCL_MIN_BYTES["all_reduce"] - 1
    finally:
        comm.close()
    comm = pyccl.Communicator(store, 0, 1, device="cpu", name="limits_from_the_environment")
    try:
        gc = GroupCommunicator(None, "cpu", comm=comm)
        assert gc.max_bytes("all_reduce", torch.float32) == 4095
        assert gc.max_bytes("all_gather", torch.bfloat16) == 4095
    finally:
        comm.close()
