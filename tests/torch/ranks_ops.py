"""Per-rank bodies of the custom-op tests (torch.ops.pyccl.*)."""

from __future__ import annotations

import torch
import torch.distributed as dist

import pyccl  # noqa: F401  (registers torch.ops.pyccl)
from gpu_sharing import rank_gpu, shared_world


def _init(rank, world, store, on_gpu):
    if on_gpu:
        device = torch.device("cuda", rank_gpu(rank))
        torch.cuda.set_device(device)
        if shared_world():  # NCCL refuses ranks sharing a GPU; pyccl only needs the group's store
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
        else:
            dist.init_process_group("nccl", store=store, rank=rank, world_size=world, device_id=device)
        return device
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    return torch.device("cpu")


def _path_taken(op: str, body):
    """Runs `body`; returns its result and the path(s) torch.ops.pyccl.<op>'s
    C++ kernel sent its calls down meanwhile ("engine", "python" or both)."""
    from pyccl import _C

    before = _C.op_calls(op)
    result = body()
    after = _C.op_calls(op)
    return result, "+".join(k for k in ("engine", "python") if after[k] != before[k])


def opcheck_all(rank, world, store, on_gpu):
    """torch.library.opcheck on every op (schema, fake tensor, autograd
    registration, AOT dispatch). Returns the failures."""
    device = _init(rank, world, store, on_gpu)
    name = dist.group.WORLD.group_name
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(4 * world, 3, generator=gen).to(device)
    cases = {
        "all_reduce": (torch.ops.pyccl.all_reduce.default, (x, "sum", name)),
        "all_gather": (torch.ops.pyccl.all_gather.default, (x, world, name)),
        "reduce_scatter": (torch.ops.pyccl.reduce_scatter.default, (x, "max", world, name)),
        "all_to_all": (torch.ops.pyccl.all_to_all.default, (x, name)),
        "broadcast": (torch.ops.pyccl.broadcast.default, (x, world - 1, name)),
    }
    bad = {}
    for label, (op, args) in cases.items():
        result = torch.library.opcheck(op, args)
        failed = {k: v for k, v in result.items() if v != "SUCCESS"}
        if failed:
            bad[label] = failed
    dist.destroy_process_group()
    return bad


def compiled_mlp(rank, world, store, on_gpu):
    """A tensor-parallel MLP (column-parallel, then row-parallel with an
    all-reduce) and a sequence-parallel gather, under torch.compile(fullgraph=True)."""
    device = _init(rank, world, store, on_gpu)
    name = dist.group.WORLD.group_name
    hidden, inner = 32, 16 * world
    g = torch.Generator().manual_seed(7)
    w1 = torch.randn(hidden, inner, generator=g) / 8
    w2 = torch.randn(inner, hidden, generator=g) / 8
    x_full = torch.randn(5, hidden, generator=g)  # the same activations on every rank
    shard = slice(rank * 16, (rank + 1) * 16)
    scale = float(rank + 1)

    def block(x, a, b):
        h = torch.relu(x @ a)                                  # column-parallel
        y = torch.ops.pyccl.all_reduce(h @ b, "sum", name)     # row-parallel + all-reduce
        return torch.ops.pyccl.all_gather(y * scale, world, name)  # every rank's scaled copy

    compiled = torch.compile(block, fullgraph=True, backend="inductor" if on_gpu else "aot_eager")
    got = compiled(x_full.to(device), w1[:, shard].contiguous().to(device), w2[shard].contiguous().to(device))
    y_ref = torch.relu(x_full.double() @ w1.double()) @ w2.double()
    ref = torch.cat([y_ref * (q + 1) for q in range(world)])
    ok = torch.allclose(got.cpu().double(), ref, rtol=1e-4, atol=1e-4)
    dist.destroy_process_group()
    return ok


