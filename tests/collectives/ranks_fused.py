"""Per-rank bodies of the fused all-reduce + residual add + RMSNorm tests; each
runs in host mode or on GPUs."""

from __future__ import annotations

import hashlib
import random

import torch

import pyccl
from ranks_collectives import _setup

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Relative tolerance of one rounding to the dtype (plus fp32 sums for float32).
RTOL = {torch.float32: 2e-5, torch.float16: 1.2e-3, torch.bfloat16: 8e-3}


def case_tensors(seed: int, case: int, world: int, rows: int, hidden: int, dtype: torch.dtype):
    """Every rank's partial sums, and the residual and weight every rank shares: fresh random values."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + case)
    xs = [(torch.randn(rows, hidden, generator=gen, dtype=torch.float64) * 2).to(dtype) for _ in range(world)]
    residual = (torch.randn(rows, hidden, generator=gen, dtype=torch.float64) * 3).to(dtype)
    weight = (1 + 0.5 * torch.randn(hidden, generator=gen, dtype=torch.float64)).to(dtype)
    return xs, residual, weight


def check_fused(xs, residual, weight, eps, normed, new_residual) -> list:
    """What is wrong with one fused result, against float64:
    - the new residual against the exact sum, within one rounding of the terms' size;
    - the normalized rows against RMSNorm (float64) of the new residual as returned, within one
      rounding of their size (fp32 sums of squares included)."""
    dtype = normed.dtype
    rtol = RTOL[dtype]
    exact = torch.stack([x.double() for x in xs]).sum(0) + residual.double()
    scale = torch.stack([x.double().abs() for x in xs]).sum(0) + residual.double().abs()
    got = new_residual.cpu().double()
    problems = []
    err = (got - exact).abs()
    if not bool((err <= rtol * scale + 1e-30).all()):
        problems.append(f"new residual off by {err.max().item():.3g} (scale {scale.max().item():.3g})")
    r = got
    ref = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.double()
    nerr = (normed.cpu().double() - ref).abs()
    bound = rtol * (ref.abs() + 4 * weight.double().abs()) + 1e-6
    if not bool((nerr <= bound).all()):
        problems.append(f"normed off by {nerr.max().item():.3g} (largest {ref.abs().max().item():.3g})")
    return problems


def random_cases(seed: int, count: int, world: int, max_hidden: int):
    """(dtype, rows, hidden, algorithm, in_place, eps, misaligned): odd hidden sizes and row counts around
    the world size; misaligned: the input and the residual start one element into their storage."""
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        rows = rng.choice([1, 2, world - 1 or 1, world, world + 1, 7, 16, 33, rng.randrange(1, 80)])
        hidden = rng.choice([1, 3, 8, 100, 257, 1024, 4099, max_hidden, rng.randrange(1, max_hidden)])
        hidden = min(hidden, max_hidden)
        algo = rng.choice([None, None, "one_shot", "two_shot", "two_kernel", "unfused"])
        if algo == "two_shot" and rows < world:
            algo = "one_shot"
        cases.append((DTYPES[i % 3], rows, hidden, algo, rng.random() < 0.3, rng.choice([1e-6, 1e-5, 0.1]),
                      rng.random() < 0.2))
    return cases


def _placed(t: torch.Tensor, device, misaligned: bool) -> torch.Tensor:
    """A contiguous copy of t on device, starting one element into its storage if misaligned."""
    if not misaligned:
        return t.to(device, copy=True)
    storage = torch.empty(t.numel() + 1, dtype=t.dtype, device=device)
    out = storage[1:].view(t.shape)
    out.copy_(t)
    return out


def fused_cases(rank, world, store, on_gpu, seed, count, max_hidden, engine_options=None):
    """Random fused calls, checked against float64 and for bitwise equality of
    both results across ranks. Returns (failures, the device's error record)."""
    return _run_cases(rank, world, store, on_gpu, seed, random_cases(seed, count, world, max_hidden), engine_options)


def fused_two_shot_row_counts(rank, world, store, seed, hidden, row_counts):
    """Two-shot calls of every row count in `row_counts` (float32 rows of
    `hidden`), in host mode: long calls go in pieces, and a last piece of fewer
    rows than ranks runs one-shot. Checked as fused_cases checks."""
    cases = [(torch.float32, rows, hidden, "two_shot", False, 1e-5, False) for rows in row_counts]
    return _run_cases(rank, world, store, False, seed, cases)


def _run_cases(rank, world, store, on_gpu, seed, cases, engine_options=None):
    """Runs `cases` (random_cases' form) and checks each. Returns (failures, the device's error record)."""
    comm, device = _setup(store, rank, world, on_gpu, engine_options=engine_options)
    pyccl.all_reduce(torch.ones(1, device=device), comm=comm)  # makes the engine
    max_row = comm._engine.fused_max_row_bytes
    bad = []
    for i, (dtype, rows, hidden, algo, in_place, eps, misaligned) in enumerate(cases):
        if algo in ("one_shot", "two_shot") and hidden * dtype.itemsize > max_row:
            algo = None  # rows the one-kernel algorithms cannot take: the automatic choice takes two_kernel
        xs, residual, weight = case_tensors(seed, i, world, rows, hidden, dtype)
        x = _placed(xs[rank], device, misaligned)  # in place must not touch the reference's inputs
        res = _placed(residual, device, misaligned)
        normed, new_res = pyccl.fused_all_reduce_rmsnorm(
            x, res, weight.to(device), eps, comm=comm, algorithm=algo,
            out=x if in_place else None, residual_out=res if in_place else None)
        case = (i, str(dtype), rows, hidden, algo, in_place, eps, misaligned)
        if in_place and (normed.data_ptr() != x.data_ptr() or new_res.data_ptr() != res.data_ptr()):
            bad.append(case + ("in place, but the results are new tensors",))
        bad += [case + (p,) for p in check_fused(xs, residual, weight, eps, normed, new_res)]
        digest = hashlib.sha256(normed.cpu().view(torch.uint8).numpy().tobytes() +
                                new_res.cpu().view(torch.uint8).numpy().tobytes()).digest()
        if any(d != digest for d in comm.all_gather_bytes(digest)):
            bad.append(case + ("results differ across ranks",))
    record = comm.device_error()
    comm.close()
    return bad, record


def fused_graph_replays(rank, world, store, replays):
    """A CUDA graph of fused calls (the automatic choice at 1 and 64 rows of
    8192 bf16, one-shot and two-shot forced), captured before any eager fused
    call and replayed with fresh inputs copied in each time; every replay checked."""
    comm, device = _setup(store, rank, world, True)
    pyccl.all_reduce(torch.ones(8, device=device), comm=comm)  # the engine, before capture
    shapes = [(1, 8192), (64, 8192), (8, 8192), (world, 8192)]
    algos = [None, None, "one_shot", "two_shot"]
    statics = [tuple(torch.empty(s, dtype=torch.bfloat16, device=device) for _ in range(2)) for s in shapes]
    weights = [torch.empty(s[1], dtype=torch.bfloat16, device=device) for s in shapes]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        results = [pyccl.fused_all_reduce_rmsnorm(x, r, w, 1e-5, comm=comm, algorithm=a)
                   for (x, r), w, a in zip(statics, weights, algos)]
    torch.cuda.current_stream().wait_stream(stream)
    bad = []
    for replay in range(replays):
        cases = []
        for k, ((x, r), w, shape) in enumerate(zip(statics, weights, shapes)):
            xs, residual, weight = case_tensors(replay, k, world, shape[0], shape[1], torch.bfloat16)
            x.copy_(xs[rank])
            r.copy_(residual)
            w.copy_(weight)
            cases.append((xs, residual, weight))
        graph.replay()
        torch.cuda.synchronize()
        for k, ((xs, residual, weight), (normed, new_res)) in enumerate(zip(cases, results)):
            bad += [(replay, k, p) for p in check_fused(xs, residual, weight, 1e-5, normed, new_res)]
    del graph
    comm.close()
    return bad


def fused_bad_arguments(rank, world, store):
    """The error (type, message) of each bad call, by label."""
    comm, device = _setup(store, rank, world, False)
    x = torch.randn(4, 16)
    r = torch.randn(4, 16)
    w = torch.randn(16)
    calls = {
        "dtype": lambda: pyccl.fused_all_reduce_rmsnorm(x.int(), r.int(), w.int(), comm=comm),
        "residual_shape": lambda: pyccl.fused_all_reduce_rmsnorm(x, r[:3], w, comm=comm),
        "residual_dtype": lambda: pyccl.fused_all_reduce_rmsnorm(x, r.double(), w, comm=comm),
        "weight_shape": lambda: pyccl.fused_all_reduce_rmsnorm(x, r, w[:8], comm=comm),
        "eps": lambda: pyccl.fused_all_reduce_rmsnorm(x, r, w, -1.0, comm=comm),
        "out": lambda: pyccl.fused_all_reduce_rmsnorm(x, r, w, comm=comm, out=torch.empty(4, 8)),
        "residual_out": lambda: pyccl.fused_all_reduce_rmsnorm(x, r, w, comm=comm, residual_out=x),
        "contiguous": lambda: pyccl.fused_all_reduce_rmsnorm(torch.randn(16, 4).t(), r, w, comm=comm),
        "algorithm": lambda: pyccl.fused_all_reduce_rmsnorm(x, r, w, comm=comm, algorithm="three_shot"),
        "two_shot_rows": lambda: pyccl.fused_all_reduce_rmsnorm(x[:1], r[:1], w, comm=comm, algorithm="two_shot"),
    }
    out = {}
    for label, call in calls.items():
        try:
            call()
            out[label] = ("accepted", "")
        except Exception as e:  # noqa: BLE001 (the test inspects the type)
            out[label] = (type(e).__name__, str(e))
    comm.close()
    return out


def launch_shapes(rank, world, store):
    """The fused kernel's automatic launch shapes on the GPU's LL layout (64
    blocks, 1 MiB), asked of a host-mode engine: {(rows, row_bytes, algorithm): (segments, threads)}."""
    comm, _ = _setup(store, rank, world, False, engine_options={"ll_blocks": 64, "ll_max_bytes": 1 << 20})
    shapes = {}
    for rows, algo in [(1, "one_shot"), (8, "one_shot"), (16, "one_shot"), (32, "two_shot"), (64, "two_shot")]:
        shapes[(rows, 16384, algo)] = comm._engine.fused_launch(rows, 16384, algo)
    shapes[(1, 1 << 17, "one_shot")] = comm._engine.fused_launch(1, 1 << 17, "one_shot")  # 128 KiB rows: 8 blocks
    shapes["max_row"] = comm._engine.fused_max_row_bytes
    comm.close()
    return shapes


def automatic_choices(rank, world, store):
    """select_fused's answers on a host-mode engine with one-shot up to 64 KiB, two-shot up to
    256 KiB and two kernels above: {(rows, row_bytes): algorithm}, and the longest row the
    one-kernel algorithms take."""
    comm, _ = _setup(store, rank, world, False,
                     engine_options={"fused_two_shot_bytes": 64 << 10, "fused_two_kernel_min_bytes": (256 << 10) + 1})
    longest = comm._engine.fused_max_row_bytes
    shapes = [(1, 16384), (world - 1, 1 << 15), (4, 16384), (5, 16384), (16, 16384), (17, 16384), (64, 16384),
              (1, longest), (1, longest + 2), (world, longest + 2)]
    choices = {shape: comm._engine.select_fused(*shape) for shape in shapes}
    comm.close()
    return choices, longest
