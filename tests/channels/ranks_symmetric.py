"""Per-rank bodies of the symmetric-buffer tests (zero-copy all-reduce); each
runs in host mode or on GPUs."""

from __future__ import annotations

import random

import torch

import pyccl
from ranks_collectives import DTYPES, _setup, check_reduction, reference, rank_input


def _view(buf: torch.Tensor, dtype: torch.dtype, offset: int, n: int) -> torch.Tensor:
    """`n` elements of `dtype` at element `offset` of the byte buffer `buf`."""
    size = torch.tensor([], dtype=dtype).element_size()
    return buf[offset * size:(offset + n) * size].view(dtype)


def symmetric_cases(rank, world, store, on_gpu, seed, count, max_elems, threshold, options=None):
    """Random all-reduces on symmetric buffers (in place, out of place,
    misaligned views, every dtype and op), back to back with the other
    algorithms on the same buffers, against a float64 reference and bitwise
    equal across ranks. Messages above `zero_copy_max_bytes` (in `options`;
    host mode's default has no limit) take the staged 2PA HB path instead.
    Returns (failures, zero-copy calls, expected zero-copy calls)."""
    comm, device = _setup(store, rank, world, on_gpu,
                          engine_options={"zero_copy_threshold_bytes": threshold, **(options or {})})
    nbytes = (max_elems + 8) * 4
    a = pyccl.symmetric_empty(nbytes, dtype=torch.uint8, comm=comm)
    b = pyccl.symmetric_empty(nbytes, dtype=torch.uint8, comm=comm)
    assert pyccl.is_symmetric(a, comm=comm) and pyccl.is_symmetric(b[100:], comm=comm)
    assert not pyccl.is_symmetric(torch.empty(8, device=device), comm=comm)
    engine = comm._engine
    zero_copy_max = (options or {}).get("zero_copy_max_bytes") or float("inf")
    rng = random.Random(seed)
    ops = ["sum", "avg", "min", "max", "prod"]
    bad, expected_zero_copy = [], 0
    for i in range(count):
        dtype = list(DTYPES.values())[i % 3]
        op = ops[(i // 3) % len(ops)]
        n = rng.choice([1, 3, 8, 9, 31, 1000, 4097, rng.randrange(1, max_elems), max_elems])
        in_place = rng.random() < 0.5
        offset = rng.choice([0, 0, 1, 3])
        algo = rng.choice([None, None, "2pa_hb", "1pa_ll", "2pa_ll", "1pa_hb"])  # 1pa_hb: staged
        size = torch.tensor([], dtype=dtype).element_size()
        if algo == "1pa_ll" and n * size > engine.ll_max_bytes:
            algo = None
        inputs = [rank_input(seed, i, r, n, dtype, op) for r in range(world)]
        x = _view(a, dtype, offset, n)
        x.copy_(inputs[rank])
        out = x if in_place else _view(b, dtype, offset, n)
        pyccl.all_reduce(x, op=op, out=out, comm=comm, algorithm=algo)
        if (algo == "2pa_hb" or (algo is None and n * size >= threshold)) and n * size <= zero_copy_max:
            expected_zero_copy += 1
        bad += check_reduction(comm, out, inputs, op, (i, str(dtype), op, n, algo, in_place, offset))
    # An output outside the symmetric buffers takes the staged path.
    before = engine.zero_copy_calls
    x = _view(a, torch.float32, 0, 5000)
    x.copy_(rank_input(seed, count, rank, 5000, torch.float32, "sum"))
    y = pyccl.all_reduce(x, comm=comm, algorithm="2pa_hb")
    expect = reference([rank_input(seed, count, r, 5000, torch.float32, "sum") for r in range(world)], "sum")
    if engine.zero_copy_calls != before or not torch.allclose(y.cpu().double(), expect, rtol=1e-5, atol=1e-4):
        bad.append(("plain output", engine.zero_copy_calls - before))
    record = comm.device_error()
    calls = engine.zero_copy_calls
    comm.close()
    return bad, calls, expected_zero_copy, record


def registration_errors(rank, world, store, on_gpu):
    """What register_symmetric refuses: sizes that differ across ranks, and a
    buffer overlapping one already registered. Returns the messages."""
    comm, device = _setup(store, rank, world, on_gpu)
    messages = {}
    try:
        pyccl.symmetric_empty(1024 + 16 * rank, dtype=torch.uint8, comm=comm)
    except pyccl.InvalidArgumentError as e:
        messages["size"] = str(e)
    t = pyccl.symmetric_empty(4096, dtype=torch.uint8, comm=comm)
    try:
        pyccl.register_symmetric(t[1024:], comm=comm)
    except pyccl.InvalidArgumentError as e:
        messages["overlap"] = str(e)
    # The communicator still works, and the registered buffer runs zero-copy.
    x = t[:2048].view(torch.float32)
    x.copy_(torch.full((512,), float(rank + 1)))
    pyccl.all_reduce(x, out=x, comm=comm, algorithm="2pa_hb")
    messages["sum_ok"] = bool(torch.all(x.cpu() == world * (world + 1) / 2))
    messages["zero_copy_calls"] = comm._engine.zero_copy_calls
    comm.close()
    return messages


def graph_replays(rank, world, store, replays):
    """The zero-copy all-reduce captured in a CUDA graph on buffers from torch's
    allocator (registered), replayed with new inputs each time. Returns failures."""
    comm, device = _setup(store, rank, world, True)
    n = 1_000_003
    x = pyccl.register_symmetric(torch.empty(n, dtype=torch.bfloat16, device=device), comm=comm)
    y = pyccl.register_symmetric(torch.empty(n, dtype=torch.bfloat16, device=device), comm=comm)
    x.copy_(rank_input(0, 0, rank, n, torch.bfloat16, "sum"))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    before = comm._engine.zero_copy_calls
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        # Forced: the tables choose 1PA HB (staged) at this size on 2 GPUs.
        pyccl.all_reduce(x, out=y, comm=comm, algorithm="2pa_hb")
    bad = []
    if comm._engine.zero_copy_calls != before + 1:
        bad.append("the captured call did not run zero-copy")
    for r in range(1, replays + 1):
        inputs = [rank_input(r, 0, q, n, torch.bfloat16, "sum") for q in range(world)]
        x.copy_(inputs[rank])
        graph.replay()
        bad += check_reduction(comm, y, inputs, "sum", (r,))
    del graph
    comm.close()
    return bad
