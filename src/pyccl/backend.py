"""The ``torch.distributed`` backend "pyccl".

Importing pyccl registers it (and torch imports pyccl on start-up through the
``torch.backends`` entry point, unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``)::

    dist.init_process_group("cuda:pyccl,cpu:pyccl")   # or "pyccl", or "cpu:gloo,cuda:pyccl"
    dist.all_reduce(x)                                 # pyccl's kernels, current stream

One GPU per rank, as with ProcessGroupNCCL. A group made for cuda
(``"pyccl"``, ``"cuda:pyccl,..."``, ``"cpu:gloo,cuda:pyccl"``) after every rank
of a host chose a GPU of its own (``torch.cuda.set_device(local_rank)``) sets
up its GPU buffers at once on that device; CUDA graphs can then capture its
first op. Otherwise (no ``set_device``, ranks sharing a GPU, or
``"cpu:pyccl,cuda:pyccl"``) that happens on the first CUDA op: on the device
``init_process_group(device_id=...)`` bound the group to, else on that op's
tensors' device; that op must not be under capture. A later op on another GPU
raises ValueError naming both devices. ``pyccl.communicator_for(group)`` and
``pyccl.all_reduce(..., group=group)`` run on the group's own communicator and
buffers (one runtime per group and device).

Ops: allreduce (+ coalesced), broadcast, reduce, allgather (list, of a size
per rank too; into_tensor, coalesced), reduce_scatter (list, tensor,
coalesced), all_to_all (list and single, uneven splits too), gather, scatter,
send/recv and barrier. Each op's algorithm is chosen by the group's selector,
the same choice as ``pyccl.all_reduce`` & co. make (``PYCCL_ALGO``, the tuning
table of the call's dtype, the defaults). On GPUs, the calls it hands to NCCL
(from ``pyccl.collectives.NCCL_MIN_BYTES`` per collective, or
``PYCCL_NCCL_MIN_BYTES`` for all) and the ops made of sends and receives (send/recv, gather, scatter,
uneven all-to-all and all-gather) go to a ProcessGroupNCCL the group keeps for
that (``PYCCL_NCCL_DELEGATE=0`` turns it off; those then run on pyccl's
send/recv kernels, matched in order per pair as ProcessGroupNCCL matches
them). CPU tensors run in host mode, where they go through the store.
Coalescing blocks (``batch_isend_irecv``) hold their sends and receives and
run them together at the end, as an NCCL group does.

A group whose ranks span nodes (``torchrun --nnodes``) runs allreduce,
all_gather_into_tensor and reduce_scatter_tensor on :mod:`pyccl.across_nodes`
(2PH and friends, NVLink inside a node, sockets between), and hands every
other op to its ProcessGroupNCCL; CPU groups take those three only.
"""

from __future__ import annotations

import datetime
import socket
from typing import Optional

import torch
import torch.distributed as dist

from . import _C, _env, across_nodes, registry
from ._logging import logger
from .communicator import Communicator
from .dispatch import selector_config, table_for
from .errors import UnsupportedError
from .tuning import kernel_choices

__all__ = ["register"]

def _delegate(store, rank: int, size: int, timeout: datetime.timedelta, device: int):
    if size < 2 or not _env.flag("PYCCL_NCCL_DELEGATE", True) or not dist.is_nccl_available():
        return None
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    nccl = dist.ProcessGroupNCCL(dist.PrefixStore("nccl_delegate/", store), rank, size, options)
    # Connect now: a CUDA graph may capture the first op handed to it.
    nccl.eager_connect_single_device(torch.device("cuda", device))
    return nccl


def _made_for_cuda(store, rank: int) -> bool:
    """torch hands the creator a store prefixed with the device the backend is
    made for ("cuda/" or "cpu/"); find which, through the parent store."""
    key = f"pyccl/device_probe/{rank}"
    try:
        store.set(key, "1")
        # PrefixStore joins with "/": torch's prefix "cuda/" gives "cuda//<key>".
        parent = store.underlying_store
        found = any(parent.check([f"cuda{sep}{key}"]) for sep in ("//", "/"))
        store.delete_key(key)
        return found
    except Exception:  # noqa: BLE001 - a store without a parent: decide on the first op
        return False


