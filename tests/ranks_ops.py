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
