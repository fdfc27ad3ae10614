"""Per-rank bodies of the graph-buffer tests (pyccl.graph_capture): on GPUs,
zero-copy all-reduces captured on plain tensors; in host mode, the block's
rules and the batched memory exchange it uses."""

from __future__ import annotations

import random

import torch

import pyccl
from ranks_collectives import DTYPES, _setup, check_reduction, rank_input

OPS = ["sum", "avg", "min", "max", "prod"]


def _case_tensor(n: int, dtype: torch.dtype, offset: int, device) -> torch.Tensor:
    """`n` elements of `dtype` from torch's allocator, `offset` elements into
    their allocation (misaligned for 16-bit types at odd offsets)."""
    return torch.empty(n + offset, dtype=dtype, device=device)[offset:]


def _capture_in_block(comm, calls):
    """`calls()` captured in one CUDA graph (on a side stream) inside
    graph_capture. Returns (graph, what calls() returned, calls on graph buffers)."""
    engine = comm._engine
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    before = engine.graph_buffer_calls
    with pyccl.graph_capture(comm=comm):
        with torch.cuda.graph(graph, stream=stream):
            outs = calls()
    return graph, outs, engine.graph_buffer_calls - before


def captured_cases(rank, world, store, seed, count, max_elems, replays, zero_copy_max):
    """Random all-reduces (every dtype and op, in place and out of place,
    misaligned views, outputs allocated inside the capture) captured in one
    CUDA graph inside graph_capture, then replayed with new inputs each time,
    against float64 and bitwise equal across ranks. Calls forced to 2pa_hb up
    to `zero_copy_max` bytes take graph buffers; the rest stage. Returns
    (failures, graph-buffer calls, expected)."""
    comm, device = _setup(store, rank, world, True, engine_options={"zero_copy_max_bytes": zero_copy_max})
    engine = comm._engine
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        dtype = list(DTYPES.values())[i % 3]
        op = OPS[(i // 3) % len(OPS)]
        n = rng.choice([1, 7, 8, 1000, 4099, rng.randrange(1, max_elems), max_elems])
        offset = rng.choice([0, 0, 0, 1, 3])
        algo = rng.choice(["2pa_hb", "2pa_hb", "2pa_hb", None, "1pa_hb"])
        cases.append((i, dtype, op, n, rng.random() < 0.5, offset, algo))
    inputs = [_case_tensor(n, dtype, offset, device) for (_, dtype, _, n, _, offset, _) in cases]

    def zero_copy(n, dtype, algo):  # as _symmetric_choice decides without a table
        nbytes = n * torch.tensor([], dtype=dtype).element_size()
        chosen = algo if algo is not None else engine.select(nbytes, symmetric=True)
        return chosen == "2pa_hb" and nbytes <= zero_copy_max

    expected = sum(1 for (_, dtype, _, n, _, _, algo) in cases if zero_copy(n, dtype, algo))
    for x, (i, dtype, op, n, *_rest) in zip(inputs, cases):
        x.copy_(rank_input(seed, i, rank, n, dtype, op))
    graph, outs, calls = _capture_in_block(
        comm, lambda: [pyccl.all_reduce(x, op=op, comm=comm, out=x if in_place else None, algorithm=algo)
                       for x, (i, dtype, op, n, in_place, offset, algo) in zip(inputs, cases)])
    bad = []
    for r in range(1, replays + 1):
        case_inputs = []
        for x, (i, dtype, op, n, *_rest) in zip(inputs, cases):
            per_rank = [rank_input(seed + r, i, q, n, dtype, op) for q in range(world)]
            x.copy_(per_rank[rank])
            case_inputs.append(per_rank)
        graph.replay()
        for out, per_rank, case in zip(outs, case_inputs, cases):
            bad += check_reduction(comm, out, per_rank, case[2], (r,) + tuple(str(c) for c in case))
    record = comm.device_error()
    del graph
    comm.close()
    return bad, calls, expected, record


def addresses_differ(rank, world, store, seed, replays):
    """Ranks whose captured calls reuse tensors differently: rank 0 passes the
    same input tensor to calls 0 and 2 (out of place), every other rank a
    tensor of its own to each. Registrations pair by call, so call k reads
    call k's tensors on every peer. Returns (failures, graph-buffer calls)."""
    comm, device = _setup(store, rank, world, True)
    n = 100_003  # 200 KB of bf16: 2PA HB forced, within zero_copy_max_bytes
    mine = [torch.empty(n, dtype=torch.bfloat16, device=device) for _ in range(3)]
    inputs = [mine[0], mine[1], mine[0] if rank == 0 else mine[2]]

    def call_inputs(r):  # per call, every rank's input; rank 0's call 2 is its call 0
        per_call = [[rank_input(seed + r, k, q, n, torch.bfloat16, "sum") for q in range(world)] for k in range(3)]
        per_call[2][0] = per_call[0][0]
        return per_call

    graph, outs, calls = _capture_in_block(comm, lambda: [pyccl.all_reduce(x, comm=comm, algorithm="2pa_hb")
                                                          for x in inputs])
    bad = []
    for r in range(replays):
        per_call = call_inputs(r)
        for k, x in enumerate(inputs):
            x.copy_(per_call[k][rank])
        graph.replay()
        for k, out in enumerate(outs):
            bad += check_reduction(comm, out, per_call[k], "sum", (r, k))
    del graph
    comm.close()
    return bad, calls


def outside_and_mismatch(rank, world, store):
    """A graph captured outside graph_capture stages as before; an eager call
    inside the block stages too; ranks that capture different numbers of
    calls get the same error at the block's exit. Returns what happened."""
    comm, device = _setup(store, rank, world, True)
    engine = comm._engine
    result = {}
    n = 300_001
    x = torch.empty(n, dtype=torch.bfloat16, device=device)
    inputs = [rank_input(7, 0, q, n, torch.bfloat16, "sum") for q in range(world)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    outside = torch.cuda.CUDAGraph()
    with torch.cuda.graph(outside, stream=stream):
        y = pyccl.all_reduce(x, comm=comm, algorithm="2pa_hb")
    x.copy_(inputs[rank])
    outside.replay()
    result["outside"] = check_reduction(comm, y, inputs, "sum", ("outside",))
    with pyccl.graph_capture(comm=comm):
        z = pyccl.all_reduce(x, comm=comm, algorithm="2pa_hb")  # eager: not captured
    result["eager"] = check_reduction(comm, z, inputs, "sum", ("eager",))
    result["calls_so_far"] = engine.graph_buffer_calls
    mismatched = torch.cuda.CUDAGraph()
    try:
        with pyccl.graph_capture(comm=comm):
            with torch.cuda.graph(mismatched, stream=stream):
                for _ in range(1 + (rank == 0)):
                    pyccl.all_reduce(x, comm=comm, algorithm="2pa_hb")
    except pyccl.InvalidArgumentError as e:
        result["mismatch"] = str(e)
    result["capturing_after"] = engine.graph_capturing
    del outside, mismatched
    comm.close()
    return result


def replay_before_exit(rank, world, store):
    """A graph replayed inside its graph_capture block, before the exit
    registers its buffers: the call computes nothing and the communicator
    breaks with an error naming the cause. Returns the error message."""
    comm, device = _setup(store, rank, world, True)
    x = torch.ones(4096, dtype=torch.float32, device=device)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    messages = {}
    try:
        with pyccl.graph_capture(comm=comm):
            with torch.cuda.graph(graph, stream=stream):
                pyccl.all_reduce(x, comm=comm, out=x, algorithm="2pa_hb")
            graph.replay()
            torch.cuda.synchronize()
            try:
                pyccl.all_reduce(x, comm=comm, out=x)
            except pyccl.PycclError as e:
                messages["next_call"] = str(e)
    except pyccl.PycclError as e:  # the exit cannot register on a broken communicator
        messages["exit"] = str(e)
    messages["unchanged"] = bool(torch.all(x == 1).item())
    del graph
    comm.close()
    return messages


def block_rules(rank, world, store):
    """Host mode: the block is a no-op (nothing is captured), calls inside it
    are right, blocks do not nest, a block that raises registers nothing and
    a later block works. Returns what happened."""
    comm, _ = _setup(store, rank, world, False)
    engine = comm._engine
    result = {"errors": []}
    n = 10_001
    inputs = [rank_input(3, 0, q, n, torch.float32, "sum") for q in range(world)]
    x = inputs[rank].clone()
    with pyccl.graph_capture(comm=comm) as c:
        result["yields_comm"] = c is comm
        result["capturing"] = engine.graph_capturing
        y = pyccl.all_reduce(x, comm=comm, algorithm="2pa_hb")
        try:
            with pyccl.graph_capture(comm=comm):
                pass
        except pyccl.InvalidArgumentError as e:
            result["nested"] = str(e)
    result["bad"] = check_reduction(comm, y, inputs, "sum", ("inside",))
    try:
        with pyccl.graph_capture(comm=comm):
            raise KeyError("the capture failed")
    except KeyError:
        result["raised_through"] = True
    result["capturing_after_raise"] = engine.graph_capturing
    with pyccl.graph_capture(comm=comm):
        pass
    result["calls"] = engine.graph_buffer_calls
    try:
        pyccl.graph_capture(comm="not a communicator").__enter__()
    except pyccl.InvalidArgumentError as e:
        result["bad_comm"] = str(e)
    comm.close()
    return result


def exchange_many(rank, world, store, counts):
    """Host mode: Communicator.exchange_many maps every rank's i-th buffer
    (this rank registers `counts[rank]` of them). Returns (ok, error)."""
    comm, _ = _setup(store, rank, world, False)
    buffers = []
    for i in range(counts[rank]):
        t = pyccl.empty(64 + 8 * i, dtype=torch.float32, device="cpu")
        t.copy_(torch.arange(t.numel(), dtype=torch.float32) + 1000 * rank + i)
        buffers.append(t)
    try:
        exchanged = comm.exchange_many([comm.register(t) for t in buffers])
    except pyccl.InvalidArgumentError as e:
        comm.close()
        return None, str(e)
    ok = len(exchanged) == counts[rank]
    for i, per_rank in enumerate(exchanged):
        for q, memory in enumerate(per_rank):
            seen = comm.tensor(memory, torch.float32, [64 + 8 * i])
            ok = ok and torch.equal(seen, torch.arange(64 + 8 * i, dtype=torch.float32) + 1000 * q + i)
    comm.barrier()
    comm.close()
    return ok, None


def backend_graph_capture(rank, world, store, replays):
    """dist.all_reduce on a group whose backend is pyccl, captured inside
    pyccl.graph_capture(), replayed with new inputs: the backend's engine takes
    graph buffers too. Returns (failures, the block's log lines)."""
    import logging

    import torch.distributed as dist
    from ranks_backend import _init

    device = _init(rank, world, store, "cuda:pyccl,cpu:pyccl", True)
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    log = logging.getLogger("pyccl")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    n = 1_000_003  # 2 MB of bf16: zero-copy by the engine's own rule (no table)
    x = torch.empty(n, dtype=torch.bfloat16, device=device)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with pyccl.graph_capture():
        with torch.cuda.graph(graph, stream=stream):
            dist.all_reduce(x)
    bad = []
    for r in range(replays):
        inputs = [rank_input(r, 0, q, n, torch.bfloat16, "sum") for q in range(world)]
        x.copy_(inputs[rank])
        graph.replay()
        comm = pyccl.communicator_for(None)
        bad += check_reduction(comm, x, inputs, "sum", (r,))
    log.removeHandler(handler)
    del graph
    dist.destroy_process_group()
    return bad, [line for line in lines if "graph buffers" in line]
