"""Per-rank bodies of the torch.distributed backend tests (host mode on CPU,
or GPUs)."""

from __future__ import annotations

import datetime
import math
import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import pyccl  # noqa: F401  (registers the backend)
from gpu_sharing import rank_gpu
from ranks_collectives import TOLERANCE, error_scale, rank_input, reference
from ranks_exchanges import movement_input

OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX,
       "prod": dist.ReduceOp.PRODUCT}


def _init(rank, world, store, backend, on_gpu, timeout_s=120):
    device = torch.device("cuda", rank_gpu(rank)) if on_gpu else torch.device("cpu")
    kwargs = {}
    if on_gpu:
        torch.cuda.set_device(device)
        kwargs["device_id"] = device
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    return device


def _close(x, ref, dtype, inputs, chunk=slice(None)):
    rtol, atol = TOLERANCE[dtype]
    return torch.allclose(x.cpu().to(torch.float64), ref, rtol=rtol, atol=atol * error_scale(inputs, chunk))


def every_op(rank, world, store, backend, on_gpu, seed):
    """Each c10d op through the pyccl backend, checked against float64 or bit
    for bit. Returns the failures."""
    device = _init(rank, world, store, backend, on_gpu)
    bad = []
    case = 0

    def fresh(n, dtype=torch.float32, op="sum"):
        nonlocal case
        case += 1
        return [rank_input(seed, case, r, n, dtype, op) for r in range(world)]

    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for op, rop in OPS.items():
            for n in (1, 37, 5003):
                ins = fresh(n, dtype, op)
                x = ins[rank].to(device, copy=True)
                dist.all_reduce(x, op=rop)
                if not _close(x, reference(ins, op), dtype, ins):
                    bad.append(("all_reduce", str(dtype), op, n))
    # reduce: only the root's tensor changes.
    ins = fresh(1001)
    x = ins[rank].to(device, copy=True)
    dist.reduce(x, dst=world - 1, op=dist.ReduceOp.MAX)
    want = reference(ins, "max") if rank == world - 1 else ins[rank].double()
    if not _close(x, want, torch.float32, ins):
        bad.append(("reduce",))
    # broadcast, any dtype.
    for dtype in (torch.int64, torch.bfloat16, torch.uint8):
        vals = [movement_input(seed, 900 + case, r, 777, dtype) for r in range(world)]
        x = vals[rank].to(device, copy=True)
        dist.broadcast(x, src=1 % world)
        if not torch.equal(x.cpu(), vals[1 % world]):
            bad.append(("broadcast", str(dtype)))
    # all_gather: into a tensor, and into a list.
    vals = [movement_input(seed, 901, r, 333, torch.int32) for r in range(world)]
    out = torch.empty(world * 333, dtype=torch.int32, device=device)
    dist.all_gather_into_tensor(out, vals[rank].to(device))
    if not torch.equal(out.cpu(), torch.cat(vals)):
        bad.append(("all_gather_into_tensor",))
    outs = [torch.empty(333, dtype=torch.int32, device=device) for _ in range(world)]
    dist.all_gather(outs, vals[rank].to(device))
    if not all(torch.equal(o.cpu(), v) for o, v in zip(outs, vals)):
        bad.append(("all_gather",))
    # reduce_scatter: tensor and list.
    ins = fresh(world * 129)
    out = torch.empty(129, device=device)
    dist.reduce_scatter_tensor(out, ins[rank].to(device))
    chunk = slice(rank * 129, (rank + 1) * 129)
    if not _close(out, reference(ins, "sum")[chunk], torch.float32, ins, chunk):
        bad.append(("reduce_scatter_tensor",))
    out = torch.empty(129, device=device)
    dist.reduce_scatter(out, list(ins[rank].to(device).chunk(world)), op=dist.ReduceOp.MIN)
    if not _close(out, reference(ins, "min")[chunk], torch.float32, ins, chunk):
        bad.append(("reduce_scatter",))
    # all_to_all: single (equal splits) and list.
    vals = [movement_input(seed, 902, r, world * 50, torch.float64) for r in range(world)]
    out = torch.empty(world * 50, dtype=torch.float64, device=device)
    dist.all_to_all_single(out, vals[rank].to(device))
    expect = torch.cat([v[rank * 50:(rank + 1) * 50] for v in vals])
    if not torch.equal(out.cpu(), expect):
        bad.append(("all_to_all_single",))
    outs = [torch.empty(50, dtype=torch.float64, device=device) for _ in range(world)]
    dist.all_to_all(outs, list(vals[rank].to(device).chunk(world)))
    if not torch.equal(torch.cat(outs).cpu(), expect):
        bad.append(("all_to_all",))
    # all_gather of a size per rank.
    vals = [movement_input(seed, 906, r, 100 + 17 * r, torch.float16) for r in range(world)]
    outs = [torch.empty(v.numel(), dtype=torch.float16, device=device) for v in vals]
    dist.all_gather(outs, vals[rank].to(device))
    if not all(torch.equal(o.cpu(), v) for o, v in zip(outs, vals)):
        bad.append(("all_gather uneven",))
    # Uneven splits (rows from src to dst), dim 0 of a 2-D tensor; the list form with a size per pair.
    rows = [[1 + (3 * src + 5 * dst) % 7 for dst in range(world)] for src in range(world)]
    sent = [movement_input(seed, 904, r, sum(rows[r]) * 3, torch.int32).view(-1, 3) for r in range(world)]
    expect = torch.cat([sent[q].split(rows[q])[rank] for q in range(world)])
    out = torch.empty(expect.shape, dtype=torch.int32, device=device)
    dist.all_to_all_single(out, sent[rank].to(device), [rows[q][rank] for q in range(world)], rows[rank])
    if not torch.equal(out.cpu(), expect):
        bad.append(("all_to_all_single uneven",))
    outs = [torch.empty(p.shape, dtype=torch.int32, device=device) for p in expect.split(
        [rows[q][rank] for q in range(world)])]
    dist.all_to_all(outs, [p.to(device) for p in sent[rank].split(rows[rank])])
    if not torch.equal(torch.cat(outs).cpu(), expect):
        bad.append(("all_to_all uneven",))
    # gather and scatter, root not 0.
    vals = [movement_input(seed, 905, r, 1001, torch.bfloat16) for r in range(world)]
    root = world - 1
    listed = [torch.empty(1001, dtype=torch.bfloat16, device=device) for _ in range(world)]
    dist.gather(vals[rank].to(device), listed if rank == root else None, dst=root)
    if rank == root and not all(torch.equal(g.cpu(), v) for g, v in zip(listed, vals)):
        bad.append(("gather",))
    got = torch.empty(1001, dtype=torch.bfloat16, device=device)
    dist.scatter(got, [v.to(device) for v in vals] if rank == root else None, src=root)
    if not torch.equal(got.cpu(), vals[rank]):
        bad.append(("scatter",))
    # The object forms, which torch builds on gather and scatter.
    objects = [None] * world if rank == root else None
    dist.gather_object({"rank": rank, "items": list(range(rank * 37))}, objects, dst=root)
    if rank == root and objects != [{"rank": q, "items": list(range(q * 37))} for q in range(world)]:
        bad.append(("gather_object",))
    one = [None]
    dist.scatter_object_list(one, [f"to {q} " * (q + 1) for q in range(world)] if rank == 0 else None, src=0)
    if one != [f"to {rank} " * (rank + 1)]:
        bad.append(("scatter_object_list", one))
    # send/recv around a ring (even ranks send first).
    mine = movement_input(seed, 903, rank, 70_001, torch.float32).to(device)
    got = torch.empty_like(mine)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    if rank % 2 == 0:
        dist.send(mine, nxt)
        dist.recv(got, prv)
    else:
        dist.recv(got, prv)
        dist.send(mine, nxt)
    if not torch.equal(got.cpu(), movement_input(seed, 903, prv, 70_001, torch.float32)):
        bad.append(("send/recv",))
    # all_gather_coalesced (deprecated, and still torch's API): lists[r][i] is rank r's input i.
    shapes = [(5, 3), (7,), (2, 2, 2)]
    lists = [[torch.full(s, float("nan"), device=device) for s in shapes] for _ in range(world)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist.all_gather_coalesced(lists, [movement_input(seed, 910 + i, rank, math.prod(s), torch.float32)
                                          .view(s).to(device) for i, s in enumerate(shapes)])
    for r in range(world):
        for i, s in enumerate(shapes):
            want = movement_input(seed, 910 + i, r, math.prod(s), torch.float32).view(s)
            if not torch.equal(lists[r][i].cpu(), want):
                bad.append(("all_gather_coalesced", r, i))
    # async_op: Work.wait / is_completed / get_future.
    ins = fresh(4097)
    x = ins[rank].to(device, copy=True)
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    result = work.get_future().wait()
    if not (work.is_completed() or on_gpu) or not _close(result[0], reference(ins, "sum"), torch.float32, ins):
        bad.append(("async_op",))
    dist.barrier()
    dist.destroy_process_group()
    return bad


def coalesced_p2p(rank, world, store, backend, on_gpu, seed, count, replays=0):
    """batch_isend_irecv and torch's coalescing block through the backend. Every
    rank lists its receives before its sends, which run one by one would wait
    forever (host mode: a receive blocks; GPUs: a send past the buffer waits for
    a receive queued behind it); held to the block's end, they run together.
    Returns the failures."""
    from torch.distributed.distributed_c10d import _coalescing_manager

    device = _init(rank, world, store, backend, on_gpu)
    group = dist.group.WORLD
    bad = []
    nxt, prv = (rank + 1) % world, (rank - 1) % world

    def mine(case, r=rank, n=count, dtype=torch.float32):
        return movement_input(seed, case, r, n, dtype)

    # A ring, receives first: each rank's whole buffer to the next.
    got = torch.empty(count, device=device)
    works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, got, prv), dist.P2POp(dist.isend, mine(1).to(device), nxt)])
    for work in works:
        work.wait()
    if not torch.equal(got.cpu(), mine(1, prv)):
        bad.append(("ring", rank))
    # Every pair both ways in one batch, of several dtypes and odd sizes.
    outs, ops = {}, []
    for q in range(world):
        if q == rank:
            continue
        dtype = (torch.bfloat16, torch.int64, torch.uint8)[(q + rank) % 3]  # one per pair
        n = count - 7 * q - 3 * rank  # elements from rank to q
        outs[q] = torch.empty(count - 7 * rank - 3 * q, dtype=dtype, device=device)
        ops.append(dist.P2POp(dist.irecv, outs[q], q))
        ops.append(dist.P2POp(dist.isend, movement_input(seed, 2, rank * world + q, n, dtype).to(device), q))
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    for q, out in outs.items():
        sent = movement_input(seed, 2, q * world + rank, out.numel(), out.dtype)
        if not torch.equal(out.cpu(), sent):
            bad.append(("pairs", rank, q))
    # The block by hand: a held op refuses wait() until the block ends.
    got.zero_()
    group._start_coalescing(device)
    recv_work = dist.irecv(got, prv)
    try:
        recv_work.wait()
        bad.append(("wait inside the block accepted",))
    except ValueError as e:
        if "coalescing block" not in str(e) or f"rank {prv}" not in str(e):
            bad.append(("wait inside the block", str(e)))
    dist.isend(mine(3).to(device), nxt)
    group._end_coalescing(device).wait()
    recv_work.wait()  # the held op's work forwards to the block's end
    if not recv_work.is_completed() and not on_gpu:
        bad.append(("held work not completed",))
    if not torch.equal(got.cpu(), mine(3, prv)):
        bad.append(("block by hand", rank))
    try:
        group._end_coalescing(device)
        bad.append(("end without start accepted",))
    except ValueError as e:
        if "without startCoalescing" not in str(e):
            bad.append(("end without start", str(e)))
    # An error at a call inside batch_isend_irecv leaves torch's block open: the next block drops it,
    # and the works of the dropped block's ops say so.
    try:
        dist.batch_isend_irecv([dist.P2POp(dist.irecv, torch.empty(4, device=device), prv),
                                dist.P2POp(dist.isend, torch.ones(4, device=device), rank)])
        bad.append(("send to self accepted",))
    except ValueError as e:
        if "'dst'" not in str(e):
            bad.append(("send to self", str(e)))
    dropped = dist.irecv(torch.empty(4, device=device), prv)  # still in that block
    works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, got, prv), dist.P2POp(dist.isend, mine(6).to(device), nxt)])
    for work in works:
        work.wait()
    if not torch.equal(got.cpu(), mine(6, prv)):
        bad.append(("block after an abandoned one", rank))
    try:
        dropped.wait()
        bad.append(("dropped op's wait accepted",))
    except dist.DistBackendError as e:
        if "never ended" not in str(e):
            bad.append(("dropped op", str(e)))
    # torch's fast path: all_reduce in the block becomes one allreduce_coalesced.
    xs = [mine(10 + i, n=257).to(device) for i in range(3)]
    with _coalescing_manager(group, device, async_ops=True) as cm:
        for x in xs:
            dist.all_reduce(x)
    cm.wait()
    for i, x in enumerate(xs):
        want = sum(mine(10 + i, r, 257).double() for r in range(world))
        if not torch.allclose(x.cpu().double(), want, rtol=1e-5, atol=1e-4):
            bad.append(("coalesced all_reduce", i))
    if not on_gpu and rank < 2:
        # A block that fails at its end (rank 1 expects fewer elements than rank 0 sends): the end raises,
        # and so do the held ops' works.
        if rank == 0:
            for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, mine(4, n=999), 1)]):
                work.wait()
        else:
            group._start_coalescing(device)
            held = dist.irecv(torch.empty(998), 0)
            try:
                group._end_coalescing(device)
                bad.append(("size mismatch accepted",))
            except dist.DistBackendError as e:
                if "size mismatch" not in str(e):
                    bad.append(("size mismatch", str(e)))
            try:
                held.wait()
                bad.append(("failed block's work waited",))
            except dist.DistBackendError as e:
                if "its batch failed" not in str(e) or "recv from rank 0" not in str(e):
                    bad.append(("failed block's work", str(e)))
    if replays:
        bad += _coalesced_p2p_graph(rank, world, device, seed, count, replays)
    dist.barrier()
    dist.destroy_process_group()
    return bad


