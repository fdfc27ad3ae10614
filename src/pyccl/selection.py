"""One collective call's choice, on the Python side: the tensor's checks,
the call's facts, and one question to its communicator's selector
(``csrc/dispatch/selector.hpp``, made from :mod:`pyccl.dispatch`), which
alone chooses what runs the call. Every entry point (``pyccl.*``,
``torch.ops.pyccl.*``, the "pyccl" process group) asks the same one.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from .dispatch import OTHER_DTYPE, TABLE_DTYPE
from .errors import ClosedError, InvalidArgumentError


def check_tensor(tensor) -> None:
    """A dense torch tensor with data, whose contiguous copy (made where it is
    not contiguous) fits its device, else InvalidArgumentError naming 'tensor'
    before anything is allocated."""
    if not isinstance(tensor, torch.Tensor) or tensor.layout is not torch.strided:
        raise InvalidArgumentError(
            f"invalid argument 'tensor': expected a dense torch.Tensor, got "
            f"{tensor.layout if isinstance(tensor, torch.Tensor) else type(tensor).__name__}")
    if tensor.is_meta:
        raise InvalidArgumentError("invalid argument 'tensor': a meta tensor has no data to communicate")
    if not tensor.is_contiguous():
        # An expanded view (stride 0) may name far more elements than memory holds; its copy would fail in the
        # allocator.
        nbytes = tensor.numel() * tensor.element_size()
        capacity = _memory_of(tensor.device)
        if nbytes > capacity:
            raise InvalidArgumentError(
                f"invalid argument 'tensor': not contiguous, and its contiguous copy ({nbytes} bytes, "
                f"{tensor.numel()} elements of shape {tuple(tensor.shape)} and strides {tensor.stride()}) would not "
                f"fit the {capacity} bytes of {tensor.device}; pass a contiguous tensor")


def _memory_of(device: torch.device) -> int:
    """The bytes of memory of `device` (a GPU's total, the host's physical memory)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class _Call:
    """What every collective resolves first: the communicator, the call's
    facts, and the selector's choice for them (``route``: "kernel", "plan",
    "nccl" or "across_nodes"; for a plan, ``plan_slot``: the key its runner
    is kept under on the communicator, and the input bytes it is set up for).

    `comm` is the call's communicator (a pyccl.Communicator, checked by the
    caller); `nccl`: the caller can hand the call to NCCL (a torch group's
    communicator whose group has an NCCL backend)."""

    __slots__ = ("comm", "nbytes", "route", "algorithm", "symmetric", "registered_plan", "tuned_plan", "source",
                 "plan_slot", "nccl_here", "_question")

    def __init__(self, collective: str, tensor: torch.Tensor, comm, algorithm: Optional[str], nccl: bool = False,
                 gathers: bool = False) -> None:
        check_tensor(tensor)
        if comm._comm.closed:
            raise ClosedError(f"{collective}: communicator '{comm.name}' is closed")
        if algorithm is not None and not isinstance(algorithm, str):
            raise InvalidArgumentError(f"invalid argument 'algorithm': expected a string or None, got "
                                       f"{type(algorithm).__name__}")
        self.comm = comm
        nbytes = tensor.numel() * tensor.element_size()
        if gathers:
            nbytes *= comm.world_size
        self.nbytes = nbytes
        nccl_here = self.nccl_here = nccl and tensor.is_cuda
        question = self._question = (collective, TABLE_DTYPE.get(tensor.dtype, OTHER_DTYPE), nbytes, tensor.numel(),
                                     algorithm, nccl_here)
        self._take(comm._selector.select(*question, True))

    def _take(self, choice: tuple) -> None:
        route, algorithm, symmetric, plan, entry, self.source, self.plan_slot = choice
        self.route, self.algorithm, self.symmetric = route, algorithm or None, symmetric or None
        self.registered_plan, self.tuned_plan = plan, entry

    def without_plans(self) -> None:
        """The choice again, plans left out: the one chosen could not be set up
        now (its first use during a CUDA-graph capture)."""
        self._take(self.comm._selector.select(*self._question, False))

    @property
    def forced(self) -> bool:
        return self.source in ("argument", "PYCCL_ALGO")

    @property
    def use_nccl(self) -> bool:
        return self.route == "nccl"

    @property
    def spans_nodes(self) -> bool:
        return self.route == "across_nodes"

    @property
    def kernel_algorithm(self) -> Optional[str]:
        return self.algorithm if self.route == "kernel" else None
