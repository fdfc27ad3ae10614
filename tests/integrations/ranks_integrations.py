"""Per-rank bodies of the integration tests (pyccl.integrations): the
engine-neutral GroupCommunicator, and the vLLM / SGLang adapters over
stand-ins of the engines' classes that have the engines' signatures."""

from __future__ import annotations

import os
import sys
import types

import torch
import torch.distributed as dist

from pyccl.errors import ClosedError, InvalidArgumentError
from pyccl.integrations.group import GroupCommunicator
from gpu_sharing import rank_gpu

RTOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _init(rank: int, world: int, store, on_gpu: bool):
    """An engine's set-up: the world, a gloo group and a device group of all ranks."""
    if on_gpu:
        torch.cuda.set_device(rank_gpu(rank))
    dist.init_process_group("cpu:gloo,cuda:nccl" if on_gpu else "gloo", store=store, rank=rank, world_size=world)
    cpu_group = dist.new_group(list(range(world)), backend="gloo")
    device_group = dist.new_group(list(range(world)), backend="nccl" if on_gpu else "gloo")
    device = torch.device("cuda", rank_gpu(rank)) if on_gpu else torch.device("cpu")
    return cpu_group, device_group, device


def _inputs(seed: int, case: int, world: int, shape, dtype):
    """Every rank's input of one case: fresh random values."""
    gen = torch.Generator().manual_seed(seed * 7919 + case)
    return [(torch.randn(*shape, generator=gen, dtype=torch.float64) * 3).to(dtype) for _ in range(world)]


def _close(got: torch.Tensor, exact: torch.Tensor, scale: torch.Tensor, dtype) -> bool:
    return bool(((got.cpu().double() - exact).abs() <= RTOL[dtype] * scale + 1e-12).all())


def _fresh_replays(graph, x: torch.Tensor, rank: int, world: int, seed: int, first_case: int, count: int):
    """Replays `graph` `count` times, each after copying fresh inputs into `x`; yields (replay, every rank's
    input, their float64 sum, the sum of their magnitudes)."""
    for replay in range(count):
        xs = _inputs(seed, first_case + replay, world, tuple(x.shape), x.dtype)
        x.copy_(xs[rank])
        graph.replay()
        torch.cuda.synchronize()
        exact = torch.stack([t.double() for t in xs]).sum(0)
        yield replay, xs, exact, torch.stack([t.double().abs() for t in xs]).sum(0)


def collective_cases(rank: int, world: int, store, on_gpu: bool, seed: int) -> list:
    """Out-of-place all-reduce, all-gather and reduce-scatter along every
    dimension, against float64 references; what is wrong, as strings."""
    cpu_group, device_group, device = _init(rank, world, store, on_gpu)
    gc = GroupCommunicator(cpu_group, device, device_group)
    bad = []
    case = 0
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for shape in [(5, 24), (3, 2 * world, 7), (world * 4, 3, 5)]:
            case += 1
            xs = _inputs(seed, case, world, shape, dtype)
            mine = xs[rank].to(device)
            before = mine.clone()
            out = gc.all_reduce(mine)
            exact = torch.stack([x.double() for x in xs]).sum(0)
            scale = torch.stack([x.double().abs() for x in xs]).sum(0)
            if out.data_ptr() == mine.data_ptr() or not torch.equal(mine, before):
                bad.append(f"all_reduce {dtype} {shape}: not out of place")
            if out.shape != mine.shape or not _close(out, exact, scale, dtype):
                bad.append(f"all_reduce {dtype} {shape}: wrong values")
            for dim in range(-len(shape), len(shape)):
                got = gc.all_gather(mine, dim)
                if not torch.equal(got.cpu(), torch.cat(xs, dim=dim)):
                    bad.append(f"all_gather {dtype} {shape} dim {dim}: got shape {tuple(got.shape)}")
                if shape[dim] % world == 0:
                    part = gc.reduce_scatter(mine, dim)
                    ref = exact.chunk(world, dim=dim)[rank]
                    sref = scale.chunk(world, dim=dim)[rank]
                    if part.shape != ref.shape or not _close(part, ref, sref, dtype):
                        bad.append(f"reduce_scatter {dtype} {shape} dim {dim}: shape {tuple(part.shape)}")
    # all-gather moves any dtype.
    ints = torch.arange(6, dtype=torch.int64, device=device).reshape(2, 3) + 100 * rank
    got = gc.all_gather(ints, 1)
    want = torch.cat([torch.arange(6, dtype=torch.int64).reshape(2, 3) + 100 * r for r in range(world)], 1)
    if not torch.equal(got.cpu(), want):
        bad.append("all_gather int64 dim 1")
    gc.destroy()
    dist.destroy_process_group()
    return bad


