"""Per-rank bodies of the fault tests: a rank killed, a slow rank, ranks that
disagree on a call, an abort from another thread or during a CUDA graph
replay, a dead proxy thread. Host mode on CPU, or GPUs (``on_gpu``)."""

from __future__ import annotations

import datetime
import os
import signal
import threading
import time

import torch
import torch.distributed as dist

import pyccl
from ranks_backend import _init

ELEMENTS = 4096


def _backend(on_gpu: bool) -> str:
    return "pyccl" if on_gpu else "cpu:pyccl"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _fresh(rank: int, device: torch.device, n: int = ELEMENTS) -> torch.Tensor:
    return torch.rand(n, device=device) + rank


def _attempt(call):
    """("ok", value, seconds) or (exception type, message, seconds, is DistBackendError)."""
    start = time.monotonic()
    try:
        value = call()
        return ("ok", value, time.monotonic() - start)
    except Exception as e:  # noqa: BLE001 - the type is what the tests check
        return (type(e).__name__, str(e), time.monotonic() - start, isinstance(e, dist.DistBackendError))


def _destroy_seconds() -> float:
    start = time.monotonic()
    dist.destroy_process_group()
    return time.monotonic() - start


def _all_reduces_until_failure(x: torch.Tensor, device: torch.device, world: int) -> None:
    """All-reduces `x` again and again (scaled back each time) until one raises."""
    while True:
        dist.all_reduce(x)
        _sync(device)
        x.div_(world)


def killed_rank(rank, world, store, on_gpu, timeout_s):
    """The last rank kills itself (SIGKILL) while every rank runs all-reduces."""
    device = _init(rank, world, store, _backend(on_gpu), on_gpu, timeout_s=timeout_s)
    x = _fresh(rank, device)
    for _ in range(3):
        dist.all_reduce(x)
    _sync(device)
    dist.barrier()
    if rank == world - 1:
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()

    first = _attempt(lambda: _all_reduces_until_failure(x, device, world))
    # Broken now: the next call fails at once, and the group still goes away.
    again = _attempt(lambda: (dist.all_reduce(x), _sync(device)))
    return first, again, _destroy_seconds()


def stopped_rank(rank, world, store, on_gpu, timeout_s, stop_after_s):
    """The last rank stops itself (SIGSTOP) `stop_after_s` into a loop of
    all-reduces; rank 0 kills it (SIGKILL) once the survivors have failed.
    Returns the survivors' failure and its seconds from the stop."""
    device = _init(rank, world, store, _backend(on_gpu), on_gpu, timeout_s=timeout_s)
    x = _fresh(rank, device)
    for _ in range(3):
        dist.all_reduce(x)
    _sync(device)
    if rank == world - 1:
        store.set("stopped_pid", str(os.getpid()))
    dist.barrier()
    stop_at = time.monotonic() + stop_after_s
    if rank == world - 1:
        threading.Timer(stop_after_s, lambda: os.kill(os.getpid(), signal.SIGSTOP)).start()

    first = _attempt(lambda: _all_reduces_until_failure(x, device, world))
    after_stop = time.monotonic() - stop_at
    store.set(f"survivor_failed_{rank}", "1")
    if rank == 0:
        store.wait([f"survivor_failed_{q}" for q in range(world - 1)])
        os.kill(int(store.get("stopped_pid")), signal.SIGKILL)
    again = _attempt(lambda: (dist.all_reduce(x), _sync(device)))
    return first, after_stop, again, _destroy_seconds()


def slow_rank(rank, world, store, on_gpu, timeout_s, delay_s, slow=None):
    """Rank `slow` (the last by default) reaches the second all-reduce `delay_s` late."""
    slow = world - 1 if slow is None else slow
    device = _init(rank, world, store, _backend(on_gpu), on_gpu, timeout_s=timeout_s)
    x = torch.full((ELEMENTS,), float(rank + 1), device=device)
    dist.all_reduce(x)
    _sync(device)
    if rank == slow:
        time.sleep(delay_s)

    def one():
        x.fill_(float(rank + 1))
        dist.all_reduce(x)
        _sync(device)
        return bool((x == world * (world + 1) / 2).all())

    first = _attempt(one)
    second = _attempt(one)
    return first, second, _destroy_seconds()


def mismatched_call(rank, world, store, on_gpu, variant):
    """Rank 1 calls with a different size (or a different op); with call checks
    on, every rank raises before anything runs, and the group stays usable."""
    device = _init(rank, world, store, _backend(on_gpu), on_gpu, timeout_s=30)
    n = ELEMENTS + (64 if rank == 1 and variant == "size" else 0)
    x = _fresh(rank, device, n)
    if rank == 1 and variant == "op":
        out = torch.empty(n * world, device=device)
        first = _attempt(lambda: (dist.all_gather_into_tensor(out, x), _sync(device)))
    else:
        first = _attempt(lambda: (dist.all_reduce(x), _sync(device)))
    y = torch.full((ELEMENTS,), float(rank + 1), device=device)
    dist.all_reduce(y)
    _sync(device)
    after = bool((y == world * (world + 1) / 2).all())
    dist.destroy_process_group()
    return first, after


