"""Run a function on N local ranks, one process each, with a shared TCPStore.

Used by ``python -m pyccl.demo`` and the multi-process tests. Children start from
a forkserver that has already imported torch and pyccl (fast, and CUDA is not
initialized before the fork). Every child is bounded by ``timeout``: a hung
rank is killed and reported, never waited on forever. The calling process
serves the store on a port the system picks as it binds, so no other socket
can take the port between choosing it and listening on it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from typing import Any, Callable, Optional, Sequence

_CTX = None


def _context():
    global _CTX
    if _CTX is None:
        _CTX = mp.get_context("forkserver")
        _CTX.set_forkserver_preload(["torch", "pyccl"])
    return _CTX


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_store(world_size: int):
    """A TCPStore served by this process on a free port (``.port``)."""
    import datetime

    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=60))


def _child(fn, rank, world_size, port, env, args, results):
    os.environ.update(env)
    try:
        import datetime

        import torch
        import torch.distributed as dist

        if "OMP_NUM_THREADS" not in os.environ:
            # As torchrun: ranks sharing a machine share its cores. Left at
            # torch's default (every core per rank), 4 ranks on 64 cores made
            # CPU-side checks of 400 000 elements take over 0.2 s each.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))

        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False,
                              timeout=datetime.timedelta(seconds=60))
        value = fn(rank, world_size, store, *args)
        results.put((rank, "ok", value))
    except BaseException as exc:  # report everything, including SystemExit
        results.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


class RankFailure(RuntimeError):
    """One or more ranks raised, or did not finish in time."""


def run_ranks(fn: Callable[..., Any], world_size: int, args: Sequence[Any] = (),
              timeout: float = 120.0, env: Optional[dict] = None,
              expect_failure: bool = False, dying: Sequence[int] = ()) -> list:
    """Runs ``fn(rank, world_size, store, *args)`` on ``world_size`` processes.

    Returns the per-rank return values. Raises RankFailure naming the ranks
    that raised or hung (unless ``expect_failure``: then returns per-rank
    ``("ok", value)`` / ``("error", message)`` / ``("hung", None)`` tuples).
    ``fn`` must be importable (defined at module level). ``dying`` names ranks
    that are expected to kill themselves; every rank may (the caller serves the
    store), and they are reported as any other rank that ends without a result.
    """
    bad_dying = sorted(set(dying) - set(range(world_size)))
    if bad_dying:
        raise ValueError(f"invalid argument 'dying': ranks {bad_dying} are not in 0..{world_size - 1}")
    ctx = _context()
    results = ctx.Queue()
    store = _serve_store(world_size)
    procs = [ctx.Process(target=_child,
                         args=(fn, r, world_size, store.port, dict(env or {}), tuple(args), results),
                         daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    outcome: dict = {}
    deadline = time.monotonic() + timeout
    while len(outcome) < world_size and time.monotonic() < deadline:
        try:
            rank, status, value = results.get(timeout=0.2)
            outcome[rank] = (status, value)
        except queue.Empty:
            if all(not p.is_alive() for p in procs) and results.empty():
                break
    killed = set()
    for r, p in enumerate(procs):
        p.join(timeout=max(0.0, deadline - time.monotonic()) if p.is_alive() else 0)
        if p.is_alive():
            killed.add(r)
            p.kill()
            p.join(5)
    for r in range(world_size):
        if r not in outcome:
            if r in killed:
                outcome[r] = ("hung", f"rank {r} did not finish within {timeout:.0f} s and was killed")
            else:
                outcome[r] = ("error", f"rank {r} exited with code {procs[r].exitcode} without a result")
    results.close()
    del store  # every child is done with it
    if expect_failure:
        return [outcome[r] for r in range(world_size)]
    bad = {r: v for r, v in outcome.items() if v[0] != "ok"}
    if bad:
        details = "\n".join(f"--- rank {r} ({s}) ---\n{msg}" for r, (s, msg) in sorted(bad.items()))
        raise RankFailure(f"{len(bad)} of {world_size} ranks failed:\n{details}")
    return [outcome[r][1] for r in range(world_size)]
