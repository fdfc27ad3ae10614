"""Per-rank bodies of the channel tests; each runs in host mode or on GPUs."""

from __future__ import annotations

import datetime
import os
import random
import threading
import time

import torch

import pyccl
from pyccl.primitives import Op, run
from pyccl.primitives import pingpong as pyccl_pingpong
from gpu_sharing import rank_gpu

from conftest import slowed

MARK = 0xAB  # what the receiver's buffer holds where nothing may be written


def _setup(store, rank, world, on_gpu, timeout_s=None, name=None):
    """A communicator whose waits give up after `timeout_s` (default 20 s, times
    PYCCL_TEST_SLOWDOWN, which scripts/sanitize_tests.py raises: under a sanitizer
    the proxy's copies run many times slower)."""
    if timeout_s is None:
        timeout_s = slowed(20.0)
    device = "cpu"
    if on_gpu:
        torch.cuda.set_device(rank_gpu(rank))
        device = f"cuda:{rank_gpu(rank)}"
    comm = pyccl.Communicator(store, rank, world, device=device, name=name,
                              timeout=datetime.timedelta(seconds=timeout_s))
    return comm, device


def _sync(comm, on_gpu):
    if on_gpu:
        torch.cuda.synchronize()
    comm.barrier()


def random_cases(seed, count, size):
    """(mode, dst_offset, src_offset, nbytes): odd sizes and unaligned offsets included."""
    rng = random.Random(seed)
    modes = ["put", "get", "ll8", "ll16", "port"]
    cases = []
    for i in range(count):
        mode = modes[i % len(modes)]
        n = rng.choice([1, 3, 15, 16, 17, 255, 4096 + 5, rng.randrange(1, size // 4)])
        src_off = rng.choice([0, 1, 8, 16 + 4, rng.randrange(0, size // 2)])
        dst_off = rng.choice([0, 3, 16, rng.randrange(0, size // 2)])
        if mode.startswith("ll"):
            dst_off &= ~3  # unpacking needs no alignment, but keep some cases aligned
            dst_off += rng.choice([0, 1])
        cases.append((mode, dst_off, src_off, n))
    return cases


def transfers(rank, world, store, on_gpu, seed, count, size, blocks):
    """Rank 0 moves random bytes to rank 1 with every protocol; rank 1 checks
    them bitwise, and that nothing outside the range changed."""
    comm, device = _setup(store, rank, world, on_gpu)
    peer = 1 - rank
    buf = (torch.empty(size, dtype=torch.uint8, device=device) if on_gpu
           else pyccl.empty(size, dtype=torch.uint8))
    packets = pyccl.empty(2 * size + 64, dtype=torch.uint8, device=device)
    mem = comm.register(buf)
    mch = comm.memory_channel(peer, mem, comm.register(packets))
    pch = comm.port_channel(peer, mem)
    bad = []
    for i, (mode, dst_off, src_off, n) in enumerate(random_cases(seed, count, size)):
        gen = torch.Generator().manual_seed(seed * 1000 + i)
        data = torch.randint(0, 256, (size,), generator=gen, dtype=torch.uint8)
        # For get, rank 1 reads rank 0's buffer: the source is rank 0's data either way.
        if rank == 0:
            buf.copy_(data)
        else:
            buf.fill_(MARK)
        _sync(comm, on_gpu)
        flag = i + 1
        if rank == 0:
            ops = {"put": [Op.put(0, dst_off, src_off, n), Op.signal(0)],
                   "get": [Op.signal(0)],
                   "ll8": [Op.put_packets(0, 0, src_off, n, flag, packet=8)],
                   "ll16": [Op.put_packets(0, 0, src_off, n, flag, packet=16)],
                   "port": [Op.port_put(0, dst_off, src_off, n, signal=True), Op.port_flush(0)]}[mode]
        else:
            # get: copy rank 0's bytes at src_off into this rank's buffer at dst_off.
            ops = {"put": [Op.wait(0)],
                   "get": [Op.wait(0), Op.get(0, src_off, dst_off, n)],
                   "ll8": [Op.read_packets(0, dst_off, 0, n, flag, packet=8)],
                   "ll16": [Op.read_packets(0, dst_off, 0, n, flag, packet=16)],
                   "port": [Op.port_wait(0)]}[mode]
        res = run(comm, ops, memory=[mch], port=[pch], blocks=blocks if mode != "port" else 1)
        if res.failures:
            bad.append((i, mode, "wait failed"))
        if rank == 1:
            got = buf.cpu()
            expect = torch.full((size,), MARK, dtype=torch.uint8)
            expect[dst_off:dst_off + n] = data[src_off:src_off + n]
            if not torch.equal(got, expect):
                wrong = int((got != expect).sum())
                bad.append((i, mode, dst_off, src_off, n, f"{wrong} wrong bytes"))
        _sync(comm, on_gpu)
    comm.close()
    return bad


def pingpong(rank, world, store, on_gpu, rounds, kind, check=True):
    """Round trips between ranks 0 and 1 on the dedicated ping-pong loop:
    semaphores ('signal', 'relaxed_signal'), LL packets ('ll8', 'll16') or
    PortChannel signals ('port_signal'). With ``check`` every message carries
    its round number and the receiver verifies it.
    Returns (failures, mismatches, rounds done, ns per round trip, error record)."""
    comm, device = _setup(store, rank, world, on_gpu)
    peer = 1 - rank
    buf = pyccl.empty(4096, dtype=torch.uint8, device=device)
    buf.fill_(0)
    packets = pyccl.empty(4096, dtype=torch.uint8, device=device)
    packets.fill_(0)
    mem = comm.register(buf)
    mch = comm.memory_channel(peer, mem, comm.register(packets))
    pch = comm.port_channel(peer, mem) if kind == "port_signal" else None
    _sync(comm, on_gpu)
    res = pyccl_pingpong(comm, mch, kind, rounds, initiator=rank == 0, port_channel=pch, check=check)
    record = comm.device_error()  # on failure: which wait, what it expected and saw
    _sync(comm, on_gpu)
    comm.close()
    return res.failures, res.mismatches, res.rounds_done, res.round_trip_ns, record


def pingpong_bad_arguments(rank, world, store):
    """Each bad argument of the ping-pong loop is refused at the call, by name."""
    comm, device = _setup(store, rank, world, False)
    mem = comm.register(pyccl.empty(4096, dtype=torch.uint8))
    with_packets = comm.memory_channel(1 - rank, mem, comm.register(pyccl.empty(4096, dtype=torch.uint8)))
    plain = comm.memory_channel(1 - rank, mem)
    out = {}
    for label, call in [
        ("mode", lambda: pyccl_pingpong(comm, with_packets, "bogus", 1, True)),
        ("rounds", lambda: pyccl_pingpong(comm, with_packets, "signal", 0, True)),
        ("flag_base", lambda: pyccl_pingpong(comm, with_packets, "ll16", 10, True, flag_base=0)),
        ("no_packets", lambda: pyccl_pingpong(comm, plain, "ll8", 1, True)),
        ("no_port", lambda: pyccl_pingpong(comm, with_packets, "port_signal", 1, True)),
    ]:
        try:
            call()
            out[label] = "accepted"
        except ValueError as e:  # InvalidArgumentError is a ValueError
            out[label] = str(e)
    comm.barrier()
    comm.close()
    return out


def op_runner_pingpong(rank, world, store, on_gpu, rounds, kind):
    """The same round trips through the op runner (block barriers between ops)."""
    comm, device = _setup(store, rank, world, on_gpu)
    peer = 1 - rank
    buf = pyccl.empty(4096, dtype=torch.uint8, device=device)
    packets = pyccl.empty(4096, dtype=torch.uint8, device=device)
    packets.fill_(0)
    mem = comm.register(buf)
    mch = comm.memory_channel(peer, mem, comm.register(packets))
    pch = comm.port_channel(peer, mem)
    if kind == "signal":
        there, back = Op.signal(0), Op.wait(0)
    elif kind == "port":
        there, back = Op.port_signal(0), Op.port_wait(0)
    else:
        there, back = Op.put_packets(0, 0, 0, 8, 1), Op.read_packets(0, 0, 0, 8, 1)
    ops = [there, back] if rank == 0 else [back, there]
    _sync(comm, on_gpu)
    res = run(comm, ops, memory=[mch], port=[pch], repeat=rounds, blocks=1, threads=32)
    record = comm.device_error()
    _sync(comm, on_gpu)
    comm.close()
    return res.failures, res.elapsed_ns / rounds, record


def port_flood(rank, world, store, on_gpu, count):
    """`count` put+signal triggers through a FIFO of 1024 slots (many wrap-arounds)."""
    comm, device = _setup(store, rank, world, on_gpu)
    peer = 1 - rank
    buf = pyccl.empty(1 << 16, dtype=torch.int64, device=device)
    buf.fill_(rank)
    pch = comm.port_channel(peer, comm.register(buf))
    _sync(comm, on_gpu)
    if rank == 0:
        res = run(comm, [Op.port_put(0, 8 * 16, 8 * 16, 64, signal=True)], port=[pch], repeat=count)
        res.failures += run(comm, [Op.port_flush(0)], port=[pch]).failures
        executed = comm.proxy_stats()["executed"]
    else:
        res = run(comm, [Op.port_wait(0)], port=[pch], repeat=count)
        executed = None
    _sync(comm, on_gpu)
    landed = bool((buf[16:24] == 0).all()) if rank == 1 else None
    comm.close()
    return res.failures, executed, landed


def flush_ordering(rank, world, store, on_gpu, nbytes, rounds):
    """After flush() returns the source may be overwritten: the peer must
    still receive what the source held at put time."""
    comm, device = _setup(store, rank, world, on_gpu)
    peer = 1 - rank
    buf = (torch.empty(nbytes, dtype=torch.uint8, device=device) if on_gpu
           else pyccl.empty(nbytes, dtype=torch.uint8))
    pch = comm.port_channel(peer, comm.register(buf))
    wrong = 0
    for r in range(rounds):
        value = (r * 37 + 11) % 251
        if rank == 0:
            buf.fill_(value)
            _sync(comm, on_gpu)
            run(comm, [Op.port_put(0, 0, 0, nbytes), Op.port_flush(0)], port=[pch])
            buf.fill_(255)  # reuse the source at once
            if on_gpu:
                torch.cuda.synchronize()
            run(comm, [Op.port_signal(0)], port=[pch])
        else:
            buf.fill_(0)
            _sync(comm, on_gpu)
            run(comm, [Op.port_wait(0)], port=[pch])
            wrong += int((buf != value).sum())
        _sync(comm, on_gpu)
    comm.close()
    return wrong


def silent_peer_waits(rank, world, store, on_gpu):
    """Each kind of wait on a peer that never sends gives up at the 2 s timeout.
    Each gets a communicator of its own: the first timeout breaks the
    communicator, whose channels then refuse further work at the call."""
    out = {} if rank == 0 else None
    peer = 1 - rank
    for label, op in [("port_wait", Op.port_wait(0)), ("wait", Op.wait(0)),
                      ("read_packets", Op.read_packets(0, 0, 0, 64, 7))]:
        comm, device = _setup(store, rank, world, on_gpu, timeout_s=2, name=f"silent_{label}")
        buf = pyccl.empty(4096, dtype=torch.uint8, device=device)
        mem = comm.register(buf)
        mch = comm.memory_channel(peer, mem, comm.register(pyccl.empty(8192, dtype=torch.uint8, device=device)))
        pch = comm.port_channel(peer, mem)
        if rank == 0:
            t0 = time.monotonic()
            res = run(comm, [op], memory=[mch], port=[pch])
            took = time.monotonic() - t0
            failure = comm.failure  # reads the record now, as the watchdog would within its period
            refused = None
            try:
                run(comm, [op], memory=[mch], port=[pch])
            except pyccl.AbortedError as e:
                refused = str(e)
            out[label] = (res.failures, took, comm.device_error(), failure, refused)
            store.set(f"silent_{label}_done", b"1")
        else:
            store.get(f"silent_{label}_done")
        comm.close()
    return out


def check_silent_peer_waits(out, most_s):
    """What silent_peer_waits returned: each wait gave up once, at the timeout
    (not later than `most_s`), recorded why, and broke its communicator."""
    for label in ("port_wait", "wait", "read_packets"):
        failures, took, record, failure, refused = out[label]
        assert failures == 1, (label, out)
        assert 1.9 <= took <= most_s, (label, took)
        assert record["status"] == "timeout" and record["peer"] == 1, (label, record)
        assert failure is not None and "no signal from rank 1" in failure, (label, failure)
        # The next call on the broken communicator's channels is refused at once.
        assert refused is not None and "aborted" in refused, (label, refused)


def close_with_pending_proxy_work(rank, world, store):
    """Host mode: close() while the proxy still has queued puts returns in
    bounded time, and the pushing "kernel" gives up instead of hanging."""
    comm, device = _setup(store, rank, world, False, timeout_s=60)
    peer = 1 - rank
    buf = pyccl.empty(8 << 20, dtype=torch.uint8)
    pch = comm.port_channel(peer, comm.register(buf))
    comm.barrier()
    result = None
    if rank == 0:
        outcome = {}

        def pusher():
            try:
                outcome["res"] = run(comm, [Op.port_put(0, 0, 0, 8 << 20)], port=[pch], repeat=3000)
                outcome["flush"] = run(comm, [Op.port_flush(0)], port=[pch])
            except pyccl.PycclError as e:  # a closed communicator is a fine answer too
                outcome["error"] = str(e)

        t = threading.Thread(target=pusher)
        t.start()
        time.sleep(0.3)
        busy = comm.proxy_stats()
        t0 = time.monotonic()
        comm.close()
        close_s = time.monotonic() - t0
        t.join(20)
        result = {"close_s": close_s, "pusher_done": not t.is_alive(), "busy": busy,
                  "outcome": {k: (v.failures if hasattr(v, "failures") else v) for k, v in outcome.items()}}
        store.set("pending_done", b"1")
    else:
        store.get("pending_done")
        comm.close()
    return result


def all_pairs(rank, world, store, on_gpu, nbytes, seed):
    """Every rank puts to every peer at once (HB and port), then checks what it got."""
    comm, device = _setup(store, rank, world, on_gpu)
    buf = pyccl.empty(world * nbytes, dtype=torch.uint8, device=device)
    mem = comm.register(buf)
    peers = [p for p in range(world) if p != rank]
    mchs = [comm.memory_channel(p, mem) for p in peers]
    pchs = [comm.port_channel(p, mem) for p in peers]
    gen = torch.Generator().manual_seed(seed)
    datas = [torch.randint(0, 256, (nbytes,), generator=gen, dtype=torch.uint8) for _ in range(world)]
    wrong = 0
    for via in ("memory", "port"):
        buf.fill_(0)
        buf[rank * nbytes:(rank + 1) * nbytes] = datas[rank].to(device)
        _sync(comm, on_gpu)
        if via == "memory":
            ops = [Op.put(i, rank * nbytes, rank * nbytes, nbytes) for i in range(len(peers))]
            ops += [Op.signal(i) for i in range(len(peers))] + [Op.wait(i) for i in range(len(peers))]
            res = run(comm, ops, memory=mchs, blocks=4)
        else:
            ops = [Op.port_put(i, rank * nbytes, rank * nbytes, nbytes, signal=True) for i in range(len(peers))]
            ops += [Op.port_wait(i) for i in range(len(peers))]
            res = run(comm, ops, port=pchs)
        got = buf.cpu()
        for p in range(world):
            wrong += int((got[p * nbytes:(p + 1) * nbytes] != datas[p]).sum())
        wrong += res.failures
        _sync(comm, on_gpu)
    comm.close()
    return wrong


def port_transfers(rank, world, store, seed, count, size, transport, split_nodes=False):
    """PortChannel over `transport` (socket, or rdma with PYCCL_RDMA_LOOPBACK):
    random puts with signals and flushes, then a flood of signalled puts. With
    split_nodes each rank is its own "node" (PYCCL_NODE_ID), so there is no P2P
    and "auto" must pick the socket."""
    if split_nodes:
        os.environ["PYCCL_NODE_ID"] = f"node{rank}"
    comm, device = _setup(store, rank, world, False)
    peer = 1 - rank
    buf = pyccl.empty(size, dtype=torch.uint8)
    mem = comm.register(buf)
    pch = comm.port_channel(peer, mem, transport="auto" if split_nodes else transport)
    out = {"transport": pch.transport, "p2p": comm.can_access_peer(peer), "bad": []}
    if split_nodes:
        try:
            comm.memory_channel(peer, mem)
            out["memory_channel_error"] = None
        except pyccl.InvalidArgumentError as e:
            out["memory_channel_error"] = str(e)
    rng = random.Random(seed)
    for i in range(count):
        n = rng.choice([1, 7, 4096, rng.randrange(1, size // 2)])
        src_off, dst_off = rng.randrange(0, size - n), rng.randrange(0, size - n)
        gen = torch.Generator().manual_seed(seed * 1000 + i)
        data = torch.randint(0, 256, (size,), generator=gen, dtype=torch.uint8)
        buf.copy_(data) if rank == 0 else buf.fill_(MARK)
        comm.barrier()
        if rank == 0:
            res = run(comm, [Op.port_put(0, dst_off, src_off, n, signal=True), Op.port_flush(0)], port=[pch])
        else:
            res = run(comm, [Op.port_wait(0)], port=[pch])
            expect = torch.full((size,), MARK, dtype=torch.uint8)
            expect[dst_off:dst_off + n] = data[src_off:src_off + n]
            if not torch.equal(buf, expect):
                out["bad"].append((i, dst_off, src_off, n))
        if res.failures:
            out["bad"].append((i, "wait failed"))
        comm.barrier()
    # Many small signalled puts in a row (ordering of data before signals).
    rounds = 2000
    if rank == 0:
        res = run(comm, [Op.port_put(0, 0, 0, 64, signal=True)], port=[pch], repeat=rounds)
    else:
        res = run(comm, [Op.port_wait(0)], port=[pch], repeat=rounds)
    out["flood_failures"] = res.failures
    comm.barrier()
    comm.close()
    return out


def rdma_loopback_failure(rank, world, store):
    """The RDMA transport with its 6th work request failing in the (loopback)
    NIC: the sender's proxy stops with an error naming the peer and the status,
    and no rank waits forever."""
    comm, _ = _setup(store, rank, world, False, timeout_s=3.0)
    buf = pyccl.empty(1 << 16, dtype=torch.uint8)
    buf.copy_(torch.randint(0, 256, (1 << 16,), dtype=torch.uint8))
    mem = comm.register(buf)
    pch = comm.port_channel(1 - rank, mem, transport="rdma")
    if rank == 0:
        res = run(comm, [Op.port_put(0, 0, 0, 1024, signal=True), Op.port_flush(0)], port=[pch], repeat=10)
    else:
        res = run(comm, [Op.port_wait(0)], port=[pch], repeat=3)  # signals 1, 2 arrive; 3 never does
    out = {"failures": res.failures}
    try:
        out["proxy"] = comm._comm.proxy_stats()
    except pyccl.AbortedError as e:  # the communicator is broken; the message says why
        out["proxy"] = {"running": False, "error": str(e)}
    comm.close()
    return out


def transport_errors(rank, world, store):
    comm, _ = _setup(store, rank, world, False)
    mem = comm.register(pyccl.empty(1024, dtype=torch.uint8))
    out = {}
    for kind in ("bogus", "rdma"):
        try:
            comm.port_channel(1 - rank, mem, transport=kind)
            out[kind] = None
        except (pyccl.InvalidArgumentError, pyccl.UnsupportedError) as e:
            out[kind] = str(e)
    comm.barrier()
    comm.close()
    return out


def bad_proxy_spin(rank, world, store):
    """A PYCCL_PROXY_SPIN_US made malformed after the communicator (which
    checks it first) is refused by name when the proxy starts."""
    comm, _ = _setup(store, rank, world, False)
    os.environ["PYCCL_PROXY_SPIN_US"] = "10ms"
    mem = comm.register(pyccl.empty(1024, dtype=torch.uint8))
    try:
        comm.port_channel(1 - rank, mem)
        message = None
    except pyccl.InvalidArgumentError as e:
        message = str(e)
    comm.barrier()
    comm.close()
    return message