def selection_and_errors(rank: int, world: int, store) -> dict:
    """should_use's answers, send/recv, the errors that name their argument, and destroy."""
    cpu_group, device_group, device = _init(rank, world, store, False)
    gc = GroupCommunicator(cpu_group, device, device_group, max_bytes=4096)
    x = torch.randn(64, 16)  # 4 KiB of float32
    out = {
        "fits": gc.should_use(x),
        "too_big": gc.should_use(torch.randn(64, 17)),
        "gather_counts_world": gc.should_use(torch.randn(64, 16), "all_gather"),
        "gather_small": gc.should_use(torch.randn(4, 4), "all_gather"),
        "int_reduce": gc.should_use(torch.ones(8, dtype=torch.int32)),
        "int_gather": gc.should_use(torch.ones(8, dtype=torch.int32), "all_gather"),
        "non_contiguous": gc.should_use(torch.randn(16, 8).t()),
        "empty": gc.should_use(torch.randn(0, 8)),
        "not_a_tensor": gc.should_use([1.0, 2.0]),
        "fused_limit": gc.should_use(x, "fused_all_reduce_rmsnorm"),
        # should_fuse: the operands pyccl's fused call takes as given, and nothing else.
        "fuse_fits": gc.should_fuse(x, torch.randn(64, 16), torch.randn(16)),
        "fuse_refused": {
            "weight_dtype": gc.should_fuse(x, torch.randn(64, 16), torch.randn(16, dtype=torch.float64)),
            "no_weight": gc.should_fuse(x, torch.randn(64, 16), None),
            "weight_length": gc.should_fuse(x, torch.randn(64, 16), torch.randn(17)),
            "residual_shape": gc.should_fuse(x, torch.randn(32, 32), torch.randn(16)),
            "residual_strided": gc.should_fuse(x, torch.randn(16, 64).t(), torch.randn(16)),
            "too_big": gc.should_fuse(torch.randn(64, 17), torch.randn(64, 17), torch.randn(17)),
        },
        "unsupported": gc.unsupported,  # one node: None
    }
    errors = {}
    for label, call in [("collective", lambda: gc.should_use(x, "all_to_all")),
                        ("dim", lambda: gc.all_gather(x, 2)),
                        ("rs_divides", lambda: gc.reduce_scatter(torch.randn(world + 1, 3), 0)),
                        ("dst", lambda: gc.send(x, dst=rank)),
                        ("max_bytes", lambda: GroupCommunicator(cpu_group, device, max_bytes=-1))]:
        try:
            call()
            errors[label] = ("none", "")
        except InvalidArgumentError as e:
            errors[label] = (type(e).__name__, str(e))
    out["errors"] = errors
    # A ring of send/recv through the device group, with the default peers.
    payload = torch.full((3, 2), float(rank) + 0.5)
    if rank % 2 == 0:
        gc.send(payload)
        got = gc.recv(torch.Size([3, 2]), torch.float32)
    else:
        got = gc.recv(torch.Size([3, 2]), torch.float32)
        gc.send(payload)
    out["recv_from"] = float(got[0, 0].item())
    gc.destroy()
    gc.destroy()  # idempotent
    out["after_destroy_should_use"] = gc.should_use(x)
    try:
        gc.all_reduce(x)
        out["after_destroy_call"] = "none"
    except ClosedError as e:
        out["after_destroy_call"] = str(e)
    dist.destroy_process_group()
    return out


# -- stand-ins of the engines' classes, with their signatures (vLLM 0.33.0, SGLang 0.5.23) --------------------------

