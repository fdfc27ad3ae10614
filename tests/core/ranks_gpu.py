"""Per-rank bodies of the GPU tests (one process per GPU)."""

from __future__ import annotations

import datetime
import os
import time

import torch

import pyccl
from gpu_sharing import rank_gpu
from ranks import refusal


def _gpu_comm(store, rank, world, timeout_s=60.0):
    torch.cuda.set_device(rank_gpu(rank))
    return pyccl.Communicator(store, rank, world, device=f"cuda:{rank_gpu(rank)}",
                              timeout=datetime.timedelta(seconds=timeout_s))


def _buffers(rank, world, words, allocator):
    """The buffer under test, from the allocator named."""
    n = world * words
    if allocator == "pyccl.empty":
        return pyccl.empty(n, dtype=torch.int32, device=f"cuda:{rank_gpu(rank)}")
    if allocator == "expandable":
        assert "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        # Something first, so the buffer starts inside a segment and spans several.
        _pad = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
        buf = torch.empty(n, dtype=torch.int32, device="cuda")
        buf._pad = _pad  # keep the padding alive with the buffer
        return buf
    return torch.empty(n, dtype=torch.int32, device="cuda")


def peer_writes(rank, world, store, words, allocator, seed):
    comm = _gpu_comm(store, rank, world)
    topo = comm.topology()
    buf = _buffers(rank, world, words, allocator)
    buf.fill_(-1)
    local = comm.register(buf)
    mapped = comm.exchange(local)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    patterns = [torch.randint(-2**31, 2**31 - 1, (words,), generator=gen, dtype=torch.int32)
                for _ in range(world)]
    mine = patterns[rank].cuda()
    # A kernel on this GPU stores into every peer's memory (NVLink/PCIe P2P).
    for p in range(world):
        comm.tensor(mapped[p], torch.int32)[rank * words:(rank + 1) * words].copy_(mine)
    torch.cuda.synchronize()
    comm.barrier()
    expected = torch.cat(patterns).cuda()
    wrong = int((buf != expected).sum())
    info = {"kind": local.kind, "chunks": local.num_chunks, "wrong": wrong,
            "p2p": topo["p2p"], "peer_kinds": sorted({m.kind for m in mapped})}
    comm.barrier()
    comm.close()
    return info


def device_selftest(rank, world, store, words, seeds):
    comm = _gpu_comm(store, rank, world)
    buf = pyccl.empty(world * words, dtype=torch.int32, device=f"cuda:{rank_gpu(rank)}")
    local = comm.register(buf)
    mapped = comm.exchange(local)
    sems = [comm.create_semaphore(p) for p in range(world) if p != rank]
    out = []
    for seed in seeds:
        t0 = time.perf_counter()
        m, f = pyccl._C._selftest_exchange(comm._comm, mapped, local, sems, words, seed)
        out.append((int(m), int(f), time.perf_counter() - t0))
    comm.barrier()
    comm.close()
    return out


def host_semaphores_on_gpu(rank, world, store, rounds):
    comm = _gpu_comm(store, rank, world)
    peer = 1 - rank
    sem = comm.create_semaphore(peer)
    buf = pyccl.empty(4, dtype=torch.int64, device=f"cuda:{rank_gpu(rank)}")
    mapped = comm.exchange(comm.register(buf))
    bad = 0
    for r in range(rounds):
        if rank == 0:
            comm.tensor(mapped[1], torch.int64)[0] = r  # store to the peer's GPU
            torch.cuda.synchronize()
            sem.signal()
            sem.wait()
        else:
            sem.wait()
            bad += int(buf[0].item() != r)
            sem.signal()
    received = sem.received
    comm.barrier()
    comm.close()
    return bad, received


def gpu_bad_input(rank, world, store):
    comm = _gpu_comm(store, rank, world)
    messages = {}
    cases = {
        "cpu tensor": lambda: comm.register(pyccl.empty(16, dtype=torch.float32, device="cpu")),
        "size 0": lambda: comm.register(torch.empty(0, device="cuda")),
        "non-contiguous": lambda: comm.register(torch.empty(8, 8, device="cuda")[:, 1]),
    }
    if torch.cuda.device_count() > 1:
        other = (rank + 1) % torch.cuda.device_count()
        cases["other device"] = lambda: comm.register(torch.empty(16, device=f"cuda:{other}"))
    for label, call in cases.items():
        messages[label] = refusal(call, pyccl.InvalidArgumentError)
    comm.barrier()
    comm.close()
    return messages