def opcheck_fused(rank, world, store, on_gpu):
    """torch.library.opcheck on torch.ops.pyccl.fused_all_reduce_rmsnorm. Returns the failures."""
    device = _init(rank, world, store, on_gpu)
    name = dist.group.WORLD.group_name
    gen = torch.Generator().manual_seed(200 + rank)
    x = torch.randn(5, 24, generator=gen).to(device)
    residual = torch.randn(5, 24, generator=torch.Generator().manual_seed(1)).to(device)
    weight = torch.randn(24, generator=torch.Generator().manual_seed(2)).to(device)
    result = torch.library.opcheck(torch.ops.pyccl.fused_all_reduce_rmsnorm.default, (x, residual, weight, 1e-5, name))
    dist.destroy_process_group()
    return {k: v for k, v in result.items() if v != "SUCCESS"}


def compiled_fused_layer(rank, world, store, on_gpu):
    """A row-parallel projection, then the fused all-reduce + residual add +
    RMSNorm, under torch.compile(fullgraph=True); checked against float64."""
    device = _init(rank, world, store, on_gpu)
    name = dist.group.WORLD.group_name
    hidden, inner = 32, 8 * world
    g = torch.Generator().manual_seed(11)
    w = torch.randn(inner, hidden, generator=g) / 4
    h = torch.randn(6, inner, generator=g)
    residual = torch.randn(6, hidden, generator=g)
    gamma = 1 + 0.1 * torch.randn(hidden, generator=g)
    shard = slice(rank * 8, (rank + 1) * 8)

    def layer(h, w, residual, gamma):
        return torch.ops.pyccl.fused_all_reduce_rmsnorm(h @ w, residual, gamma, 1e-5, name)

    compiled = torch.compile(layer, fullgraph=True, backend="inductor" if on_gpu else "aot_eager")
    normed, new_res = compiled(h[:, shard].contiguous().to(device), w[shard].contiguous().to(device),
                               residual.to(device), gamma.to(device))
    s = h.double() @ w.double() + residual.double()
    ref = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * gamma.double()
    ok = (torch.allclose(new_res.cpu().double(), s, rtol=1e-4, atol=1e-4) and
          torch.allclose(normed.cpu().double(), ref, rtol=1e-4, atol=1e-4))
    dist.destroy_process_group()
    return ok


def wrong_group_size(rank, world, store, on_gpu):
    """all_gather and reduce_scatter told a group size the group does not have:
    the error message (both must refuse, naming group_size)."""
    device = _init(rank, world, store, on_gpu)
    name = dist.group.WORLD.group_name
    x = torch.randn(6, 2).to(device)
    messages = []
    for call in (lambda: torch.ops.pyccl.all_gather(x, world + 1, name),
                 lambda: torch.ops.pyccl.reduce_scatter(x, "sum", world + 1, name)):
        try:
            call()
            messages.append("no error")
        except ValueError as e:
            messages.append(str(e))
    dist.destroy_process_group()
    assert messages[0] == messages[1], messages
    return messages[0]


def no_backward(rank, world, store, on_gpu):
    """Each op on inputs that require grad: the forward runs and is right, the
    result requires grad, and a backward through it raises naming the op; under
    torch.no_grad the result does not require grad. Returns the failures."""
    device = _init(rank, world, store, on_gpu)
    name = dist.group.WORLD.group_name
    # Every rank's input, drawn here from its seed: the reference needs no collective.
    parts = [torch.randn(2 * world, 3, generator=torch.Generator().manual_seed(300 + q)).to(device)
             for q in range(world)]
    x = parts[rank].clone().requires_grad_()
    total = sum(p.double() for p in parts)
    residual = torch.randn(2 * world, 3, generator=torch.Generator().manual_seed(3)).to(device)
    weight = torch.ones(3, device=device)
    calls = {
        "all_reduce": (lambda: torch.ops.pyccl.all_reduce(x, "sum", name), total),
        "all_gather": (lambda: torch.ops.pyccl.all_gather(x, world, name), torch.cat(parts).double()),
        "reduce_scatter": (lambda: torch.ops.pyccl.reduce_scatter(x, "sum", world, name),
                           total.chunk(world)[rank]),
        "all_to_all": (lambda: torch.ops.pyccl.all_to_all(x, name), torch.cat([p.chunk(world)[rank] for p in parts])
                       .double()),
        "broadcast": (lambda: torch.ops.pyccl.broadcast(x, 0, name), parts[0].double()),
        "fused_all_reduce_rmsnorm": (lambda: torch.ops.pyccl.fused_all_reduce_rmsnorm(x, residual, weight, 1e-5,
                                                                                       name)[1],
                                     total + residual.double()),
    }
    bad = []
    for label, (call, expected) in calls.items():
        y = call()
        if not torch.allclose(y.detach().double(), expected, rtol=1e-5, atol=1e-5):
            bad.append(f"{label}: wrong result")
        if not y.requires_grad:
            bad.append(f"{label}: the result of inputs that require grad does not require grad")
        try:
            y.sum().backward()
            bad.append(f"{label}: backward ran")
        except RuntimeError as e:
            if f"pyccl::{label}" not in str(e) or "not implemented" not in str(e):
                bad.append(f"{label}: backward raised {e}")
        with torch.no_grad():
            if call().requires_grad:
                bad.append(f"{label}: under no_grad the result requires grad")
    dist.destroy_process_group()
    return bad