def _coalesced_p2p_graph(rank, world, device, seed, count, replays):
    """batch_isend_irecv captured in a CUDA graph, replayed with fresh inputs."""
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    send, got = torch.empty(count, device=device), torch.empty(count, device=device)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, got, prv), dist.P2POp(dist.isend, send, nxt)])
        for work in works:
            work.wait()
    bad = []
    for r in range(replays):
        send.copy_(movement_input(seed, 100 + r, rank, count, torch.float32))
        got.zero_()
        graph.replay()
        if not torch.equal(got.cpu(), movement_input(seed, 100 + r, prv, count, torch.float32)):
            bad.append(("graph replay", r))
    torch.cuda.synchronize()
    del graph
    return bad


def functional_and_compile(rank, world, store, backend, on_gpu):
    """Functional collectives (what torch.compile traces) through the backend,
    eager and under torch.compile(fullgraph=True)."""
    device = _init(rank, world, store, backend, on_gpu)
    group = dist.group.WORLD

    def block(x, w):
        h = funcol.all_reduce(x @ w, "sum", group)
        g = funcol.all_gather_tensor(h, 0, group)
        return funcol.reduce_scatter_tensor(g * 2, "sum", 0, group)

    gen = torch.Generator().manual_seed(17)
    xs = [torch.randn(8, 16, generator=gen) for _ in range(world)]
    w = torch.randn(16, 16, generator=torch.Generator().manual_seed(5))
    h = sum(x.double() @ w.double() for x in xs)
    expect = (torch.cat([h] * world) * 2 * world)[rank * 8:(rank + 1) * 8]
    x, wd = xs[rank].to(device), w.to(device)
    bad = []
    eager = block(x, wd)
    if not torch.allclose(eager.cpu().double(), expect, rtol=1e-4, atol=1e-3):
        bad.append("eager")
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager" if not on_gpu else "inductor")
    got = compiled(x, wd)
    if not torch.allclose(got.cpu().double(), expect, rtol=1e-4, atol=1e-3):
        bad.append("compiled")
    dist.destroy_process_group()
    return bad


