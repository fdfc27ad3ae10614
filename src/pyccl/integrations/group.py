"""The engine-neutral half of the integrations: pyccl's collectives for one
torch process group, in the shape inference engines call them.

vLLM's device communicators and SGLang's custom all-reduce both ask the same
things of a collective library: out-of-place all-reduce, all-gather and
reduce-scatter along a dimension, a check of whether a tensor should go
through it at all, and a way to close it. :class:`GroupCommunicator` answers
them with pyccl's kernels; the engine adapters (``pyccl.integrations.vllm``,
``pyccl.integrations.sglang``) route a call here when :meth:`should_use`
says so, and to the engine's own NCCL path otherwise. That covers the sizes
where NCCL's ring is faster (from ``PYCCL_NCCL_MIN_BYTES`` or the tuning
table's hand-over point), so the engine is never slower for having pyccl.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
import torch.distributed as dist

from .._logging import logger
from ..collectives import REDUCIBLE_DTYPES, all_gather, all_reduce, reduce_scatter
from ..communicator import Communicator
from ..errors import ClosedError, InvalidArgumentError
from ..fused import FUSED_MAX_BYTES, fused_all_reduce_rmsnorm, operand_error
from ..group_communicators import communicator_for

__all__ = ["GroupCommunicator", "MAX_KERNEL_RANKS", "REDUCIBLE_DTYPES", "unsupported_reason", "warn_if_untested"]

_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "fused_all_reduce_rmsnorm")


_warned_versions: set = set()


def warn_if_untested(engine: str, installed: str, tested: str) -> bool:
    """Logs a warning, once per engine and version, where the ``installed`` version of ``engine`` is not the one
    its adapter was written and tested for; returns whether it differs."""
    if installed == tested:
        return False
    if (engine, installed) not in _warned_versions:
        _warned_versions.add((engine, installed))
        logger.warning("pyccl's %s adapter is written and tested for %s %s; %s %s is installed: it runs as far "
                       "as that version's interfaces are the same", engine, engine, tested, engine, installed)
    return True


#: The world sizes pyccl's kernels run (csrc/algorithms/collective_context.hpp, kMaxCollectiveRanks).
MAX_KERNEL_RANKS = 8


def unsupported_reason(topology: dict, on_gpu: bool) -> Optional[str]:
    """Why pyccl's kernels cannot serve a group of this ``topology`` (a communicator's ``topology()``), or None:
    ranks on more than one node (there pyccl would stage every message through the host), a pair of GPUs whose
    peer access the communicator's probe did not prove, or more ranks than the kernels run. Every rank of a group
    sees the same topology, so every rank gives the same answer."""
    ranks = topology["ranks"]
    if len(ranks) > MAX_KERNEL_RANKS:
        return f"{len(ranks)} ranks: pyccl's kernels run at most {MAX_KERNEL_RANKS}"
    if not all(r["same_node"] for r in ranks):
        nodes = sorted({str(r["node"]) for r in ranks})
        return f"the ranks span {len(nodes)} nodes"
    if on_gpu:
        p2p = topology["p2p"]
        missing = [(a, b) for a in range(len(ranks)) for b in range(len(ranks)) if a != b and not p2p[a][b]]
        if missing:
            a, b = missing[0]
            return f"no peer access between the GPUs of ranks {a} and {b} (the communicator's probe)"
    return None


def _positive_dim(dim: int, tensor: torch.Tensor) -> int:
    if not isinstance(dim, int) or not -tensor.dim() <= dim < tensor.dim():
        raise InvalidArgumentError(f"invalid argument 'dim': {dim!r} is out of range for a tensor of shape "
                                   f"{tuple(tensor.shape)}")
    return dim + tensor.dim() if dim < 0 else dim


class GroupCommunicator:
    """pyccl collectives over the ranks of ``cpu_group``, on ``device``.

    Collective to make: every rank of the group constructs it at the same point
    (as engines construct their device communicators). It makes (or reuses) the
    group's pyccl communicator, so that no set-up is left for the first call;
    calls may then be captured in CUDA graphs.

    Args:
        cpu_group: the torch process group whose ranks take part (engines pass
            their gloo group; pyccl uses only its ranks and the default store).
        device: a CUDA device, or ``cpu`` for host mode (tests); default: the
            current CUDA device (host mode where there is none).
        device_group: the group's NCCL process group, used for send/recv.
        max_bytes: the largest message (bytes of the input) that :meth:`should_use`
            accepts, for every collective; default: per collective, where the
            tuning table (or ``PYCCL_NCCL_MIN_BYTES``) hands messages to NCCL.
        comm: a pyccl Communicator to use instead of the group's.
    """

    def __init__(self, cpu_group: Optional[dist.ProcessGroup], device: Union[str, torch.device, None] = None,
                 device_group: Optional[dist.ProcessGroup] = None, *, max_bytes: Optional[int] = None,
                 comm: Optional[Communicator] = None) -> None:
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes < 0):
            raise InvalidArgumentError(f"invalid argument 'max_bytes': expected a byte count >= 0, got {max_bytes!r}")
        self.cpu_group = cpu_group
        self.device_group = device_group
        self.comm = comm if comm is not None else communicator_for(cpu_group, self.device)
        self.world_size = self.comm.world_size
        self.rank = self.comm.rank
        self._max_bytes = max_bytes
        #: Why pyccl's kernels cannot serve this group (unsupported_reason), or None.
        self.unsupported: Optional[str] = unsupported_reason(self.comm.topology(), self.device.type == "cuda")
        #: Set to stop routing calls here (the engine's own path takes them).
        self.disabled = self.world_size < 2 or self.unsupported is not None
        if self.unsupported is not None:
            logger.info("pyccl group communicator: rank %d of %d stays out (%s); the engine's own path runs",
                        self.rank, self.world_size, self.unsupported)
        else:
            logger.info("pyccl group communicator: rank %d of %d on %s", self.rank, self.world_size, self.device)

    # -- selection ----------------------------------------------------------------------------------------------

    def max_bytes(self, collective: str, dtype: torch.dtype) -> int:
        """The largest message of ``collective`` that :meth:`should_use` takes."""
        if self._max_bytes is not None:
            return self._max_bytes
        if collective == "fused_all_reduce_rmsnorm":
            return FUSED_MAX_BYTES
        # Below where the communicator's selector hands every size to NCCL (pyccl.dispatch).
        return self.comm._selector.nccl_from(collective, dtype) - 1

    def should_use(self, tensor: torch.Tensor, collective: str = "all_reduce") -> bool:
        """Whether ``collective`` on ``tensor`` should go through pyccl: the
        group is one pyccl's kernels serve (one node, peer access proven, at
        most MAX_KERNEL_RANKS ranks: :attr:`unsupported`), the tensor is
        contiguous, on this device, of a dtype the collective takes, and at
        most :meth:`max_bytes` (the message of an all-gather is the gathered
        tensor). False when disabled or closed; never raises for a tensor.
        Every rank answers alike for the same call."""
        if collective not in _COLLECTIVES:
            raise InvalidArgumentError(f"invalid argument 'collective': {collective!r} is not one of "
                                       f"{', '.join(_COLLECTIVES)}")
        if self.disabled or self.comm.closed or not isinstance(tensor, torch.Tensor):
            return False
        if tensor.device != self.device or not tensor.is_contiguous() or tensor.numel() == 0:
            return False
        if collective != "all_gather" and tensor.dtype not in REDUCIBLE_DTYPES:
            return False
        nbytes = tensor.numel() * tensor.element_size()
        if collective == "all_gather":
            nbytes *= self.world_size
        return nbytes <= self.max_bytes(collective, tensor.dtype)

    def should_fuse(self, input_: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> bool:
        """Whether the all-reduce of ``input_`` + residual add + RMSNorm with ``weight`` should go through
        :meth:`fused_all_reduce_rmsnorm`: :meth:`should_use` takes ``input_`` for the fused collective, and
        the operands are ones pyccl's fused call takes as given (``pyccl.fused.operand_error``: the residual
        of the input's shape, a 1-D weight over its last dimension, all of one dtype, on one device,
        contiguous). An engine's norm takes more (a weight of another dtype, or none); those calls stay on the
        engine's own path. Never raises for a tensor; every rank answers alike for the same call."""
        return (self.should_use(input_, "fused_all_reduce_rmsnorm")
                and operand_error(input_, residual, weight) is None)

    # -- collectives --------------------------------------------------------------------------------------------

    def _check_open(self, what: str) -> None:
        if self.comm.closed:
            raise ClosedError(f"{what}: the pyccl group communicator is closed (destroy() was called)")

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        """Sum of ``input_`` over the ranks, in a new tensor (``input_`` is left
        as it is). Enqueued on the current stream; capturable in CUDA graphs."""
        self._check_open("all_reduce")
        return all_reduce(input_, comm=self.comm)

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's ``input_`` concatenated in rank order along ``dim``."""
        self._check_open("all_gather")
        dim = _positive_dim(dim, input_)
        shape = tuple(input_.shape)
        gathered = all_gather(input_.contiguous(), comm=self.comm)
        if dim == 0:
            return gathered
        # (world * n0, ...) -> (world, n0, ...) -> world moved next to dim, merged into it.
        gathered = gathered.reshape((self.world_size,) + shape).movedim(0, dim)
        return gathered.reshape(shape[:dim] + (self.world_size * shape[dim],) + shape[dim + 1:])

    def reduce_scatter(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Sum over the ranks of ``input_``, split in ``world_size`` equal parts
        along ``dim``; rank r gets part r."""
        self._check_open("reduce_scatter")
        dim = _positive_dim(dim, input_)
        if input_.shape[dim] % self.world_size != 0:
            raise InvalidArgumentError(f"invalid argument 'input_': dimension {dim} has {input_.shape[dim]} entries, "
                                       f"not a multiple of the {self.world_size} ranks")
        moved = input_.movedim(dim, 0).contiguous()
        part = reduce_scatter(moved, comm=self.comm)
        return part.movedim(0, dim).contiguous() if dim != 0 else part

    def all_gather_into(self, output: torch.Tensor, input_: torch.Tensor) -> None:
        """Every rank's ``input_`` concatenated in rank order into ``output`` (``world_size`` times its elements,
        laid out as ``torch.distributed.all_gather_into_tensor`` lays them out)."""
        self._check_open("all_gather_into")
        all_gather(input_, out=output, comm=self.comm)

    def reduce_scatter_into(self, output: torch.Tensor, input_: torch.Tensor) -> None:
        """Part r of the sum over the ranks of ``input_`` (its elements in ``world_size`` equal parts, as
        ``torch.distributed.reduce_scatter_tensor`` splits them) into ``output`` on rank r."""
        self._check_open("reduce_scatter_into")
        reduce_scatter(input_, out=output, comm=self.comm)

    def fused_all_reduce_rmsnorm(self, input_: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                                 eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
        """``pyccl.fused_all_reduce_rmsnorm`` on this group: (normed, new residual)."""
        self._check_open("fused_all_reduce_rmsnorm")
        return fused_all_reduce_rmsnorm(input_, residual, weight, eps, comm=self.comm)

    # -- point to point -----------------------------------------------------------------------------------------

    def _p2p_group(self) -> dist.ProcessGroup:
        return self.device_group if self.device_group is not None else self.cpu_group

    def _peer(self, peer: Optional[int], step: int, name: str) -> int:
        if peer is None:
            peer = (self.rank + step) % self.world_size
        if not isinstance(peer, int) or not 0 <= peer < self.world_size or peer == self.rank:
            raise InvalidArgumentError(f"invalid argument '{name}': {peer!r} is not another rank of the group "
                                       f"(0..{self.world_size - 1}, this rank is {self.rank})")
        return dist.get_global_rank(self._p2p_group(), peer)

    def send(self, tensor: torch.Tensor, dst: Optional[int] = None) -> None:
        """Sends ``tensor`` to group rank ``dst`` (default: the next rank),
        through the device group (NCCL on GPUs): pyccl has no point-to-point
        kernel faster than NCCL's."""
        dist.send(tensor, self._peer(dst, 1, "dst"), group=self._p2p_group())

    def recv(self, size: torch.Size, dtype: torch.dtype, src: Optional[int] = None) -> torch.Tensor:
        """Receives a tensor of ``size`` and ``dtype`` from group rank ``src``
        (default: the previous rank)."""
        tensor = torch.empty(size, dtype=dtype, device=self.device)
        dist.recv(tensor, self._peer(src, -1, "src"), group=self._p2p_group())
        return tensor

    # -- life cycle ---------------------------------------------------------------------------------------------

    def destroy(self) -> None:
        """Closes the pyccl communicator (idempotent); later calls raise ClosedError."""
        if not self.comm.closed:
            self.comm.close()
        self.disabled = True

    close = destroy

    def __repr__(self) -> str:
        state = "closed" if self.comm.closed else ("disabled" if self.disabled else "open")
        return f"GroupCommunicator(rank={self.rank}, world_size={self.world_size}, device={self.device}, {state})"
