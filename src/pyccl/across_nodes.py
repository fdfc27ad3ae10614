"""Collectives of a communicator whose ranks span nodes.

Inside one node pyccl's kernels reach every peer's memory. Across nodes they
cannot, so :mod:`pyccl.collectives` hands such a communicator's calls here,
where DSL plans run on the plan interpreter with the ranks of other nodes
reached through the proxy (socket transport, ``csrc/executor``):

- all-reduce: the two-phase hierarchical algorithm (2PH,
  :mod:`pyccl.algorithms.hierarchical`), LL up to :data:`LL_MAX_BYTES`, HB
  above;
- all-gather and reduce-scatter: the hierarchical ones of the same module
  (one network hop per chunk between ranks of one local index, NVLink for
  the rest).

Ranks must be numbered node by node with the same count on every node, as
torchrun numbers them (``rank = node_rank * nproc_per_node + local_rank``).
Inputs whose size the plan cannot split into whole chunks are padded (the
padding's results are dropped).

On GPUs nothing between the nodes is a CUDA call: the plan's kernel copies
what leaves the node into page-locked host memory and what arrived from it
out of there (csrc/channels/inbox_device.hpp), so work the application
queues behind the call (a ``.cpu()`` of the result, a kernel that loads
lazily) cannot stall the transfers the kernel waits for.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple, Union

import torch

from . import registry
from .dispatch import REDUCIBLE_DTYPES
from .errors import InvalidArgumentError, UnsupportedError

__all__ = ["LL_MAX_BYTES", "LL_PIPELINE", "LL_PIPELINE_MIN_BYTES", "node_layout", "run"]

#: All-reduces up to this size take 2PH LL, larger ones 2PH HB (docs/scaling.md).
LL_MAX_BYTES = 256 << 10
#: 2PH LL pipelines its phases (in ``allreduce_2ph_ll``'s default pieces)
#: from this size; smaller all-reduces send each part in one piece. Over
#: sockets every piece costs the receiver a wait of its own: on 2 x 2 H200
#: one piece was 1.4x faster at 4-16 KiB, two 1.1x faster at 256 KiB
#: (docs/performance.md#history).
LL_PIPELINE_MIN_BYTES = 256 << 10
#: Pieces for every 2PH LL all-reduce, overriding the size rule (None: by size).
LL_PIPELINE: Optional[int] = None


def layout_of(name: str, nodes: List[str]) -> Union[None, Tuple[int, int], UnsupportedError]:
    """The layout of communicator `name` whose rank r lies on node
    ``nodes[r]``: ``(num_nodes, gpus_per_node)`` when the ranks span nodes,
    None when they share one, or the UnsupportedError to raise at a call for
    a layout the hierarchical plans do not take (nodes of different sizes, or
    ranks of a node not numbered consecutively)."""
    order = list(dict.fromkeys(nodes))  # node keys, first appearance first
    if len(order) == 1:
        return None
    per = len(nodes) // len(order)
    node_major = all(nodes[i] == order[i // per] for i in range(len(nodes)))
    if len(nodes) % len(order) != 0 or not node_major:
        counts = {k: nodes.count(k) for k in order}
        return UnsupportedError(
            f"communicator '{name}' spans {len(order)} nodes with ranks {nodes} (per node {counts}); "
            "pyccl's collectives across nodes need the same number of ranks on every node, numbered node "
            "by node (as torchrun numbers them)")
    return len(order), per


def node_layout(comm) -> Optional[Tuple[int, int]]:
    """``(num_nodes, gpus_per_node)`` when the communicator's ranks span
    nodes, None when they share one. Raises UnsupportedError for a layout the
    hierarchical plans do not take (see :func:`layout_of`)."""
    layout = comm._node_layout
    if isinstance(layout, UnsupportedError):
        raise layout
    return layout


def _plan_for(collective: str, layout: Tuple[int, int], nbytes: int):
    """The plan for this collective and size (its name tells it apart)."""
    from .algorithms import HIERARCHICAL

    nodes, per_node = layout
    options = {}
    if collective != "all_reduce":
        name = {"all_gather": "allgather_hierarchical", "reduce_scatter": "reduce_scatter_hierarchical"}[collective]
    elif nbytes > LL_MAX_BYTES:
        name = "allreduce_2ph_hb"
    else:
        name = "allreduce_2ph_ll"
        pieces = LL_PIPELINE if LL_PIPELINE is not None else (None if nbytes >= LL_PIPELINE_MIN_BYTES else 1)
        options = {"pipeline": pieces}
    return registry.cached_plan((name, nodes, per_node, tuple(options.items())),
                                lambda: HIERARCHICAL[name](nodes, per_node, **options).lower())


def _check(collective: str, tensor: torch.Tensor, out: torch.Tensor, comm, out_elements: int) -> None:
    if collective != "all_gather" and tensor.dtype not in REDUCIBLE_DTYPES:
        raise InvalidArgumentError(f"invalid argument 'tensor': {collective} reduces "
                                   f"{', '.join(str(d) for d in REDUCIBLE_DTYPES)}, not {tensor.dtype}")
    if not tensor.is_contiguous():
        raise InvalidArgumentError("invalid argument 'tensor': must be contiguous")
    if tensor.device != comm.device:
        raise InvalidArgumentError(f"invalid argument 'tensor': is on {tensor.device}, the communicator on "
                                   f"{comm.device}")
    if not isinstance(out, torch.Tensor) or out.dtype != tensor.dtype or out.device != tensor.device:
        raise InvalidArgumentError("invalid argument 'out': must be a tensor of the input's dtype and device")
    if not out.is_contiguous() or out.numel() != out_elements:
        raise InvalidArgumentError(f"invalid argument 'out': must be contiguous with {out_elements} elements, "
                                   f"has {out.numel()}")


def run(comm, collective: str, tensor: torch.Tensor, out: torch.Tensor, op: str = "sum",
        fallback: Optional[Callable[[], None]] = None) -> bool:
    """Runs the collective across nodes if the communicator spans them (False
    otherwise). `fallback` (NCCL, where the group has it) runs the call when
    the plan cannot be set up now: a first call of this size while a CUDA
    graph is being captured."""
    layout = node_layout(comm)
    if layout is None:
        return False
    world = comm.world_size
    n = tensor.numel()
    out_elements = {"all_reduce": n, "all_gather": n * world, "reduce_scatter": n // world}[collective]
    _check(collective, tensor, out, comm, out_elements)
    if n == 0:
        return True
    elem = tensor.element_size()
    nbytes = n * elem * (world if collective == "all_gather" else 1)
    plan = _plan_for(collective, layout, nbytes)
    unit = plan.buffers["input"]
    # Elements per chunk-unit of the input: all-reduce and all-gather pad the
    # whole input, reduce-scatter each rank's part.
    parts = world if collective == "reduce_scatter" else 1
    per_part = n // parts
    part_unit = unit // parts
    padded_part = -(-per_part // part_unit) * part_unit
    limit = 1 << max(16, (padded_part * parts * elem - 1).bit_length())
    runner = registry._runner(comm, f"across_nodes {plan.name} {limit}", tensor, lambda: plan, max_bytes=limit)
    if runner is None:
        if fallback is None:
            raise UnsupportedError(f"{collective} across nodes: the first call of {nbytes} bytes is being captured "
                                   "in a CUDA graph, and the plan's buffers cannot be set up during a capture; run "
                                   "one call of this size eagerly first")
        fallback()
        return True
    if padded_part == per_part:
        runner(tensor, out=out, op=op)
        return True
    padded = tensor.new_zeros(parts, padded_part)
    padded[:, :per_part] = tensor.view(parts, per_part)
    result = runner(padded.view(-1), op=op)
    if collective == "all_gather":
        out.view(world, n).copy_(result.view(world, padded_part)[:, :n])
    elif collective == "reduce_scatter":
        out.copy_(result[:per_part])
    else:
        out.copy_(result[:n])
    return True
