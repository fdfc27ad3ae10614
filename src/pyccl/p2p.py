"""Point-to-point: ``pyccl.send``, ``pyccl.recv`` and ``pyccl.send_recv``.

What ``ncclSend`` and ``ncclRecv`` do, on pyccl's kernels (see
``csrc/algorithms/p2p.cu``): each call runs on the current CUDA
stream (host mode: on CPU threads, returning when done) and can be captured in
a CUDA graph. Only the two ranks of a transfer take part::

    if rank == 0:
        pyccl.send(x, dst=1)
    elif rank == 1:
        pyccl.recv(y, src=0)              # y: x's size (any dtype or shape)

- Matching: the n-th send from rank a to rank b meets the n-th receive from a
  on b, as in NCCL (no tags); their sizes in bytes must agree. A receive that
  meets a send of another size raises on the receiving rank and breaks the
  communicator.
- A send of up to ``engine.p2p_buffered_bytes`` (8 MiB on 2 GPUs) completes
  before its receive starts; a larger one waits for it. So two ranks that each
  send a large message before receiving the other's must use ``send_recv``,
  which runs its transfers together (as ``ncclGroupStart``/``ncclGroupEnd``).
- The group's communicator is made collectively on first use: call
  ``pyccl.communicator_for(group)`` (or any collective) on every rank of the
  group before the first send or receive.
- Ranks are ranks of ``group`` (as ``group_dst``/``group_src`` in
  ``torch.distributed``). Tensors must be contiguous; any dtype.
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Tuple

import torch
import torch.distributed as dist

from .communicator import Communicator
from .errors import InvalidArgumentError
from .group_communicators import given_or_group_communicator

__all__ = ["recv", "send", "send_recv"]


def _peer(value, arg: str, comm: Communicator) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"invalid argument '{arg}': expected a rank (int), got {value!r}")
    if not 0 <= value < comm.world_size or value == comm.rank:
        raise InvalidArgumentError(f"invalid argument '{arg}': must be another rank of the group (0 to "
                                   f"{comm.world_size - 1}, not {comm.rank}), got {value}")
    return value


def _pairs(pairs: Iterable[Tuple[torch.Tensor, int]], arg: str) -> List[Tuple[torch.Tensor, int]]:
    if isinstance(pairs, torch.Tensor) or not hasattr(pairs, "__iter__"):
        raise InvalidArgumentError(f"invalid argument '{arg}': expected (tensor, rank) pairs, got "
                                   f"{type(pairs).__name__}")
    out = []
    for i, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not isinstance(pair[0], torch.Tensor):
            raise InvalidArgumentError(f"invalid argument '{arg}': entry {i} must be a (tensor, rank) pair, "
                                       f"got {pair!r}")
        out.append((pair[0], pair[1]))
    return out


def send_recv(sends: Iterable[Tuple[torch.Tensor, int]] = (), recvs: Iterable[Tuple[torch.Tensor, int]] = (),
              group: Optional[dist.ProcessGroup] = None, *, comm: Optional[Communicator] = None) -> None:
    """Sends and receives together, in one launch where it can: each
    ``(tensor, dst)`` of ``sends`` goes to rank ``dst``, each ``(tensor, src)``
    of ``recvs`` is filled from rank ``src``. A second send to the same rank
    (or receive from it) starts a further launch, after the first."""
    sends, recvs = _pairs(sends, "sends"), _pairs(recvs, "recvs")
    if not sends and not recvs:
        return
    comm = given_or_group_communicator(comm, group, (sends or recvs)[0][0].device)
    transfers = [(True, _peer(dst, "dst", comm), t) for t, dst in sends]
    transfers += [(False, _peer(src, "src", comm), t) for t, src in recvs]
    comm._collective_engine().send_recv(comm._comm, transfers)


def send(tensor: torch.Tensor, dst: int, group: Optional[dist.ProcessGroup] = None, *,
         comm: Optional[Communicator] = None) -> None:
    """Sends ``tensor`` to rank ``dst`` of the group, on the current stream."""
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(f"invalid argument 'tensor': expected a torch.Tensor, got {type(tensor).__name__}")
    send_recv(sends=[(tensor, dst)], group=group, comm=comm)


def recv(tensor: torch.Tensor, src: int, group: Optional[dist.ProcessGroup] = None, *,
         comm: Optional[Communicator] = None) -> torch.Tensor:
    """Fills ``tensor`` with what rank ``src`` of the group sends, on the
    current stream; returns it."""
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(f"invalid argument 'tensor': expected a torch.Tensor, got {type(tensor).__name__}")
    send_recv(recvs=[(tensor, src)], group=group, comm=comm)
    return tensor