class _StandInCudaCommunicator:
    """vLLM's CudaCommunicator as far as the adapter relies on it: the
    constructor's arguments and attributes, and NCCL-path methods that record
    what reached them."""

    def __init__(self, cpu_group, device=None, device_group=None, unique_name="", global_ranks=None,
                 global_world_size=None, tcp_store_group=None):
        self.cpu_group, self.device_group, self.unique_name = cpu_group, device_group, unique_name
        self.device = device or torch.device("cpu")
        self.world_size = dist.get_world_size(cpu_group)
        self.rank_in_group = dist.get_rank(cpu_group)
        self.fallback_calls = []
        self.destroyed = False
        self.ca_comm = _StandInCustomAllreduce()  # vLLM's CustomAllreduce, where it makes one

    def all_reduce(self, input_):
        self.fallback_calls.append("all_reduce")
        out = input_.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, group=self.device_group)
        return out

    def all_gather(self, input_, dim=-1):
        self.fallback_calls.append("all_gather")
        parts = [torch.empty_like(input_) for _ in range(self.world_size)]
        dist.all_gather(parts, input_.contiguous(), group=self.device_group)
        return torch.cat(parts, dim=dim)

    def reduce_scatter(self, input_, dim=-1):
        self.fallback_calls.append("reduce_scatter")
        total = input_.clone()
        dist.all_reduce(total, group=self.device_group)
        return total.chunk(self.world_size, dim=dim)[self.rank_in_group].contiguous()

    def destroy(self):
        self.destroyed = True


def vllm_stand_in_modules() -> dict:
    """A minimal ``vllm`` package: the modules the adapter imports, by name."""
    names = ["vllm", "vllm.distributed", "vllm.distributed.device_communicators",
             "vllm.distributed.device_communicators.cuda_communicator", "vllm.distributed.parallel_state",
             "vllm.platforms", "vllm.platforms.cuda", "vllm.compilation", "vllm.compilation.passes",
             "vllm.compilation.passes.pass_manager"]
    mods = {n: types.ModuleType(n) for n in names}
    mods["vllm"].__version__ = "0.33.0"
    mods["vllm.distributed.parallel_state"]._ENABLE_CUSTOM_ALL_REDUCE = True
    mods["vllm.distributed"].parallel_state = mods["vllm.distributed.parallel_state"]
    mods["vllm.distributed.device_communicators.cuda_communicator"].CudaCommunicator = _StandInCudaCommunicator

    class CudaPlatform:
        @classmethod
        def get_device_communicator_cls(cls) -> str:
            return "vllm.distributed.device_communicators.cuda_communicator.CudaCommunicator"

    mods["vllm.platforms.cuda"].CudaPlatform = CudaPlatform
    mods["vllm.platforms"].cuda = mods["vllm.platforms.cuda"]
    mods["vllm.platforms"].current_platform = types.SimpleNamespace(is_cuda=lambda: True)

    class PostGradPassManager:  # vLLM's compiler's list of post-grad passes, made by configure
        def configure(self, config) -> None:
            self.passes = []

    mods["vllm.compilation.passes.pass_manager"].PostGradPassManager = PostGradPassManager
    return mods