def _ranks_chose_their_gpus(store, rank: int, size: int, timeout: datetime.timedelta) -> bool:
    """Collective: whether no two ranks of a host have the same current CUDA
    device, i.e. each chose its own (``torch.cuda.set_device``), so the group
    can set up its GPU side now. Ranks that never chose all stand on device 0
    while their tensors are on ``cuda:rank``: they bind at the first CUDA op."""
    mine = f"{socket.gethostname()}/{torch.cuda.current_device()}"
    store.set(f"pyccl/bind_probe/{rank}", mine)
    keys = [f"pyccl/bind_probe/{q}" for q in range(size)]
    store.wait(keys, timeout)
    seen = [store.get(k).decode() for k in keys]
    return len(set(seen)) == size


def _group_timeout(timeout) -> datetime.timedelta:
    """The group's timeout. torch gives backends other than NCCL its 30-minute
    default when init_process_group names none; pyccl then takes
    ProcessGroupNCCL's default (10 minutes), which it stands in for. Any other
    value is used as given."""
    from torch.distributed import constants

    if not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=float(timeout))
    nccl_default = getattr(constants, "default_pg_nccl_timeout", None)
    if timeout == constants.default_pg_timeout and isinstance(nccl_default, datetime.timedelta):
        return nccl_default
    return timeout


def _plan_runner():
    """The backend's runner of the DSL plans its selector chooses (a
    registered plan, or a library plan its tuning table names) and has not
    found set up in the lane's table: on the Python communicator adopting the
    lane's, which sets the plan up there, for every entry point on the group."""

    def run(collective: str, native, plans, plan_id: int, entry, slot, tensor: torch.Tensor, out: torch.Tensor,
            op: str) -> None:
        comm = Communicator._adopt(native, plans=plans)
        runner = registry.chosen_runner(comm, plan_id, entry, slot, tensor)
        if runner is None:
            nbytes = tensor.numel() * tensor.element_size()
            raise UnsupportedError(f"{collective}: the plan chosen for {nbytes} bytes of input cannot be set up while "
                                   "a CUDA graph is being captured; run one call of this size eagerly first")
        registry.run(runner, collective, tensor, out, op)

    return run


def _across_nodes_runner():
    """The backend's runner of collectives on a group that spans nodes
    (pyccl.across_nodes), over the Python communicator adopting each lane's."""

    def run(collective: str, native, tensor: torch.Tensor, out: torch.Tensor, op: str) -> None:
        across_nodes.run(Communicator._adopt(native), collective, tensor, out, op)

    return run


def _create(options, backend_options) -> "torch._C._distributed_c10d.Backend":
    """The creator torch calls for each group (extended API)."""
    store, rank, size = options.store, options.group_rank, options.group_size
    timeout = _group_timeout(options.timeout)
    device = -1
    table = None
    gpu_selector = {"world": size, "nccl_min_bytes": [0] * 5}
    if _C.cuda_built() and torch.cuda.is_available():
        if _made_for_cuda(store, rank) and _ranks_chose_their_gpus(store, rank, size, timeout):
            device = torch.cuda.current_device()
        # The GPUs of a node are alike: the current one names the tables, wherever the group binds.
        gpu = torch.device("cuda", torch.cuda.current_device())
        table = table_for(gpu, size, torch.bfloat16)
        gpu_selector = selector_config(gpu, size)
    host_selector = selector_config(torch.device("cpu"), size)
    name = f"pg{options.group_id}"
    logger.info("pyccl backend for group %s: rank %d of %d, %s", options.group_id, rank, size,
                f"on cuda:{device}" if device >= 0 else "GPU bound at the first CUDA op")

    def delegate(dev: int):
        return _delegate(store, rank, size, timeout, dev)

    return _C._make_backend(store, rank, size, int(timeout.total_seconds() * 1000), name, device, gpu_selector,
                            host_selector, delegate, _across_nodes_runner(), kernel_choices(table), _plan_runner())


def register() -> None:
    """Registers the backend "pyccl" for cuda and cpu (idempotent)."""
    if "PYCCL" in dist.Backend._plugins:
        return
    dist.Backend.register_backend("pyccl", _create, extended_api=True, devices=["cuda", "cpu"])


def is_pyccl_group(group: Optional[dist.ProcessGroup] = None) -> bool:
    """Whether ``group`` (default: the world) runs pyccl on its CUDA device."""
    try:
        return dist.get_backend(group).lower().find("pyccl") >= 0
    except Exception:  # noqa: BLE001
        return False
