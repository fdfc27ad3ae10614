"""The collectives' bodies on a resolved communicator: the selector's choice
(:class:`pyccl.selection._Call`) run on the engine, a DSL plan, the
collectives across nodes, or NCCL through the call's torch group.

The public functions (:mod:`pyccl.collectives`) resolve a torch group to its
communicator and call these; :class:`pyccl.Communicator`'s methods call them
on themselves, without a group (so never NCCL).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Dict, Optional

import torch
import torch.distributed as dist

from . import _C, across_nodes, registry
from .errors import InvalidArgumentError
from .selection import _Call

if TYPE_CHECKING:  # the communicator sits above: its methods call these
    from .communicator import Communicator

_REDUCE_OPS = ("sum", "avg", "min", "max", "prod")


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
    engine or a plan, which check it themselves: NCCL, across nodes."""
    _C.check_out_placement(collective, tensor, out, call.comm.rank)


def _run_plan(call: _Call, collective: str, tensor: torch.Tensor, out: torch.Tensor, op: str = "sum") -> bool:
    """Runs the call with the DSL plan the selector chose, if it chose one: a
    plan of pyccl.register_algorithm, or the library plan the tuning table
    names for this size. Where the plan cannot be set up now (its first use
    during a CUDA-graph capture), the selector's choice without plans runs it."""
    if call.route != "plan":
        return False
    runner = registry.chosen_runner(call.comm, call.registered_plan, call.tuned_plan, call.plan_slot, tensor)
    if runner is None:
        call.without_plans()
        return False
    registry.run(runner, collective, tensor, out, op)
    return True


def all_reduce(comm, group: Optional[dist.ProcessGroup], nccl: bool, tensor: torch.Tensor, op,
               out: Optional[torch.Tensor], algorithm: Optional[str]) -> torch.Tensor:
    """pyccl.all_reduce on `comm` (see there); `group`: the torch group to hand NCCL's calls to where
    `nccl` (the caller has it)."""
    runtime = comm._runtime
    if runtime is not None:  # a kernel choice, checked, chosen and run in one call into C++
        done = runtime.all_reduce(tensor, out, op, algorithm, nccl)
        if done is not None:
            return done
    call = _Call("all_reduce", tensor, comm, algorithm, nccl)
    op_name = _op_name(op)
    if out is None:
        out = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    elif not isinstance(out, torch.Tensor):
        raise _not_a_tensor(out)
    if _run_plan(call, "all_reduce", tensor, out, op_name):
        return out
    engine = call.comm._engine
    # Symmetric buffers, and plain tensors captured on graph buffers (pyccl.graph_capture), are chosen alike. The
    # engine tells them apart at the launch, given their choice; only a choice that may leave the engine (NCCL
    # for one kind of call) is settled here, by asking.
    symmetric = None
    if not call.forced and engine is not None:
        symmetric = call.symmetric
        if call.use_nccl or symmetric == "nccl":
            if ((engine.is_symmetric(tensor) and engine.is_symmetric(out))
                    or (engine.graph_capturing and tensor.is_cuda and torch.cuda.is_current_stream_capturing())):
                call.algorithm, call.route = symmetric, "nccl" if symmetric == "nccl" else "kernel"
            symmetric = None
    if call.use_nccl:
        _check_placement("all_reduce", call, tensor, out)
        # Large messages: NCCL's ring is faster than the 2PA kernel here (see
        # docs/performance.md#history), so hand them to NCCL: in place, the group's
        # backend; out of place, NCCL called directly (ProcessGroupNCCL would
        # need a copy first, 12% of the time at 256 MiB).
        in_place = out.data_ptr() == tensor.data_ptr()
        direct = None if in_place else direct_nccl(call.comm, group, tensor.device)
        if direct is not None:
            if torch.cuda.is_current_stream_capturing():
                call.comm._nccl_captured()  # see Communicator.close
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
    call.comm._collective_engine().all_reduce(call.comm._comm, tensor, out, op_name, call.kernel_algorithm, symmetric)
    return out


def all_gather(comm, group: Optional[dist.ProcessGroup], nccl: bool, tensor: torch.Tensor,
               out: Optional[torch.Tensor], algorithm: Optional[str]) -> torch.Tensor:
    """pyccl.all_gather on `comm` (see there); `group`: the torch group to hand NCCL's calls to where
    `nccl` (the caller has it)."""
    runtime = comm._runtime
    if runtime is not None:  # as all_reduce
        done = runtime.all_gather(tensor, out, algorithm, nccl)
        if done is not None:
            return done
    call = _Call("all_gather", tensor, comm, algorithm, nccl, gathers=True)
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
    call.comm._collective_engine().all_gather(call.comm._comm, tensor, out, call.kernel_algorithm)
    return out