def vllm_adapter(rank: int, world: int, store, on_gpu: bool, seed: int) -> dict:
    """PycclCudaCommunicator over the stand-in: small messages reach pyccl, the
    rest the NCCL path; results against float64; the TP group's ca_comm is
    vLLM's custom all-reduce with pyccl's graph buffers beside it (on GPUs, an
    all-reduce captured inside its capture() takes them, replayed against
    float64); destroy closes both."""
    sys.modules.update(vllm_stand_in_modules())
    import pyccl.integrations.vllm as pv

    cpu_group, device_group, device = _init(rank, world, store, on_gpu)
    if on_gpu:  # read when the group's communicator is made (as NCCL reads its environment): see _capture_as_vllm
        os.environ["PYCCL_ALGO"] = "all_reduce=2pa_hb"
    try:
        tp = pv.PycclCudaCommunicator(cpu_group=cpu_group, device=device, device_group=device_group,
                                      unique_name="tp:0")
    finally:
        os.environ.pop("PYCCL_ALGO", None)
    pp = pv.PycclCudaCommunicator(cpu_group=cpu_group, device=device, device_group=device_group, unique_name="pp:0")
    tp.pyccl_comm._max_bytes = 64 << 10  # to see both routes at test sizes
    xs = _inputs(seed, 1, world, (4, 32), torch.bfloat16)
    big = _inputs(seed, 2, world, (256, 160), torch.float32)  # 160 KiB: the NCCL path
    res = {"pp_has_pyccl": pp.pyccl_comm is not None, "bad": []}
    slot, custom = tp.ca_comm, tp.ca_comm.custom
    res["slot"] = (isinstance(slot, pv.CustomAllreduceSlot), isinstance(custom, _StandInCustomAllreduce),
                   isinstance(pp.ca_comm, _StandInCustomAllreduce))
    custom.disabled = True
    res["slot_delegates"] = [slot.disabled, slot.calls is custom.calls]
    custom.disabled = False
    res["slot_delegates"] += [slot.disabled, slot.should_custom_ar(torch.zeros(2))]
    res["graph_buffer_calls"] = _capture_as_vllm(tp, slot, rank, world, device, seed, res["bad"])
    res["custom_captures"] = custom.captures
    for label, inputs in (("small", xs), ("big", big)):
        mine = inputs[rank].to(device)
        exact = torch.stack([x.double() for x in inputs]).sum(0)
        scale = torch.stack([x.double().abs() for x in inputs]).sum(0)
        if not _close(tp.all_reduce(mine), exact, scale, mine.dtype):
            res["bad"].append(f"all_reduce {label}")
        if not torch.equal(tp.all_gather(mine, 1).cpu(), torch.cat(inputs, 1)):
            res["bad"].append(f"all_gather {label}")
        part = tp.reduce_scatter(mine, 0)
        if not _close(part, exact.chunk(world, 0)[rank], scale.chunk(world, 0)[rank], mine.dtype):
            res["bad"].append(f"reduce_scatter {label}")
    res["fallback_calls"] = list(tp.fallback_calls)
    # Non-contiguous input: the NCCL path.
    tp.all_reduce(xs[rank].to(device).t())
    res["non_contiguous_to"] = tp.fallback_calls[-1]
    # vLLM's --disable-custom-all-reduce: pyccl stays out of the TP group too (no collective: every rank alike).
    sys.modules["vllm.distributed.parallel_state"]._ENABLE_CUSTOM_ALL_REDUCE = False
    off = pv.PycclCudaCommunicator(cpu_group=cpu_group, device=device, device_group=device_group, unique_name="tp:1")
    res["disabled_has_pyccl"] = off.pyccl_comm is not None
    sys.modules["vllm.distributed.parallel_state"]._ENABLE_CUSTOM_ALL_REDUCE = True
    off.destroy()
    os.environ["PYCCL_VLLM"] = "1"
    res["plugin_patched"] = pv.general_plugin()
    res["platform_names"] = sys.modules["vllm.platforms.cuda"].CudaPlatform.get_device_communicator_cls()
    comm = tp.pyccl_comm.comm
    tp.destroy()
    res["destroyed"] = (tp.destroyed, comm.closed, tp.pyccl_comm is None)
    pp.destroy()
    dist.destroy_process_group()
    return res


def _capture_as_vllm(tp, slot, rank: int, world: int, device, seed: int, bad: list) -> int:
    """As vLLM's GroupCoordinator.graph_capture: a CUDA graph captured on a
    side stream inside ca_comm.capture(), with one all-reduce through the
    communicator (forced to 2PA HB, which graph buffers run zero-copy), then
    replayed with fresh inputs against float64. Host mode: the block alone.
    Returns the all-reduces registered on graph buffers."""
    if device.type != "cuda":
        with slot.capture():
            pass
        return 0
    engine = tp.pyccl_comm.comm._collective_engine()
    before = engine.graph_buffer_calls
    x = torch.empty(16, 512, dtype=torch.bfloat16, device=device)  # 16 KiB
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with slot.capture():  # the group's all-reduces are forced to 2PA HB (PYCCL_ALGO when vllm_adapter made it)
        with torch.cuda.graph(graph, stream=stream):
            y = tp.all_reduce(x)
    for replay, _, exact, scale in _fresh_replays(graph, x, rank, world, seed, 50, 3):
        if not _close(y, exact, scale, torch.bfloat16):
            bad.append(f"captured all_reduce, replay {replay}")
    del graph
    return engine.graph_buffer_calls - before


