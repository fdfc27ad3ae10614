"""Rank functions of test_call_history.py (importable by spawned ranks)."""

import datetime
import logging
import os
import tempfile

import torch

import pyccl
from gpu_sharing import rank_gpu


def _comm(rank, world, store, timeout_s=30):
    return pyccl.Communicator(store, rank, world, device="cpu", name="history",
                              timeout=datetime.timedelta(seconds=timeout_s))


def calls_recorded(rank, world, store):
    """Four calls of three kinds, then the recorder and what the torch profiler saw."""
    from torch.profiler import ProfilerActivity, profile

    comm = _comm(rank, world, store)
    x = pyccl.empty(256, dtype=torch.bfloat16)
    x.copy_(torch.randn(256, generator=torch.Generator().manual_seed(rank)))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        pyccl.all_reduce(x, comm=comm, algorithm="1pa_ll")
        pyccl.all_gather(x, comm=comm)
    labels = sorted({e.name for e in prof.events() if e.name.startswith("pyccl ")})
    pyccl.reduce_scatter(x, comm=comm)
    pyccl.all_reduce(x, comm=comm, algorithm="2pa_ll")
    history = comm.history()
    logged = []  # what dump_history logs, at INFO
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    logger = logging.getLogger("pyccl")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        dumped = pyccl.dump_history(comm=comm)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    comm.close()
    return labels, history, dumped, logged


def a_failed_call_is_named(rank, world, store):
    """Rank 1 skips the second all-reduce: rank 0's times out. Rank 0 returns
    its recorder after the failure and what the communicator logged."""
    # The ranks meet first: the 2 s timeout also bounds the communicator's set-up.
    store.set(f"ready_{rank}", "1")
    store.wait([f"ready_{q}" for q in range(world)])
    comm = _comm(rank, world, store, timeout_s=2)
    x = pyccl.empty(64, dtype=torch.float32)
    x.fill_(1.0)
    pyccl.all_reduce(x, comm=comm)
    if rank == 1:
        store.get("rank0_failed")
        comm.close()
        return None
    log = tempfile.TemporaryFile()
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)  # the C++ log lines
    try:
        pyccl.all_reduce(x, comm=comm)
        failure = None
    except pyccl.PycclError as e:
        failure = str(e)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    log.seek(0)
    logged = log.read().decode(errors="replace")
    history = comm.history()
    store.set("rank0_failed", b"1")
    comm.close()
    return failure, history, logged


def gpu_calls_recorded(rank, world, store):
    """An eager all-reduce under the torch profiler and one captured in a CUDA
    graph: the profiler's labels, the recorder, and the replay's largest error
    against a float64 sum."""
    from torch.profiler import ProfilerActivity, profile

    gpu = rank_gpu(rank)
    torch.cuda.set_device(gpu)
    comm = pyccl.Communicator(store, rank, world, device=f"cuda:{gpu}", name="history")
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(512, generator=gen).to(device=f"cuda:{gpu}", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        pyccl.all_reduce(x, out=y, comm=comm, algorithm="1pa_ll")
        torch.cuda.synchronize()
    labels = sorted({e.name for e in prof.events() if e.name.startswith("pyccl ")})
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        pyccl.all_reduce(x, out=y, comm=comm, algorithm="1pa_ll")
    y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    parts = torch.empty(world * x.numel(), dtype=x.dtype, device=x.device)
    pyccl.all_gather(x, out=parts, comm=comm)
    expected = parts.view(world, -1).double().sum(0)
    error = (y.double() - expected).abs().max().item()
    history = comm.history()
    del graph
    comm.close()
    return labels, history, error
