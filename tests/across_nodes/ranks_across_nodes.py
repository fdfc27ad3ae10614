"""Per-rank bodies of the tests of collectives across nodes (pyccl.across_nodes):
each group of ranks its own "node" (PYCCL_NODE_ID), host mode or GPUs."""

from __future__ import annotations

import os
import random

import torch

import pyccl
from gpu_sharing import rank_gpu
from ranks import refusal
from ranks_collectives import TOLERANCE, _setup, error_scale, rank_input, reference

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _close(y: torch.Tensor, want: torch.Tensor, dtype, inputs) -> bool:
    rtol, atol = TOLERANCE[dtype]
    return torch.allclose(y.cpu().to(torch.float64), want, rtol=rtol, atol=atol * error_scale(inputs))


def collectives(rank, world, store, on_gpu, seed, calls, max_elems, gpus_per_node, gpus=None):
    """pyccl.all_reduce, all_gather and reduce_scatter on a communicator that
    spans world / gpus_per_node nodes, on random sizes (odd ones included),
    dtypes and ops, against float64. With `gpus`, rank r runs on GPU r % gpus,
    so that more ranks than GPUs can run (as long as a node's ranks are on
    different GPUs). Returns (failures, node layout seen, refusals of bad calls)."""
    os.environ["PYCCL_NODE_ID"] = f"node{rank // gpus_per_node}"
    comm, device = _setup(store, rank, world, on_gpu, gpu_index=None if gpus is None else rank_gpu(rank % gpus))
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
    x = torch.ones(8, dtype=torch.int32, device=device)
    refusals = {"dtype": refusal(lambda: pyccl.all_reduce(x, comm=comm)),
                "out": refusal(lambda: pyccl.all_gather(x.float(), comm=comm, out=torch.empty(3, device=device)))}
    comm.close()
    return bad, layout, refusals


def interleaved_nodes(rank, world, store):
    """Ranks of a node not numbered consecutively: the collectives refuse the
    communicator with a message that says what they need."""
    os.environ["PYCCL_NODE_ID"] = f"node{rank % 2}"
    comm, _ = _setup(store, rank, world, False)
    message = refusal(lambda: pyccl.all_reduce(torch.ones(16), comm=comm))
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


def torch_group(rank, world, store, on_gpu, seed, gpus_per_node):
    """The torch.distributed backend "pyccl" on a group that spans nodes, as
    torchrun makes it: all_reduce (every dtype and op pyccl reduces),
    all_gather_into_tensor and reduce_scatter_tensor on pyccl.across_nodes
    against float64; barrier; the other ops on the NCCL delegate on GPUs,
    refused with a message naming the op on CPU. Returns (failures, refusals)."""
    import datetime

    import torch.distributed as dist

    from ranks_backend import OPS

    os.environ["PYCCL_NODE_ID"] = f"node{rank // gpus_per_node}"
    device = torch.device("cuda", rank_gpu(rank)) if on_gpu else torch.device("cpu")
    kwargs = {}
    if on_gpu:
        torch.cuda.set_device(device)
        kwargs["device_id"] = device
    dist.init_process_group("pyccl" if on_gpu else "cpu:pyccl", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60), **kwargs)
    rng = random.Random(seed)
    bad = []
    for i in range(12):
        dtype = rng.choice(_FLOATS)
        op = rng.choice(tuple(OPS))
        n = rng.choice((rng.randrange(1, 300), rng.randrange(300, 200_000))) // world * world + world
        inputs = [rank_input(seed, i, r, n, dtype, op) for r in range(world)]
        x = inputs[rank].to(device, copy=True)
        kind = i % 3
        if kind == 0:
            dist.all_reduce(x, op=OPS[op])
            ok = _close(x, reference(inputs, op), dtype, inputs)
        elif kind == 1:
            out = torch.empty(n * world, dtype=dtype, device=device)
            dist.all_gather_into_tensor(out, x)
            ok = torch.equal(out.cpu(), torch.cat(inputs))
        else:
            part = n // world
            out = torch.empty(part, dtype=dtype, device=device)
            dist.reduce_scatter_tensor(out, x, op=OPS[op])
            want = reference(inputs, op)[rank * part:(rank + 1) * part]
            ok = _close(out, want, dtype, [t[rank * part:(rank + 1) * part] for t in inputs])
        if not ok:
            bad.append((i, kind, str(dtype), op, n))
    dist.barrier()
    ints = torch.arange(5, dtype=torch.int32, device=device) + rank
    b = torch.full((7,), float(rank), device=device)
    torch_errors = (RuntimeError, NotImplementedError)
    refusals = {"int_all_reduce": refusal(lambda: dist.all_reduce(ints), torch_errors),
                "broadcast": refusal(lambda: dist.broadcast(b, src=world - 1), torch_errors)}
    if on_gpu:  # the NCCL delegate's results
        if not torch.equal(ints.cpu(), torch.arange(5, dtype=torch.int32) * world + sum(range(world))):
            bad.append("int_all_reduce")
        if not torch.equal(b.cpu(), torch.full((7,), float(world - 1))):
            bad.append("broadcast")
    dist.destroy_process_group()
    return bad, refusals


