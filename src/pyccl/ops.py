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
benchmarks/RESULTS.md).
They have no derivative: their Autograd kernel (csrc/torch/custom_ops.cpp)
lets a call on tensors that require grad run, and a backward through its
result raise, naming the op.

The CPU and CUDA kernels of ``all_reduce``, ``all_gather``, ``reduce_scatter``
and ``fused_all_reduce_rmsnorm`` are C++ (csrc/python/collective_ops.cpp): a
call like one that the Python kernel below already ran on the engine (same
op, group, device, dtype and size, nothing its choice was made from changed
since) goes straight to the engine without calling Python (it only reads,
under the GIL, the values that choice was made from). Every other call runs
the Python kernel, which then teaches the C++ one.
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _resolve_process_group

from . import _C, _env, collectives, fused, registry, selection
from .group_communicators import communicator_for

__all__ = ["all_gather", "all_reduce", "all_to_all", "broadcast", "fused_all_reduce_rmsnorm", "reduce_scatter"]

_LIB = torch.library.Library("pyccl", "DEF")


def _define(schema: str, fake, kernel_in_cpp: bool = False):
    """Defines ``pyccl::<name>`` with `schema` (``name(args) -> result``); the
    decorated function is its CPU (host mode) and CUDA kernel, `fake` its fake
    implementation. With `kernel_in_cpp`, the CPU and CUDA kernel is pyccl._C's,
    and the function the Python path it falls back to. Returns the function,
    callable directly as well."""
    name = schema.split("(", 1)[0]

    def register(kernel):
        _LIB.define(schema)
        if not kernel_in_cpp:
            _LIB.impl(name, kernel, "CPU")
            _LIB.impl(name, kernel, "CUDA")
        torch.library.register_fake(f"pyccl::{name}", fake, lib=_LIB)
        # Without an Autograd kernel a backward would only warn and drop the gradient.
        for key in ("Autograd", "CPU", "CUDA") if kernel_in_cpp else ("Autograd",):
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


@_define("all_reduce(Tensor x, str op, str group_name) -> Tensor", _like, kernel_in_cpp=True)
def all_reduce(x: torch.Tensor, op: str, group_name: str) -> torch.Tensor:
    """All-reduce of ``x`` over the group named ``group_name``; a new tensor."""
    x = x.contiguous()
    group = _group(group_name)
    out = collectives.all_reduce(x, op, group=group)
    _teach_collective("all_reduce", x, group, group_name)
    return out


@_define("all_gather(Tensor x, int group_size, str group_name) -> Tensor", _gathered, kernel_in_cpp=True)
def all_gather(x: torch.Tensor, group_size: int, group_name: str) -> torch.Tensor:
    """Every rank's ``x`` concatenated along dim 0, in rank order; ``group_size``
    is the group's size (checked)."""
    x = x.contiguous()
    group = _group_of_size(group_name, group_size)
    out = collectives.all_gather(x, group=group)
    _teach_collective("all_gather", x, group, group_name)
    return out


@_define("reduce_scatter(Tensor x, str op, int group_size, str group_name) -> Tensor", _scattered,
         kernel_in_cpp=True)
def reduce_scatter(x: torch.Tensor, op: str, group_size: int, group_name: str) -> torch.Tensor:
    """The reduction of ``x`` over the group, split along dim 0; this rank's
    part. ``group_size`` is the group's size (checked)."""
    x = x.contiguous()
    group = _group_of_size(group_name, group_size)
    out = x.new_empty((x.shape[0] // group_size, *x.shape[1:]))
    out = collectives.reduce_scatter(x, op, group=group, out=out)
    _teach_collective("reduce_scatter", x, group, group_name)
    return out


def _teach_collective(collective: str, x: torch.Tensor, group: dist.ProcessGroup, group_name: str) -> None:
    """Where pyccl.<collective> ran this call on the engine, tells the op's C++
    kernel the engine and the choice it was given: the same branches as
    pyccl.collectives, from the selector's choice. Nothing is learned while
    a plan is registered (it may take some sizes) or the sources cannot be watched."""
    if not _WATCHED[collective] or registry._registry:
        return
    call = selection._Call(collective, x, group, None, None, gathers=collective == "all_gather")
    engine = getattr(call.comm, "_engine", None)
    if engine is None or call.use_nccl:
        return
    symmetric = None
    if not call.forced:
        if call.spans_nodes or call.route == "plan":
            return
        if collective == "all_reduce":
            symmetric = call.symmetric
            if symmetric == "nccl":
                return
    _C.learn_op_route(collective, group_name, x, call.comm._comm, engine, call.kernel_algorithm, symmetric)


def _watched_sources(collective: str) -> list:
    """What a learned choice of `collective` was made from, beyond the call
    itself: the variables and thresholds the group's selector was made from (a change there
    re-learns the route), and the registered plans."""
    sources = []
    for name in selection.SHARED_ENV:
        lookup = _env.lookup(name)
        if lookup is None:
            return []  # the environment cannot be watched here: no call is learned
        sources.append((lookup[0], lookup[1], None))
    sources.append((vars(selection), "NCCL_MIN_BYTES", collective))
    sources.append((vars(registry), "_generation", None))
    return sources


@_define("all_to_all(Tensor x, str group_name) -> Tensor", _like)
def all_to_all(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """Part q of ``x`` (equal splits along dim 0) to rank q; what arrives, in rank order."""
    return collectives.all_to_all(x.contiguous(), group=_group(group_name))


@_define("broadcast(Tensor x, int src, str group_name) -> Tensor", _like)
def broadcast(x: torch.Tensor, src: int, group_name: str) -> torch.Tensor:
    """Rank ``src``'s ``x`` on every rank of the group."""
    return collectives.broadcast(x.contiguous(), src, group=_group(group_name))


@_define("fused_all_reduce_rmsnorm(Tensor x, Tensor residual, Tensor weight, float eps, str group_name) "
         "-> (Tensor, Tensor)", _normed, kernel_in_cpp=True)
def fused_all_reduce_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                             group_name: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """All-reduce of ``x`` + ``residual``, then RMSNorm with ``weight``: (normed, new residual)."""
    x = x.contiguous()
    group = _group(group_name)
    out = fused.fused_all_reduce_rmsnorm(x, residual.contiguous(), weight.contiguous(), eps, group=group)
    if _WATCHED["fused_all_reduce_rmsnorm"] and x.numel() * x.element_size() <= fused.FUSED_MAX_BYTES:
        # The fused kernel ran, with the engine's own choice (above the limit: pyccl.all_reduce and torch's ops).
        comm = communicator_for(group, x.device)
        _C.learn_op_route("fused_all_reduce_rmsnorm", group_name, x, comm._comm, comm._engine)
    return out


# What each op's learned choices depend on; an op with nothing here learns nothing.
_WATCHED = {name: _watched_sources(name) for name in ("all_reduce", "all_gather", "reduce_scatter")}
_WATCHED["fused_all_reduce_rmsnorm"] = [(vars(fused), "FUSED_MAX_BYTES", None)]
for _name, _path in (("all_reduce", all_reduce), ("all_gather", all_gather), ("reduce_scatter", reduce_scatter),
                     ("fused_all_reduce_rmsnorm", fused_all_reduce_rmsnorm)):
    _C.set_op_python(_name, _path, _WATCHED[_name])