class _StandInCustomAllreduce:
    """The engines' CustomAllreduce (vLLM's and SGLang's) as their code calls it."""

    def __init__(self):
        self.disabled = False
        self.calls = []
        self.captures = 0
        self.closed = False

    def should_custom_ar(self, inp):
        return inp.dtype == torch.float32  # takes what pyccl leaves, in these tests

    def custom_all_reduce(self, input):  # noqa: A002
        self.calls.append("custom_all_reduce")
        out = input.clone()
        dist.all_reduce(out)
        return out

    def capture(self):
        import contextlib

        @contextlib.contextmanager
        def ctx():
            self.captures += 1
            yield
        return ctx()

    def close(self):
        self.closed = True


class _StandInGroupCoordinator:
    """SGLang's GroupCoordinator as far as the adapter relies on it: the
    attributes __init__ sets and the methods the hooks wrap."""

    def __init__(self, unique_name, cpu_group, device_group, device, ca_comm):
        self.unique_name, self.cpu_group, self.device_group, self.device = unique_name, cpu_group, device_group, device
        self.world_size = dist.get_world_size(cpu_group)
        self.rank_in_group = dist.get_rank(cpu_group)
        self.ca_comm = ca_comm
        self.native_calls = []

    def all_gather(self, input_, dim=-1, output_tensor_list=None):
        self.native_calls.append("all_gather")
        parts = [torch.empty_like(input_) for _ in range(self.world_size)]
        dist.all_gather(parts, input_.contiguous(), group=self.device_group)
        if output_tensor_list is not None:
            for o, p in zip(output_tensor_list, parts):
                o.copy_(p)
            return None
        return torch.cat(parts, dim=dim)

    def reduce_scatter_along_dim(self, input_, dim=-1):
        self.native_calls.append("reduce_scatter_along_dim")
        total = input_.clone()
        dist.all_reduce(total, group=self.device_group)
        return total.chunk(self.world_size, dim=dim)[self.rank_in_group]

    def all_gather_into_tensor(self, output, input):  # noqa: A002 - SGLang's names
        self.native_calls.append("all_gather_into_tensor")
        dist.all_gather_into_tensor(output, input, group=self.device_group)

    def reduce_scatter_tensor(self, output, input):  # noqa: A002 - SGLang's names
        self.native_calls.append("reduce_scatter_tensor")
        total = input.clone()
        dist.all_reduce(total, group=self.device_group)
        output.copy_(total.reshape(-1).chunk(self.world_size)[self.rank_in_group].view_as(output))