def bad_input(rank, world, store):
    _init(rank, world, store, "cpu:pyccl", False)
    out = {}
    buf = torch.ones(8 * world)
    for label, call in [
        ("dtype", lambda: dist.all_reduce(torch.ones(4, dtype=torch.int16))),  # NCCL reduces no int16
        ("op", lambda: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.BAND)),
        ("contiguous", lambda: dist.all_reduce(torch.ones(4, 4).t())),
        ("out_size", lambda: dist.all_gather_into_tensor(torch.empty(3), torch.ones(4))),
        ("splits", lambda: dist.all_to_all_single(torch.empty(4 * world), torch.ones(4 * world),
                                                  [4] * world, [4 * world] + [1] * (world - 1))),
        ("gather_list", lambda: dist.gather(torch.ones(4), [torch.empty(4)] * (world + 1), dst=rank)),
        ("overlap", lambda: dist.all_gather_into_tensor(buf[1:1 + 4 * world], buf[:4])),
    ]:
        try:
            call()
            out[label] = ("accepted", "")
        except Exception as e:  # noqa: BLE001 - the type is what is checked
            out[label] = (type(e).__name__, str(e))
    # Still usable after the refusals; in place is not an overlap.
    x = torch.ones(3)
    dist.all_reduce(x)
    out["after"] = x.tolist()
    gathered = torch.zeros(2 * world)
    gathered[2 * rank:2 * rank + 2] = rank + 1.0
    dist.all_gather_into_tensor(gathered, gathered[2 * rank:2 * rank + 2])
    out["gathered"] = gathered.tolist()
    dist.destroy_process_group()
    return out


