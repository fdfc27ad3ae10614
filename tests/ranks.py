"""Per-rank bodies of the multi-process tests. They live in one importable
module so the forkserver children can unpickle them by name."""

from __future__ import annotations

import datetime
import os
import threading
import time

import torch

import pyccl
from gpu_sharing import rank_gpu


def refusal(call, errors=pyccl.PycclError):
    """The message of the `errors` that `call()` raises; None if it returns."""
    try:
        call()
    except errors as e:
        return str(e)
    return None


def _comm(store, rank, world, device="cpu", timeout_s=30.0, name=None):
    return pyccl.Communicator(store, rank, world, device=device, name=name,
                              timeout=datetime.timedelta(seconds=timeout_s))


# -- bootstrap ----------------------------------------------------------------
def bootstrap_collectives(rank, world, store, rounds):
    comm = _comm(store, rank, world)
    out = {}
    for r in range(rounds):
        payload = f"rank{rank}-round{r}-".encode() + bytes([rank]) * (rank * 100 + r)
        out.setdefault("gather", []).append(comm.all_gather_bytes(payload))
        comm.barrier()
    # Ring send/recv, two tags, several messages each (order must hold per tag).
    right, left = (rank + 1) % world, (rank - 1) % world
    for i in range(3):
        comm.send_bytes(right, 7, f"m{i} from {rank}".encode())
        comm.send_bytes(right, 8, f"t8 m{i} from {rank}".encode())
    out["recv7"] = [comm.recv_bytes(left, 7) for _ in range(3)]
    out["recv8"] = [comm.recv_bytes(left, 8) for _ in range(3)]
    out["topology"] = comm.topology()
    comm.close()
    return out


def two_communicators_one_store(rank, world, store):
    a = _comm(store, rank, world, name="alpha")
    b = _comm(store, rank, world, name="beta")
    ga = a.all_gather_bytes(f"a{rank}".encode())
    gb = b.all_gather_bytes(f"b{rank}".encode())
    # Default names: the n-th unnamed communicator over a store is comm<n> on every rank.
    c = _comm(store, rank, world)
    d = _comm(store, rank, world)
    names = (c.name, d.name)
    for x in (a, b, c, d):
        x.close()
    return ga, gb, names


def names_serve_one_communicator(rank, world, store):
    """A name taken on a store is refused on every rank, after its communicator
    closed (its last barrier's keys remain) and while it lives; the live one
    is unharmed."""
    first = _comm(store, rank, world, name="alpha")
    first.all_gather_bytes(b"x")
    first.barrier()
    first.close()
    after_close = refusal(lambda: _comm(store, rank, world, name="alpha"), pyccl.InvalidArgumentError)
    live = _comm(store, rank, world, name="beta")
    while_live = refusal(lambda: _comm(store, rank, world, name="beta"), pyccl.InvalidArgumentError)
    gathered = live.all_gather_bytes(f"b{rank}".encode())
    live.barrier()
    live.close()
    return after_close, while_live, gathered


def bootstrap_missing_rank(rank, world, store, timeout_s):
    if rank == world - 1:
        time.sleep(timeout_s + 3)  # never joins
        return None
    t0 = time.monotonic()
    try:
        _comm(store, rank, world, timeout_s=timeout_s)
    except pyccl.PycclTimeoutError as e:
        return ("timeout", str(e), time.monotonic() - t0)
    return ("no error", "", time.monotonic() - t0)


def mismatched_world_size(rank, world, store):
    claimed = world if rank == 0 else world + 1
    try:
        _comm(store, rank, claimed, timeout_s=20)
    except pyccl.InvalidArgumentError as e:
        return str(e)
    return None


# -- host-mode memory -----------------------------------------------------------
def host_registration(rank, world, store, words):
    comm = _comm(store, rank, world)
    buf = pyccl.empty(world * words, dtype=torch.int64)
    buf.fill_(-1)
    local = comm.register(buf)
    mapped = comm.exchange(local)
    assert all(m is not None for m in mapped), mapped
    assert mapped[rank].is_local and mapped[rank].data_ptr == buf.data_ptr()
    # Write this rank's id into its slot of every peer's buffer (and its own).
    for p in range(world):
        view = comm.tensor(mapped[p], torch.int64)
        view[rank * words:(rank + 1) * words] = rank * 1000 + torch.arange(words)
    comm.barrier()  # every rank has written
    expected = torch.cat([p * 1000 + torch.arange(words) for p in range(world)])
    ok = torch.equal(buf, expected)
    kinds = {m.kind for m in mapped}
    sizes = {m.size for m in mapped}
    comm.barrier()  # nobody unmaps before everyone has checked
    comm.close()
    return ok, kinds, sizes


