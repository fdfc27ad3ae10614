"""Per-rank bodies of the tests of collectives across nodes (pyccl.across_nodes):
each group of ranks its own "node" (PYCCL_NODE_ID), host mode or GPUs."""

from __future__ import annotations

import os
import random

import torch

import pyccl
from ranks_collectives import TOLERANCE, _setup, error_scale, rank_input, reference

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _close(y: torch.Tensor, want: torch.Tensor, dtype, inputs) -> bool:
    rtol, atol = TOLERANCE[dtype]
    return torch.allclose(y.cpu().to(torch.float64), want, rtol=rtol, atol=atol * error_scale(inputs))


def collectives(rank, world, store, on_gpu, seed, calls, max_elems, gpus_per_node):
    """pyccl.all_reduce, all_gather and reduce_scatter on a communicator that
    spans world / gpus_per_node nodes, on random sizes (odd ones included),
    dtypes and ops, against float64. Returns (failures, node layout seen,
    refusals of bad calls)."""
    os.environ["PYCCL_NODE_ID"] = f"node{rank // gpus_per_node}"
    comm, device = _setup(store, rank, world, on_gpu)
    rng = random.Random(seed)
    bad = []
    for i in range(calls):
        collective = rng.choice(("all_reduce", "all_reduce", "all_gather", "reduce_scatter"))
        dtype = rng.choice(_FLOATS)
        op = rng.choice(("sum", "avg", "max", "min", "prod")) if collective != "all_gather" else "sum"
        # Small (2PH LL) and large (2PH HB), whole chunks and odd counts.
        n = rng.choice((rng.randrange(1, 64), rng.randrange(64, max_elems), max_elems))
        if i == 0:  # avg queues a division behind the plan's kernel on the same stream
            collective, dtype, op, n = "all_reduce", torch.float32, "avg", max_elems
        if collective == "reduce_scatter":
            n = max(1, n // world) * world
        inputs = [rank_input(seed, i, r, n, dtype, op) for r in range(world)]
        x = inputs[rank].to(device)
        case = (i, collective, str(dtype), op, n)
        if collective == "all_reduce":
            y = pyccl.all_reduce(x, op=op, comm=comm)
            ok = _close(y, reference(inputs, op), dtype, inputs)
        elif collective == "all_gather":
            y = pyccl.all_gather(x, comm=comm)
            ok = torch.equal(y.cpu(), torch.cat(inputs))
        else:
            y = pyccl.reduce_scatter(x, op=op, comm=comm)
            part = n // world
            want = reference(inputs, op)[rank * part:(rank + 1) * part]
            ok = _close(y, want, dtype, [t[rank * part:(rank + 1) * part] for t in inputs])
        if not ok:
            bad.append(case)
    layout = pyccl.across_nodes.node_layout(comm)
    refusals = {}
    x = torch.ones(8, dtype=torch.int32, device=device)
    for key, call in (("dtype", lambda: pyccl.all_reduce(x, comm=comm)),
                      ("out", lambda: pyccl.all_gather(x.float(), comm=comm, out=torch.empty(3, device=device)))):
        try:
            call()
            refusals[key] = None
        except pyccl.PycclError as e:
            refusals[key] = str(e)
    comm.close()
    return bad, layout, refusals


def interleaved_nodes(rank, world, store):
    """Ranks of a node not numbered consecutively: the collectives refuse the
    communicator with a message that says what they need."""
    os.environ["PYCCL_NODE_ID"] = f"node{rank % 2}"
    comm, _ = _setup(store, rank, world, False)
    try:
        pyccl.all_reduce(torch.ones(16), comm=comm)
        message = None
    except pyccl.PycclError as e:
        message = str(e)
    comm.close()
    return message


def graph_replays(rank, world, store, seed, gpus_per_node, replays):
    """An all-reduce across nodes captured in a CUDA graph (after one eager
    call of its size) and replayed on fresh inputs, each checked; then one of
    2PH LL's size and one of HB's in the same graph. Returns the failures."""
    os.environ["PYCCL_NODE_ID"] = f"node{rank // gpus_per_node}"
    comm, device = _setup(store, rank, world, True)
    bad = []
    sizes = (3000, 300_000)  # bf16: 2PH LL and 2PH HB
    static = [rank_input(seed, 0, rank, n, torch.bfloat16, "sum").to(device) for n in sizes]
    for x in static:
        pyccl.all_reduce(x.clone(), comm=comm)  # sets the plan's buffers up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [pyccl.all_reduce(x, comm=comm) for x in static]
    for i in range(1, replays + 1):
        inputs = [[rank_input(seed, i * 10 + k, r, n, torch.bfloat16, "sum") for r in range(world)]
                  for k, n in enumerate(sizes)]
        for k, x in enumerate(static):
            x.copy_(inputs[k][rank])
        graph.replay()
        torch.cuda.synchronize()
        for k in range(len(sizes)):
            if not _close(outs[k], reference(inputs[k], "sum"), torch.bfloat16, inputs[k]):
                bad.append((i, sizes[k]))
    comm.close()
    return bad
