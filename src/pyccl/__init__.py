"""pyccl: GPU collective communication for PyTorch inference engines.

The runtime core is in the extension module ``pyccl._C``; this package adds the
Python API on top of it::

    import pyccl
    comm = pyccl.Communicator(store, rank, world_size, device="cuda:0")
    buf = pyccl.empty(1024, dtype=torch.float32, device="cuda:0")
    peers = comm.exchange(comm.register(buf))
"""

from __future__ import annotations

import os

import torch  # noqa: F401  (loads libtorch and the CUDA runtime that _C links against)


def _check_torch(built: "str | None", running: str) -> None:
    """ImportError naming both versions unless this process's torch is the one
    pyccl was built against: the C++ extension links libtorch's C++ symbols,
    which change between torch releases and builds, and another torch fails
    with "undefined symbol" or worse. `built` is None in a tree not built yet
    (the import of _C says so)."""
    if built is not None and built != running:
        raise ImportError(
            f"pyccl was built for torch {built}, and this process has torch {running}: pyccl's C++ extension "
            f"loads only into the torch it was built against. Install torch=={built.split('+')[0]} (the "
            f"{built} build), or rebuild pyccl for this torch: bash scripts/setup.sh in its checkout, or "
            "pip install --no-build-isolation <pyccl source>.")


try:
    from ._build import TORCH_VERSION as _BUILT_FOR  # written by the build, beside _C
except ImportError:
    _BUILT_FOR = None
_check_torch(_BUILT_FOR, torch.__version__)

from . import _C  # noqa: E402
from ._logging import logger
from .collectives import all_gather, all_reduce, all_to_all, broadcast, communicator_for, reduce_scatter
from .group_communicators import dump_history
from .communicator import Communicator
from .memory import empty
from .errors import (
    AbortedError,
    ClosedError,
    CudaError,
    InvalidArgumentError,
    PycclError,
    PycclTimeoutError,
    PycclTypeError,
    RemoteError,
    UnsupportedError,
)
from ._C import RegisteredMemory, Semaphore
from .backend import register as _register_backend

_register_backend()

from . import ops  # noqa: E402  (torch.ops.pyccl.*)
from .symmetric import is_symmetric, register_symmetric, symmetric_empty  # noqa: E402
from .registry import register_algorithm, registered_algorithms, unregister_algorithm  # noqa: E402
from .fused import fused_all_reduce_rmsnorm  # noqa: E402
from .graphs import graph_capture  # noqa: E402
from .p2p import recv, send, send_recv  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "AbortedError",
    "ClosedError",
    "Communicator",
    "CudaError",
    "InvalidArgumentError",
    "PycclError",
    "PycclTimeoutError",
    "PycclTypeError",
    "RegisteredMemory",
    "RemoteError",
    "Semaphore",
    "UnsupportedError",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "broadcast",
    "communicator_for",
    "reduce_scatter",
    "recv",
    "send",
    "send_recv",
    "cuda_available",
    "dump_history",
    "empty",
    "fused_all_reduce_rmsnorm",
    "graph_capture",
    "get_include",
    "is_symmetric",
    "logger",
    "register_algorithm",
    "register_symmetric",
    "registered_algorithms",
    "symmetric_empty",
    "unregister_algorithm",
]


def cuda_available() -> bool:
    """Whether this build has CUDA support and at least one GPU is visible."""
    return _C.cuda_built() and _C.device_count() > 0


def get_include() -> str:
    """The include directory of pyccl's public device headers: ``#include "channels/semaphore_device.hpp"``."""
    here = os.path.dirname(os.path.abspath(__file__))
    installed = os.path.join(here, "include")
    if os.path.isdir(installed):
        return installed
    # Editable installs: the headers are in the source tree.
    return os.path.abspath(os.path.join(here, "..", "..", "csrc"))
