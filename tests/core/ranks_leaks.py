"""Per-rank bodies of the leak and load tests."""

from __future__ import annotations

import datetime
import os
import random
import threading
import time

import torch
import torch.distributed as dist

import pyccl
from gpu_sharing import rank_gpu
from ranks import _resources
from ranks_collectives import TOLERANCE


def _snapshot(on_gpu: bool) -> dict:
    """ranks._resources() (fds, threads, shared memory, host allocations), plus
    peer device mappings, RSS and, on GPUs, device memory in use."""
    with open("/proc/self/statm") as f:
        rss_pages = int(f.read().split()[1])
    snap = {
        **_resources(),
        "peer_device_mappings": pyccl._C.num_peer_device_mappings(),
        "rss_mib": rss_pages * os.sysconf("SC_PAGE_SIZE") / 2**20,
    }
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info()
        snap["gpu_used_mib"] = (total - free) / 2**20
    return snap


def communicator_cycles(rank, world, store, on_gpu, cycles):
    """Creates a communicator, runs every collective at an LL and an HB size,
    destroys it; `cycles` times. Returns the resources after a warm-up and at
    the end, and whether every result was right."""
    device = torch.device("cuda", rank_gpu(rank)) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    wrong = []

    def one(i):
        comm = pyccl.Communicator(store, rank, world, device=device, name=f"leak{i}",
                                  timeout=datetime.timedelta(seconds=60))
        for n in (1000, 300_000):
            x = torch.full((n,), float(rank + 1), device=device)
            if not bool((comm.all_reduce(x) == world * (world + 1) / 2).all()):
                wrong.append((i, "all_reduce", n))
            gathered = comm.all_gather(x)
            if not bool((gathered.view(world, n)[:, 0].cpu() == torch.arange(1, world + 1)).all()):
                wrong.append((i, "all_gather", n))
            scattered = comm.reduce_scatter(torch.full((n * world,), float(rank + 1), device=device))
            if not bool((scattered == world * (world + 1) / 2).all()):
                wrong.append((i, "reduce_scatter", n))
            if not bool((comm.broadcast(x, src=world - 1) == world).all()):
                wrong.append((i, "broadcast", n))
            exchanged = comm.all_to_all(torch.full((n * world,), float(rank + 1), device=device))
            if not bool((exchanged.view(world, n)[:, -1].cpu() == torch.arange(1, world + 1)).all()):
                wrong.append((i, "all_to_all", n))
        comm.close()

    for i in range(3):  # warm-up: process-wide state made once (CUDA context, caches)
        one(-1 - i)
    before = _snapshot(on_gpu)
    start = time.monotonic()
    for i in range(cycles):
        one(i)
    seconds = time.monotonic() - start
    return before, _snapshot(on_gpu), wrong, seconds


