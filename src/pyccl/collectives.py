"""Collectives on torch tensors: ``pyccl.all_reduce``, ``all_gather``,
``reduce_scatter``, ``all_to_all`` and ``broadcast``.

Each call runs on the current CUDA stream (host mode: on CPU threads, and
returns when done) and can be captured in a CUDA graph. Every rank of the
group must make the same calls in the same order, as with NCCL. The first
collective on a communicator is itself collective: it allocates and maps the
scratch buffers.

    import torch.distributed as dist, pyccl
    dist.init_process_group("gloo")       # or nccl: pyccl only needs its store
    torch.cuda.set_device(rank)
    y = pyccl.all_reduce(x)               # x: on cuda (every dtype NCCL reduces)
    g = pyccl.all_gather(x)               # any dtype; shape (world * x.shape[0], ...)

Tensors must be contiguous (a non-contiguous tensor raises; pass
``x.contiguous()``). All-reduce and reduce-scatter reduce every dtype NCCL
reduces (float32, float16, bfloat16, float64, float8 and the integers, each
as NCCL does: docs/collectives.md, "Reduction dtypes"), and bool; data
movement takes every dtype.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.distributed as dist

from . import calls
from .communicator import Communicator
from .dispatch import ALGORITHMS, NCCL_MIN_BYTES, REDUCIBLE_DTYPES  # noqa: F401  (where users have found them)
from .group_communicators import communicator_for, given_or_group_communicator, group_call
from .selection import check_tensor

__all__ = ["all_gather", "all_reduce", "all_to_all", "broadcast", "communicator_for", "reduce_scatter"]


def _resolve(tensor: torch.Tensor, group: Optional[dist.ProcessGroup],
             comm: Optional[Communicator]) -> Tuple[Communicator, bool]:
    """The call's communicator (`comm`, else the group's on the tensor's
    device) and whether it may hand the call to NCCL (a group's, whose
    backend has NCCL)."""
    if not isinstance(tensor, torch.Tensor):
        check_tensor(tensor)  # raises, naming it (the call checks the rest)
    if comm is not None:
        return given_or_group_communicator(comm, group), False
    return group_call(group, tensor.device)


def all_reduce(tensor: torch.Tensor, op="sum", group: Optional[dist.ProcessGroup] = None,
               out: Optional[torch.Tensor] = None, *, comm: Optional[Communicator] = None,
               algorithm: Optional[str] = None) -> torch.Tensor:
    """All-reduces ``tensor`` over the ranks of ``group`` (or of ``comm``).

    Args:
        tensor: contiguous, on the communicator's device: float32, float16, bfloat16, float64, int8, uint8,
            int32, uint32, int64, uint64, float8_e4m3fn, float8_e5m2 (NCCL's semantics) or bool (sum and max
            give any, prod and min all).
        op: "sum", "avg", "min", "max", "prod", or a ``torch.distributed.ReduceOp``.
        group: a torch process group (default: the world).
        out: where the result goes (may be ``tensor`` itself); a new tensor if None.
        comm: a pyccl Communicator to use instead of ``group``.
        algorithm: "1pa_ll", "2pa_ll", "1pa_hb", "2pa_hb" or "nccl" to force one (default: ``PYCCL_ALGO``,
            else by size on GPUs: the tuning table for the GPU and world size, or 1PA LL up to
            128 KiB, 2PA LL up to 1 MiB (2 ranks: 1PA HB up to 8 MiB), 2PA HB above, and from ``NCCL_MIN_BYTES`` (16 MiB;
            ``PYCCL_NCCL_MIN_BYTES``) the group's NCCL backend when it has one). When ``tensor``
            and ``out`` both lie in symmetric buffers (:func:`pyccl.symmetric_empty`), 2PA HB
            reads and writes the peers' buffers directly (no scratch), and is the default from
            the engine's ``zero_copy_threshold_bytes`` on. Captured in a CUDA graph inside
            :func:`pyccl.graph_capture`, plain tensors are chosen (and run) as symmetric buffers are.

    Returns the result tensor. 16-bit inputs are reduced in fp32; results are
    bitwise identical on every rank.
    """
    comm, nccl = _resolve(tensor, group, comm)
    return calls.all_reduce(comm, group, nccl, tensor, op, out, algorithm)


def all_gather(tensor: torch.Tensor, group: Optional[dist.ProcessGroup] = None, out: Optional[torch.Tensor] = None,
               *, comm: Optional[Communicator] = None, algorithm: Optional[str] = None) -> torch.Tensor:
    """Gathers ``tensor`` from every rank, concatenated in rank order along dim 0
    (as ``torch.distributed.all_gather_into_tensor``).

    Args:
        tensor: contiguous, any dtype, on the communicator's device.
        out: world_size * tensor.numel() elements of the same dtype (any shape), or None
            for a new tensor of shape (world_size * tensor.shape[0], *tensor.shape[1:]).
            In place: ``tensor`` may be the rank's slice of ``out``.
        algorithm: "ll", "hb" or "nccl" (default: ``PYCCL_ALGO``, else by size).
    """
    comm, nccl = _resolve(tensor, group, comm)
    return calls.all_gather(comm, group, nccl, tensor, out, algorithm)


def reduce_scatter(tensor: torch.Tensor, op="sum", group: Optional[dist.ProcessGroup] = None,
                   out: Optional[torch.Tensor] = None, *, comm: Optional[Communicator] = None,
                   algorithm: Optional[str] = None) -> torch.Tensor:
    """Reduces ``tensor`` over the ranks and leaves rank r with the r-th of
    world_size equal parts (as ``torch.distributed.reduce_scatter_tensor``).

    Args:
        tensor: contiguous, a dtype all_reduce takes; numel a multiple of world_size.
        op: "sum", "avg", "min", "max", "prod", or a ``torch.distributed.ReduceOp``.
        out: tensor.numel() / world_size elements of the same dtype, or None for a new tensor
            (shape (tensor.shape[0] / world_size, ...) when dim 0 divides, else flat).
            In place: ``out`` may be this rank's part of ``tensor``.
        algorithm: "ll", "hb" or "nccl" (default: ``PYCCL_ALGO``, else by size).
    """
    comm, nccl = _resolve(tensor, group, comm)
    return calls.reduce_scatter(comm, group, nccl, tensor, op, out, algorithm)


def all_to_all(tensor: torch.Tensor, group: Optional[dist.ProcessGroup] = None, out: Optional[torch.Tensor] = None,
               *, comm: Optional[Communicator] = None, algorithm: Optional[str] = None) -> torch.Tensor:
    """Splits ``tensor`` into world_size equal parts, sends part q to rank q, and
    concatenates what each rank sent in rank order (as
    ``torch.distributed.all_to_all_single`` with equal splits).

    Args:
        tensor: contiguous, any dtype; numel a multiple of world_size.
        out: same numel and dtype (may be ``tensor`` itself), or None for a new tensor.
        algorithm: "ll", "hb" or "nccl" (default: ``PYCCL_ALGO``, else by size).
    """
    comm, nccl = _resolve(tensor, group, comm)
    return calls.all_to_all(comm, group, nccl, tensor, out, algorithm)


def broadcast(tensor: torch.Tensor, src: int = 0, group: Optional[dist.ProcessGroup] = None,
              out: Optional[torch.Tensor] = None, *, comm: Optional[Communicator] = None,
              algorithm: Optional[str] = None) -> torch.Tensor:
    """Copies ``tensor`` of rank ``src`` (a rank of the group) to every rank.

    Args:
        tensor: contiguous, any dtype; the source on ``src``, same shape elsewhere.
        out: where the result goes (``tensor`` itself for the in-place form of
            ``torch.distributed.broadcast``), or None for a new tensor.
        algorithm: "ll", "hb" or "nccl" (default: ``PYCCL_ALGO``, else by size).
    """
    comm, nccl = _resolve(tensor, group, comm)
    return calls.broadcast(comm, group, nccl, tensor, src, out, algorithm)
