"""Per-rank bodies of the collective tests; each runs in host mode or on GPUs."""

from __future__ import annotations

import datetime
import hashlib
import os
import random

import torch

import pyccl
from gpu_sharing import rank_gpu

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
TOLERANCE = {torch.float32: (1e-5, 1e-6), torch.float16: (2e-3, 1e-3), torch.bfloat16: (1.6e-2, 1e-2)}


def _setup(store, rank, world, on_gpu, timeout_s=60.0, engine_options=None, gpu_index=None):
    """A communicator named "coll" (on GPU `gpu_index`, the rank's own by
    default); with `engine_options`, its collective engine is made with them
    (pyccl._C.CollectiveEngine keyword arguments)."""
    device = "cpu"
    if on_gpu:
        index = rank_gpu(rank) if gpu_index is None else gpu_index
        torch.cuda.set_device(index)
        device = f"cuda:{index}"
    comm = pyccl.Communicator(store, rank, world, device=device, name="coll",
                              timeout=datetime.timedelta(seconds=timeout_s), collectives=engine_options is None)
    if engine_options is not None:
        comm._engine = pyccl._C.CollectiveEngine(comm._comm, **engine_options)
    return comm, device


def rank_input(seed: int, case: int, rank: int, count: int, dtype: torch.dtype, op: str) -> torch.Tensor:
    """Rank `rank`'s input of case `case`: fresh random values (never zeros);
    near 1 for prod so the product stays finite."""
    gen = torch.Generator().manual_seed(seed * 100_003 + case * 101 + rank)
    if op == "prod":
        x = 1.0 + 0.25 * (torch.rand(count, generator=gen, dtype=torch.float64) - 0.5)
    else:
        x = torch.randn(count, generator=gen, dtype=torch.float64) * 4
    return x.to(dtype)


def reference(inputs, op: str) -> torch.Tensor:
    stack = torch.stack([x.to(torch.float64) for x in inputs])
    if op == "sum":
        return stack.sum(0)
    if op == "avg":
        return stack.mean(0)
    if op == "min":
        return stack.min(0).values
    if op == "max":
        return stack.max(0).values
    return stack.prod(0)


def error_scale(inputs, chunk=slice(None)) -> float:
    """The size rounding errors scale with: the largest sum of |inputs| (a
    result that nearly cancels is still only as exact as its terms)."""
    return torch.stack([x[chunk].to(torch.float64) for x in inputs]).abs().sum(0).max().item()


def random_engine_options(rng: random.Random) -> dict:
    """A valid CollectiveEngine configuration drawn at random, as a user may set
    one: few blocks, small LL regions and HB rounds, push or pull, rounds per
    launch, LL calls on fewer blocks, fused segments; unset keys keep their
    host-mode defaults (2 blocks, 64 KiB LL regions, 1 MiB HB rounds)."""
    options: dict = {}
    ll_blocks = rng.choice([1, 2, 3, 5, 8])
    options["ll_blocks"] = ll_blocks
    if rng.random() < 0.5:
        options["hb_blocks"] = rng.choice([1, 3, 6])
    if rng.random() < 0.6:
        options["ll_max_bytes"] = rng.choice([4096, 24_576, 100_000])
    if rng.random() < 0.6:
        options["hb_piece_bytes"] = rng.choice([16_384, 49_152, 100_000])
    if rng.random() < 0.4:
        options["hb_rounds_per_launch"] = rng.choice([1, 2, 3])
    options["hb_push"] = rng.random() < 0.5
    if rng.random() < 0.4:
        options["ll_packets_per_block"] = rng.choice([16, 64, 256])
    if rng.random() < 0.4:
        options["one_phase_hb_bytes_per_block"] = rng.choice([1024, 8192])
    if rng.random() < 0.5:
        options["fused_segments"] = rng.randrange(1, min(ll_blocks, 4) + 1)
    if rng.random() < 0.3:
        options["fused_two_shot_bytes"] = rng.choice([1, 4096])
    return options