def serialized_import(rank, world, store):
    """Point-to-point: rank 0 sends its descriptor to rank 1, which imports it."""
    comm = _comm(store, rank, world)
    buf = pyccl.empty(64, dtype=torch.float32)
    result = None
    if rank == 0:
        buf.copy_(torch.arange(64, dtype=torch.float32) * 0.5)
        reg = comm.register(buf)
        comm.send_bytes(1, 1, reg.serialize())
        comm.recv_bytes(1, 2)  # rank 1 has read it
        result = True
    elif rank == 1:
        mem = comm.import_memory(comm.recv_bytes(0, 1))
        seen = comm.tensor(mem, torch.float32).clone()
        result = (mem.rank, mem.is_local, seen.tolist())
        comm.send_bytes(0, 2, b"done")
        try:
            mem.serialize()
        except pyccl.InvalidArgumentError:
            pass
        else:
            raise AssertionError("serialize() of imported memory must raise")
    comm.barrier()
    comm.close()
    return result


# -- semaphores -------------------------------------------------------------------
def semaphore_pingpong(rank, world, store, rounds):
    comm = _comm(store, rank, world)
    buf = pyccl.empty(world, dtype=torch.int64)
    local = comm.register(buf)
    mapped = comm.exchange(local)
    sems = {p: comm.create_semaphore(p) for p in range(world) if p != rank}
    # Each round: write (round, rank) into every peer's slot, signal, wait, check.
    bad = 0
    for r in range(rounds):
        for p, sem in sems.items():
            comm.tensor(mapped[p], torch.int64)[rank] = r * 100 + rank
            sem.signal()
        for p, sem in sems.items():
            sem.wait()
            if int(buf[p]) != r * 100 + p:
                bad += 1
        # A second semaphore round keeps a fast rank from overwriting a slot
        # before its owner has read it.
        for p, sem in sems.items():
            sem.signal()
        for p, sem in sems.items():
            sem.wait()
    received = {p: s.received for p, s in sems.items()}
    comm.barrier()
    comm.close()
    return bad, received


def semaphore_wait_timeout(rank, world, store):
    comm = _comm(store, rank, world, timeout_s=30)
    sem = comm.create_semaphore(1 - rank)
    result = None
    if rank == 0:
        t0 = time.monotonic()
        try:
            sem.wait(timeout_ms=1500)
        except pyccl.PycclTimeoutError as e:
            result = ("timeout", str(e), time.monotonic() - t0)
        comm.barrier()
        # The signal that comes later is still delivered to the next wait.
        sem.wait(timeout_ms=10000)
    else:
        comm.barrier()
        sem.signal()
        result = ("signalled",)
    comm.barrier()
    comm.close()
    return result


def semaphore_abort_unblocks(rank, world, store):
    comm = _comm(store, rank, world, timeout_s=60)
    sem = comm.create_semaphore(1 - rank)
    result = None
    if rank == 0:
        threading.Timer(1.0, comm.abort).start()
        t0 = time.monotonic()
        try:
            sem.wait()
        except pyccl.AbortedError as e:
            result = ("aborted", str(e), time.monotonic() - t0)
        # An aborted communicator fails every later call at once.
        try:
            comm.barrier()
        except pyccl.AbortedError as e:
            result += (str(e),)
    comm.close()
    return result


def host_selftest(rank, world, store, words):
    """The demo's exchange (CPU threads standing in for kernels)."""
    comm = _comm(store, rank, world)
    buf = pyccl.empty(world * words, dtype=torch.int32)
    local = comm.register(buf)
    mapped = comm.exchange(local)
    sems = [comm.create_semaphore(p) for p in range(world) if p != rank]
    results = [pyccl._C._selftest_exchange(comm._comm, mapped, local, sems, words, seed)
               for seed in (1, 2, 3)]
    comm.barrier()
    comm.close()
    return results