# What torch.ops.pyccl.all_reduce's C++ kernel does with each call of all_reduce_routes: it asks the group's
# selector, and runs a kernel choice on the engine (whatever the size or the case of op); a group pyccl has not
# set up yet (the first call, a closed communicator, a new group of the same name) and a registered plan's size go
# to Python, and so does a bad op, to be refused.
ALL_REDUCE_ROUTES = [
    ("first", "python"),
    ("again", "engine"),
    ("again, max", "engine"),
    ("column-major input", "engine"),
    ("new size", "engine"),
    ("a plan registered for this size", "python, the plan ran"),
    ("a plan registered, again", "engine, the plan ran"),
    ("the plan unregistered", "engine"),
    ("op spelled SUM", "engine"),
    ("op bogus", "refused"),
    ("communicator closed", "python"),
    ("communicator closed, again", "engine"),
    ("a new world of the same name", "python"),
    ("a new world of the same name, again", "engine"),
]


def all_reduce_routes(rank, world, store, on_gpu):
    """torch.ops.pyccl.all_reduce's C++ kernel: which calls it runs straight
    into the engine and which it hands to the Python path, with every result
    checked against float64. Returns [(step, path taken)] and raises on a
    wrong result (ALL_REDUCE_ROUTES: what they should be)."""
    from pyccl import algorithms, registry

    device = _init(rank, world, store, on_gpu)
    name = dist.group.WORLD.group_name
    seeds = iter(range(1000, 100000, 97))
    taken = []

    def plan_runs():
        trace = pyccl.communicator_for(None, device)._selector.trace()
        return sum(n for k, n in trace.items() if k.startswith("all_reduce plan registered"))

    def call(step, shape=(37, 5), op="sum", transpose=False):
        seed = next(seeds)
        parts = [torch.randn(*shape, generator=torch.Generator().manual_seed(seed + q)) for q in range(world)]
        x = parts[rank].to(device)
        if transpose:
            x = x.t().contiguous().t()  # the same values, column-major
        plans_before = plan_runs() if "plan" in step else 0  # (asked only once the group is set up)
        got, path = _path_taken("all_reduce", lambda: torch.ops.pyccl.all_reduce(x, op, name))
        if path in ("python", "engine") and "plan" in step and plan_runs() == plans_before + 1:
            path += ", the plan ran"
        ref = torch.stack([p.double() for p in parts])
        ref = {"sum": ref.sum(0), "max": ref.amax(0), "SUM": ref.sum(0)}[op]
        if got.shape != x.shape or not torch.allclose(got.cpu().double(), ref, rtol=1e-5, atol=1e-5):
            raise AssertionError(f"{step}: wrong result")
        taken.append((step, path))

    call("first")
    call("again")
    call("again, max", op="max")
    call("column-major input", transpose=True)
    call("new size", shape=(3, 11))
    nbytes = 40 * 8 * 4
    entry = registry.register_algorithm(algorithms.allreduce_2pa_hb_pull(world), "all_reduce", nbytes, nbytes, world)
    call("a plan registered for this size", shape=(40, 8))
    call("a plan registered, again", shape=(40, 8))
    registry.unregister_algorithm(entry)
    call("the plan unregistered", shape=(40, 8))
    call("op spelled SUM", op="SUM")
    try:
        torch.ops.pyccl.all_reduce(torch.randn(4).to(device), "bogus", name)
        taken.append(("op bogus", "no error"))
    except pyccl.InvalidArgumentError as e:
        taken.append(("op bogus", "refused" if "'op'" in str(e) else str(e)))
    pyccl.communicator_for(None, device).close()
    call("communicator closed")
    call("communicator closed, again")
    dist.destroy_process_group()
    _init(rank, world, dist.PrefixStore("second", store), on_gpu)  # the new world takes the destroyed one's name
    if dist.group.WORLD.group_name != name:
        raise AssertionError("the new world group has a new name; the step below tests nothing")
    call("a new world of the same name")
    call("a new world of the same name, again")
    dist.destroy_process_group()
    return taken


