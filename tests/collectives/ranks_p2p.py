"""Per-rank bodies of the send/receive tests; each runs in host mode or on GPUs."""

from __future__ import annotations

import random
import time

import torch

import pyccl
from ranks_collectives import _setup

DTYPES = [torch.uint8, torch.bfloat16, torch.float16, torch.float32, torch.int32, torch.int64, torch.float64,
          torch.float8_e4m3fn, torch.bool]


def payload(seed: int, case: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """Case `case`'s message, the same on every rank: random bytes viewed as
    `dtype` (never all zeros)."""
    size = torch.empty(0, dtype=dtype).element_size()
    g = torch.Generator().manual_seed(seed * 100_003 + case)
    raw = torch.randint(1, 256, (count * size,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw = raw & 1
    return raw.view(dtype)


def schedule(seed: int, world: int, cases: int, max_bytes: int):
    """(src, dst, count, dtype, the receive's element offset) per case, the same on every rank."""
    rng = random.Random(seed)
    out = []
    for _ in range(cases):
        src = rng.randrange(world)
        dst = rng.choice([q for q in range(world) if q != src])
        dtype = rng.choice(DTYPES)
        size = torch.empty(0, dtype=dtype).element_size()
        nbytes = rng.choice([0, size, rng.randrange(1, 4096), rng.randrange(1, max_bytes)])
        out.append((src, dst, max(nbytes // size, 0), dtype, rng.choice([0, 0, 1, 3])))
    return out


def _unaligned(count: int, dtype: torch.dtype, offset: int, device) -> torch.Tensor:
    """A tensor of `count` elements (filled with 0xA5 bytes) whose data starts
    `offset` elements into its storage."""
    base = torch.full(((offset + count) * torch.empty(0, dtype=dtype).element_size(),), 0xA5, dtype=torch.uint8,
                      device=device)
    return base.view(dtype)[offset:]


def random_transfers(rank, world, store, on_gpu, seed, cases, max_bytes, engine_options=None):
    """Cases in one global order, each a send on its source and a receive on
    its destination (a total order: large sends wait for their receives
    without a deadlock); every received message checked bit for bit."""
    comm, device = _setup(store, rank, world, on_gpu, engine_options=engine_options)
    bad = []
    received = []
    for i, (src, dst, count, dtype, offset) in enumerate(schedule(seed, world, cases, max_bytes)):
        if rank == src:
            pyccl.send(payload(seed, i, count, dtype).to(device), dst, comm=comm)
        elif rank == dst:
            out = _unaligned(count, dtype, offset, device)
            received.append((i, pyccl.recv(out, src, comm=comm)))
    if on_gpu:
        torch.cuda.synchronize()
    for i, out in received:
        src, dst, count, dtype, offset = schedule(seed, world, cases, max_bytes)[i]
        want = payload(seed, i, count, dtype)
        if not torch.equal(out.cpu().view(torch.uint8), want.view(torch.uint8)):
            bad.append((i, src, dst, count, str(dtype)))
    comm.close()
    return bad, len(received)


def ring_and_all_to_all(rank, world, store, on_gpu, seed, nbytes):
    """send_recv with transfers that must run together: every rank sends
    `nbytes` (more than a send may buffer) to the next rank while receiving
    from the one before; then an uneven all-to-all (a send to and a receive
    from every peer, sizes by pair); then two sends to the same peer in one
    call. Returns the mismatches."""
    comm, device = _setup(store, rank, world, on_gpu)
    engine = comm._collective_engine()
    bad = []
    if nbytes <= engine.p2p_buffered_bytes:
        bad.append(f"{nbytes} bytes fit the buffer ({engine.p2p_buffered_bytes}): the ring would not test grouping")
    # Lanes: at most p2p_blocks, fewer where a launch with every peer would not stay resident; the same everywhere.
    store.set(f"p2p_lanes/{rank}", str(engine.p2p_lanes))
    gathered = [int(store.get(f"p2p_lanes/{q}")) for q in range(world)]
    if len(set(gathered)) != 1 or not 1 <= engine.p2p_lanes <= (64 if on_gpu else 2):
        bad.append(f"lanes {gathered}")
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    out = torch.empty(nbytes, dtype=torch.uint8, device=device)
    pyccl.send_recv(sends=[(payload(seed, rank, nbytes, torch.uint8).to(device), nxt)], recvs=[(out, prv)],
                    comm=comm)
    if not torch.equal(out.cpu(), payload(seed, prv, nbytes, torch.uint8)):
        bad.append("ring")

    def pair_count(a, b):  # elements from a to b
        return 1 + (a * 7919 + b * 104_729 + seed) % (nbytes // 4)

    sends = [(payload(seed, 1000 + rank * 16 + q, pair_count(rank, q), torch.float32).to(device), q)
             for q in range(world) if q != rank]
    recvs = [(torch.empty(pair_count(q, rank), dtype=torch.float32, device=device), q)
             for q in range(world) if q != rank]
    pyccl.send_recv(sends=sends, recvs=recvs, comm=comm)
    for t, q in recvs:
        if not torch.equal(t.cpu().view(torch.uint8),
                           payload(seed, 1000 + q * 16 + rank, pair_count(q, rank), torch.float32).view(torch.uint8)):
            bad.append(("all_to_all from", q))

    # Two messages to the same peer in one call: two launches, received in order.
    firsts = [payload(seed, 5000 + rank * 2 + k, 3000 + k, torch.int32).to(device) for k in range(2)]
    got = [torch.empty(3000 + k, dtype=torch.int32, device=device) for k in range(2)]
    pyccl.send_recv(sends=[(firsts[0], nxt), (firsts[1], nxt)], recvs=[(got[0], prv), (got[1], prv)], comm=comm)
    for k in range(2):
        if not torch.equal(got[k].cpu(), payload(seed, 5000 + prv * 2 + k, 3000 + k, torch.int32)):
            bad.append(("same peer twice", k))
    comm.close()
    return bad


def size_mismatch(rank, world, store, sent, received, on_gpu=False):
    """Rank 0 sends `sent` bytes (an int, or a list of sends in turn) where
    rank 1 receives `received`: rank 1 raises, naming both sizes (and how
    long it took: out["recv_s"]), and its communicator is broken."""
    comm, device = _setup(store, rank, world, on_gpu, timeout_s=30.0)
    out = {}
    if rank == 0:
        for nbytes in sent if isinstance(sent, list) else [sent]:
            pyccl.send(torch.arange(nbytes, dtype=torch.uint8, device=device), 1, comm=comm)
        if on_gpu:
            torch.cuda.synchronize()
        out["sent"] = True
    else:
        start = time.monotonic()
        try:
            pyccl.recv(torch.empty(received, dtype=torch.uint8, device=device), 0, comm=comm)
            if on_gpu:  # the kernel finds the mismatch after the call returned: the next call is refused
                torch.cuda.synchronize()
                pyccl.all_reduce(torch.ones(4, device=device), comm=comm)
        except pyccl.PycclError as e:
            out["recv"] = (type(e).__name__, str(e))
        out["recv_s"] = time.monotonic() - start
        try:
            pyccl.all_reduce(torch.ones(4, device=device), comm=comm)
        except pyccl.PycclError as e:
            out["after"] = str(e)
    store.set(f"mismatch_done_{rank}", "1")
    store.wait([f"mismatch_done_{q}" for q in range(world)])
    comm.close()
    return out


def missing_sender(rank, world, store):
    """Rank 1 receives from rank 0, which never sends: a bounded wait that
    names the call and the peer."""
    # The ranks meet first: the 2 s timeout also bounds the communicator's set-up, which a rank whose process
    # started seconds later (a loaded machine) would miss.
    store.set(f"missing_ready_{rank}", "1")
    store.wait([f"missing_ready_{q}" for q in range(world)])
    comm, device = _setup(store, rank, world, False, timeout_s=2.0)
    out = None
    if rank == 1:
        try:
            pyccl.recv(torch.empty(100, dtype=torch.float32), 0, comm=comm)
        except pyccl.PycclError as e:
            out = (type(e).__name__, str(e))
    store.set(f"missing_done_{rank}", "1")
    store.wait([f"missing_done_{q}" for q in range(world)])
    comm.close()
    return out


def bad_arguments(rank, world, store, on_gpu):
    """Every bad argument raises at the call, naming it, and runs nothing."""
    comm, device = _setup(store, rank, world, on_gpu)
    x = torch.ones(8, device=device)
    attempts = {
        "self": lambda: pyccl.send(x, rank, comm=comm),
        "range": lambda: pyccl.send(x, world, comm=comm),
        "negative": lambda: pyccl.recv(x, -1, comm=comm),
        "bool": lambda: pyccl.send(x, True, comm=comm),
        "not_tensor": lambda: pyccl.send([1.0], (rank + 1) % world, comm=comm),
        "non_contiguous": lambda: pyccl.recv(torch.ones(8, 2, device=device).t(), (rank + 1) % world, comm=comm),
        "overlap": lambda: pyccl.send_recv(sends=[(x, (rank + 1) % world)], recvs=[(x[2:], (rank - 1) % world)],
                                           comm=comm),
        "pair": lambda: pyccl.send_recv(sends=[x], comm=comm),
    }
    if on_gpu:
        attempts["device"] = lambda: pyccl.send(torch.ones(8), (rank + 1) % world, comm=comm)
    messages = {}
    for name, attempt in attempts.items():
        try:
            attempt()
            messages[name] = None
        except pyccl.PycclError as e:
            messages[name] = str(e)
    # Nothing ran: a collective still works and the ranks still agree.
    y = pyccl.all_reduce(torch.full((5,), float(rank + 1), device=device), comm=comm)
    messages["after"] = y.cpu().tolist()
    comm.close()
    return messages


def bad_engine_options(rank, world, store, on_gpu=False):
    """Engine options of the sends and receives out of range: each names itself
    (on GPUs p2p_threads also makes p2p_ll_lane_bytes' default)."""
    comm, _ = _setup(store, rank, world, on_gpu)
    messages = {}
    for name, options in (("lane", {"p2p_ll_lane_bytes": 12}), ("max", {"p2p_ll_max_bytes": 1 << 30}),
                          ("threads", {"p2p_threads": 0})):
        try:
            pyccl._C.CollectiveEngine(comm._comm, **options).close()
            messages[name] = "accepted"
        except ValueError as e:
            messages[name] = str(e)
    messages["default"] = comm._collective_engine().p2p_ll_max_bytes
    comm.close()
    return messages


def graph_replays(rank, world, store, replays):
    """A ring send_recv and a send/recv pair captured in a CUDA graph (after
    one eager call), replayed with fresh inputs, with eager collectives and
    transfers of other sizes in between."""
    comm, device = _setup(store, rank, world, True)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    big = 3 << 20
    x = torch.empty(big, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    s = torch.empty(777, dtype=torch.bfloat16, device=device)
    r = torch.empty_like(s)
    pyccl.send_recv(sends=[(x, nxt)], recvs=[(y, prv)], comm=comm)  # warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        pyccl.send_recv(sends=[(x, nxt)], recvs=[(y, prv)], comm=comm)
        if rank == 0:
            pyccl.send(s, 1, comm=comm)
        elif rank == 1:
            pyccl.recv(r, 0, comm=comm)
    bad = []
    for k in range(replays):
        x.copy_(payload(k, rank, big, torch.uint8).to(device))
        s.copy_(payload(k, 99, 777, torch.bfloat16).to(device))
        graph.replay()
        # Eager calls between replays move the counts on.
        between = torch.empty(1000 + k, device=device)
        pyccl.send_recv(sends=[(torch.full((1000 + k,), float(rank) + 0.5, device=device), nxt)],
                        recvs=[(between, prv)], comm=comm)
        pyccl.all_reduce(torch.randn(513, device=device), comm=comm)
        if not torch.equal(between.cpu(), torch.full((1000 + k,), float(prv) + 0.5)):
            bad.append(("between replays", k))
        if not torch.equal(y.cpu(), payload(k, prv, big, torch.uint8)):
            bad.append(("ring", k))
        if rank == 1 and not torch.equal(r.cpu().view(torch.int16), payload(k, 99, 777, torch.bfloat16).view(torch.int16)):
            bad.append(("pair", k))
    torch.cuda.synchronize()
    del graph
    comm.close()
    return bad