def gpu_create_destroy_cycles(rank, world, store, cycles):
    def one(i):
        torch.cuda.set_device(rank_gpu(rank))
        comm = pyccl.Communicator(store, rank, world, device=f"cuda:{rank_gpu(rank)}", name=f"gcycle{i}",
                                  timeout=datetime.timedelta(seconds=60))
        buf = torch.empty(1 << 20, dtype=torch.int32, device="cuda")
        sym = pyccl.empty(1 << 20, dtype=torch.int32, device=f"cuda:{rank_gpu(rank)}")
        mapped = comm.exchange(comm.register(buf))
        mapped2 = comm.exchange(comm.register(sym))
        sems = [comm.create_semaphore(p) for p in range(world) if p != rank]
        pyccl._C._selftest_exchange(comm._comm, mapped2, mapped2[rank], sems, 1024, i & 0xffff)
        comm.barrier()
        comm.close()
        del comm, buf, sym, mapped, mapped2, sems

    def snapshot():
        torch.cuda.synchronize()
        free, _ = torch.cuda.mem_get_info()
        return {"fds": len(os.listdir("/proc/self/fd")), "threads": len(os.listdir("/proc/self/task")),
                "gpu_used_mib": (torch.cuda.mem_get_info()[1] - free) >> 20}

    one(-1)
    torch.cuda.empty_cache()
    before = snapshot()
    for i in range(cycles):
        one(i)
    torch.cuda.empty_cache()
    return before, snapshot()



def crossed_first_launches(rank, world, store, seed):
    """Two communicators; on each rank one thread launches a collective of
    the first, another a collective of the second, in crossed order (rank 0
    the first one first, rank 1 the other), each a kernel nothing in this
    process has launched before, and the second while the first spins for its
    peer. Returns the wrong results, the errors and the seconds it took."""
    import threading

    torch.cuda.set_device(rank_gpu(rank))
    comms = [pyccl.Communicator(store, rank, world, device=f"cuda:{rank_gpu(rank)}", name=f"crossed{g}",
                                timeout=datetime.timedelta(seconds=20)) for g in range(2)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    n = 1 << 20  # 2 MiB of 16-bit values: the HB kernels
    a, b = (t.cuda() for t in _crossed_inputs(seed, rank, n))
    a_out = torch.empty_like(a)
    b_out = torch.empty(n // world, dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()  # torch's own kernels for the inputs have run: only pyccl's launch below
    calls = [lambda: comms[0].all_reduce(a, op="prod", out=a_out),
             lambda: comms[1].reduce_scatter(b, op="max", out=b_out)]
    first = rank % 2
    errors = []

    def run(g):
        try:
            with torch.cuda.stream(streams[g]):
                if g != first:
                    time.sleep(1.0)  # the other communicator's kernel is spinning for its peer by now
                calls[g]()
                streams[g].synchronize()
        except Exception as e:  # noqa: BLE001 - reported to the test
            errors.append(f"{type(e).__name__}: {e}")

    start = time.monotonic()
    threads = [threading.Thread(target=run, args=(g,)) for g in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    seconds = time.monotonic() - start
    hung = any(t.is_alive() for t in threads)
    wrong = []
    if not hung and not errors:
        inputs = [_crossed_inputs(seed, q, n) for q in range(world)]
        product = torch.ones(n, dtype=torch.float64)
        for x, _ in inputs:
            product *= x.double()
        if not torch.allclose(a_out.cpu().double(), product, rtol=4e-3):
            wrong.append("all_reduce prod")
        largest = torch.stack([y.double() for _, y in inputs]).max(dim=0).values
        if not torch.equal(b_out.cpu().double(), largest.view(world, -1)[rank]):
            wrong.append("reduce_scatter max")
    for c in comms:
        c.close()
    return wrong, errors, hung, seconds


def _crossed_inputs(seed, rank, n):
    """Rank `rank`'s inputs of crossed_first_launches, on the CPU: an fp16 factor
    near 1 (the product over ranks stays exact enough) and a bf16 value."""
    gen = torch.Generator().manual_seed(seed * 16 + rank)
    a = (1 + torch.rand(n, generator=gen, dtype=torch.float64) / 64).to(torch.float16)
    b = torch.randn(n, generator=gen, dtype=torch.float64).to(torch.bfloat16)
    return a, b


def ranks_on_one_gpu(rank, world, store):
    """Every rank on cuda:0. Returns the communicator's refusal (InvalidArgumentError),
    or None and whether an all-reduce on the shared GPU was right."""
    torch.cuda.set_device(0)
    try:
        comm = pyccl.Communicator(store, rank, world, device="cuda:0", timeout=datetime.timedelta(seconds=60))
    except pyccl.InvalidArgumentError as e:
        return str(e), None
    inputs = [torch.randn(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(q)) + 2
              for q in range(world)]
    y = pyccl.all_reduce(inputs[rank].to(torch.float32).cuda(), comm=comm).cpu().double()
    comm.close()
    return None, bool(torch.allclose(y, sum(inputs), rtol=1e-5, atol=1e-5))
