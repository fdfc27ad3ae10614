"""The pyccl communicators of torch process groups: ``pyccl.communicator_for``.

A group's communicator is made on its first collective (or
``communicator_for``), collectively over the group's store, and kept for the
group's life: every eager collective looks it up, without a lock.
"""

from __future__ import annotations

import datetime
import threading
import weakref
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from . import _C
from ._logging import logger
from .calls import group_store, made_count
from .communicator import DEFAULT_TIMEOUT, Communicator
from .errors import InvalidArgumentError

__all__ = ["communicator_for", "dump_history"]

_lock = threading.Lock()
# (id(group), device) -> (a weak reference to the group, its communicator, whether the group has NCCL). The
# reference tells a live group from a new one that took a destroyed group's id.
_communicators: Dict[Tuple[int, torch.device], Tuple[weakref.ref, Communicator, bool]] = {}


def given_or_group_communicator(comm, group, device: Optional[torch.device] = None) -> Communicator:
    """`comm` where given (checked to be one), else the group's communicator
    (:func:`communicator_for`): what every call taking ``group`` and ``comm=``
    runs on."""
    if comm is None:
        return communicator_for(group, device)
    if not isinstance(comm, Communicator):
        raise InvalidArgumentError(f"invalid argument 'comm': expected a pyccl.Communicator, got "
                                   f"{type(comm).__name__}; a torch ProcessGroup goes in 'group'")
    return comm


def communicator_for(group: Optional[dist.ProcessGroup] = None, device: Optional[torch.device] = None) -> Communicator:
    """The pyccl communicator of a torch process group on ``device`` (made on
    first use, collectively, over the group's store). On a group whose backend
    for ``device`` is pyccl's (``init_process_group("pyccl")``), it is the
    group's own communicator, the one ``torch.distributed`` ops on the group run
    on: one runtime and one set of buffers per group and device, and the
    group's timeout. A group destroyed (``dist.destroy_process_group``) has its
    communicators closed when the next one is made, and a new group never gets
    them."""
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    return group_call(group, device)[0]


def dump_history(group: Optional[dist.ProcessGroup] = None, *, comm: Optional[Communicator] = None) -> List[dict]:
    """The flight recorder (:meth:`Communicator.history`) of `comm`, else of
    every open communicator of `group` (default: the world), each record with
    the communicator's ``name`` and ``rank``. It makes no communicator: a group
    that has run nothing on pyccl gives an empty list. The records go to the
    log too (``PYCCL_LOG_LEVEL=INFO``)."""
    if comm is not None:
        comms = [given_or_group_communicator(comm, group)]
    else:
        pg = group if group is not None else dist.group.WORLD
        comms = [entry[1] for key, entry in list(_communicators.items())
                 if key[0] == id(pg) and entry[0]() is pg and not entry[1]._comm.closed]
    records = []
    for c in comms:
        records += [dict(r, name=c.name, rank=c.rank) for r in c.history()]
        # The text a breaking communicator logs, in the same format.
        logger.info("communicator %r rank %d: %s", c.name, c.rank, c._comm.describe_history())
    return records


def group_call(group: Optional[dist.ProcessGroup], device: torch.device) -> Tuple[Communicator, bool]:
    """What a collective call on `group`'s tensors of `device` runs on: the
    group's communicator (:func:`communicator_for`) and whether the group has
    NCCL to hand calls to."""
    pg = group if group is not None else dist.group.WORLD  # None before init_process_group: never a key
    # Every eager collective asks: a live communicator is read without the lock
    # (one dict read, atomic in CPython); making one takes it.
    entry = _communicators.get((id(pg), device))
    # _comm.closed, the native flag: the property would add a call per collective.
    if entry is not None and entry[0]() is pg and not entry[1]._comm.closed:
        return entry[1], entry[2]
    return _made_for(group, pg, device)