def mixed_load(rank, world, store, on_gpu, seconds, seed):
    """Two process groups, each driven by its own thread (and CUDA stream),
    run random collectives of random sizes for `seconds`; every result is
    checked. Returns the calls made per group and the wrong results."""
    device = torch.device("cuda", rank_gpu(rank)) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=float(os.environ.get("LOAD_TIMEOUT", "120")))
    # LOAD_BACKEND=nccl runs the same load on ProcessGroupNCCL, for comparison.
    backend = os.environ.get("LOAD_BACKEND", "pyccl") if on_gpu else "cpu:pyccl"
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=timeout, **({"device_id": device} if on_gpu else {}))
    groups = [dist.new_group(list(range(world)), timeout=timeout) for _ in range(2)]
    calls = [0, 0]
    phase = ["start", "start"]  # where each thread is, for the LOAD_TRACE diagnostics
    wrong = []
    errors = []
    deadline = [0.0]
    warmed = [threading.Event(), threading.Event()]
    go_on = threading.Event()

    def drive(g: int):
        rng = random.Random(seed * 100 + g)
        stream = torch.cuda.Stream(device) if on_gpu else None
        group = groups[g]
        try:
            with torch.cuda.stream(stream) if on_gpu else _Null():
                # One group at a time first: see _warm_up.
                try:
                    if g == 1:
                        warmed[0].wait()
                    phase[g] = "warm-up"
                    if os.environ.get("LOAD_WARMUP", "1") != "0":
                        _warm_up(rank, world, group, device, wrong, g)
                finally:
                    warmed[g].set()
                go_on.wait()
                while True:
                    # Agree on whether to go on: the decision rides on the data itself.
                    phase[g] = "go: tensor"
                    go = torch.tensor([1.0 if time.time() < deadline[0] else 0.0], device=device)
                    phase[g] = "go: all_reduce"
                    dist.all_reduce(go, op=dist.ReduceOp.MIN, group=group)
                    phase[g] = "go: item"
                    if go.item() < 1.0:
                        break
                    kind, n, dtype = rng.choice(KINDS), rng.choice(SIZES), rng.choice(DTYPES)
                    phase[g] = f"{kind} of {n} {dtype}: call"
                    _check_one(kind, n, dtype, rank, world, group, device, rng, wrong, g)
                    calls[g] += 1
                phase[g] = "done: synchronize"
                if on_gpu:
                    stream.synchronize()
                phase[g] = "done"
        except Exception as e:  # noqa: BLE001 - reported to the test
            errors.append(f"group {g}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=drive, args=(g,)) for g in range(2)]
    for t in threads:
        t.start()
    warmed[1].wait(300)
    # The load runs `seconds` from here on every rank (the go/no-go all-reduce
    # makes the ranks stop after the same call in any case).
    if rank == 0:
        store.set("load/deadline", str(time.time() + seconds))
    deadline[0] = float(store.get("load/deadline"))
    go_on.set()
    if os.environ.get("LOAD_TRACE"):
        _trace(rank, calls, phase, threads, seconds)
    for t in threads:
        t.join(seconds + 300)
    hung = [g for g, t in enumerate(threads) if t.is_alive()]
    if not hung:
        dist.destroy_process_group()
    return calls, wrong[:10], errors, hung


KINDS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]
SIZES = [1, 7, 1000, 4096, 65_537, 300_000, 1 << 20]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _warm_up(rank, world, group, device, wrong, g):
    """Every kind, size and dtype of the load once, checked. With lazy module
    loading (CUDA's default), the first launch of a kernel may wait for every
    kernel running on the device; if the other group's collective is running
    and its peer is stuck the same way, the two ranks deadlock. That holds for
    torch's kernels and any collective library (NCCL included); pyccl loads its
    own kernels when a communicator is made. A serving engine warms up before
    it runs concurrent work; so does this test (LOAD_WARMUP=0 skips it)."""
    rng = random.Random(1234)  # every rank the same
    for kind in KINDS:
        for n in SIZES:
            for dtype in DTYPES:
                _check_one(kind, n, dtype, rank, world, group, device, rng, wrong, g)


def _trace(rank, calls, phase, threads, seconds):
    """Diagnostics (LOAD_TRACE names a folder): progress and each thread's
    phase every 2 s, native stacks when progress stops, and every thread's
    Python stack if the load runs 30 s past its end."""
    import faulthandler

    with open(os.path.join(os.environ["LOAD_TRACE"], f"load_rank{rank}.txt"), "w") as log:
        print(f"[load rank {rank}] pid {os.getpid()}", file=log, flush=True)
        faulthandler.dump_traceback_later(seconds + 30, exit=False, file=log)
        last, dumped = None, False
        while any(t.is_alive() for t in threads):
            time.sleep(2)
            print(f"[load rank {rank}] calls {calls} phases {phase}", file=log, flush=True)
            if list(calls) == last and not dumped:
                dumped = True
                _native_stacks(log)
            last = list(calls)
        faulthandler.cancel_dump_traceback_later()


def _native_stacks(log):
    import shutil
    import subprocess

    if shutil.which("py-spy"):
        out = subprocess.run(["py-spy", "dump", "--native", "--pid", str(os.getpid())],
                             capture_output=True, text=True, timeout=60)
        log.write(out.stdout + out.stderr)
    elif shutil.which("gdb"):
        out = subprocess.run(["gdb", "-p", str(os.getpid()), "-batch", "-ex", "thread apply all bt 30"],
                             capture_output=True, text=True, timeout=60)
        log.write(out.stdout)
    else:
        for task in os.listdir("/proc/self/task"):
            base = f"/proc/self/task/{task}"
            try:
                with open(f"{base}/comm") as a, open(f"{base}/wchan") as b, open(f"{base}/syscall") as c:
                    log.write(f"task {task} {a.read().strip()} wchan={b.read().strip()} syscall={c.read().strip()}\n")
            except OSError:
                pass
    log.flush()


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _check_one(kind, n, dtype, rank, world, group, device, rng, wrong, g):
    # Small integers, exact in every dtype: the sum of ranks' values is checked exactly.
    value = float(rng.randint(1, 3) + rank)
    rtol, atol = TOLERANCE[dtype]
    if kind == "all_reduce":
        x = torch.full((n,), value, dtype=dtype, device=device)
        dist.all_reduce(x, group=group)
        expected = sum(value - rank + q for q in range(world))
        ok = bool((x.double() - expected).abs().max() <= atol + rtol * expected)
    elif kind == "all_gather":
        x = torch.full((n,), value, dtype=dtype, device=device)
        out = torch.empty(n * world, dtype=dtype, device=device)
        dist.all_gather_into_tensor(out, x, group=group)
        ok = bool((out.view(world, n)[:, 0].double().cpu() == torch.tensor(
            [value - rank + q for q in range(world)], dtype=torch.float64)).all())
    elif kind == "reduce_scatter":
        x = torch.full((n * world,), value, dtype=dtype, device=device)
        out = torch.empty(n, dtype=dtype, device=device)
        dist.reduce_scatter_tensor(out, x, group=group)
        expected = sum(value - rank + q for q in range(world))
        ok = bool((out.double() - expected).abs().max() <= atol + rtol * expected)
    elif kind == "broadcast":
        x = torch.full((n,), value, dtype=dtype, device=device)
        src = rng.randrange(world)
        dist.broadcast(x, src=src, group=group)
        ok = bool((x.double() == value - rank + src).all())
    else:
        x = torch.full((n * world,), value, dtype=dtype, device=device)
        out = torch.empty(n * world, dtype=dtype, device=device)
        dist.all_to_all_single(out, x, group=group)
        ok = bool((out.view(world, n)[:, 0].double().cpu() == torch.tensor(
            [value - rank + q for q in range(world)], dtype=torch.float64)).all())
    if not ok:
        wrong.append((g, kind, n, str(dtype)))