def mismatched_direct_call(rank, world, store):
    """The same through pyccl's own API (a Communicator, host mode)."""
    comm = pyccl.Communicator(store, rank, world, device="cpu", timeout=datetime.timedelta(seconds=30))
    x = torch.rand(ELEMENTS + (16 if rank == 0 else 0))
    first = _attempt(lambda: comm.all_reduce(x))
    y = comm.all_reduce(torch.ones(ELEMENTS))
    comm.close()
    return first, bool((y == world).all())


def abort_unblocks(rank, world, store, on_gpu):
    """Rank 0 runs an all-reduce its peers never join; another thread aborts
    the group after 1 s."""
    device = _init(rank, world, store, _backend(on_gpu), on_gpu, timeout_s=120)
    x = _fresh(rank, device)
    dist.all_reduce(x)
    _sync(device)
    dist.barrier()
    result = None
    if rank == 0:
        group = dist.group.WORLD
        timer = threading.Timer(1.0, group.abort)
        timer.start()
        result = _attempt(lambda: (dist.all_reduce(x), _sync(device), dist.all_reduce(x), _sync(device)))
        timer.join()
        result += (_destroy_seconds(),)
    store.set(f"abort_done{rank}", "1")
    store.wait(["abort_done0"], datetime.timedelta(seconds=60))
    if rank != 0:
        dist.destroy_process_group()
    return result


def abort_during_graph_replay(rank, world, store):
    """Both ranks replay a graph of all-reduces; then rank 1 stops, so rank 0's
    next replay hangs, and another thread of rank 0 aborts its group: the
    replay returns long before the (60 s) timeout, and the next call raises."""
    device = _init(rank, world, store, "pyccl", True, timeout_s=60)
    x = _fresh(rank, device, 1024)
    dist.all_reduce(x)  # eager first: the group's GPU buffers exist before the capture
    torch.cuda.synchronize()
    graph = _captured_all_reduces(x, 20, world)
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.synchronize()
    result = None
    if rank == 0:
        timer = threading.Timer(1.0, dist.group.WORLD.abort)
        timer.start()
        start = time.monotonic()
        graph.replay()
        torch.cuda.synchronize()
        replay_s = time.monotonic() - start
        timer.join()
        result = (replay_s, _attempt(lambda: (dist.all_reduce(x), torch.cuda.synchronize())))
        store.set("replay_done", "1")
    else:
        store.wait(["replay_done"], datetime.timedelta(seconds=120))
    del graph
    return result, _destroy_seconds()


def _captured_all_reduces(x, count, world):
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(count):
                dist.all_reduce(x)
                x.div_(world)
    torch.cuda.synchronize()
    return graph


def replayed_failure(rank, world, store, timeout_s):
    """The last rank dies; rank 0 only replays a graph. By default its next
    eager call raises, naming the replayed call; with
    PYCCL_ASYNC_ERROR_HANDLING=1 the watchdog aborts the process first."""
    device = _init(rank, world, store, "pyccl", True, timeout_s=timeout_s)
    x = _fresh(rank, device, 1024)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    graph = _captured_all_reduces(x, 1, world)
    dist.barrier()
    torch.cuda.synchronize()
    if rank == world - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    while time.monotonic() - start < timeout_s + 3:
        graph.replay()
        torch.cuda.synchronize()
    eager = _attempt(lambda: (dist.all_reduce(x), torch.cuda.synchronize()))
    del graph
    return eager, _destroy_seconds()


def proxy_death(rank, world, store):
    """Rank 0's proxy thread dies; its port channel refuses work, its
    communicator says why, and rank 1's wait for its signal times out."""
    from pyccl.primitives import Op, run

    comm = pyccl.Communicator(store, rank, world, device="cpu", timeout=datetime.timedelta(seconds=2))
    buf = pyccl.empty(1024, dtype=torch.int32, device="cpu")
    local = comm.register(buf)
    channel = comm.port_channel(1 - rank, local)
    comm.barrier()
    if rank == 0:
        comm._comm._inject_proxy_failure("injected: a transfer failed")
        deadline = time.monotonic() + 5
        while comm.failure is None and time.monotonic() < deadline:
            time.sleep(0.01)
    ran = _attempt(lambda: run(comm, [Op.port_put(0, 0, 0, 64, signal=True), Op.port_flush(0), Op.port_wait(0)],
                               port=[channel]).failures)
    failure = comm.failure
    record = comm.device_error()
    later = _attempt(lambda: comm.all_reduce(torch.ones(16)))
    comm.close()
    return ran, failure, record, later


def work_outlives_group(rank, world, store):
    """A Work may be waited on after its group is destroyed."""
    device = _init(rank, world, store, "cpu:pyccl", False, timeout_s=30)
    x = torch.ones(16, device=device)
    work = dist.all_reduce(x, async_op=True)
    dist.destroy_process_group()
    return work.wait(), work.is_success(), x.tolist() == [float(world)] * 16


