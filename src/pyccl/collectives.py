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
    y = pyccl.all_reduce(x)               # x: float32/float16/bfloat16 on cuda
    g = pyccl.all_gather(x)               # any dtype; shape (world * x.shape[0], ...)

Tensors must be contiguous (a non-contiguous tensor raises; pass
``x.contiguous()``). Reductions take float32, float16 and bfloat16 (16-bit
values are reduced in fp32); data movement takes every dtype.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from . import _C, across_nodes, registry
from ._logging import logger
from .communicator import Communicator
from .errors import InvalidArgumentError, UnsupportedError
from .group_communicators import _direct_nccl, communicator_for
# Re-exported: where users and the other modules have found them.
from .selection import ALGORITHMS, NCCL_MIN_BYTES, _Call, new_engine, table_for  # noqa: F401

__all__ = ["all_gather", "all_reduce", "all_to_all", "broadcast", "communicator_for", "reduce_scatter"]

_REDUCE_OPS = ("sum", "avg", "min", "max", "prod")
#: The dtypes the reducing collectives take (data movement takes any dtype).
REDUCIBLE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _engine(comm: Communicator) -> "_C.CollectiveEngine":
    engine = getattr(comm, "_engine", None)
    if engine is None:
        if comm._collectives_error is not None:
            raise UnsupportedError(comm._collectives_error)
        if comm.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise InvalidArgumentError(
                f"communicator {comm.name} was made with collectives=False and cannot set them up while a CUDA "
                "graph is being captured; make it with collectives=True (the default) before capturing")
        engine = new_engine(comm._comm, comm.device, comm.world_size)  # UnsupportedError where it cannot run
        comm._engine = engine
        logger.info("communicator %s: collective engine ready", comm.name)
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


def _not_a_tensor(out) -> InvalidArgumentError:
    return InvalidArgumentError(f"invalid argument 'out': expected a torch.Tensor or None, got {type(out).__name__}")


def _check_placement(collective: str, call: _Call, tensor: torch.Tensor, out: torch.Tensor) -> None:
    """Where `out` may lie against `tensor` (the input itself, apart, or in
    place as the collective defines it), for the calls that do not reach the
    engine, which checks it itself: NCCL, plans, across nodes."""
    _C.check_out_placement(collective, tensor, out, call.comm.rank)


def _run_plan(call: _Call, collective: str, tensor: torch.Tensor, out: torch.Tensor, op: str = "sum") -> bool:
    """Runs the call with the DSL plan the selector chose, if it chose one: a
    plan of pyccl.register_algorithm, or the library plan the tuning table
    names for this size. Where the plan cannot be set up now (its first use
    during a CUDA-graph capture), the selector's choice without plans runs it."""
    if call.route != "plan":
        return False
    runner = registry.chosen_runner(call.comm, collective, call.registered_plan, call.tuned_plan, call.nbytes, tensor)
    if runner is None:
        call.without_plans()
        return False
    _check_placement(collective, call, tensor, out)
    registry.run(runner, call.comm, tensor, out, op)
    return True


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
    call = _Call("all_reduce", tensor, group, comm, algorithm)
    op_name = _op_name(op)
    if out is None:
        out = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    elif not isinstance(out, torch.Tensor):
        raise _not_a_tensor(out)
    if _run_plan(call, "all_reduce", tensor, out, op_name):
        return out
    engine = getattr(call.comm, "_engine", None)
    # Symmetric buffers, and plain tensors captured on graph buffers (pyccl.graph_capture), are chosen alike. The
    # engine tells them apart at the launch, given their choice; only a choice that may leave the engine (NCCL
    # for one kind of call) is settled here, by asking.
    symmetric = None
    if not call.forced and engine is not None:
        symmetric = call.symmetric
        if call.use_nccl or symmetric == "nccl":
            if ((engine.is_symmetric(tensor) and engine.is_symmetric(out))
                    or (engine.graph_capturing and tensor.is_cuda and torch.cuda.is_current_stream_capturing())):
                call.algorithm, call.use_nccl = symmetric, symmetric == "nccl"
            symmetric = None
    if call.use_nccl:
        _check_placement("all_reduce", call, tensor, out)
        # Large messages: NCCL's ring is faster than the 2PA kernel here (see
        # benchmarks/RESULTS.md), so hand them to NCCL: in place, the group's
        # backend; out of place, NCCL called directly (ProcessGroupNCCL would
        # need a copy first, 12% of the time at 256 MiB).
        in_place = out.data_ptr() == tensor.data_ptr()
        direct = None if in_place else _direct_nccl(call.comm, group, tensor.device)
        if direct is not None:
            if torch.cuda.is_current_stream_capturing():
                call.comm._nccl_direct_captured = True  # see Communicator.close
            direct.all_reduce(tensor, out, op_name)
            return out
        if not in_place:
            out.copy_(tensor)
        dist.all_reduce(out, op=_DIST_OPS[op_name], group=group)
        return out
    if call.spans_nodes and not call.forced:
        _check_placement("all_reduce", call, tensor, out)

        def nccl() -> None:
            out.copy_(tensor)
            dist.all_reduce(out, op=_DIST_OPS[op_name], group=group)

        across_nodes.run(call.comm, "all_reduce", tensor, out, op_name, nccl if call.nccl_here else None)
        return out
    _engine(call.comm).all_reduce(call.comm._comm, tensor, out, op_name, call.kernel_algorithm, symmetric)
    return out


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
    call = _Call("all_gather", tensor, group, comm, algorithm, gathers=True)
    world = call.comm.world_size
    if out is None:
        shape = (world * tensor.shape[0], *tensor.shape[1:]) if tensor.dim() > 0 else (world,)
        out = torch.empty(shape, dtype=tensor.dtype, device=tensor.device)
    elif not isinstance(out, torch.Tensor):
        raise _not_a_tensor(out)
    if _run_plan(call, "all_gather", tensor, out):
        return out
    if call.use_nccl:
        _check_placement("all_gather", call, tensor, out)
        dist.all_gather_into_tensor(out, tensor, group=group)
        return out
    if call.spans_nodes and not call.forced:
        _check_placement("all_gather", call, tensor, out)
        across_nodes.run(call.comm, "all_gather", tensor, out, fallback=(
            lambda: dist.all_gather_into_tensor(out, tensor, group=group)) if call.nccl_here else None)
        return out
    _engine(call.comm).all_gather(call.comm._comm, tensor, out, call.kernel_algorithm)
    return out