# The other ops' C++ kernels: the group's runtime, set up by the first call of any op, serves them all.
OTHER_OP_ROUTES = [
    ("all_gather first", "python"),
    ("all_gather again", "engine"),
    ("all_gather new dtype", "engine"),
    ("all_gather group_size wrong", "refused"),
    ("reduce_scatter first", "engine"),
    ("reduce_scatter again, max", "engine"),
    ("reduce_scatter rows that do not split", "refused"),
    ("all_to_all", "engine"),
    ("all_to_all again, bfloat16", "engine"),
    ("all_to_all elements that do not split", "refused"),
    ("broadcast from the last rank", "engine"),
    ("broadcast from rank 0", "engine"),
    ("broadcast src not a rank", "refused"),
    ("fused first", "engine"),
    ("fused again", "engine"),
    ("fused wrong residual", "refused"),
    ("fused above FUSED_MAX_BYTES: unfused", "python"),
    ("fused below it again", "engine"),
]


def other_op_routes(rank, world, store, on_gpu):
    """The C++ kernels of torch.ops.pyccl.all_gather, reduce_scatter,
    all_to_all, broadcast and fused_all_reduce_rmsnorm, as all_reduce_routes
    checks all_reduce's: which
    calls run straight into the engine, which go to Python, and the errors
    of bad arguments on either path; every result against float64. Returns
    [(step, path)] (OTHER_OP_ROUTES: what they should be)."""
    from pyccl import fused

    device = _init(rank, world, store, on_gpu)
    name = dist.group.WORLD.group_name
    seeds = iter(range(5000, 100000, 89))
    taken = []

    def parts_of(shape, dtype=torch.float32):
        seed = next(seeds)
        return [torch.randn(*shape, generator=torch.Generator().manual_seed(seed + q)).to(dtype)
                for q in range(world)]

    def run(step, op, body, check):
        got, path = _path_taken(op, body)
        if not check(got):
            raise AssertionError(f"{step}: wrong result")
        taken.append((step, path))

    def refused(step, body, words):
        try:
            body()
            taken.append((step, "no error"))
        except (ValueError, pyccl.PycclError) as e:
            taken.append((step, "refused" if all(w in str(e) for w in words) else str(e)))

    def gather(step, dtype=torch.float32):
        parts = parts_of((6, 5), dtype)
        want = torch.cat(parts).view(torch.uint8)
        run(step, "all_gather", lambda: torch.ops.pyccl.all_gather(parts[rank].to(device), world, name),
            lambda got: got.shape == (6 * world, 5) and torch.equal(got.cpu().view(torch.uint8), want))

    def scatter(step, op="sum"):
        parts = parts_of((4 * world, 3))
        ref = torch.stack([p.double() for p in parts])
        ref = (ref.sum(0) if op == "sum" else ref.amax(0))[4 * rank:4 * (rank + 1)]
        run(step, "reduce_scatter", lambda: torch.ops.pyccl.reduce_scatter(parts[rank].to(device), op, world, name),
            lambda got: got.shape == (4, 3) and torch.allclose(got.cpu().double(), ref, rtol=1e-5, atol=1e-5))

    def exchange(step, dtype=torch.float32):
        parts = parts_of((2 * world, 5), dtype)
        want = torch.cat([p.chunk(world)[rank] for p in parts]).view(torch.uint8)
        run(step, "all_to_all", lambda: torch.ops.pyccl.all_to_all(parts[rank].to(device), name),
            lambda got: got.shape == (2 * world, 5) and torch.equal(got.cpu().view(torch.uint8), want))

    def broadcast(step, src):
        parts = parts_of((7, 3))
        run(step, "broadcast", lambda: torch.ops.pyccl.broadcast(parts[rank].to(device), src, name),
            lambda got: got.shape == (7, 3) and torch.equal(got.cpu(), parts[src]))

    def norm(step, rows=3, hidden=64):
        parts = parts_of((rows, hidden))
        residual, weight = parts_of((rows, hidden))[0], parts_of((hidden,))[0]
        new_res = torch.stack([p.double() for p in parts]).sum(0) + residual.double()
        normed = new_res * torch.rsqrt(new_res.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.double()
        run(step, "fused_all_reduce_rmsnorm",
            lambda: torch.ops.pyccl.fused_all_reduce_rmsnorm(parts[rank].to(device), residual.to(device),
                                                             weight.to(device), 1e-6, name),
            lambda got: all(torch.allclose(g.cpu().double(), w, rtol=1e-4, atol=1e-4)
                            for g, w in zip(got, (normed, new_res))))

    gather("all_gather first")
    gather("all_gather again")
    gather("all_gather new dtype", torch.bfloat16)
    refused("all_gather group_size wrong",
            lambda: torch.ops.pyccl.all_gather(torch.randn(6, 5).to(device), world + 1, name), ["group_size"])
    scatter("reduce_scatter first")
    scatter("reduce_scatter again, max", op="max")
    refused("reduce_scatter rows that do not split",
            lambda: torch.ops.pyccl.reduce_scatter(torch.randn(4 * world + 1, 3).to(device), "sum", world, name),
            ["split"])
    exchange("all_to_all")
    exchange("all_to_all again, bfloat16", torch.bfloat16)
    refused("all_to_all elements that do not split",
            lambda: torch.ops.pyccl.all_to_all(torch.randn(2 * world + 1).to(device), name), ["'tensor'", "multiple"])
    broadcast("broadcast from the last rank", world - 1)
    broadcast("broadcast from rank 0", 0)
    refused("broadcast src not a rank", lambda: torch.ops.pyccl.broadcast(torch.randn(4).to(device), world, name),
            ["'src'"])
    norm("fused first")
    norm("fused again")
    refused("fused wrong residual",
            lambda: torch.ops.pyccl.fused_all_reduce_rmsnorm(torch.randn(3, 64).to(device),
                                                             torch.randn(3, 32).to(device),
                                                             torch.randn(64).to(device), 1e-6, name),
            ["'residual'", "shape"])
    rows = fused.FUSED_MAX_BYTES // (64 * 4) + 1  # fp32 rows of 64: just above the limit
    norm("fused above FUSED_MAX_BYTES: unfused", rows=rows)
    norm("fused below it again")
    dist.destroy_process_group()
    return taken


def captured_all_reduce_op(rank, world, store, on_gpu):
    """torch.ops.pyccl.all_reduce captured in a CUDA graph after an eager call
    set the group's runtime up, replayed with new inputs: each replay
    against float64. Returns (replays right, path of the captured call)."""
    device = _init(rank, world, store, on_gpu)
    name = dist.group.WORLD.group_name
    static_in = torch.randn(1000, 3, device=device)
    torch.ops.pyccl.all_reduce(static_in, "sum", name)  # eager: the Python path, which sets the group up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()

    def capture():
        with torch.cuda.graph(graph):
            return torch.ops.pyccl.all_reduce(static_in, "sum", name)

    static_out, path = _path_taken("all_reduce", capture)
    right = 0
    for replay in range(20):
        parts = [torch.randn(1000, 3, generator=torch.Generator().manual_seed(5000 + 31 * replay + q))
                 for q in range(world)]
        static_in.copy_(parts[rank].to(device))
        graph.replay()
        torch.cuda.synchronize()
        ref = torch.stack([p.double() for p in parts]).sum(0)
        right += bool(torch.allclose(static_out.cpu().double(), ref, rtol=1e-5, atol=1e-5))
    dist.destroy_process_group()
    return right, path