def late_rank_after_a_verdict(rank, world, store, on_gpu, collective, timeout_s, delay_s):
    """Rank 0 reaches the second `collective` `delay_s` late, after its peers
    gave it up (timeout `timeout_s`): its peers published their verdict, so
    rank 0 must fail that call too, naming the rank that gave up, never
    report it done. "plan": an all-reduce by a registered DSL plan that reads
    its peers' buffers."""
    import pyccl.algorithms as algorithms
    from ranks_collectives import _setup

    comm, device = _setup(store, rank, world, on_gpu, timeout_s=timeout_s)
    entry = None
    if collective == "plan":
        entry = pyccl.register_algorithm(algorithms.allreduce_2pa_hb_pull(world), "all_reduce", 0, 1 << 20, world)
    n = ELEMENTS * world
    x = torch.rand(n, device=device) + rank

    def one():
        if collective in ("all_reduce", "plan"):
            return pyccl.all_reduce(x, comm=comm)
        if collective == "all_gather":
            return pyccl.all_gather(x, comm=comm)
        if collective == "reduce_scatter":
            return pyccl.reduce_scatter(x, comm=comm)
        if collective == "all_to_all":
            return pyccl.all_to_all(x, comm=comm)
        return pyccl.broadcast(x, src=0, comm=comm)  # the late rank is the root: its peer waits for it

    try:
        one()
        _sync(torch.device(device))
        if rank == 0:
            time.sleep(delay_s)

        def late():
            out = one()
            _sync(torch.device(device))
            return None if out is None else out.float().sum().item()

        first = _attempt(late)
        # Either way the communicator is broken now: the next call is refused at once.
        again = _attempt(late)
        return first[:3], again[:3], comm.sequence
    finally:
        if entry is not None:
            pyccl.unregister_algorithm(entry)
        comm.close()


def group_timeout_reaches_pyccl_calls(rank, world, store, timeout_s):
    """pyccl.all_reduce on a gloo group made with `timeout_s`: the group's
    communicator takes that timeout, so a call the last rank never makes
    fails within it (not pyccl's 10-minute default)."""
    _init(rank, world, store, "gloo", False, timeout_s=timeout_s)
    x = torch.rand(ELEMENTS) + rank
    pyccl.all_reduce(x)
    if rank == world - 1:
        time.sleep(timeout_s + 2)
        result = ("skipped", "", 0.0)
    else:
        result = _attempt(lambda: pyccl.all_reduce(x))[:3]
    return result, _destroy_seconds()


def fused_rows_differ(rank, world, store, on_gpu, timeout_s):
    """pyccl.fused_all_reduce_rmsnorm through a torch group made with
    `timeout_s`, rank q with 3 + 2q rows, then two all-reduces of ones: the
    three calls' outcomes (the all-reduces' value: whether the sum is right),
    and the first call's outputs untouched (call checks refuse it before
    anything runs)."""
    device = _init(rank, world, store, "nccl" if on_gpu else "gloo", on_gpu, timeout_s=timeout_s)
    rows, hidden = 3 + 2 * rank, 64
    x, residual = torch.rand(rows, hidden, device=device), torch.rand(rows, hidden, device=device)
    weight = torch.rand(hidden, device=device)
    out = torch.full_like(x, -1.0)
    first = _attempt(lambda: (pyccl.fused_all_reduce_rmsnorm(x, residual, weight, out=out), _sync(device))[1])[:3]
    untouched = bool((out == -1.0).all())
    ones = torch.ones(16, device=device)
    def all_reduce_ones() -> bool:
        ones.fill_(1.0)
        pyccl.all_reduce(ones, out=ones)
        _sync(device)
        return bool((ones == world).all())

    second = _attempt(all_reduce_ones)[:3]
    third = _attempt(all_reduce_ones)[:3]
    return first, second, third, untouched, _destroy_seconds()


def missing_call_under_call_checks(rank, world, store, timeout_s):
    """With PYCCL_DEBUG=1 the last rank skips the second all-reduce: the
    others' check of the call times out, breaking the communicator."""
    from ranks_collectives import _setup

    comm, _ = _setup(store, rank, world, False, timeout_s=timeout_s)
    x = torch.rand(ELEMENTS) + rank
    try:
        pyccl.all_reduce(x, comm=comm)
        if rank == world - 1:
            time.sleep(timeout_s + 2)
            return None
        first = _attempt(lambda: pyccl.all_reduce(x, comm=comm))[:3]
        again = _attempt(lambda: pyccl.all_reduce(x, comm=comm))[:3]
        return first, again
    finally:
        comm.close()


def detail_debug_group(rank, world, store):
    """A "cpu:pyccl" group made under TORCH_DISTRIBUTED_DEBUG=DETAIL (torch wraps it and asks for its
    sequence numbers): its collectives run and its sequence number counts its ops alike on every rank."""
    _init(rank, world, store, "cpu:pyccl", False, timeout_s=30)
    x = torch.full((ELEMENTS,), float(rank + 1))
    dist.all_reduce(x)
    dist.broadcast(x, src=0)
    ok = bool((x == world * (world + 1) / 2).all())
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    seq = backend._get_sequence_number_for_group()
    _destroy_seconds()
    return ok, seq
