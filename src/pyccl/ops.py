"""pyccl's collectives as torch custom ops: ``torch.ops.pyccl.*``.

They take the process group by name (``group.group_name``), return new
tensors (functional, as torch.compile prefers), and have fake
implementations, so ``torch.compile(fullgraph=True)`` traces through them::

    @torch.compile(fullgraph=True)
    def mlp(x, w1, w2, group_name):
        h = torch.relu(x @ w1)
        return torch.ops.pyccl.all_reduce(h @ w2, "sum", group_name)

Ops: ``all_reduce(x, op, group_name)``, ``all_gather(x, group_size,
group_name)`` (concatenated along dim 0), ``reduce_scatter(x, op, group_size,
group_name)`` (split along dim 0), ``all_to_all(x, group_name)`` (equal
splits) and
``broadcast(x, src, group_name)`` (``src`` a rank of the group), and
``fused_all_reduce_rmsnorm(x, residual, weight, eps, group_name)`` returning
``(normed, new_residual)``. Each runs ``pyccl.<name>`` on the group: same
algorithms, same stream semantics.

The ops whose output shape depends on the group's size take that size as an
argument, as torch's functional collectives do: it is then part of the traced
graph, so a compiled graph cached for one group size (torch.compile's FX and
AOT caches key on the graph and its inputs) is never reused for another.

The ops are defined with ``torch.library.Library`` (schema, a CPU and a CUDA
kernel, a fake implementation), not ``torch.library.custom_op``: the latter's
Python autograd layer made an eager call of the op cost the host 78 µs, where
this one costs 34 and ``pyccl.all_reduce`` itself 18 (one H100's host;
docs/performance.md#history).
They have no derivative: their Autograd kernel (csrc/torch/custom_ops.cpp)
lets a call on tensors that require grad run, and a backward through its
result raise, naming the op.

The CPU and CUDA kernels of every op are C++ (csrc/python/collective_ops.cpp):
each asks the group's selector (the one ``pyccl.<name>`` asks) and runs a
kernel choice straight on the engine, and a plan choice on the plan the
group has set up for it, without Python. A plan's first call (which sets it
up), NCCL, the collectives across nodes, a group pyccl has not set up yet,
and an argument to refuse go to the Python functions below, which run
``pyccl.<name>``.
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _resolve_process_group

from . import _C, collectives, fused

__all__ = ["all_gather", "all_reduce", "all_to_all", "broadcast", "fused_all_reduce_rmsnorm", "reduce_scatter"]

_LIB = torch.library.Library("pyccl", "DEF")


def _define(schema: str, fake):
    """Defines ``pyccl::<name>`` with `schema` (``name(args) -> result``) and
    `fake` its fake implementation; its CPU (host mode), CUDA and Autograd
    kernels are pyccl._C's, and the decorated function the Python path the
    CPU and CUDA kernels hand calls to. Returns the function, callable
    directly as well."""
    name = schema.split("(", 1)[0]

    def register(kernel):
        _LIB.define(schema)
        torch.library.register_fake(f"pyccl::{name}", fake, lib=_LIB)
        # Without an Autograd kernel a backward would only warn and drop the gradient.
        for key in ("Autograd", "CPU", "CUDA"):
            if not torch._C._dispatch_has_kernel_for_dispatch_key(f"pyccl::{name}", key):
                raise RuntimeError(f"pyccl::{name} has no {key} kernel in pyccl._C (csrc/torch/custom_ops.cpp, "
                                   "csrc/python/collective_ops.cpp)")
        return kernel

    return register


def _group(group_name: str) -> dist.ProcessGroup:
    return _resolve_process_group(group_name)


def _group_of_size(group_name: str, group_size: int) -> dist.ProcessGroup:
    group = _group(group_name)
    world = dist.get_world_size(group)
    if group_size != world:
        raise ValueError(f"group_size is {group_size}, but group '{group_name}' has {world} ranks")
    return group


def _like(x: torch.Tensor, *args) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _gathered(x: torch.Tensor, group_size: int, group_name: str) -> torch.Tensor:
    torch._check(group_size >= 1, lambda: f"all_gather: group_size must be positive, got {group_size}")
    shape = (group_size * x.shape[0], *x.shape[1:]) if x.dim() > 0 else (group_size,)
    return x.new_empty(shape)


def _scattered(x: torch.Tensor, op: str, group_size: int, group_name: str) -> torch.Tensor:
    torch._check(group_size >= 1, lambda: f"reduce_scatter: group_size must be positive, got {group_size}")
    torch._check(x.shape[0] % group_size == 0,
                 lambda: f"reduce_scatter: dim 0 ({x.shape[0]}) must divide by group_size {group_size}")
    return x.new_empty((x.shape[0] // group_size, *x.shape[1:]))


def _normed(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
            group_name: str) -> Tuple[torch.Tensor, torch.Tensor]:
    torch._check(residual.shape == x.shape, lambda: "fused_all_reduce_rmsnorm: residual must have x's shape")
    torch._check(weight.dim() == 1 and weight.shape[0] == x.shape[-1],
                 lambda: "fused_all_reduce_rmsnorm: weight must have shape [x.shape[-1]]")
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(residual, memory_format=torch.contiguous_format))


@_define("all_reduce(Tensor x, str op, str group_name) -> Tensor", _like)
def all_reduce(x: torch.Tensor, op: str, group_name: str) -> torch.Tensor:
    """All-reduce of ``x`` over the group named ``group_name``; a new tensor."""
    return collectives.all_reduce(x.contiguous(), op, group=_group(group_name))


@_define("all_gather(Tensor x, int group_size, str group_name) -> Tensor", _gathered)
def all_gather(x: torch.Tensor, group_size: int, group_name: str) -> torch.Tensor:
    """Every rank's ``x`` concatenated along dim 0, in rank order; ``group_size``
    is the group's size (checked)."""
    return collectives.all_gather(x.contiguous(), group=_group_of_size(group_name, group_size))