def random_cases(seed: int, count: int, max_elems: int):
    """(dtype, op, elements, algorithm, in_place, offset): odd sizes and
    misaligned views included; algorithm None means the automatic choice."""
    rng = random.Random(seed)
    ops = ["sum", "avg", "min", "max", "prod"]
    cases = []
    for i in range(count):
        dtype = list(DTYPES.values())[i % 3]
        op = ops[(i // 3) % len(ops)]
        n = rng.choice([1, 2, 3, 7, 8, 9, 31, 255, 1000, 4097, rng.randrange(1, max_elems)])
        algo = rng.choice([None, "1pa_ll", "2pa_ll", "1pa_hb", "2pa_hb"])
        cases.append((dtype, op, n, algo, rng.random() < 0.3, rng.choice([0, 0, 1, 3])))
    return cases


def check_reduction(comm, result: torch.Tensor, inputs, op: str, case: tuple) -> list:
    """Failures of one all-reduce (tagged with `case`): against the float64
    reference, and bitwise equality across ranks (collective: every rank calls)."""
    got = result.cpu()
    expect = reference(inputs, op)
    rtol, atol = TOLERANCE[got.dtype]
    bad = []
    if not torch.allclose(got.to(torch.float64), expect, rtol=rtol, atol=atol * error_scale(inputs)):
        err = (got.to(torch.float64) - expect).abs().max().item()
        bad.append(case + (f"max abs error {err:.3g}",))
    digest = hashlib.sha256(got.view(torch.uint8).numpy().tobytes()).digest()
    if any(d != digest for d in comm.all_gather_bytes(digest)):
        bad.append(case + ("results differ across ranks",))
    return bad


def all_reduce_cases(rank, world, store, on_gpu, seed, count, max_elems, engine_options=None):
    """Random all-reduces checked against a float64 reference, and bitwise
    equality of the results across ranks. Returns a list of failures."""
    comm, device = _setup(store, rank, world, on_gpu, engine_options=engine_options)
    ll_max = None
    bad = []
    for i, (dtype, op, n, algo, in_place, offset) in enumerate(random_cases(seed, count, max_elems)):
        if algo == "1pa_ll":
            if ll_max is None:
                pyccl.all_reduce(torch.ones(1, device=device), comm=comm)  # creates the engine
                ll_max = comm._engine.ll_max_bytes
            if n * torch.tensor([], dtype=dtype).element_size() > ll_max:
                algo = "2pa_hb"
        inputs = [rank_input(seed, i, r, n, dtype, op) for r in range(world)]
        # A view at an element offset: misaligned for the vector paths.
        base = torch.empty(n + offset, dtype=dtype, device=device)
        x = base[offset:]
        x.copy_(inputs[rank])
        out = x if in_place else None
        y = pyccl.all_reduce(x, op=op, out=out, comm=comm, algorithm=algo)
        bad += check_reduction(comm, y, inputs, op, (i, str(dtype), op, n, algo, in_place, offset))
    record = comm.device_error()
    comm.close()
    return bad, record


def back_to_back(rank, world, store, on_gpu, rounds, engine_options=None):
    """Many calls in a row with no host synchronization between them, sizes
    alternating, every algorithm: each result must match its own reference."""
    comm, device = _setup(store, rank, world, on_gpu, engine_options=engine_options)
    sizes = [5, 4096 + 3, 16_000, 17, 9_000]  # within host mode's 64 KiB LL limit
    inputs, outputs, refs = [], [], []
    for r in range(rounds):
        n = sizes[r % len(sizes)]
        per_rank = [rank_input(7, r, q, n, torch.float32, "sum") for q in range(world)]
        x = per_rank[rank].to(device)
        inputs.append(x)
        refs.append(reference(per_rank, "sum"))
        outputs.append(pyccl.all_reduce(x, comm=comm, algorithm=["1pa_ll", "2pa_hb", "2pa_ll", "1pa_hb"][r % 4]))
    bad = 0
    for y, ref in zip(outputs, refs):
        if not torch.allclose(y.cpu().to(torch.float64), ref, rtol=1e-5, atol=1e-5):
            bad += 1
    comm.close()
    return bad


def bad_arguments(rank, world, store):
    comm, device = _setup(store, rank, world, False)
    x = torch.randn(16)
    out = {}
    for label, call in [
        ("op", lambda: pyccl.all_reduce(x, op="median", comm=comm)),
        ("dtype", lambda: pyccl.all_reduce(torch.ones(4, dtype=torch.int32), comm=comm)),
        ("out_size", lambda: pyccl.all_reduce(x, out=torch.empty(3), comm=comm)),
        ("algorithm", lambda: pyccl.all_reduce(x, comm=comm, algorithm="ring")),
        ("contiguous", lambda: pyccl.all_reduce(torch.randn(4, 4).t(), comm=comm)),
    ]:
        try:
            call()
            out[label] = "accepted"
        except (ValueError, TypeError) as e:
            out[label] = str(e)
    comm.close()
    return out


def graph_replays(rank, world, store, replays):
    """All-reduces captured in a CUDA graph (after one eager call), replayed
    with fresh inputs, with eager collectives of other sizes in between."""
    comm, device = _setup(store, rank, world, True)
    sizes = {"1pa_ll": 3001, "2pa_ll": 100_003, "1pa_hb": 200_001, "2pa_hb": 300_001}
    xs = {a: torch.empty(n, device=device, dtype=torch.bfloat16) for a, n in sizes.items()}
    outs = {a: torch.empty_like(x) for a, x in xs.items()}
    for a in sizes:
        pyccl.all_reduce(xs[a].normal_(), out=outs[a], comm=comm, algorithm=a)  # warm-up (engine set-up)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for a in sizes:
            pyccl.all_reduce(xs[a], out=outs[a], comm=comm, algorithm=a)
    bad = []
    for r in range(replays):
        per_rank = {a: [rank_input(11, r * 7 + k, q, n, torch.bfloat16, "sum") for q in range(world)]
                    for k, (a, n) in enumerate(sizes.items())}
        for a in sizes:
            xs[a].copy_(per_rank[a][rank])
        graph.replay()
        # Eager calls between replays move the per-block call counters on.
        extra = torch.randn(777 + r, device=device)
        pyccl.all_reduce(extra, comm=comm)
        for a in sizes:
            ref = reference(per_rank[a], "sum")
            got = outs[a].cpu().to(torch.float64)
            if not torch.allclose(got, ref, rtol=1.6e-2, atol=1e-2 * ref.abs().max().item()):
                bad.append((r, a))
    torch.cuda.synchronize()
    del graph
    comm.close()
    return bad


def large_cases(rank, world, store, on_gpu, seed, n32=700_001, n16=1_300_003, engine_options=None):
    """Messages larger than one HB round (several rounds per kernel, or
    launches with `hb_rounds_per_launch`), every dtype, out of place and in
    place at a misaligned offset; results bitwise equal across ranks."""
    comm, device = _setup(store, rank, world, on_gpu, engine_options=engine_options)
    bad = []
    for i, dtype in enumerate(DTYPES.values()):
        for algo in ("2pa_hb", "2pa_ll", "1pa_hb"):
            for in_place in (False, True):
                n = n32 if dtype == torch.float32 else n16
                inputs = [rank_input(seed, 2 * i + in_place, r, n, dtype, "sum") for r in range(world)]
                if in_place:
                    base = torch.empty(n + 1, dtype=dtype, device=device)
                    x = base[1:]  # misaligned: the push path stages its own chunk too
                    x.copy_(inputs[rank])
                    y = pyccl.all_reduce(x, out=x, comm=comm, algorithm=algo)
                else:
                    y = pyccl.all_reduce(inputs[rank].to(device), comm=comm, algorithm=algo)
                bad += check_reduction(comm, y, inputs, "sum", (str(dtype), n, algo, in_place))
    comm.close()
    return bad


def group_path(rank, world, store):
    """pyccl.all_reduce on a torch NCCL group: small messages through pyccl's
    kernels, large ones through NCCL (out of place: NCCL called directly; in
    place: the group's backend), eagerly and in a CUDA graph; all correct."""
    import torch.distributed as dist

    torch.cuda.set_device(rank_gpu(rank))
    device = torch.device("cuda", rank_gpu(rank))
    dist.init_process_group("nccl", store=store, rank=rank, world_size=world, device_id=device)
    bad = []
    cases = [(1000, "sum", False), (5_000_000, "sum", False), (5_000_000, "max", False), (5_000_000, "avg", True)]
    for i, (n, op, in_place) in enumerate(cases):  # 4 KB and 20 MB of float32
        inputs = [rank_input(3, i, r, n, torch.float32, op) for r in range(world)]
        x = inputs[rank].to(device)
        y = pyccl.all_reduce(x, op=op, out=x if in_place else None)
        if not torch.allclose(y.cpu().to(torch.float64), reference(inputs, op), rtol=1e-5, atol=1e-4):
            bad.append((n, op, in_place))
    comm = pyccl.collectives.communicator_for(None, device)
    if getattr(comm, "_nccl_direct", None) is None:
        bad.append("no direct NCCL communicator after an out-of-place hand-off")
    # Captured after the direct communicator exists, replayed on new inputs.
    x = torch.empty(5_000_000, device=device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = pyccl.all_reduce(x)
    for r in range(3):
        inputs = [rank_input(4, r, q, x.numel(), torch.float32, "sum") for q in range(world)]
        x.copy_(inputs[rank])
        graph.replay()
        if not torch.allclose(y.cpu().to(torch.float64), reference(inputs, "sum"), rtol=1e-5, atol=1e-4):
            bad.append(("graph replay", r))
    comm.close()
    dist.destroy_process_group()
    return bad


# ---------------------------------------------------------------------------
# All-gather, reduce-scatter, all-to-all and broadcast
# ---------------------------------------------------------------------------

MOVEMENT_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.float64,
                   torch.uint8, torch.float8_e4m3fn, torch.float8_e5m2, torch.bool]
EXCHANGES = ["all_gather", "reduce_scatter", "all_to_all", "broadcast"]


def movement_input(seed: int, case: int, rank: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """Fresh random values of any dtype (bit patterns checked exactly)."""
    gen = torch.Generator().manual_seed(seed * 100_019 + case * 103 + rank)
    if dtype == torch.bool:
        return torch.rand(count, generator=gen) < 0.5
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        return torch.randint(max(info.min, -(1 << 62)), min(info.max, 1 << 62), (count,), generator=gen,
                             dtype=torch.int64).to(dtype)
    return (torch.randn(count, generator=gen, dtype=torch.float64) * 4).to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8) if t.dtype != torch.bool else t.to(torch.uint8)


def exchange_cases_list(seed: int, count: int, max_elems: int):
    """(collective, dtype, op, elements per chunk, algorithm, in_place, root)."""
    rng = random.Random(seed)
    ops = ["sum", "avg", "min", "max", "prod"]
    cases = []
    for i in range(count):
        coll = EXCHANGES[i % len(EXCHANGES)]
        if coll == "reduce_scatter":
            dtype = list(DTYPES.values())[rng.randrange(3)]
        else:
            dtype = MOVEMENT_DTYPES[(i // len(EXCHANGES)) % len(MOVEMENT_DTYPES)]
        n = rng.choice([1, 2, 3, 5, 8, 17, 255, 1000, 4097, rng.randrange(1, max_elems)])
        cases.append((coll, dtype, rng.choice(ops), n, rng.choice([None, "ll", "hb"]), rng.random() < 0.35,
                      rng.randrange(64)))
    return cases


def exchange_cases(rank, world, store, on_gpu, seed, count, max_elems, engine_options=None):
    """Random exchanges: data movement checked bit for bit, reduce-scatter
    against a float64 reference and bitwise across ranks. Returns failures."""
    comm, device = _setup(store, rank, world, on_gpu, engine_options=engine_options)
    bad = []
    for i, (coll, dtype, op, n, algo, in_place, root) in enumerate(exchange_cases_list(seed, count, max_elems)):
        root %= world
        label = (i, coll, str(dtype), op, n, algo, in_place)
        if coll == "all_gather":
            inputs = [movement_input(seed, i, r, n, dtype) for r in range(world)]
            if in_place:
                out = torch.empty(world * n, dtype=dtype, device=device)
                x = out[rank * n:(rank + 1) * n]
                x.copy_(inputs[rank])
            else:
                out, x = None, inputs[rank].to(device, copy=True)
            got = pyccl.all_gather(x, out=out, comm=comm, algorithm=algo).cpu()
            if not torch.equal(_bits(got), _bits(torch.cat(inputs))):
                bad.append(label)
        elif coll == "all_to_all":
            inputs = [movement_input(seed, i, r, world * n, dtype) for r in range(world)]
            x = inputs[rank].to(device, copy=True)
            got = pyccl.all_to_all(x, out=x if in_place else None, comm=comm, algorithm=algo).cpu()
            expect = torch.cat([inputs[q][rank * n:(rank + 1) * n] for q in range(world)])
            if not torch.equal(_bits(got), _bits(expect)):
                bad.append(label)
        elif coll == "broadcast":
            inputs = [movement_input(seed, i, r, n, dtype) for r in range(world)]
            x = inputs[rank].to(device, copy=True)
            got = pyccl.broadcast(x, root, out=x if in_place else None, comm=comm, algorithm=algo).cpu()
            if not torch.equal(_bits(got), _bits(inputs[root])):
                bad.append(label + (f"root {root}",))
        else:
            inputs = [rank_input(seed, i, r, world * n, dtype, op) for r in range(world)]
            x = inputs[rank].to(device, copy=True)
            out = x[rank * n:(rank + 1) * n] if in_place else None
            got = pyccl.reduce_scatter(x, op=op, out=out, comm=comm, algorithm=algo).cpu()
            expect = reference(inputs, op)[rank * n:(rank + 1) * n]
            rtol, atol = TOLERANCE[dtype]
            if not torch.allclose(got.to(torch.float64), expect, rtol=rtol,
                                  atol=atol * error_scale(inputs, slice(rank * n, (rank + 1) * n))):
                err = (got.to(torch.float64) - expect).abs().max().item()
                bad.append(label + (f"max abs error {err:.3g}",))
            # The reduction order is the same on every rank: compare rank 0's chunk as
            # computed by every rank through an all-gather of the results.
            everyone = pyccl.all_gather(got.to(device), comm=comm).cpu()
            digest = hashlib.sha256(_bits(everyone).numpy().tobytes()).digest()
            if any(d != digest for d in comm.all_gather_bytes(digest)):
                bad.append(label + ("gathered results differ across ranks",))
    record = comm.device_error()
    comm.close()
    return bad, record


def mixed_back_to_back(rank, world, store, on_gpu, rounds, window=None):
    """Every collective and protocol in a row with no host synchronization:
    scratch phases and flags shared between them stay consistent. Results are
    checked every `window` rounds (default: all at the end)."""
    comm, device = _setup(store, rank, world, on_gpu)
    results = []
    bad = []
    for r in range(rounds):
        if window and r and r % window == 0:
            bad += _check_mixed(results, rank, r - len(results))
            results = []
        n = [3, 1000, 5000, 17][r % 4]
        algo = ["ll", "hb"][(r // 4) % 2]
        per_rank = [movement_input(5, r, q, world * n, torch.float32) for q in range(world)]
        x = per_rank[rank].to(device, copy=True)
        kind = EXCHANGES[r % len(EXCHANGES)]
        if kind == "all_gather":
            y = pyccl.all_gather(x, comm=comm, algorithm=algo)
            expect = torch.cat(per_rank)
        elif kind == "all_to_all":
            y = pyccl.all_to_all(x, comm=comm, algorithm=algo)
            expect = torch.cat([p[rank * n:(rank + 1) * n] for p in per_rank])
        elif kind == "broadcast":
            y = pyccl.broadcast(x, r % world, comm=comm, algorithm=algo)
            expect = per_rank[r % world]
        else:
            y = pyccl.reduce_scatter(x, comm=comm, algorithm=algo)
            expect = reference(per_rank, "sum")[rank * n:(rank + 1) * n].float()
        z = pyccl.all_reduce(x, comm=comm, algorithm=["1pa_ll", "2pa_hb", "2pa_ll", "1pa_hb"][r % 4])
        results.append((kind, y, expect, z, reference(per_rank, "sum")))
    bad += _check_mixed(results, rank, rounds - len(results))
    comm.close()
    return bad


def _check_mixed(results, rank, first_round):
    bad = []
    for r, (kind, y, expect, z, zref) in enumerate(results, start=first_round):
        ok = torch.allclose(y.cpu().float(), expect, rtol=1e-5, atol=1e-4) if kind == "reduce_scatter" \
            else torch.equal(y.cpu(), expect)
        if not ok or not torch.allclose(z.cpu().to(torch.float64), zref, rtol=1e-5, atol=1e-4):
            bad.append((r, kind))
    return bad


def exchange_bad_arguments(rank, world, store):
    comm, _ = _setup(store, rank, world, False)
    x = torch.randn(16)
    out = {}
    for label, call in [
        ("rs_dtype", lambda: pyccl.reduce_scatter(torch.ones(4 * world, dtype=torch.int32), comm=comm)),
        ("rs_split", lambda: pyccl.reduce_scatter(torch.randn(4 * world + 1), comm=comm)),
        ("rs_out", lambda: pyccl.reduce_scatter(x.repeat(world), out=torch.empty(3), comm=comm)),
        ("ag_out", lambda: pyccl.all_gather(x, out=torch.empty(16), comm=comm)),
        ("ag_dtype_out", lambda: pyccl.all_gather(x, out=torch.empty(16 * world, dtype=torch.float64), comm=comm)),
        ("a2a_split", lambda: pyccl.all_to_all(torch.randn(4 * world + 1), comm=comm)),
        ("bcast_src", lambda: pyccl.broadcast(x, world, comm=comm)),
        ("algorithm", lambda: pyccl.all_gather(x, comm=comm, algorithm="1pa_ll")),
        ("device", lambda: pyccl.all_gather(x.to("meta"), comm=comm)),
    ]:
        try:
            call()
            out[label] = ("accepted", "")
        except (ValueError, TypeError) as e:
            out[label] = (type(e).__name__, str(e))
    comm.close()
    return out


def overlapping_outputs(rank, world, store, on_gpu):
    """Outputs against inputs, through every protocol: the in-place forms
    (the input itself; all-gather's input as out's chunk `rank`; reduce-
    scatter's out as the input's chunk `rank`) give the float64 reference;
    any other overlap is refused naming 'out', before anything runs, so the
    valid call after it still agrees across ranks."""
    comm, device = _setup(store, rank, world, on_gpu)
    n = 1000 + 8 * world  # per-rank chunk, elements
    refused, wrong = {}, []

    def inputs(case, count):
        return [rank_input(case, 7, r, count, torch.float32, "sum").double() for r in range(world)]

    def check(label, got, want):
        if not torch.allclose(got.cpu().double(), want, rtol=1e-6, atol=1e-5):
            wrong.append(label)

    for case, algo in enumerate((None, "ll", "hb")):
        ar_algo = {None: None, "ll": "1pa_ll", "hb": "2pa_hb"}[algo]
        # All-reduce and broadcast: partly overlapping outputs, then in place.
        xs = inputs(case, 2 * n)
        buf = xs[rank].to(device, torch.float32)
        for label, call in [
            ("all_reduce", lambda: pyccl.all_reduce(buf[:n], out=buf[1:n + 1], comm=comm, algorithm=ar_algo)),
            ("broadcast", lambda: pyccl.broadcast(buf[:n], 0, out=buf[n - 3:2 * n - 3], comm=comm, algorithm=algo)),
            ("all_to_all", lambda: pyccl.all_to_all(buf[:world * 8], out=buf[4:world * 8 + 4], comm=comm,
                                                    algorithm=algo)),
            ("all_gather", lambda: pyccl.all_gather(buf[:n // world], out=buf[1:1 + n // world * world],
                                                    comm=comm, algorithm=algo)),
            ("reduce_scatter", lambda: pyccl.reduce_scatter(buf[:world * 8], out=buf[rank * 8 + 1:rank * 8 + 9],
                                                            comm=comm, algorithm=algo)),
        ]:
            try:
                call()
                refused[(label, algo)] = "accepted"
            except pyccl.InvalidArgumentError as e:
                refused[(label, algo)] = str(e)
        if not torch.equal(buf.cpu().double(), xs[rank]):
            wrong.append(("refused calls wrote", algo))
        pyccl.all_reduce(buf[:n], out=buf[:n], comm=comm, algorithm=ar_algo)
        check(("all_reduce in place", algo), buf[:n], sum(x[:n] for x in xs))
        pyccl.broadcast(buf[n:], world - 1, out=buf[n:], comm=comm, algorithm=algo)
        check(("broadcast in place", algo), buf[n:], xs[world - 1][n:])
        # All-gather: the input is out's chunk `rank`.
        xs = inputs(10 + case, n)
        out = torch.empty(world * n, device=device)
        out[rank * n:(rank + 1) * n] = xs[rank].to(device, torch.float32)
        pyccl.all_gather(out[rank * n:(rank + 1) * n], out=out, comm=comm, algorithm=algo)
        check(("all_gather in place", algo), out, torch.cat(xs))
        # Reduce-scatter: out is the input's chunk `rank`.
        xs = inputs(20 + case, world * n)
        x = xs[rank].to(device, torch.float32)
        pyccl.reduce_scatter(x, out=x[rank * n:(rank + 1) * n], comm=comm, algorithm=algo)
        check(("reduce_scatter in place", algo), x[rank * n:(rank + 1) * n], sum(xs)[rank * n:(rank + 1) * n])
        # All-to-all in place.
        xs = inputs(30 + case, world * n)
        x = xs[rank].to(device, torch.float32)
        pyccl.all_to_all(x, out=x, comm=comm, algorithm=algo)
        check(("all_to_all in place", algo), x, torch.cat([xs[q][rank * n:(rank + 1) * n] for q in range(world)]))
    # DSL plans in the automatic choice: checked as the engine checks.
    import pyccl.algorithms as algorithms

    entries = [pyccl.register_algorithm(algorithms.allreduce_ring(world), "all_reduce", 0, 1 << 20, world),
               pyccl.register_algorithm(algorithms.allgather_ring(world), "all_gather", 0, 1 << 20, world)]
    unit = 2 * world * 8  # whole chunks of the ring all-reduce
    xs = inputs(40, 2 * unit)
    buf = xs[rank].to(device, torch.float32)
    calls = lambda: sum(r.calls for r in getattr(comm, "_plan_runners", {}).values())  # noqa: E731
    for label, call in [("all_reduce", lambda: pyccl.all_reduce(buf[:unit], out=buf[8:unit + 8], comm=comm)),
                        ("all_gather", lambda: pyccl.all_gather(buf[:8], out=buf[4:4 + 8 * world], comm=comm))]:
        try:
            call()  # the plan executor would stage the all-gather's input: run, not refused
            refused[(label, "plan")] = "accepted"
        except pyccl.InvalidArgumentError as e:
            refused[(label, "plan")] = str(e)
    before = calls()
    pyccl.all_reduce(buf[:unit], out=buf[:unit], comm=comm)
    check(("all_reduce plan in place", None), buf[:unit], sum(x[:unit] for x in xs))
    xs = inputs(41, unit)
    out = torch.empty(world * unit, device=device)
    out[rank * unit:(rank + 1) * unit] = xs[rank].to(device, torch.float32)
    pyccl.all_gather(out[rank * unit:(rank + 1) * unit], out=out, comm=comm)
    check(("all_gather plan in place", None), out, torch.cat(xs))
    if calls() - before != 2:
        wrong.append(("plans ran", calls() - before))
    for e in entries:
        pyccl.unregister_algorithm(e)
    comm.close()
    return refused, wrong


def graph_all_collectives(rank, world, store, replays):
    """Every collective captured in one CUDA graph right after the communicator
    is made (no eager collective before), replayed with fresh inputs each time
    and with eager collectives in between; every replay checked."""
    comm, device = _setup(store, rank, world, True)
    n_small, n_large = 1001, 150_001  # per rank: LL and HB sizes
    gen = torch.Generator(device=device)
    xs = {n: torch.empty(world * n, device=device, dtype=torch.bfloat16) for n in (n_small, n_large)}
    outs = {}
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.graph(graph, stream=stream):
        for n, x in xs.items():
            proto = "ll" if n == n_small else "hb"
            outs[("ar", n)] = pyccl.all_reduce(x, comm=comm, algorithm="1pa_ll" if n == n_small else "2pa_hb")
            outs[("ar1", n)] = pyccl.all_reduce(x, comm=comm, algorithm="2pa_ll" if n == n_small else "1pa_hb")
            outs[("ag", n)] = pyccl.all_gather(x[:n], comm=comm, algorithm=proto)
            outs[("rs", n)] = pyccl.reduce_scatter(x, comm=comm, algorithm=proto)
            outs[("a2a", n)] = pyccl.all_to_all(x, comm=comm, algorithm=proto)
            outs[("bc", n)] = pyccl.broadcast(x, world - 1, comm=comm, algorithm=proto)
    bad = []
    for r in range(replays):
        gen.manual_seed(1000 * r + rank)
        for x in xs.values():
            x.normal_(generator=gen)
        graph.replay()
        if r % 10 == 3:
            pyccl.all_gather(torch.randn(333 + r, device=device), comm=comm)  # counters move on
        gathered = {n: pyccl.all_gather(x, comm=comm).view(world, -1).double() for n, x in xs.items()}
        for n in xs:
            ins = gathered[n]
            chunk = slice(rank * n, (rank + 1) * n)
            expect = {"ar": ins.sum(0), "ar1": ins.sum(0), "ag": ins[:, :n].reshape(-1), "rs": ins.sum(0)[chunk],
                      "a2a": ins[:, chunk].reshape(-1), "bc": ins[world - 1]}
            for kind, ref in expect.items():
                got = outs[(kind, n)].double()
                tol = 0 if kind in ("ag", "a2a", "bc") else 3e-2
                if not torch.allclose(got, ref, rtol=tol, atol=tol * 4):
                    bad.append((r, kind, n))
        if len(bad) > 10:
            break
    torch.cuda.synchronize()
    del graph
    comm.close()
    return bad


def closed_communicator(rank, world, store):
    """Every collective on a closed communicator raises ClosedError at the call."""
    comm, _ = _setup(store, rank, world, False)
    comm.close()
    x = torch.randn(4 * world)
    out = {}
    for label, call in [("all_reduce", lambda: pyccl.all_reduce(x, comm=comm)),
                        ("all_gather", lambda: pyccl.all_gather(x, comm=comm)),
                        ("reduce_scatter", lambda: pyccl.reduce_scatter(x, comm=comm)),
                        ("all_to_all", lambda: pyccl.all_to_all(x, comm=comm)),
                        ("broadcast", lambda: pyccl.broadcast(x, 0, comm=comm))]:
        try:
            call()
            out[label] = "accepted"
        except pyccl.PycclError as e:
            out[label] = f"{type(e).__name__}: {e}"
    return out


def special_inputs(rank: int, world: int, dtype: torch.dtype) -> torch.Tensor:
    """Columns of ±0, ±inf and NaN placed at one rank each, the other ranks
    holding small integers (exact in every dtype, so the order of a sum does
    not matter): what each op makes of them is then well defined."""
    specials = [0.0, -0.0, float("inf"), -float("inf"), float("nan")]
    cols = []
    for holder in range(world):
        for v in specials:
            cols.append(v if rank == holder else float(rank + 1))
    cols += [-0.0, -0.0, 0.0, float("nan")]  # every rank: -0 + -0 = -0; equal zeros; NaN everywhere
    return torch.tensor(cols, dtype=torch.float64).to(dtype)


def special_values(rank, world, store, on_gpu):
    """pyccl's all-reduce and reduce-scatter on ±0/±inf/NaN. On GPUs the result
    must match NCCL's bit for bit; in host mode, NaN propagates through
    sum/avg/prod, min/max drop it unless every rank holds NaN (fminf/fmaxf, as
    NCCL), and inf follows IEEE arithmetic. Returns the mismatches."""
    import torch.distributed as dist

    comm, device = _setup(store, rank, world, on_gpu)
    if on_gpu:
        dist.init_process_group("nccl", store=dist.PrefixStore("nccl", store), rank=rank, world_size=world,
                                device_id=torch.device(device))
    bad = []
    ops = {"sum": "sum", "avg": "avg", "min": "min", "max": "max", "prod": "prod"}
    for dtype in DTYPES.values():
        x = special_inputs(rank, world, dtype).to(device)
        everyone = [special_inputs(q, world, dtype) for q in range(world)]
        for op in ops:
            # In rank order, one IEEE operation at a time (-0 + -0 stays -0; a
            # float64 sum() would start from +0).
            acc = everyone[0].double()
            for t in everyone[1:]:
                t = t.double()
                if op in ("sum", "avg"):
                    acc = acc + t
                elif op == "prod":
                    acc = acc * t
                else:  # fminf/fmaxf: NaN loses to a number; ties keep the earlier rank's
                    pick = ((t < acc) if op == "min" else (t > acc)) | acc.isnan()
                    acc = torch.where(pick, t, acc)
            expect = (acc / world if op == "avg" else acc).to(dtype)
            if on_gpu:
                ref = x.clone()
                dist.all_reduce(ref, op=getattr(dist.ReduceOp, {"prod": "PRODUCT"}.get(op, op.upper())))
                expect = ref.cpu()
            for algo in ("1pa_ll", "2pa_ll", "1pa_hb", "2pa_hb"):
                got = pyccl.all_reduce(x, op=op, comm=comm, algorithm=algo).cpu()
                same = (got.isnan() == expect.isnan()).all() and torch.equal(
                    torch.where(got.isnan(), 0, got).view(torch.int16 if got.element_size() == 2 else torch.int32),
                    torch.where(expect.isnan(), 0, expect).view(torch.int16 if got.element_size() == 2 else torch.int32))
                if not same:
                    bad.append((str(dtype), op, algo, got.tolist(), expect.tolist()))
    if on_gpu:
        dist.destroy_process_group()
    comm.close()
    return bad


def engine_choices(rank, world, store):
    """The automatic choice of an engine given a tuning table's kernel entries
    (what the process group's engine gets), checked and run; and the table
    errors, each naming its option."""
    comm, device = _setup(store, rank, world, False)
    choices = {"all_reduce": [(2048, "1pa_ll"), (16384, "1pa_hb"), (None, "2pa_ll")],
               "all_reduce_symmetric": [(1024, "1pa_ll"), (None, "2pa_hb")],
               "all_gather": [(1024, "hb"), (None, "ll")]}
    engine = pyccl._C.CollectiveEngine(comm._comm, kernel_choices=choices)
    comm._engine = engine
    picked = {n: engine.select(n) for n in (100, 2048, 2049, 16384, 1 << 20)}
    # Symmetric (and graph) buffers take the symmetric entries, not the zero-copy threshold.
    picked.update({f"sym{n}": engine.select(n, symmetric=True) for n in (1000, 1025, 1 << 20)})
    picked.update({f"ag{n}": engine.select_exchange("all_gather", n) for n in (512, 4096)})
    picked["rs"] = engine.select_exchange("reduce_scatter", 4096)  # no entries: the threshold rule
    bad = []
    for i, n in enumerate((300, 3000, 9000)):  # 1PA LL, 1PA HB, 2PA LL by the table
        inputs = [rank_input(23, i, r, n, torch.float32, "sum") for r in range(world)]
        y = pyccl.all_reduce(inputs[rank], comm=comm)
        bad += check_reduction(comm, y, inputs, "sum", (n,))
    errors = {}
    for label, table in [("order", {"all_reduce": [(4096, "1pa_ll"), (1024, "2pa_hb")]}),
                         ("name", {"all_reduce": [(None, "ring")]}),
                         ("ll_max", {"all_reduce": [(1 << 30, "1pa_ll")]}),
                         ("sym_ll_max", {"all_reduce_symmetric": [(1 << 30, "1pa_ll")]}),
                         ("collective", {"gather": [(None, "ll")]})]:
        try:
            pyccl._C.CollectiveEngine(comm._comm, kernel_choices=table).close()
            errors[label] = "accepted"
        except ValueError as e:
            errors[label] = str(e)
    comm.close()
    return picked, bad, errors


def engine_options_must_agree(rank, world, store, on_gpu):
    """Engines made with options that differ on the last rank: every rank
    raises the same error, naming the option and both values, before any
    scratch is allocated; then engines whose options agree (launch aside)
    run a random all-reduce on the same communicator."""
    comm, device = _setup(store, rank, world, on_gpu)
    last = rank == world - 1
    cases = {
        "scalar": {"ll_max_bytes": 8192 if last else 16384},
        "exchange": {"exchange_ll_threshold_bytes": [512, 512, 512, 1024 if last else 512]},
        "table_length": {"kernel_choices": {"all_reduce": [(2048, "1pa_ll")] + ([] if last else [(None, "2pa_hb")])}},
        "table_entry": {"kernel_choices": {"all_gather": [(4096 if last else 2048, "ll"), (None, "hb")]}},
        "p2p_default": {"p2p_ll_max_bytes": 1024 if last else None},
        "setting": {"agreed_settings": {"PYCCL_ALGO (environment)": "1pa_ll" if last else "", "other": "same"}},
    }
    errors = {}
    for label, options in cases.items():
        try:
            pyccl._C.CollectiveEngine(comm._comm, **options).close()
            errors[label] = "accepted"
        except ValueError as e:
            errors[label] = str(e)
    # programmatic_launch changes only how kernels are launched: it may differ.
    engine = pyccl._C.CollectiveEngine(comm._comm, ll_blocks=3, programmatic_launch=last)
    engine.close()
    seed = 31 + world
    inputs = [rank_input(seed, 0, r, 5003, torch.float32, "sum").to(device) for r in range(world)]
    y = pyccl.all_reduce(inputs[rank], comm=comm)
    bad = check_reduction(comm, y.cpu(), [x.cpu() for x in inputs], "sum", (5003,))
    comm.close()
    return errors, bad


def communicator_under_another_algo(rank, world, store):
    """A communicator made while PYCCL_ALGO differs on the last rank: its
    engine refuses on every rank; made again with it alike, it runs."""

    last = rank == world - 1
    if last:
        os.environ["PYCCL_ALGO"] = "2pa_hb"
    threads, kept = len(os.listdir("/proc/self/task")), None  # native threads too
    try:
        pyccl.Communicator(store, rank, world, device="cpu", name="algo",
                           timeout=datetime.timedelta(seconds=60)).close()
        error = "accepted"
    except ValueError as e:
        error, kept = str(e), e  # its traceback holds the refused communicator, as a caller's handler may
    # The refused communicator's threads (its fd server) are gone at once, not when it is collected.
    error_threads = len(os.listdir("/proc/self/task")) - threads
    del kept
    if last:
        del os.environ["PYCCL_ALGO"]
    comm = pyccl.Communicator(store, rank, world, device="cpu", name="algo_again",
                              timeout=datetime.timedelta(seconds=60))
    inputs = [rank_input(7, 0, r, 999, torch.float32, "sum") for r in range(world)]
    bad = check_reduction(comm, pyccl.all_reduce(inputs[rank], comm=comm), inputs, "sum", (999,))
    comm.close()
    return error, error_threads, bad


def engine_choice_by_size(rank, world, store):
    """The automatic choice of a new communicator's own engine, at a few sizes."""
    comm, _ = _setup(store, rank, world, False)
    picked = {n: comm._engine.select(n) for n in (512, 4096, 40_000)}
    picked["ag"] = comm._engine.select_exchange("all_gather", 512)
    comm.close()
    return picked


def group_communicator_with_a_table(rank, world, store):
    """pyccl.all_reduce on a torch group's communicator, made on the first call
    while a tuning table is in force (the new engine looks it up)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    inputs = [rank_input(31, 0, r, 3000, torch.float32, "sum") for r in range(world)]
    y = pyccl.all_reduce(inputs[rank].clone())
    ok = torch.allclose(y.to(torch.float64), reference(inputs, "sum"), rtol=1e-5, atol=1e-4)
    choice = pyccl.collectives.communicator_for(None, torch.device("cpu"))._engine.select(4096)
    dist.destroy_process_group()
    return ok, choice


def communicators_of_destroyed_groups(rank, world, store):
    """pyccl.all_reduce on the torch groups of two init_process_group's in
    turn: the second init's world group gets a new communicator, and making it
    closes those of the groups destroyed before."""
    import torch.distributed as dist

    cpu = torch.device("cpu")
    inputs = [rank_input(37, 0, r, 2000, torch.float32, "sum") for r in range(world)]
    expect = reference(inputs, "sum")

    def right(y):
        return torch.allclose(y.to(torch.float64), expect, rtol=1e-5, atol=1e-4)

    seen = {}
    dist.init_process_group("gloo", store=dist.PrefixStore("first", store), rank=rank, world_size=world)
    sub = dist.new_group(list(range(world)))
    seen["first"] = right(pyccl.all_reduce(inputs[rank].clone())) and right(
        pyccl.all_reduce(inputs[rank].clone(), group=sub))
    first, first_sub = pyccl.communicator_for(None, cpu), pyccl.communicator_for(sub, cpu)
    dist.destroy_process_group(sub)
    seen["world kept"] = right(pyccl.all_reduce(inputs[rank].clone())) and pyccl.communicator_for(None, cpu) is first
    dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.PrefixStore("second", store), rank=rank, world_size=world)
    seen["second"] = right(pyccl.all_reduce(inputs[rank].clone()))
    second = pyccl.communicator_for(None, cpu)
    seen["new communicator"] = second is not first and not second.closed
    seen["destroyed closed"] = first.closed and first_sub.closed
    second.close()  # closed by the user: the next call makes another, whose set-up must not meet this one's keys
    seen["after close"] = right(pyccl.all_reduce(inputs[rank].clone()))
    third = pyccl.communicator_for(None, cpu)
    seen["another communicator"] = third is not second and not third.closed and third.name != second.name
    dist.destroy_process_group()
    return seen