def mixed_string(rank, world, store):
    """'cpu:gloo,cuda:pyccl': CPU tensors go to gloo."""
    if torch.cuda.device_count() >= world:
        torch.cuda.set_device(rank_gpu(rank))  # the pyccl half sets up on the current GPU
    _init(rank, world, store, "cpu:gloo,cuda:pyccl", False)
    x = torch.full((3,), float(rank))
    dist.all_reduce(x)
    backend = str(dist.get_backend())
    dist.destroy_process_group()
    return x.tolist(), backend


def gpu_extras(rank, world, store, replays):
    """On GPUs: a graph that captures dist collectives before any eager op on
    the group, replayed with fresh inputs; integer reductions handed to NCCL."""
    device = _init(rank, world, store, "cuda:pyccl,cpu:pyccl", True)
    bad = []
    xs = {n: torch.empty(n, device=device, dtype=torch.bfloat16) for n in (3000, 400_000)}
    gathered = torch.empty(world * 3000, device=device, dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for x in xs.values():
            dist.all_reduce(x)
        dist.all_gather_into_tensor(gathered, xs[3000])
    for r in range(replays):
        ins = {n: [torch.randn(n, generator=torch.Generator().manual_seed(r * 131 + q * 7 + n)) for q in range(world)]
               for n in xs}
        for n, x in xs.items():
            x.copy_(ins[n][rank])
        graph.replay()
        for n, x in xs.items():
            ref = sum(t.bfloat16().double() for t in ins[n])
            if not torch.allclose(x.cpu().double(), ref, rtol=3e-2, atol=0.1):
                bad.append(("graph all_reduce", r, n))
        if r % 50 == 0:
            torch.cuda.synchronize()
    counts = torch.arange(5, dtype=torch.int32, device=device) + rank
    dist.all_reduce(counts)  # int32: the kernels (the "other" dtypes' choice)
    if counts.cpu().tolist() != [world * i + world * (world - 1) // 2 for i in range(5)]:
        bad.append(("int32 all_reduce", counts.cpu().tolist()))
    torch.cuda.synchronize()
    del graph
    dist.destroy_process_group()
    return bad


def thresholds_must_agree(rank, world, store):
    """On GPUs: a group whose last rank hands collectives to NCCL from other
    sizes (PYCCL_NCCL_MIN_BYTES) is refused on every rank where its GPU side
    is set up (init_process_group with device_id, else the first CUDA op),
    naming a threshold, instead of waiting on peers that run pyccl's kernels."""
    import os

    if rank == world - 1:
        os.environ["PYCCL_NCCL_MIN_BYTES"] = "4096"
    try:
        device = _init(rank, world, store, "cuda:pyccl", True)
        dist.all_reduce(torch.randn(1000, device=device))
        torch.cuda.synchronize()
        error = ("accepted", "")
    except Exception as e:  # noqa: BLE001 - the type is what is checked
        error = (type(e).__name__, str(e))
    if dist.is_initialized():
        dist.destroy_process_group()
    return error


def missing_peer_times_out(rank, world, store, timeout_s):
    """init_process_group's timeout bounds a collective whose peer never comes:
    the error is a DistBackendError that names the op and the peer."""
    import time

    _init(rank, world, store, "cpu:pyccl", False, timeout_s=timeout_s)
    x = torch.ones(1000)
    dist.all_reduce(x)  # every rank: the lanes are set up
    result = None
    if rank == 0:
        start = time.monotonic()
        try:
            x.fill_(5.0)
            dist.all_reduce(x)
            result = ("completed", time.monotonic() - start, f"{x[:3].tolist()} {dist.get_backend()}")
        except Exception as e:  # noqa: BLE001 - the type is what is checked
            result = (type(e).__name__, time.monotonic() - start, str(e),
                      isinstance(e, dist.DistBackendError))
        # Broken now: the next call fails at once.
        start = time.monotonic()
        try:
            dist.all_reduce(x)
            result += ("completed",)
        except dist.DistBackendError:
            result += (time.monotonic() - start,)
    store.set(f"done{rank}", "1")
    for q in range(world):
        store.get(f"done{q}")
    return result


def barrier_without_its_peer(rank, world, store, timeout_s):
    """A barrier that rank 1 never joins: rank 0's error and how long it took
    (None on rank 1)."""
    import time

    _init(rank, world, store, "cpu:pyccl", False, timeout_s=timeout_s)
    dist.barrier()  # every rank: the lane is set up
    result = None
    if rank == 0:
        start = time.monotonic()
        try:
            dist.barrier()
            result = ("completed", time.monotonic() - start, "")
        except Exception as e:  # noqa: BLE001 - the type is what is checked
            result = (type(e).__name__, time.monotonic() - start, str(e))
    store.set(f"barrier_done{rank}", "1")
    for q in range(world):
        store.get(f"barrier_done{q}")
    return result


def one_runtime_per_group(rank, world, store):
    """Host mode: pyccl.communicator_for on a "cpu:pyccl" group is the group's
    own lane, with the group's timeout: calls through both APIs count on one
    communicator, closing it leaves the group running, and destroying the
    group closes it."""
    import pyccl

    dist.init_process_group("cpu:pyccl", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=45))
    bad = []
    comm = pyccl.communicator_for(device=torch.device("cpu"))
    if comm.timeout != datetime.timedelta(seconds=45):
        bad.append(("timeout", comm.timeout))
    if pyccl.communicator_for(device=torch.device("cpu")) is not comm:
        bad.append("a second communicator_for gave another communicator")
    gen = torch.Generator().manual_seed(1234)
    ins = [torch.randn(5000, generator=gen) for _ in range(world)]
    ref = sum(t.double() for t in ins)
    before = comm.sequence
    x = ins[rank].clone()
    dist.all_reduce(x)
    y = pyccl.all_reduce(ins[rank].clone())
    for name, got in (("dist.all_reduce", x), ("pyccl.all_reduce", y)):
        if not torch.allclose(got.double(), ref, rtol=1e-5, atol=1e-5):
            bad.append((name, (got.double() - ref).abs().max().item()))
    if comm.sequence != before + 2:
        bad.append(("calls on the group's communicator", before, comm.sequence))
    comm.close()
    if comm.closed:
        bad.append("close() closed the group's own communicator")
    z = ins[rank].clone()
    dist.all_reduce(z)
    if not torch.allclose(z.double(), ref, rtol=1e-5, atol=1e-5):
        bad.append("dist.all_reduce after close()")
    dist.destroy_process_group()
    if not comm.closed:
        bad.append("the group's communicator is open after destroy_process_group")
    return bad


def without_set_device(rank, world, store, backend, seed):
    """GPUs, as torch's own tests and many scripts run: no torch.cuda.set_device
    and no device_id, each rank's tensors on cuda:rank while the current device
    stays cuda:0. Collectives of two sizes, twice; pyccl's API on the same
    group; a second group; torch's average_parameters on the default group and
    on a subgroup; and a tensor of another GPU refused at the call."""
    import pyccl
    from torch.distributed.algorithms.model_averaging.utils import average_parameters

    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    device = torch.device("cuda", rank_gpu(rank))
    bad = []
    gen = torch.Generator().manual_seed(seed)

    def fresh(n):
        ins = [torch.randn(n, generator=gen) for _ in range(world)]
        return ins, sum(t.double() for t in ins)

    def check(what, got, ref):
        if not torch.allclose(got.cpu().double(), ref, rtol=1e-5, atol=1e-4):
            bad.append((what, (got.cpu().double() - ref).abs().max().item()))

    for call in range(2):
        for n in (1000, 300_001, 5_000_000):  # the last goes to the NCCL delegate
            ins, ref = fresh(n)
            x = ins[rank].to(device)
            dist.all_reduce(x)
            check(("dist.all_reduce", call, n), x, ref)
    ins, ref = fresh(70_000)
    check("pyccl.all_reduce on the group", pyccl.all_reduce(ins[rank].to(device)), ref)
    if pyccl.communicator_for(device=device).device != device:
        bad.append(("communicator_for's device", pyccl.communicator_for(device=device).device))
    second = dist.new_group(list(range(world)), backend=backend)
    ins, ref = fresh(12_345)
    x = ins[rank].to(device)
    dist.all_reduce(x, group=second)
    check("dist.all_reduce on a second group", x, ref)

    # torch's parameter averaging: parameters on cuda:rank, random per rank; the average in float64.
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 3, kernel_size=3, padding=1), torch.nn.ReLU(),
                                torch.nn.Linear(1, 5, bias=False)).to(device)
    for group, members in ((None, list(range(world))), ("sub", [0, 1])):
        pg = dist.new_group(members, backend=backend) if group == "sub" else None
        values = [[torch.randn(p.shape, generator=gen) for p in model.parameters()] for _ in range(world)]
        for p, v in zip(model.parameters(), values[rank]):
            p.data = v.to(device)
        if rank in members:
            average_parameters(model.parameters(), pg)
            for i, p in enumerate(model.parameters()):
                mean = sum(values[q][i].double() for q in members) / len(members)
                check(("average_parameters", group or "world", i), p.data, mean)

    other = torch.ones(10, device=torch.device("cuda", (device.index + 1) % torch.cuda.device_count()))
    try:
        dist.all_reduce(other)
        bad.append("a tensor of another GPU was accepted")
    except ValueError as e:
        if f"cuda:{device.index}" not in str(e) or f"cuda:{other.device.index}" not in str(e):
            bad.append(("the other GPU's error names both devices", str(e)))
    torch.cuda.synchronize(device)
    dist.destroy_process_group()
    return bad