def reduce_scatter(comm, group: Optional[dist.ProcessGroup], nccl: bool, tensor: torch.Tensor, op,
                   out: Optional[torch.Tensor], algorithm: Optional[str]) -> torch.Tensor:
    """pyccl.reduce_scatter on `comm` (see there); `group`: the torch group to hand NCCL's calls to where
    `nccl` (the caller has it)."""
    runtime = comm._runtime
    if runtime is not None:  # as all_reduce
        done = runtime.reduce_scatter(tensor, out, op, algorithm, nccl)
        if done is not None:
            return done
    call = _Call("reduce_scatter", tensor, comm, algorithm, nccl)
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
    call.comm._collective_engine().reduce_scatter(call.comm._comm, tensor, out, op_name, call.kernel_algorithm)
    return out


def all_to_all(comm, group: Optional[dist.ProcessGroup], nccl: bool, tensor: torch.Tensor,
               out: Optional[torch.Tensor], algorithm: Optional[str]) -> torch.Tensor:
    """pyccl.all_to_all on `comm` (see there); `group`: the torch group to hand NCCL's calls to where
    `nccl` (the caller has it)."""
    runtime = comm._runtime
    if runtime is not None:  # as all_reduce
        done = runtime.all_to_all(tensor, out, algorithm, nccl)
        if done is not None:
            return done
    call = _Call("all_to_all", tensor, comm, algorithm, nccl)
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
    call.comm._collective_engine().all_to_all(call.comm._comm, tensor, out, call.kernel_algorithm)
    return out


def broadcast(comm, group: Optional[dist.ProcessGroup], nccl: bool, tensor: torch.Tensor, src: int,
              out: Optional[torch.Tensor], algorithm: Optional[str]) -> torch.Tensor:
    """pyccl.broadcast on `comm` (see there); `group`: the torch group to hand NCCL's calls to where
    `nccl` (the caller has it)."""
    runtime = comm._runtime
    if runtime is not None:  # as all_reduce
        done = runtime.broadcast(tensor, src, out, algorithm, nccl)
        if done is not None:
            return done
    call = _Call("broadcast", tensor, comm, algorithm, nccl)
    if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < call.comm.world_size:
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
    call.comm._collective_engine().broadcast(call.comm._comm, tensor, out, src, call.kernel_algorithm)
    return out


_DIST_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "min": dist.ReduceOp.MIN,
             "max": dist.ReduceOp.MAX, "prod": dist.ReduceOp.PRODUCT}


# Communicators made per kind and name (made_count): each new one's store keys carry the count.
_made_lock = threading.Lock()
_made: Dict[str, int] = {}


def made_count(key: str) -> int:
    """How many communicators have been made under `key`, this one included;
    every rank makes a group's communicators at the same
    calls, so the count is the same on every rank."""
    with _made_lock:
        made = _made[key] = _made.get(key, 0) + 1
    return made


def group_store(group: Optional[dist.ProcessGroup]):
    store = dist.distributed_c10d._get_default_store()
    if group is not None:
        store = dist.PrefixStore(f"pyccl/{dist.get_process_group_ranks(group)}", store)
    return store


def direct_nccl(comm: "Communicator", group: Optional[dist.ProcessGroup], device: torch.device):
    """The NCCL communicator pyccl calls directly for `comm`'s group (as vLLM's
    pynccl does), made collectively on the first out-of-place hand-off and
    closed with `comm`. None while a CUDA graph is being captured before it
    exists (NCCL cannot be set up then) or where libnccl cannot be used: the
    caller then copies and calls the group's backend."""
    if torch.cuda.is_current_stream_capturing() and not comm._has_direct_nccl():
        return None

    def make():
        from ._nccl import NcclComm  # loads libnccl: only where a call is handed to NCCL

        # Every rank makes its communicators for a group in the same order: the count makes each one's key new
        # on the store.
        key = f"pyccl_nccl_direct/{comm.name}/{made_count('nccl_direct/' + comm.name)}"
        return NcclComm(group_store(group), comm.rank, comm.world_size, device.index, key=key)

    return comm._direct_nccl(make)
