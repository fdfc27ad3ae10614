"""Graph buffers: zero-copy all-reduces on plain tensors inside CUDA graphs.

A CUDA graph replays its all-reduces on the same addresses every time. Inside
:func:`graph_capture`, pyccl chooses a captured all-reduce on plain tensors as
if its input and output were symmetric buffers (the tuning table's
``all_reduce_symmetric`` entries), and where that is zero-copy 2PA HB, the
captured kernel reads every rank's input and writes every rank's output
directly, with no staging through scratch. The ranks' addresses are exchanged
when the block exits, after the capture; the graph may replay from then on::

    with pyccl.graph_capture(group):
        with torch.cuda.graph(g):
            y = pyccl.all_reduce(x, group=group)
    g.replay()

vLLM's custom all-reduce registers its graph buffers the same way. Rules:

* every rank captures the same collectives in the same order (as always), and
  enters and exits the block together: the exit is collective;
* enter the block before the capture begins (it allocates), and replay the
  graph only after the block has exited. A replay before that computes
  nothing and breaks the communicator with an error that says so;
* the captured tensors' memory must stay where it is while the graph may
  replay, as the graph's private memory pool keeps it. Their registrations
  are held until the communicator closes.

Outside the block, or on tensors the choice does not take zero-copy, captured
all-reduces stage through scratch as usual. The block is a no-op in host mode,
where nothing is captured.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
import torch.distributed as dist

from . import _C
from ._logging import logger
from .collectives import communicator_for
from .communicator import Communicator
from .errors import InvalidArgumentError

__all__ = ["graph_capture"]


@contextlib.contextmanager
def graph_capture(group: Optional[dist.ProcessGroup] = None, *,
                  comm: Optional[Communicator] = None) -> Iterator[Communicator]:
    """Collective context manager: all-reduces on ``group`` (or ``comm``)
    captured in CUDA graphs inside it run zero-copy on their own tensors where
    the size calls for it (see the module docstring). Yields the communicator.
    With ``group``, ``pyccl.all_reduce`` on it and, where the group's backend is
    pyccl, ``torch.distributed.all_reduce`` on it both take graph buffers.

    On normal exit every rank registers its captured tensors and exchanges
    them (raising on every rank if the ranks captured different numbers of
    such calls). If the block raises, nothing is registered and the error goes
    on; the peers' exits then fail with the communicator's timeout, and the
    graph must not be replayed."""
    backend = None
    if comm is None:
        comm = communicator_for(group)
        # A pyccl group's communicator runs on the group's own engine, which the block below collects on.
        backend = _pyccl_backend(group) if comm.device.type == "cuda" and not comm._group_owned else None
    elif not isinstance(comm, Communicator):
        raise InvalidArgumentError(f"invalid argument 'comm': expected a pyccl.Communicator, got {type(comm).__name__}")
    if comm.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise InvalidArgumentError("graph_capture: enter the block before the CUDA graph capture begins (it sets up "
                                   "memory, which a capture does not allow)")
    engine = comm._collective_engine()
    engine.begin_graph_capture()
    if backend is not None:
        try:
            _C._backend_graph_capture(backend, "begin", comm.device.index)
        except BaseException:
            engine.abandon_graph_capture()
            raise
    try:
        yield comm
    except BaseException:
        engine.abandon_graph_capture()
        if backend is not None:
            _C._backend_graph_capture(backend, "abandon")
        raise
    try:
        registered = engine.finish_graph_capture()
    except BaseException:
        if backend is not None:
            _C._backend_graph_capture(backend, "abandon")
        raise
    if backend is not None:
        registered += _C._backend_graph_capture(backend, "finish")
    logger.info("communicator %s: %d captured all-reduce(s) on graph buffers", comm.name, registered)


def _pyccl_backend(group: Optional[dist.ProcessGroup]):
    """The group's CUDA backend where it is pyccl's (its dist.all_reduce then
    takes graph buffers too), else None."""
    pg = group if group is not None else dist.group.WORLD
    name = str(dist.get_backend(pg))
    if name != "pyccl" and "cuda:pyccl" not in name:
        return None
    return pg._get_backend(torch.device("cuda"))
