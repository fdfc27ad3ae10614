"""The all-reduce of a tensor-parallel layer fused with what follows it: the
residual add and RMSNorm, ``pyccl.fused_all_reduce_rmsnorm``.

    normed, residual = pyccl.fused_all_reduce_rmsnorm(partial, residual, norm.weight, eps=1e-5)

is, per row of the last dimension and with sums in fp32,

    new_residual = (all_reduce(partial) + residual).to(dtype)
    normed = (new_residual * rsqrt(mean(new_residual ** 2) + eps) * weight).to(dtype)

The algorithms:

- ``one_shot``: one kernel (``csrc/algorithms/fused_norm.cu``), LL
  packets from every rank to every rank; few rows;
- ``two_shot``: one kernel, each rank reduces a share of the rows and sends it
  on as LL packets;
- ``two_kernel``: pyccl's all-reduce kernel, then an add + RMSNorm kernel
  (the same file) launched to overlap its start with the all-reduce; the sum
  is rounded to the dtype before the residual add, as ``pyccl.all_reduce``
  followed by ``torch.add`` rounds it; any row length;
- ``unfused``: ``pyccl.all_reduce`` (which may hand the message to NCCL), then
  torch's add and ``rms_norm``; above ``FUSED_MAX_BYTES``.

The automatic choice: ``unfused`` above ``FUSED_MAX_BYTES``, else the engine's
(on GPUs ``one_shot`` up to 128 KiB, ``two_kernel`` above, which in a
tensor-parallel decode step beats the two-shot; the engine options
``fused_two_kernel_min_bytes`` and ``fused_two_shot_bytes`` move the bounds). Both results are
bitwise identical on every rank.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.distributed as dist

from . import _C
from ._logging import logger
from .collectives import all_reduce
from .dispatch import REDUCIBLE_DTYPES
from .communicator import Communicator
from .errors import ClosedError, InvalidArgumentError, PycclError, PycclTypeError
from .group_communicators import given_or_group_communicator

__all__ = ["FUSED_ALGORITHMS", "FUSED_MAX_BYTES", "fused_all_reduce_rmsnorm", "operand_error"]

FUSED_ALGORITHMS = ("one_shot", "two_shot", "two_kernel", "unfused")
#: Messages (bytes of the input) above this take the unfused path: the engine's
#: limit (kFusedMaxBytes, csrc/engine/collective_engine.hpp), which
#: torch.ops.pyccl.fused_all_reduce_rmsnorm's C++ kernel reads too.
FUSED_MAX_BYTES: int = _C.FUSED_MAX_BYTES


def operand_error(x, residual, weight, eps: float = 0.0, out=None, residual_out=None) -> Optional[PycclError]:
    """What is wrong with these operands of the fused call, as the error it raises (naming the argument), or
    None where they are well formed: the one statement of what the fused call takes, for the call's checks
    and for the engine adapters, which hand a call pyccl would refuse to the engine's own path instead.
    ``out`` and ``residual_out`` of None are made by the call."""
    tensors = {"tensor": x, "residual": residual, "weight": weight, "out": out, "residual_out": residual_out}
    for name in ("out", "residual_out"):
        if tensors[name] is None:
            del tensors[name]
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            return InvalidArgumentError(f"invalid argument '{name}': expected a torch.Tensor, got {type(t).__name__}")
    if x.dtype not in REDUCIBLE_DTYPES:
        return PycclTypeError(f"invalid argument 'tensor': the fused all-reduce supports float32, float16 and "
                              f"bfloat16, got {x.dtype}")
    if x.dim() < 1:
        return InvalidArgumentError("invalid argument 'tensor': must have at least one dimension (rows x hidden)")
    for name, t in tensors.items():
        if t.dtype != x.dtype:
            return InvalidArgumentError(f"invalid argument '{name}': dtype {t.dtype} differs from the input's "
                                        f"{x.dtype}")
        if t.device != x.device:
            return InvalidArgumentError(f"invalid argument '{name}': on {t.device}, the input on {x.device}")
        if not t.is_contiguous():
            return InvalidArgumentError(f"invalid argument '{name}': must be contiguous")
        if name != "weight" and t.shape != x.shape:
            return InvalidArgumentError(f"invalid argument '{name}': has shape {tuple(t.shape)}, the input "
                                        f"{tuple(x.shape)}")
    if weight.dim() != 1 or weight.numel() != x.shape[-1]:
        return InvalidArgumentError(f"invalid argument 'weight': must have shape [{x.shape[-1]}] (the input's last "
                                    f"dimension), got {tuple(weight.shape)}")
    if not isinstance(eps, (int, float)) or not (0 <= float(eps) < float("inf")):
        return InvalidArgumentError(f"invalid argument 'eps': must be a finite number >= 0, got {eps!r}")
    return None


def _check(x, residual, weight, eps, out, residual_out) -> None:
    """The argument checks of the fused call, for every path (the kernel's binding checks again)."""
    error = operand_error(x, residual, weight, eps, out, residual_out)
    if error is not None:
        raise error


def fused_all_reduce_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                             group: Optional[dist.ProcessGroup] = None, *, out: Optional[torch.Tensor] = None,
                             residual_out: Optional[torch.Tensor] = None, comm: Optional[Communicator] = None,
                             algorithm: Optional[str] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """All-reduces ``x`` (sum) over the ranks, adds ``residual`` and applies
    RMSNorm with ``weight`` over the last dimension, on the current stream.

    Args:
        x: this rank's partial sums, contiguous float32, float16 or bfloat16, shape (..., hidden).
        residual: the residual stream, the same shape and dtype (the same on every rank).
        weight: the norm's weight, shape (hidden,), the same dtype.
        eps: added to the mean square before the square root.
        group: a torch process group (default: the world); or ``comm``, a pyccl Communicator.
        out: where the normalized rows go (may be ``x``); a new tensor if None.
        residual_out: where the new residual goes (may be ``residual``); a new tensor if None.
        algorithm: "one_shot", "two_shot" (at least one row per rank), "two_kernel" or "unfused"
            to force one; default: by size (the module's docstring).

    Returns ``(normed, new_residual)``, bitwise identical on every rank.
    Capturable in CUDA graphs, like the other collectives.
    """
    if algorithm is not None and algorithm not in FUSED_ALGORITHMS:
        raise InvalidArgumentError(f"invalid argument 'algorithm': {algorithm!r} is not one of "
                                   f"{', '.join(FUSED_ALGORITHMS)}")
    if not isinstance(x, torch.Tensor):
        raise InvalidArgumentError(f"invalid argument 'tensor': expected a torch.Tensor, got {type(x).__name__}")
    given = comm
    comm = given_or_group_communicator(comm, group, x.device)
    runtime = comm._runtime
    if runtime is not None:  # a well-formed fused call, checked and run in one call into C++
        done = runtime.fused_all_reduce_rmsnorm(x, residual, weight, eps, out, residual_out, algorithm)
        if done is not None:
            return done
    if residual_out is None and isinstance(residual, torch.Tensor):
        residual_out = torch.empty_like(residual, memory_format=torch.contiguous_format)
    _check(x, residual, weight, eps, out, residual_out)
    if comm.closed:
        raise ClosedError(f"fused_all_reduce_rmsnorm: communicator '{comm.name}' is closed")
    engine = comm._collective_engine()
    # Long rows: the engine's automatic choice takes two_kernel, and refuses one_shot or two_shot forced.
    unfused = algorithm == "unfused" or (algorithm is None and x.numel() * x.element_size() > FUSED_MAX_BYTES)
    if unfused:
        return _unfused(x, residual, weight, float(eps), group, given, out, residual_out), residual_out
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    engine.all_reduce_rmsnorm(comm._comm, x, residual, weight, out, residual_out, float(eps), algorithm)
    return out, residual_out


def _unfused(x, residual, weight, eps, group, comm, out, residual_out) -> torch.Tensor:
    """The same result from pyccl.all_reduce (on ``comm`` if given, else on
    ``group``, which may hand it to NCCL), torch's add and rms_norm; the
    normalized rows in ``out`` if given, else in rms_norm's own result (a copy
    of the whole message saved: 1.6% of an 8K-token prefill, 80 layers, 4 x H200)."""
    if x.numel() == 0:
        return out if out is not None else torch.empty_like(x)
    logger.debug("fused_all_reduce_rmsnorm: %d bytes take the unfused path", x.numel() * x.element_size())
    reduced = all_reduce(x, group=group, comm=comm)
    torch.add(reduced, residual, out=residual_out)
    normed = torch.nn.functional.rms_norm(residual_out, (x.shape[-1],), weight, eps)
    if out is None:
        return normed
    out.copy_(normed)
    return out