def sglang_adapter(rank: int, world: int, store, seed: int) -> dict:
    """patch() on the stand-in GroupCoordinator: the TP group's ca_comm becomes
    pyccl's (the previous one behind it), all-gather and reduce-scatter go
    through pyccl; the fused call matches the unfused reference; close closes both."""
    from pyccl.integrations import sglang as ps

    cpu_group, device_group, device = _init(rank, world, store, False)
    ps.patch(_StandInGroupCoordinator)
    ps.patch(_StandInGroupCoordinator)  # idempotent
    previous = _StandInCustomAllreduce()
    tp = _StandInGroupCoordinator("tp:0", cpu_group, device_group, device, previous)
    other = _StandInGroupCoordinator("world:0", cpu_group, device_group, device, None)
    res = {"tp_installed": isinstance(tp.ca_comm, ps.PycclCustomAllreduce),
           "other_installed": isinstance(other.ca_comm, ps.PycclCustomAllreduce), "bad": []}
    ca = tp.ca_comm
    ca.group._max_bytes = 1 << 10
    xs = _inputs(seed, 3, world, (2, 64), torch.bfloat16)  # 256 bytes: pyccl
    mine = xs[rank]
    exact = torch.stack([x.double() for x in xs]).sum(0)
    scale = torch.stack([x.double().abs() for x in xs]).sum(0)
    if not (ca.should_custom_ar(mine) and _close(ca.custom_all_reduce(mine), exact, scale, mine.dtype)):
        res["bad"].append("all_reduce through pyccl")
    big = torch.randn(64, 64)  # 16 KiB float32: over the limit; the previous custom all-reduce takes it
    res["big_taken"] = ca.should_custom_ar(big)
    ca.custom_all_reduce(big)
    res["previous_calls"] = list(previous.calls)
    res["big_half_taken"] = ca.should_custom_ar(torch.randn(64, 64).half())
    with ca.capture():
        pass
    res["previous_captures"] = previous.captures
    if not torch.equal(tp.all_gather(mine, -1), torch.cat(xs, -1)):
        res["bad"].append("all_gather")
    part = tp.reduce_scatter_along_dim(mine, 1)
    if not _close(part, exact.chunk(world, 1)[rank], scale.chunk(world, 1)[rank], mine.dtype):
        res["bad"].append("reduce_scatter_along_dim")
    lists = [torch.empty_like(mine) for _ in range(world)]
    tp.all_gather(mine, 0, lists)  # the list form stays SGLang's
    res["native_calls"] = list(tp.native_calls)
    # The *_into_tensor forms: pyccl where the output fits, SGLang's own path where it does not.
    gathered = torch.empty((world * mine.shape[0],) + tuple(mine.shape[1:]), dtype=mine.dtype)
    tp.all_gather_into_tensor(gathered, mine)
    if not torch.equal(gathered, torch.cat(xs, 0)):
        res["bad"].append("all_gather_into_tensor")
    scattered = torch.empty((mine.shape[0] // world,) + tuple(mine.shape[1:]), dtype=mine.dtype)
    tp.reduce_scatter_tensor(scattered, mine)
    if not _close(scattered, exact.chunk(world, 0)[rank], scale.chunk(world, 0)[rank], mine.dtype):
        res["bad"].append("reduce_scatter_tensor")
    res["into_native_calls"] = list(tp.native_calls[len(res["native_calls"]):])
    tp.all_gather_into_tensor(torch.empty(world * mine.numel() + 1, dtype=mine.dtype)[1:], mine.reshape(-1))
    tp.reduce_scatter_tensor(torch.empty(scattered.shape, dtype=torch.float32), mine)
    res["into_native_calls_odd"] = list(tp.native_calls[len(res["native_calls"]):])
    residual = _inputs(seed, 4, 1, (2, 64), torch.bfloat16)[0]
    weight = (1 + 0.1 * _inputs(seed, 5, 1, (64,), torch.float64)[0]).to(torch.bfloat16)
    normed, new_residual = ca.fused_allreduce_rmsnorm(mine, residual, weight, 1e-5)
    ref_res = (exact + residual.double()).to(torch.bfloat16)
    ref_norm = torch.nn.functional.rms_norm(ref_res.double(), (64,), weight.double(), 1e-5)
    res["fused_residual_ok"] = bool((new_residual.double() - ref_res.double()).abs().max() <= 0.02 * scale.max())
    res["fused_norm_ok"] = bool(torch.allclose(normed.double(), ref_norm, rtol=2e-2, atol=2e-2))
    res["fused_declines_big"] = ca.fused_allreduce_rmsnorm(torch.randn(512, 512).bfloat16(),
                                                            torch.randn(512, 512).bfloat16(),
                                                            torch.ones(512).bfloat16(), 1e-5) is None
    comm = ca.group.comm
    ca.close()
    res["closed"] = (comm.closed, previous.closed, ca.disabled)
    dist.destroy_process_group()
    return res


def graph_replays(rank: int, world: int, store, seed: int) -> list:
    """GroupCommunicator's all-reduce, all-gather and reduce-scatter captured in
    one CUDA graph before any eager call, replayed with fresh inputs."""
    cpu_group, device_group, device = _init(rank, world, store, True)
    gc = GroupCommunicator(cpu_group, device, device_group)
    x = torch.empty(8, 256, dtype=torch.bfloat16, device=device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        reduced = gc.all_reduce(x)
        gathered = gc.all_gather(x, 1)
        part = gc.reduce_scatter(x, 0)
    bad = []
    for replay, xs, exact, scale in _fresh_replays(graph, x, rank, world, seed, 100, 4):
        if not _close(reduced, exact, scale, torch.bfloat16):
            bad.append(f"replay {replay}: all_reduce")
        if not torch.equal(gathered.cpu(), torch.cat(xs, 1)):
            bad.append(f"replay {replay}: all_gather")
        if not _close(part, exact.chunk(world, 0)[rank], scale.chunk(world, 0)[rank], torch.bfloat16):
            bad.append(f"replay {replay}: reduce_scatter")
    del graph
    gc.destroy()
    dist.destroy_process_group()
    return bad
