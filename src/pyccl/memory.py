"""Memory peers can map: ``pyccl.empty``."""

from __future__ import annotations

import torch

from . import _C
from .errors import InvalidArgumentError

__all__ = ["empty"]


def empty(*size, dtype: torch.dtype = torch.float32, device="cpu") -> torch.Tensor:
    """An uninitialized tensor in memory that peers can map.

    On ``cpu`` the memory is shared host memory (what host mode registers); on
    ``cuda`` it is a cuMem allocation exportable to other processes. Zero-filled.
    """
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    if not isinstance(dtype, torch.dtype):
        raise InvalidArgumentError(f"invalid argument 'dtype': expected a torch.dtype (e.g. torch.bfloat16), got "
                                   f"{dtype!r}")
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if dev.type not in ("cpu", "cuda"):
        raise InvalidArgumentError(f"invalid argument 'device': must be cpu or cuda, got {device}")
    return _C.empty_shared([int(s) for s in size], dtype, str(dev))