def _made_for(group: Optional[dist.ProcessGroup], pg, device: torch.device) -> Tuple[Communicator, bool]:
    """group_call where the group has no live communicator on `device` yet:
    checks `group`, then makes one (collectively) and registers it."""
    if isinstance(group, Communicator):
        raise InvalidArgumentError("invalid argument 'group': got a pyccl.Communicator; pass it as comm=, "
                                   "group= takes a torch.distributed ProcessGroup")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise InvalidArgumentError(f"invalid argument 'group': expected a torch.distributed ProcessGroup or None, "
                                   f"got {type(group).__name__}")
    if not dist.is_initialized():
        raise InvalidArgumentError(
            "invalid argument 'group': torch.distributed is not initialized; call init_process_group "
            "first, or pass comm= (a pyccl.Communicator)")
    key = (id(pg), device)
    with _lock:
        entry = _communicators.get(key)
        if entry is not None and entry[0]() is pg and not entry[1].closed:
            return entry[1], entry[2]
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise InvalidArgumentError(
                "invalid argument 'group': pyccl has no communicator for this group yet, and cannot make one "
                "while a CUDA graph is being captured; call pyccl.communicator_for(group) (or any pyccl "
                "collective) on the group once before capturing")
        _close_communicators_of_destroyed_groups()
        backend = pyccl_backend_of(pg, device)
        if backend is not None:
            # The group's own runtime: its lane on this device (made now, collectively, if no op made it yet).
            comm = Communicator._adopt(*_C._backend_lane(backend, device.index if device.type == "cuda" else -1))
        else:
            # The name must be the same on every rank (device indices differ), and new on the store: a group whose
            # communicator was closed gets another, and its set-up must not read the closed one's keys. Every rank
            # makes a group's communicators at the same calls, so the count agrees.
            base = f"pyccl_{pg.group_name}_{device.type}"
            made = made_count(base)
            comm = Communicator(group_store(group), dist.get_rank(pg), dist.get_world_size(pg), device=device,
                                name=base if made == 1 else f"{base}_{made}", timeout=group_timeout(pg, device) or DEFAULT_TIMEOUT)
        # Whether a call of CUDA tensors may be handed to the group's NCCL: a group's backend does not change.
        nccl = "nccl" in str(dist.get_backend(pg)).lower()
        _communicators[key] = (weakref.ref(pg, _close_when_gone(key, comm)), comm, nccl)
        if comm._engine is not None:
            # torch.ops.pyccl.* on the group run its selector's kernel choices, and plans set up, in C++
            # (csrc/python/op_runtimes.hpp).
            _C.register_group_runtime(pg.group_name, device.index if device.type == "cuda" else -1, comm._comm,
                                      comm._engine, comm._selector, comm._plans, nccl)
    return comm, nccl


def group_timeout(pg: dist.ProcessGroup, device: torch.device) -> Optional[datetime.timedelta]:
    """The timeout `pg`'s backend for `device`'s kind was made with
    (``init_process_group(timeout=)``, ``new_group(timeout=)``), or None
    where the backend does not say (pyccl's default then)."""
    try:
        timeout = pg._get_backend(torch.device(device.type)).options._timeout
    except (RuntimeError, AttributeError, TypeError):
        return None
    return timeout if isinstance(timeout, datetime.timedelta) and timeout.total_seconds() > 0 else None


def pyccl_backend_of(group: Optional[dist.ProcessGroup], device: torch.device):
    """The pyccl backend that runs ``group``'s ops on tensors of ``device``'s
    kind, or None where another backend does (or ``group`` is not a torch
    process group)."""
    pg = group if group is not None else dist.group.WORLD
    try:
        backend = pg._get_backend(torch.device(device.type))
    except (RuntimeError, AttributeError, TypeError):
        return None
    return backend if backend.name() == "pyccl" else None


def _close_when_gone(key: Tuple[int, torch.device], comm: Communicator):
    """The callback of the weak reference to a group, for its communicator
    `comm` (registered under `key`): closes it as soon as the group is gone.
    ``dist.destroy_process_group`` drops torch's own references to the group,
    so its threads, fds and shared memory go then, or when the user's last
    reference to the group does; not at the next communicator made. Closing
    is local (this rank's kernels only), so it needs no peer."""
    def close(ref: weakref.ref) -> None:
        entry = _communicators.get(key)
        if entry is not None and entry[0] is ref:  # not a new group's, which took the id since
            _communicators.pop(key, None)
        try:
            if not comm.closed:
                logger.info("communicator %s: closed, its torch process group is gone", comm.name)
                comm.close()
        except Exception as e:  # a callback's error would only be printed; say what it was
            logger.warning("communicator %s: closing it after its group was gone failed: %s", comm.name, e)
    return close


def _close_communicators_of_destroyed_groups() -> None:
    """Closes and forgets the communicators of groups that are gone or
    destroyed; with _lock held. Every rank makes a group's communicators at
    the same calls, so they close theirs at the same point too (closing is
    local: it waits for this rank's kernels only)."""
    try:
        registered = dist.distributed_c10d._world.pg_map
    except AttributeError:  # a torch without the registry: only groups that are gone
        registered = None
    for key, (ref, comm, _) in list(_communicators.items()):
        pg = ref()
        if pg is not None and (registered is None or pg in registered) and not comm.closed:
            continue
        del _communicators[key]
        if not comm.closed:
            logger.info("communicator %s: closed, its torch process group was destroyed", comm.name)
            comm.close()