@_define("reduce_scatter(Tensor x, str op, int group_size, str group_name) -> Tensor", _scattered)
def reduce_scatter(x: torch.Tensor, op: str, group_size: int, group_name: str) -> torch.Tensor:
    """The reduction of ``x`` over the group, split along dim 0; this rank's
    part. ``group_size`` is the group's size (checked)."""
    x = x.contiguous()
    group = _group_of_size(group_name, group_size)
    out = x.new_empty((x.shape[0] // group_size, *x.shape[1:]))
    return collectives.reduce_scatter(x, op, group=group, out=out)


@_define("all_to_all(Tensor x, str group_name) -> Tensor", _like)
def all_to_all(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """Part q of ``x`` (equal splits along dim 0) to rank q; what arrives, in rank order."""
    return collectives.all_to_all(x.contiguous(), group=_group(group_name))


@_define("broadcast(Tensor x, int src, str group_name) -> Tensor", _like)
def broadcast(x: torch.Tensor, src: int, group_name: str) -> torch.Tensor:
    """Rank ``src``'s ``x`` on every rank of the group."""
    return collectives.broadcast(x.contiguous(), src, group=_group(group_name))


@_define("fused_all_reduce_rmsnorm(Tensor x, Tensor residual, Tensor weight, float eps, str group_name) "
         "-> (Tensor, Tensor)", _normed)
def fused_all_reduce_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                             group_name: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """All-reduce of ``x`` + ``residual``, then RMSNorm with ``weight``: (normed, new residual)."""
    return fused.fused_all_reduce_rmsnorm(x.contiguous(), residual.contiguous(), weight.contiguous(), eps,
                                          group=_group(group_name))


for _name, _path in (("all_reduce", all_reduce), ("all_gather", all_gather), ("reduce_scatter", reduce_scatter),
                     ("all_to_all", all_to_all), ("broadcast", broadcast),
                     ("fused_all_reduce_rmsnorm", fused_all_reduce_rmsnorm)):
    _C.set_op_python(_name, _path)
