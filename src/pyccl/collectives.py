"""Collectives on torch tensors: ``pyccl.all_reduce``.

Each call runs on the current CUDA stream (host mode: on CPU threads, and
returns when done). Every rank of the group must make the same calls in the
same order, as with NCCL. The first collective on a communicator is itself
collective: it allocates and maps the scratch buffers.

    import torch.distributed as dist, pyccl
    dist.init_process_group("gloo")       # or nccl: pyccl only needs its store
    torch.cuda.set_device(rank)
    y = pyccl.all_reduce(x)               # x: float32/float16/bfloat16 on cuda
"""

from __future__ import annotations

import os
import threading
from typing import Dict, Optional, Tuple

import torch
import torch.distributed as dist

from . import _C
from ._logging import logger
from .communicator import Communicator
from .errors import InvalidArgumentError

__all__ = ["all_reduce", "communicator_for"]

_REDUCE_OPS = ("sum", "avg", "min", "max", "prod")
_ALGORITHMS = ("1pa_ll", "2pa_hb")
_lock = threading.Lock()
_communicators: Dict[Tuple[int, str], Communicator] = {}


def _engine(comm: Communicator) -> "_C.AllReduceEngine":
    engine = getattr(comm, "_allreduce_engine", None)
    if engine is None:
        engine = _C.AllReduceEngine(comm._comm)
        comm._allreduce_engine = engine
        logger.info("communicator %s: all-reduce engine ready", comm.name)
    return engine


def _op_name(op) -> str:
    if isinstance(op, str):
        name = op.lower()
    elif isinstance(op, dist.ReduceOp) or type(op).__name__ == "RedOpType":
        name = str(op).split(".")[-1].lower()
        name = {"product": "prod"}.get(name, name)
    else:
        raise InvalidArgumentError(f"invalid argument 'op': expected a string or torch.distributed.ReduceOp, got {op!r}")
    if name not in _REDUCE_OPS:
        raise InvalidArgumentError(f"invalid argument 'op': {op!r} is not one of {', '.join(_REDUCE_OPS)}")
    return name


def communicator_for(group: Optional[dist.ProcessGroup] = None, device: Optional[torch.device] = None) -> Communicator:
    """The pyccl communicator of a torch process group on ``device`` (made on
    first use, collectively, over the group's store)."""
    if not dist.is_initialized():
        raise InvalidArgumentError(
            "invalid argument 'group': torch.distributed is not initialized; call init_process_group "
            "first, or use Communicator.all_reduce on a pyccl.Communicator")
    pg = group if group is not None else dist.group.WORLD
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    key = (id(pg), str(device))
    with _lock:
        comm = _communicators.get(key)
        if comm is None or comm.closed:
            store = dist.distributed_c10d._get_default_store()
            if group is not None:
                store = dist.PrefixStore(f"pyccl/{dist.get_process_group_ranks(pg)}", store)
            # The name must be the same on every rank (device indices differ).
            comm = Communicator(store, dist.get_rank(pg), dist.get_world_size(pg), device=device,
                                name=f"pyccl_{pg.group_name}_{device.type}")
            _communicators[key] = comm
    return comm


def all_reduce(tensor: torch.Tensor, op="sum", group: Optional[dist.ProcessGroup] = None,
               out: Optional[torch.Tensor] = None, *, comm: Optional[Communicator] = None,
               algorithm: Optional[str] = None) -> torch.Tensor:
    """All-reduces ``tensor`` over the ranks of ``group`` (or of ``comm``).

    Args:
        tensor: contiguous float32, float16 or bfloat16, on the communicator's device.
        op: "sum", "avg", "min", "max", "prod", or a ``torch.distributed.ReduceOp``.
        group: a torch process group (default: the world).
        out: where the result goes (may be ``tensor`` itself); a new tensor if None.
        comm: a pyccl Communicator to use instead of ``group``.
        algorithm: "1pa_ll", "2pa_hb" or "nccl" to force one (default: ``PYCCL_ALGO``, else
            by size: 1PA LL up to 512 KiB, 2PA HB above, and from ``PYCCL_NCCL_MIN_BYTES``
            (16 MiB) the group's NCCL backend when it has one).

    Returns the result tensor. 16-bit inputs are reduced in fp32; results are
    bitwise identical on every rank.
    """
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(f"invalid argument 'tensor': expected a torch.Tensor, got {type(tensor).__name__}")
    from_group = comm is None
    if from_group:
        comm = communicator_for(group, tensor.device)
    if out is None:
        out = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    algo = algorithm if algorithm is not None else os.environ.get("PYCCL_ALGO") or None
    if algo is not None and algo not in _ALGORITHMS + ("nccl",):
        raise InvalidArgumentError(f"invalid argument 'algorithm': {algo!r} is not one of "
                                   f"{', '.join(_ALGORITHMS + ('nccl',))}"
                                   + (" (from PYCCL_ALGO)" if algorithm is None else ""))
    op_name = _op_name(op)
    nbytes = tensor.numel() * tensor.element_size()
    if from_group and tensor.is_cuda and (algo == "nccl" or (algo is None and nbytes >= _nccl_min_bytes())) \
            and _has_nccl(group):
        # Large messages: NCCL's ring is faster than the 2PA kernel here (see
        # benchmarks/RESULTS.md), so hand them to the group's NCCL backend.
        if out.data_ptr() != tensor.data_ptr():
            out.copy_(tensor)
        dist.all_reduce(out, op=_DIST_OPS[op_name], group=group)
        return out
    if algo == "nccl":
        raise InvalidArgumentError("invalid argument 'algorithm': 'nccl' needs a CUDA tensor and a group "
                                   "with an NCCL backend")
    _engine(comm).all_reduce(comm._comm, tensor, out, op_name, algo)
    return out


_DIST_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "min": dist.ReduceOp.MIN,
             "max": dist.ReduceOp.MAX, "prod": dist.ReduceOp.PRODUCT}


def _nccl_min_bytes() -> int:
    """Messages from here on go to NCCL when the group has it: PYCCL_NCCL_MIN_BYTES,
    by default 16 MiB (where NCCL overtakes the 2PA kernel on 4 x H200)."""
    text = os.environ.get("PYCCL_NCCL_MIN_BYTES")
    if not text:
        return 16 << 20
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidArgumentError(f"invalid PYCCL_NCCL_MIN_BYTES {text!r}: expected a byte count >= 0")
    return value


def _has_nccl(group) -> bool:
    try:
        backend = dist.get_backend(group)
    except Exception:
        return False
    return "nccl" in str(backend).lower()