def selftest_peer_absent(rank, world, store, on_gpu):
    """Rank 1 never takes part: rank 0's waits (CPU threads in host mode, a
    kernel on GPU) give up at the 2 s timeout and the error record names rank 1."""
    device = "cpu"
    if on_gpu:
        torch.cuda.set_device(rank_gpu(rank))
        device = f"cuda:{rank_gpu(rank)}"
    comm = _comm(store, rank, world, device=device, timeout_s=2)
    buf = pyccl.empty(world * 16, dtype=torch.int32, device=device)
    local = comm.register(buf)
    mapped = comm.exchange(local)
    sem = comm.create_semaphore(1 - rank)
    result = None
    if rank == 0:
        t0 = time.monotonic()
        _, failures = pyccl._C._selftest_exchange(comm._comm, mapped, local, [sem], 16, 9)
        result = (int(failures), comm.device_error(), time.monotonic() - t0)
        store.set("absent_test_done", b"1")
    else:
        store.get("absent_test_done")  # the store's own (longer) timeout, not the comm's 2 s
    comm.close()
    return result


# -- lifetime and leaks -----------------------------------------------------------------
def _resources():
    fds = len(os.listdir("/proc/self/fd"))
    threads = len(os.listdir("/proc/self/task"))
    shm = len([f for f in os.listdir("/dev/shm")]) if os.path.isdir("/dev/shm") else 0
    with open("/proc/self/maps") as f:
        memfd_maps = sum(1 for line in f if "memfd:pyccl" in line)
    return {"fds": fds, "threads": threads, "dev_shm": shm, "memfd_maps": memfd_maps,
            "host_allocs": pyccl._C.num_host_shared_allocations()}


def create_destroy_cycles(rank, world, store, cycles):
    def one(i):
        comm = _comm(store, rank, world, name=f"cycle{i}")
        buf = pyccl.empty(1024, dtype=torch.int32)
        local = comm.register(buf)
        mapped = comm.exchange(local)
        sems = {p: comm.create_semaphore(p) for p in range(world) if p != rank}
        for p, sem in sems.items():
            comm.tensor(mapped[p], torch.int32)[rank] = i
            sem.signal()
        for sem in sems.values():
            sem.wait()
        # Channels start the proxy thread and, for sockets, receiver threads.
        from pyccl.primitives import Op, run
        peer = (rank + 1) % world if rank % 2 == 0 else (rank - 1) % world
        chans = [comm.memory_channel(peer, local), comm.port_channel(peer, local),
                 comm.port_channel(peer, local, transport="socket")]
        run(comm, [Op.port_put(0, 0, 0, 64, signal=True), Op.port_wait(0),
                   Op.port_put(1, 64, 64, 64, signal=True), Op.port_wait(1)], port=chans[1:])
        comm.barrier()
        comm.close()
        del comm, buf, local, mapped, sems, chans

    one(-1)  # warm-up: lazily created process-wide state
    before = _resources()
    for i in range(cycles):
        one(i)
    after = _resources()
    return before, after


def closed_communicator_errors(rank, world, store):
    comm = _comm(store, rank, world)
    buf = pyccl.empty(16, dtype=torch.float32)
    local = comm.register(buf)
    sem = comm.create_semaphore(1 - rank)
    comm.barrier()
    comm.close()
    comm.close()  # idempotent
    errors = {}
    for label, call in [
        ("register", lambda: comm.register(buf)),
        ("barrier", comm.barrier),
        ("exchange", lambda: comm.exchange(local)),
        ("create_semaphore", lambda: comm.create_semaphore(1 - rank)),
        ("memory", lambda: local.data_ptr),
        ("signal", sem.signal),
    ]:
        try:
            call()
            errors[label] = None
        except pyccl.ClosedError as e:
            errors[label] = str(e)
    return errors, local.valid, sem.valid


def bootstrap_large_messages(rank, world, store, size, seed):
    """An all-gather and a ring send/recv of `size` random bytes per rank (more
    than a TCPStore message may hold), then a small one on the same keys'
    paths. Returns whether every rank's bytes arrived intact."""
    import random

    def payload(q, what):
        return random.Random(f"{seed}/{q}/{what}").randbytes(size)

    comm = _comm(store, rank, world)
    gathered = comm.all_gather_bytes(payload(rank, "gather"))
    ok = [gathered[q] == payload(q, "gather") for q in range(world)]
    right, left = (rank + 1) % world, (rank - 1) % world
    comm.send_bytes(right, 3, payload(rank, "send"))
    comm.send_bytes(right, 3, b"small")
    ok.append(comm.recv_bytes(left, 3) == payload(left, "send"))
    ok.append(comm.recv_bytes(left, 3) == b"small")
    comm.barrier()
    comm.close()
    return ok