def across_nodes_cycles(rank, world, store, on_gpu, cycles):
    """As communicator_cycles, on a communicator whose ranks are each their
    own "node" (PYCCL_NODE_ID): every cycle opens sockets, receiver threads,
    proxy channels and host mirrors for the plans across nodes (an LL and an
    HB all-reduce, an all-gather, a reduce-scatter) and closes them."""
    os.environ["PYCCL_NODE_ID"] = f"node{rank}"
    device = torch.device("cuda", rank_gpu(rank)) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    wrong = []
    total = world * (world + 1) / 2

    def one(i):
        comm = pyccl.Communicator(store, rank, world, device=device, name=f"far{i}",
                                  timeout=datetime.timedelta(seconds=60))
        for n in (1000, 200_000):
            x = torch.full((n,), float(rank + 1), device=device)
            if not bool((pyccl.all_reduce(x, comm=comm) == total).all()):
                wrong.append((i, "all_reduce", n))
            gathered = pyccl.all_gather(x, comm=comm)
            if not bool((gathered.view(world, n)[:, 0].cpu() == torch.arange(1, world + 1)).all()):
                wrong.append((i, "all_gather", n))
            scattered = pyccl.reduce_scatter(torch.full((n * world,), float(rank + 1), device=device), comm=comm)
            if not bool((scattered == total).all()):
                wrong.append((i, "reduce_scatter", n))
        comm.close()

    for i in range(3):
        one(-1 - i)
    before = _snapshot(on_gpu)
    start = time.monotonic()
    for i in range(cycles):
        one(i)
    return before, _snapshot(on_gpu), wrong, time.monotonic() - start


def released_when_let_go(rank, world, store, on_gpu):
    """What a communicator holds goes when the user lets go, not later:
    closed while a reference to its engine survives (as a failed call's
    traceback keeps one), and a gloo group's pyccl communicator at
    ``dist.destroy_process_group``. Returns the resources of this process
    (ranks._resources, less the machine-wide /dev/shm count) before, after
    the close, and after the destroy; whether the group's communicator was
    closed then; and the results that were wrong."""
    device = torch.device("cuda", rank_gpu(rank)) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    wrong = []

    def used():
        return {k: v for k, v in _resources().items() if k != "dev_shm"}

    def cycle(i, keep):
        comm = pyccl.Communicator(store, rank, world, device=device, name=f"let_go{i}",
                                  timeout=datetime.timedelta(seconds=60))
        if not bool((comm.all_reduce(torch.ones(1000, device=device)) == world).all()):
            wrong.append((i, "all_reduce"))
        keep.append(comm._engine)
        comm.close()

    def group_cycle(i):
        dist.init_process_group("gloo", store=dist.PrefixStore(f"let_go_group{i}", store), rank=rank,
                                world_size=world)
        if not bool((pyccl.all_reduce(torch.ones(1000, device=device)) == world).all()):
            wrong.append((i, "group all_reduce"))
        comm = pyccl.communicator_for(device=device)
        dist.destroy_process_group()
        return comm

    cycle(-1, [])  # warm-up: process-wide state made once
    group_cycle(-1)
    before = used()
    engines = []
    cycle(0, engines)
    after_close = used()
    comm = group_cycle(0)
    after_destroy = used()
    closed = comm.closed
    del engines
    return before, after_close, after_destroy, closed, wrong
