"""Per-rank bodies of the collective tests, each in host mode or on GPUs, and
the helpers every ranks_* file shares: set-up, fresh inputs and float64
references. The exchanges and the engine's choice have files of their own."""

from __future__ import annotations

import datetime
import hashlib
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
                              timeout=datetime.timedelta(seconds=timeout_s), engine_options=engine_options)
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
        ("dtype", lambda: pyccl.all_reduce(torch.ones(4, dtype=torch.int16), comm=comm)),  # NCCL reduces no int16
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


#: The dtypes the kernels reduce besides float32, float16 and bfloat16 (csrc/device/reduce_types.hpp), and bool,
#: with their width in bits (integers) and signedness.
OTHER_REDUCTION_DTYPES = {torch.float64: None, torch.int8: (8, True), torch.uint8: (8, False), torch.int32: (32, True),
                   torch.uint32: (32, False), torch.int64: (64, True), torch.uint64: (64, False), torch.bool: None,
                   torch.float8_e4m3fn: None, torch.float8_e5m2: None}
# The float8 types' largest finite values (sums and products saturate there) and the scale of the test's inputs.
FLOAT8 = {torch.float8_e4m3fn: (448.0, 8.0), torch.float8_e5m2: (57344.0, 300.0)}


def other_dtype_input(seed: int, rank: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank `rank`'s input: fresh random values over the whole range of an integer dtype (so sums and
    products wrap), float64 with a NaN and signed zeros in places, bool at random."""
    gen = torch.Generator().manual_seed(seed * 7919 + rank)
    if dtype == torch.float64:
        x = torch.randn(count, generator=gen, dtype=torch.float64) * 1e3
        x[0] = float("nan") if rank == 0 else 1.5  # NaN loses to any number
        x[1] = float("nan")  # ... unless every rank holds NaN
        x[2] = -0.0 if rank % 2 == 0 else 0.0  # ties keep the earlier rank's zero
        return x
    if dtype == torch.bool:
        return torch.randint(0, 2, (count,), generator=gen).bool()
    if dtype in FLOAT8:
        largest, scale = FLOAT8[dtype]
        x = torch.randn(count, generator=gen, dtype=torch.float32) * scale
        x[0] = float("nan") if rank == 0 else 1.5  # NaN loses to any number
        x[1] = float("nan")  # ... unless every rank holds NaN
        x[2] = -0.0 if rank % 2 == 0 else 0.0  # ties keep the earlier rank's zero
        x[3] = largest * 0.75  # sums saturate at the largest finite value
        x[4] = -largest * 0.75
        return x.to(dtype)
    bits, _signed = OTHER_REDUCTION_DTYPES[dtype]
    raw = torch.randint(-(1 << 62), 1 << 62, (count,), generator=gen, dtype=torch.int64) * 2 + 1  # odd, all bits
    raw[:4] = torch.tensor([-1, 0, 1, (1 << 62) - 1]) * (rank + 1)
    narrow = {8: torch.int8, 32: torch.int32, 64: torch.int64}[bits]
    return raw.to(narrow).view(dtype)  # truncation keeps the low bits: every value of the width occurs


def _as_int(v, bits: int, signed: bool) -> int:
    v %= 1 << bits
    return v - (1 << bits) if signed and v >= 1 << (bits - 1) else v


def other_dtype_reference(inputs, op: str, dtype: torch.dtype) -> list:
    """NCCL's result, element by element, in Python numbers: integers wrap in their width; avg truncates the
    wrapped sum; float64 in rank order, min/max ignoring NaN unless all are NaN; float8 as float64, then
    saturated at the type's largest finite value (sum, avg, prod) and rounded to the type once; bool
    sum/max any, prod/min all."""
    columns = list(zip(*[t.tolist() for t in inputs]))
    world = len(inputs)
    out = []
    for col in columns:
        if dtype == torch.bool:
            out.append(any(col) if op in ("sum", "max") else all(col))
        elif dtype == torch.float64 or dtype in FLOAT8:
            acc = col[0]
            for x in col[1:]:
                if op in ("sum", "avg"):
                    acc = acc + x
                elif op == "prod":
                    acc = acc * x
                elif op == "min":
                    acc = x if (x < acc or acc != acc) else acc
                else:
                    acc = x if (x > acc or acc != acc) else acc
            if op == "avg":
                acc = acc / world
            if dtype in FLOAT8:
                largest = FLOAT8[dtype][0]
                if op in ("sum", "avg", "prod") and acc == acc:
                    acc = max(-largest, min(largest, acc))
                acc = torch.tensor([acc], dtype=torch.float64).to(dtype).item()
            out.append(acc)
        else:
            bits, signed = OTHER_REDUCTION_DTYPES[dtype]
            if op in ("sum", "avg"):
                acc = _as_int(sum(col), bits, signed)
                if op == "avg":
                    acc = abs(acc) // world * (1 if acc >= 0 else -1)
            elif op == "prod":
                acc = 1
                for x in col:
                    acc *= x
                acc = _as_int(acc, bits, signed)
            else:
                acc = min(col) if op == "min" else max(col)
            out.append(acc)
    return out


def _same(got: list, want: list) -> bool:
    """Equal element by element, NaN equal to NaN and -0.0 told from 0.0 (bitwise for float64)."""
    import math

    for g, w in zip(got, want):
        if isinstance(w, float):
            if not (g == w and math.copysign(1, g) == math.copysign(1, w)) and not (g != g and w != w):
                return False
        elif g != w:
            return False
    return len(got) == len(want)


def other_dtype_reductions(rank, world, store, seed, counts, through_group, on_gpu=False):
    """Every dtype of OTHER_REDUCTION_DTYPES, every op, all-reduce (in and out of place) and reduce-scatter, of
    each of `counts` elements: on a communicator of its own (host mode, or `on_gpu`), by the selector's choice
    and forced to each kernel (all-reduce 1pa_ll, 2pa_ll, 1pa_hb, 2pa_hb; reduce-scatter ll, hb), or
    (`through_group`) through dist on a "cpu:pyccl" group; the cases that differ from NCCL's results, and the
    messages of the refused ones (avg of bool, int16)."""
    import torch.distributed as dist

    device = "cpu"
    if through_group:
        dist.init_process_group("cpu:pyccl", store=store, rank=rank, world_size=world)
        comm = None
    else:
        comm, device = _setup(store, rank, world, on_gpu)
    bad, refused = [], []
    ops = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX,
           "prod": dist.ReduceOp.PRODUCT}
    all_reduce_algos = [None] if through_group else [None, "1pa_ll", "2pa_ll", "1pa_hb", "2pa_hb"]
    reduce_scatter_algos = [None] if through_group else [None, "ll", "hb"]
    try:
        for count in counts:
            for case, dtype in enumerate(OTHER_REDUCTION_DTYPES):
                inputs = [other_dtype_input(seed + case + count, r, count, dtype) for r in range(world)]
                part = count // world
                for op in ops:
                    if dtype == torch.bool and op == "avg":
                        continue
                    want = other_dtype_reference(inputs, op, dtype)
                    want_rs = other_dtype_reference([t[:part * world] for t in inputs], op, dtype)
                    for algo in all_reduce_algos:
                        label = f"all_reduce {dtype} {op} x {count} ({algo or 'chosen'})"
                        x = inputs[rank].to(device, copy=True)  # the inputs stay for the reference
                        if through_group:
                            dist.all_reduce(x, op=ops[op])
                            got = x
                        else:
                            got = pyccl.all_reduce(x, op, comm=comm, algorithm=algo)
                            pyccl.all_reduce(x, op, out=x, comm=comm, algorithm=algo)  # in place
                            if not _same(x.tolist(), want):
                                bad.append(label + " in place")
                        if not _same(got.tolist(), want):
                            bad.append(label)
                    # Reduce-scatter: rank r's part of the reduced whole.
                    for algo in reduce_scatter_algos:
                        whole = inputs[rank][:part * world].to(device, copy=True)
                        out = torch.empty(part, dtype=dtype, device=device)
                        if through_group:
                            dist.reduce_scatter_tensor(out, whole, op=ops[op])
                        else:
                            pyccl.reduce_scatter(whole, op, out=out, comm=comm, algorithm=algo)
                        if not _same(out.tolist(), want_rs[rank * part:(rank + 1) * part]):
                            bad.append(f"reduce_scatter {dtype} {op} x {count} ({algo or 'chosen'})")
        # Every float8 bit pattern through the conversions to and from the accumulator: rank 0's patterns plus
        # -0.0 from the others (the sum's identity) give the patterns back, saturated where infinite.
        for dtype, (largest, _scale) in FLOAT8.items() if not through_group else ():
            patterns = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype)
            x = (patterns if rank == 0 else torch.full((256,), -0.0).to(dtype)).to(device)
            want = [max(-largest, min(largest, v)) if v == v else v for v in patterns.float().tolist()]
            want = torch.tensor(want).to(dtype).tolist()
            for algo in all_reduce_algos:
                if not _same(pyccl.all_reduce(x, "sum", comm=comm, algorithm=algo).tolist(), want):
                    bad.append(f"all_reduce {dtype} of every bit pattern ({algo or 'chosen'})")
        for dtype, op, what in ((torch.bool, "avg", "op"), (torch.int16, "sum", "tensor")):
            x = torch.ones(8, dtype=dtype, device=device)
            try:
                if through_group:
                    dist.all_reduce(x, op=ops[op])
                else:
                    pyccl.all_reduce(x, op, comm=comm)
                refused.append((str(dtype), op, "accepted"))
            except Exception as e:  # noqa: BLE001 - the type and message are what the test checks
                refused.append((str(dtype), op, type(e).__name__, str(e)))
        # Still usable after the refusals.
        y = torch.full((16,), rank + 1, dtype=torch.int32, device=device)
        if through_group:
            dist.all_reduce(y)
        else:
            y = pyccl.all_reduce(y, comm=comm)
        usable = bool((y == world * (world + 1) // 2).all())
    finally:
        if through_group:
            dist.destroy_process_group()
        else:
            comm.close()
    return bad, refused, usable
