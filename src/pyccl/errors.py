"""Exceptions raised by pyccl (defined by the C++ core, re-exported here).

- ``PycclError`` (a ``RuntimeError``): base of all of them.
- ``InvalidArgumentError`` (also a ``ValueError``): a bad argument, named in the message.
- ``PycclTimeoutError`` (also a ``TimeoutError``): a bounded wait ran out; names op and peer.
- ``AbortedError``: the communicator was aborted.
- ``ClosedError``: the communicator or memory was destroyed.
- ``PycclTypeError`` (also a ``TypeError``): an unsupported dtype or dtype/op pair.
- ``CudaError``, ``UnsupportedError`` (also ``NotImplementedError``), ``RemoteError``.
"""

from ._C import (  # noqa: F401
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