def reduce_scatter(tensor: torch.Tensor, op="sum", group: Optional[dist.ProcessGroup] = None,
                   out: Optional[torch.Tensor] = None, *, comm: Optional[Communicator] = None,
                   algorithm: Optional[str] = None) -> torch.Tensor:
    """Reduces ``tensor`` over the ranks and leaves rank r with the r-th of
    world_size equal parts (as ``torch.distributed.reduce_scatter_tensor``).

    Args:
        tensor: contiguous float32, float16 or bfloat16; numel a multiple of world_size.
        op: "sum", "avg", "min", "max", "prod", or a ``torch.distributed.ReduceOp``.
        out: tensor.numel() / world_size elements of the same dtype, or None for a new tensor
            (shape (tensor.shape[0] / world_size, ...) when dim 0 divides, else flat).
            In place: ``out`` may be this rank's part of ``tensor``.
        algorithm: "ll", "hb" or "nccl" (default: ``PYCCL_ALGO``, else by size).
    """
    call = _Call("reduce_scatter", tensor, group, comm, algorithm)
    op_name = _op_name(op)
    world = call.comm.world_size
    if tensor.numel() % world != 0:
        raise InvalidArgumentError(f"invalid argument 'tensor': {tensor.numel()} elements do not split into "
                                   f"{world} equal parts")
    if out is None:
        if tensor.dim() > 0 and tensor.shape[0] % world == 0:
            shape = (tensor.shape[0] // world, *tensor.shape[1:])
        else:
            shape = (tensor.numel() // world,)
        out = torch.empty(shape, dtype=tensor.dtype, device=tensor.device)
    elif not isinstance(out, torch.Tensor):
        raise _not_a_tensor(out)
    if _run_plan(call, "reduce_scatter", tensor, out, op_name):
        return out
    if call.use_nccl:
        _check_placement("reduce_scatter", call, tensor, out)
        dist.reduce_scatter_tensor(out, tensor, op=_DIST_OPS[op_name], group=group)
        return out
    if call.spans_nodes and not call.forced:
        _check_placement("reduce_scatter", call, tensor, out)
        across_nodes.run(call.comm, "reduce_scatter", tensor, out, op_name, fallback=(
            lambda: dist.reduce_scatter_tensor(out, tensor, op=_DIST_OPS[op_name], group=group))
            if call.nccl_here else None)
        return out
    _engine(call.comm).reduce_scatter(call.comm._comm, tensor, out, op_name, call.kernel_algorithm)
    return out


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
    call = _Call("all_to_all", tensor, group, comm, algorithm)
    if out is None:
        out = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    elif not isinstance(out, torch.Tensor):
        raise _not_a_tensor(out)
    if _run_plan(call, "all_to_all", tensor, out):
        return out
    if call.use_nccl:
        _check_placement("all_to_all", call, tensor, out)
        if out.data_ptr() == tensor.data_ptr():
            tensor = tensor.clone()
        dist.all_to_all_single(out, tensor, group=group)
        return out
    _engine(call.comm).all_to_all(call.comm._comm, tensor, out, call.kernel_algorithm)
    return out


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
    call = _Call("broadcast", tensor, group, comm, algorithm)
    if not isinstance(src, int) or not 0 <= src < call.comm.world_size:
        raise InvalidArgumentError(f"invalid argument 'src': must be a rank of the group (0 to "
                                   f"{call.comm.world_size - 1}), got {src!r}")
    if out is None:
        out = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    elif not isinstance(out, torch.Tensor):
        raise _not_a_tensor(out)
    if call.use_nccl:
        _check_placement("broadcast", call, tensor, out)
        if call.comm.rank == src and out.data_ptr() != tensor.data_ptr():
            out.copy_(tensor)
        pg = group if group is not None else dist.group.WORLD
        dist.broadcast(out, src=dist.get_global_rank(pg, src), group=group)
        return out
    _engine(call.comm).broadcast(call.comm._comm, tensor, out, src, call.kernel_algorithm)
    return out


_DIST_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "min": dist.ReduceOp.MIN,
             "max": dist.ReduceOp.MAX, "prod": dist.ReduceOp.PRODUCT}