def launch_torchrun(nodes: int, per_node: int, node_env, timeout: float = 240.0, master: str = "127.0.0.1",
                    wrap=None) -> list:
    """Runs examples/torchrun/across_nodes.py under one torchrun agent per
    "node" (static rendezvous at `master`), with `node_env(node)` added to its
    environment and its command passed through `wrap(node, command)` if given
    (to run it in a network namespace). Returns each agent's (exit code, output)."""
    import subprocess
    import sys
    from pathlib import Path

    from pyccl._spawn import free_port

    script = Path(__file__).resolve().parents[2] / "examples" / "torchrun" / "across_nodes.py"
    port = free_port()
    agents = []
    for node in range(nodes):
        env = dict(os.environ, OMP_NUM_THREADS="1", **node_env(node))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--nproc-per-node",
               str(per_node), "--node-rank", str(node), "--master-addr", master, "--master-port", str(port),
               "--max-restarts", "0", str(script)]
        if wrap is not None:
            cmd = wrap(node, cmd)
        agents.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    results = []
    for agent in agents:
        try:
            out, _ = agent.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            agent.kill()
            out, _ = agent.communicate()
            out += f"\n(killed after {timeout:.0f} s)"
        results.append((agent.returncode, out))
    return results


def check_torchrun(results, world: int) -> list:
    """Every agent exited 0 and every rank of `world` reported ok (the lines
    of ranks sharing an agent's output may run together). Returns the
    (rank, node) of each report."""
    import re

    for code, out in results:
        assert code == 0, out[-3000:]
    reports = re.findall(r"rank (\d+)/(\d+) node (\S+): (ok|WRONG)", "\n".join(out for _, out in results))
    assert sorted(int(r) for r, *_ in reports) == list(range(world)), reports
    assert all(w == str(world) and verdict == "ok" for _, w, _, verdict in reports), reports
    return sorted((int(r), node) for r, _, node, _ in reports)


def plan_transport(rank, world, store, transports, n):
    """Each rank its own node, rank r choosing transports[r] for plans
    (PYCCL_PLAN_TRANSPORT) over the RDMA stand-in: an all-reduce of n float32.
    Returns (error message or None, whether the result was right)."""
    os.environ["PYCCL_NODE_ID"] = f"node{rank}"
    os.environ["PYCCL_PLAN_TRANSPORT"] = transports[rank]
    comm, _ = _setup(store, rank, world, False, timeout_s=20)
    x = torch.full((n,), float(rank + 1))
    try:
        y = pyccl.all_reduce(x, comm=comm)
        result = (None, bool((y == world * (world + 1) / 2).all()))
    except pyccl.PycclError as e:
        result = (str(e), False)
    comm.close()
    return result


def too_many_on_one_node(rank, world, store):
    """A plan on more ranks of one node than its tables hold: refused when the
    runner is made, on every rank, saying the limit."""
    from pyccl.algorithms import LIBRARY
    from pyccl.plans import PlanRunner

    comm, _ = _setup(store, rank, world, False)
    message = refusal(lambda: PlanRunner(LIBRARY["allgather_allpairs"](world).lower(), comm, max_bytes=4096).close())
    comm.close()
    return message
