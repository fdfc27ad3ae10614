"""Symmetric buffers: memory that every rank of a group allocates (or
registers) alike, so that collectives on it read and write the peers' memory
directly instead of staging through pyccl's scratch.

An all-reduce whose input and output both lie in symmetric buffers, at the
same offset on every rank (as with torch's symmetric memory), runs the
zero-copy two-phase kernel from ``engine.zero_copy_threshold_bytes`` on: rank
r reads chunk r of every rank's input over NVLink, reduces it, and writes the
result into chunk r of every rank's output.

    buf = pyccl.symmetric_empty(1 << 20, dtype=torch.bfloat16)   # collective
    buf.copy_(x)
    pyccl.all_reduce(buf, out=buf)                                 # zero-copy, in place

Registering is collective (every rank, same order, same size); a buffer stays
registered, and its memory alive, until the communicator closes.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from .communicator import Communicator
from .errors import InvalidArgumentError
from .group_communicators import given_or_group_communicator
from .memory import empty

__all__ = ["is_symmetric", "register_symmetric", "symmetric_empty"]


def _checked_tensor(tensor) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(f"invalid argument 'tensor': expected a torch.Tensor, got {type(tensor).__name__}")
    return tensor


def register_symmetric(tensor: torch.Tensor, group: Optional[dist.ProcessGroup] = None, *,
                       comm: Optional[Communicator] = None) -> torch.Tensor:
    """Collective: makes ``tensor`` (contiguous, on the communicator's device,
    the same number of bytes on every rank) a symmetric buffer of the group and
    returns it. Tensors from torch's allocator and from :func:`pyccl.empty`
    both work; the registration holds a reference to ``tensor``."""
    c = given_or_group_communicator(comm, group, _checked_tensor(tensor).device)
    memory = c.register(tensor)
    c._collective_engine().register_symmetric(memory)
    return tensor


def symmetric_empty(*size, dtype: torch.dtype = torch.float32, group: Optional[dist.ProcessGroup] = None,
                    comm: Optional[Communicator] = None) -> torch.Tensor:
    """Collective: a new tensor of ``size`` on the communicator's device,
    registered as a symmetric buffer of the group (see the module docstring)."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    comm = given_or_group_communicator(comm, group)  # the group's on the current CUDA device, or the CPU
    return register_symmetric(empty(*size, dtype=dtype, device=comm.device), comm=comm)


def is_symmetric(tensor: torch.Tensor, group: Optional[dist.ProcessGroup] = None, *,
                 comm: Optional[Communicator] = None) -> bool:
    """Whether ``tensor``'s bytes lie within one symmetric buffer of the group."""
    c = given_or_group_communicator(comm, group, _checked_tensor(tensor).device)
    engine = c._engine
    return engine is not None and engine.is_symmetric(tensor)
