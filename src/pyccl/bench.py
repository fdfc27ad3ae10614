"""Collective benchmark, nccl-tests style: ``python -m pyccl.bench``.

For each collective and message size ("bytes" is the whole buffer, as
nccl-tests counts it), every implementation runs the same call captured in a
CUDA graph (``--iters`` calls per graph), replayed ``--trials`` times; the
table gives the median time per call, measured in the same run on the same GPUs:

- ``pyccl``: ``pyccl.<collective>`` on a torch group (its kernels by size, the
  group's NCCL from ``pyccl.collectives.NCCL_MIN_BYTES``);
- ``pyccl_pg``: ``torch.distributed`` on a process group whose backend is pyccl;
- ``pyccl_kernels``: pyccl's kernels alone, and each one forced (``--all-algos``);
- ``plan:<name>``: each DSL plan of the library through the plan interpreter,
  at its best launch shape (``--plans``; see ``pyccl.bench_plans``);
- ``pyccl_sym``: all-reduce with input and output in pyccl symmetric buffers
  (``pyccl.symmetric_empty``; zero-copy 2PA HB by size), and ``pyccl_sym_2pa_hb``
  the zero-copy kernel at every size (``--all-algos``);
- ``pyccl_graph``: all-reduce on the plain tensors, captured inside
  ``pyccl.graph_capture`` (zero-copy on graph buffers where the symmetric
  choice is), and ``pyccl_graph_2pa_hb`` forced zero-copy (``--all-algos``);
- ``nccl_direct``: ``ncclAllReduce`` & co. on the stream through the NCCL torch
  loaded (as vLLM's pynccl calls it), and ``nccl``: ProcessGroupNCCL (in place
  for all-reduce and broadcast, the only form ``torch.distributed`` has);
- ``pyccl_inplace`` and ``nccl_direct_inplace``: the same calls in place, as
  nccl-tests' second group of columns: all-reduce, broadcast and all-to-all
  (pyccl only: NCCL has no in-place all-to-all) with the output as the input,
  all-gather with the input as this rank's part of the output, reduce-scatter
  with the output as this rank's part of the input.
- torch symmetric memory's one-shot and two-shot all-reduce, where available
  (multicast stays off: ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``).

``send_recv`` is nccl-tests' sendrecv: each rank sends its buffer to the next
rank and receives the previous rank's, in one grouped call ("bytes" is one
rank's send). pyccl runs ``pyccl.send_recv``; NCCL direct ``ncclSend`` and
``ncclRecv`` between ``ncclGroupStart`` and ``ncclGroupEnd``; ProcessGroupNCCL
``dist.batch_isend_irecv``, as does ``pyccl_pg`` on the pyccl process group
(which hands GPU sends and receives to its NCCL delegate where it has one,
grouped as torch's coalescing block is). It has no in-place form. It needs
two ranks at least, so ``--world 1`` leaves it out of "all".

Every rank starts each replay at the same moment (a barrier and a GPU sleep
before it, outside the timed region: ``align_trials``), so no rank's time
holds the others' host launch lag. Each result is checked against NCCL's
before it is timed. busbw uses
nccl-tests' factors; the ratio columns divide NCCL direct's time by pyccl's,
out of place and in place, and the best other implementation's time by
pyccl's. ``--world 1`` runs every column on one GPU: a check that the
benchmark runs, not a measure of any collective.

Rank 0 prints each row as soon as it is timed. With ``--out``, the JSON of
the rows so far is rewritten after each row (``"complete": false`` until the
run ends), so a run stopped by ``--timeout`` or a failing rank keeps them.

``--eager`` launches the ``--iters`` calls of a trial one by one instead of
replaying a graph (nccl-tests without ``-G``), and leaves out the
``pyccl_graph`` columns. Where a call's launch takes the host longer than the
call takes the GPU (small sizes), the time per call is then the host's: what an
engine without CUDA graphs sees.

    python -m pyccl.bench --world 4 --collectives all --dtype bfloat16 -b 1K -e 256M -f 2
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

from typing import Dict, List, Optional  # noqa: E402

from . import bench_args  # noqa: E402
from ._logging import logger as log  # noqa: E402
from ._spawn import RankFailure  # noqa: E402
from .bench_timing import BUS_FACTOR as _BUS_FACTOR  # noqa: E402
from .bench_timing import REPLAYS_PER_TRIAL, align_trials, align_trials_with, time_eager, time_graph  # noqa: E402

# Per collective: busbw factor (nccl-tests); "size" is the whole buffer, as nccl-tests counts it.
# Every timing column a row may have, in table order.
_COLUMNS = ("pyccl", "pyccl_pg", "pyccl_kernels", "pyccl_1pa_ll", "pyccl_2pa_ll", "pyccl_1pa_hb", "pyccl_2pa_hb",
            "pyccl_ll", "pyccl_hb", "pyccl_sym", "pyccl_sym_2pa_hb", "pyccl_graph", "pyccl_graph_2pa_hb",
            "nccl_direct", "nccl", "symm_one_shot",
            "symm_two_shot", "pyccl_inplace", "nccl_direct_inplace")


def _tensors(collective, nbytes, world, dtype, device, rank):
    """(input, output) of a call whose whole buffer is about `nbytes`."""
    size = torch.tensor([], dtype=dtype).element_size()
    per = max(1, nbytes // size // world)
    whole_buffer = collective in ("broadcast", "all_reduce", "send_recv")
    n = max(1, nbytes // size) if whole_buffer else per * world
    gen = torch.Generator(device=device).manual_seed(1234 + rank)
    if collective == "all_gather":
        x = torch.randn(per, generator=gen, device=device).to(dtype)
        return x, torch.empty(per * world, device=device, dtype=dtype)
    x = torch.randn(n, generator=gen, device=device).to(dtype)
    if collective == "reduce_scatter":
        return x, torch.empty(per, device=device, dtype=dtype)
    return x, torch.empty_like(x)


def _ring_peers(rank: int, world: int) -> tuple:
    """(next, previous) rank: where send_recv sends, and whence it receives."""
    return (rank + 1) % world, (rank - 1) % world


def _pyccl_fn(pyccl, collective, x, out, comm, algo):
    if collective == "send_recv":
        import torch.distributed as dist  # the bench's ranks are the world group's

        nxt, prv = _ring_peers(dist.get_rank(), dist.get_world_size())
        return lambda: pyccl.send_recv(sends=[(x, nxt)], recvs=[(out, prv)], comm=comm)
    if collective == "all_reduce":
        return lambda: pyccl.all_reduce(x, out=out, comm=comm, algorithm=algo)
    if collective == "broadcast":
        return lambda: pyccl.broadcast(x, 0, out=out, comm=comm, algorithm=algo)
    fn = getattr(pyccl, collective)
    return lambda: fn(x, out=out, comm=comm, algorithm=algo)


def _dist_fn(dist, collective, x, out, group=None):
    """The collective through torch.distributed on `group` (in place for all-reduce)."""
    if collective == "send_recv":
        nxt, prv = _ring_peers(dist.get_rank(), dist.get_world_size())

        def send_recv() -> None:
            ops = [dist.P2POp(dist.isend, x, nxt, group), dist.P2POp(dist.irecv, out, prv, group)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()

        return send_recv
    if collective == "all_reduce":
        return lambda: dist.all_reduce(out, group=group)
    if collective == "all_gather":
        return lambda: dist.all_gather_into_tensor(out, x, group=group)
    if collective == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(out, x, group=group)
    if collective == "all_to_all":
        return lambda: dist.all_to_all_single(out, x, group=group)
    return lambda: dist.broadcast(out, 0, group=group)


def _time_nccl_sends(row: dict, label: str, timed, fn) -> None:
    """row[label] = timed(fn) for sends and receives that ProcessGroupNCCL runs,
    which not every torch can capture in a CUDA graph: then None, and the error
    under label + "_error"."""
    try:
        row[label] = timed(fn)
    except Exception as e:
        row[label] = None
        row[label + "_error"] = f"{type(e).__name__}: {str(e)[:200]}"


def _in_place(lib, collective, x, out, rank):
    """The in-place form of the call through ``lib`` (the pyccl module, or a
    NcclComm), as nccl-tests times it: ``(fn, result, prepare)``, where
    `prepare` puts this rank's input in place before a checked call; or None
    where there is no in-place form (all-to-all in NCCL)."""
    is_pyccl = not hasattr(lib, "comm")
    if collective == "send_recv":
        return None
    if collective == "all_gather":
        buf = torch.empty_like(out)
        mine = buf[rank * x.numel():(rank + 1) * x.numel()]
        fn = (lambda: lib.all_gather(mine, out=buf)) if is_pyccl else (lambda: lib.all_gather(mine, buf))
        return fn, buf, lambda: mine.copy_(x)
    if collective == "reduce_scatter":
        # The output is this rank's part of the input (ncclReduceScatter's recvbuff = sendbuff + rank * recvcount).
        buf = torch.empty_like(x)
        mine = buf[rank * out.numel():(rank + 1) * out.numel()]
        fn = (lambda: lib.reduce_scatter(buf, out=mine)) if is_pyccl else (lambda: lib.reduce_scatter(buf, mine))
        return fn, mine, lambda: buf.copy_(x)
    if collective == "all_to_all" and not is_pyccl:
        return None
    buf = torch.empty_like(x)
    if collective == "all_reduce":
        fn = (lambda: lib.all_reduce(buf, out=buf)) if is_pyccl else (lambda: lib.all_reduce(buf))
    elif collective == "broadcast":
        fn = (lambda: lib.broadcast(buf, 0, out=buf)) if is_pyccl else (lambda: lib.broadcast(buf, buf))
    else:
        fn = lambda: lib.all_to_all(buf, out=buf)  # noqa: E731
    return fn, buf, lambda: buf.copy_(x)


def _check(collective: str, label: str, got: torch.Tensor, ref: torch.Tensor, nbytes: int) -> None:
    """Raises unless `got` matches NCCL's `ref` (bit for bit for data movement)."""
    torch.cuda.synchronize()
    if collective in ("all_reduce", "reduce_scatter"):
        tol = 2e-2 if got.dtype != torch.float32 else 1e-4
        ok = torch.allclose(got.float(), ref.float(), rtol=tol, atol=tol * ref.float().abs().max().item())
    else:
        ok = torch.equal(got, ref)
    if not ok:
        raise AssertionError(f"{collective} {label}: wrong result at {nbytes} bytes")


def _progress_bar(total: int):
    """A progress bar on stderr (tqdm), or None where tqdm is missing (an
    install without pyccl's dependencies): the run goes on without one."""
    try:
        from tqdm import tqdm
    except ImportError:
        log.info("no progress bar: tqdm is not installed (pip install tqdm)")
        return None
    return tqdm(total=total, unit="size", file=sys.stderr, dynamic_ncols=True)


def _header(collective: str, about: dict, cols: List[str]) -> str:
    how = (f"eager ({about['iters']} calls in a row, median of {about['trials']} trials)" if about["mode"] == "eager"
           else f"CUDA graph ({about['iters']} calls/graph, median of {about['trials']} trials of "
                 f"{REPLAYS_PER_TRIAL} replays)")
    return (f"# pyccl {collective}, {about['world']} x {about['gpu']}, {about['dtype']}, {how}, {about['date']}\n"
            f"{'bytes':>11} " + " ".join(f"{c + ' us':>15}" for c in cols)
            + f" {'algo':>7} {'busbw GB/s':>10} {'NCCLd/pyccl':>11} {'in place':>8} {'best other/pyccl':>16}")


def _row_line(r: dict, cols: List[str], factor: float) -> str:
    vals = " ".join(f"{r[c]:>15.2f}" if r.get(c) is not None else f"{'-':>15}" for c in cols)
    others = [r[c] for c in ("nccl_direct", "nccl", "symm_one_shot", "symm_two_shot") if r.get(c) is not None]
    busbw = r["bytes"] * factor / (r["pyccl"] * 1e-6) / 1e9
    in_place = (f"{r['nccl_direct_inplace'] / r['pyccl_inplace']:>8.2f}"
                if r.get("nccl_direct_inplace") and r.get("pyccl_inplace") else f"{'-':>8}")
    best_other = f"{min(others) / r['pyccl']:>16.2f}" if others else f"{'-':>16}"
    return (f"{r['bytes']:>11} {vals} {r['pyccl_algo']:>7} {busbw:>10.1f} "
            f"{r['nccl_direct'] / r['pyccl']:>11.2f} {in_place} {best_other}")


def _write_results(path: str, about: dict, complete: bool, tables: Dict[str, List[dict]], **more) -> None:
    """The results JSON at `path`: the run's description, whether it ended, its rows, and `more`."""
    bench_args.write_atomically(path, json.dumps({**about, "complete": complete, **more, "tables": tables}, indent=1))


class Report:
    """What rank 0 reports as it measures: each row printed as soon as it is
    timed (a table per collective, nccl-tests style), and, with `out`, the
    JSON of the rows so far rewritten after each (``"complete": false`` until
    the run ends), so that a run stopped partway keeps what it measured.
    `about` describes the run (world, dtype, date, mode, iters, trials); rank
    0 adds the GPU's name."""

    def __init__(self, about: dict, out: Optional[str] = None) -> None:
        self.about = dict(about)
        self.out = out
        self.tables: Dict[str, List[dict]] = {}
        self.notes: List[str] = []
        self._cols: Dict[str, List[str]] = {}

    def note(self, line: str) -> None:
        """A "# ..." line before the tables (kept in the JSON as "notes")."""
        self.notes.append(line)
        print(f"# {line}", flush=True)

    def row(self, collective: str, row: dict) -> None:
        rows = self.tables.setdefault(collective, [])
        if not rows:  # the first row's timing columns head the table
            self._cols[collective] = [c for c in _COLUMNS if c in row]
            print(_header(collective, self.about, self._cols[collective]), flush=True)
        rows.append(row)
        print(_row_line(row, self._cols[collective], _BUS_FACTOR[collective](self.about["world"])), flush=True)
        if self.out:
            self.write(complete=False)

    def write(self, complete: bool) -> None:
        """The JSON at `out`: the run's description, its rows so far, whether it ended."""
        _write_results(self.out, self.about, complete, self.tables, notes=self.notes)


def _bench_rank(rank, world, store, collectives, sizes, dtype_name, iters, trials, all_algos, progress=False,
                engine_options=None, plans=False, eager=False, report: Optional[Report] = None):
    import torch.distributed as dist

    import pyccl

    def timed(fn):
        return time_eager(fn, iters, trials) if eager else time_graph(fn, iters, trials)

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", store=store, rank=rank, world_size=world, device_id=device)
    dtype = getattr(torch, dtype_name)
    # The kernels' communicator; engine_options (CollectiveEngine keywords) try other settings.
    comm = pyccl.Communicator(store, rank, world, device=device, name="bench", engine_options=engine_options)
    align_trials_with(comm, device)
    # The torch-group path's communicator, made before any graph is captured.
    pyccl.communicator_for(None, device)
    pyccl_group = dist.new_group(backend="pyccl")
    from ._nccl import NcclComm

    nccl = NcclComm(store, rank, world, device.index)
    group_name = dist.group.WORLD.group_name
    symm = None
    try:
        import torch.distributed._symmetric_memory as symm_mem

        symm_buf = symm_mem.empty(max(sizes) // torch.tensor([], dtype=dtype).element_size(), dtype=dtype, device=device)
        symm_mem.rendezvous(symm_buf, group_name)
        symm = symm_buf
    except Exception as e:  # not every build has it
        symm_error = f"{type(e).__name__}: {e}"
    else:
        symm_error = None
    if rank != 0:
        report = None
    if report is not None:
        report.about["gpu"] = torch.cuda.get_device_name(device)
        if symm_error:
            report.note(f"torch symmetric memory unavailable: {symm_error}")
    sym_in = sym_out = None
    if "all_reduce" in collectives:
        sym_in = pyccl.symmetric_empty(max(sizes), dtype=torch.uint8, comm=comm)
        sym_out = pyccl.symmetric_empty(max(sizes), dtype=torch.uint8, comm=comm)
    tables = {}
    bar = _progress_bar(len(collectives) * len(sizes)) if progress and rank == 0 else None
    for collective in collectives:
        rows = []
        for nbytes in sizes:
            x, out = _tensors(collective, nbytes, world, dtype, device, rank)
            whole = max(x.numel(), out.numel()) * x.element_size()
            row = {"bytes": whole, "count": max(x.numel(), out.numel())}
            if collective == "send_recv":
                # What the previous rank sends: its input, drawn from its seed.
                ref = _tensors(collective, nbytes, world, dtype, device, _ring_peers(rank, world)[1])[0]
            else:
                # The reference: NCCL through the torch group.
                ref = out.clone() if collective != "all_reduce" else x.clone()
                if collective == "broadcast":
                    ref.copy_(x)
                _dist_fn(dist, collective, x, ref)()
            candidates = {"pyccl": None, "pyccl_kernels": None}
            if all_algos:
                for algo in (a for a in pyccl.tuning.CANDIDATES.get(collective, ()) if a != "nccl"):
                    candidates[f"pyccl_{algo}"] = algo
            for label, algo in candidates.items():
                if algo == "1pa_ll" and whole > comm._engine.ll_max_bytes:
                    continue
                if algo in ("2pa_ll", "ll") and whole > 4 * world * comm._engine.ll_max_bytes:
                    continue  # LL far past its range: slow, and says nothing new
                use = None if label == "pyccl" else comm
                fn = _pyccl_fn(pyccl, collective, x, out, use, algo)
                fn()
                _check(collective, label, out, ref, whole)
                row[label] = timed(fn)
            if collective == "all_reduce":
                # The same call on symmetric buffers (zero-copy from the engine's threshold).
                sx = sym_in[:x.numel() * x.element_size()].view(dtype)
                sy = sym_out[:x.numel() * x.element_size()].view(dtype)
                sx.copy_(x)
                for label, algo in [("pyccl_sym", None)] + ([("pyccl_sym_2pa_hb", "2pa_hb")] if all_algos else []):
                    fn = _pyccl_fn(pyccl, collective, sx, sy, comm, algo)
                    fn()
                    _check(collective, label, sy, ref, whole)
                    row[label] = timed(fn)
                # Plain tensors captured under pyccl.graph_capture (zero-copy on graph buffers where chosen so).
                graph_columns = [] if eager else [("pyccl_graph", None)] + (
                    [("pyccl_graph_2pa_hb", "2pa_hb")] if all_algos else [])
                for label, algo in graph_columns:
                    fn = _pyccl_fn(pyccl, collective, x, out, comm, algo)
                    row[label] = time_graph(fn, iters, trials, capture_in=pyccl.graph_capture(comm=comm),
                                             check=lambda: _check(collective, label, out, ref, whole), output=out)
            if collective == "send_recv":
                row["pyccl_algo"] = "ll" if x.numel() * x.element_size() <= comm._engine.p2p_ll_max_bytes else "hb"
            else:  # what the group's selector chooses for the pyccl column's calls
                route, algo = pyccl.communicator_for(None, device)._selector.select(
                    collective, dtype, whole, x.numel(), None, True)[:2]
                row["pyccl_algo"] = algo if route in ("kernel", "nccl") else f"{route} {algo}".strip()
            buf = x.clone() if collective == "all_reduce" else out
            if collective == "send_recv":
                buf.fill_(float("nan"))
                _dist_fn(dist, collective, x, buf)()
                _check(collective, "ProcessGroupNCCL", buf, ref, whole)
                _time_nccl_sends(row, "nccl", timed, _dist_fn(dist, collective, x, buf))
            else:
                row["nccl"] = timed(_dist_fn(dist, collective, x, buf))
            direct = {"all_reduce": lambda: nccl.all_reduce(x, buf), "all_gather": lambda: nccl.all_gather(x, buf),
                      "reduce_scatter": lambda: nccl.reduce_scatter(x, buf), "all_to_all": lambda: nccl.all_to_all(x, buf),
                      "broadcast": lambda: nccl.broadcast(x, buf),
                      "send_recv": lambda: nccl.send_recv(x, buf, *_ring_peers(rank, world))}[collective]
            buf.fill_(float("nan"))
            direct()
            _check(collective, "NCCL direct", buf, ref, whole)
            row["nccl_direct"] = timed(direct)
            for label, made in (("pyccl_inplace", _in_place(pyccl, collective, x, out, rank)),
                                ("nccl_direct_inplace", _in_place(nccl, collective, x, out, rank))):
                if made is not None:
                    fn, result, prepare = made
                    prepare()
                    fn()
                    _check(collective, label, result, ref, whole)
                    row[label] = timed(fn)
            # The same call through a process group whose backend is pyccl.
            got = ref.clone()
            if collective in ("broadcast", "all_reduce"):
                got.copy_(x)
            elif collective == "send_recv":
                got.fill_(float("nan"))
            _dist_fn(dist, collective, x, got, pyccl_group)()
            _check(collective, "the pyccl process group", got, ref, whole)
            if collective == "send_recv":  # its GPU sends go to its NCCL delegate, grouped as the block is
                _time_nccl_sends(row, "pyccl_pg", timed, _dist_fn(dist, collective, x, got, pyccl_group))
            else:
                row["pyccl_pg"] = timed(_dist_fn(dist, collective, x, got, pyccl_group))
            if symm is not None and collective == "all_reduce":
                view = symm[:x.numel()]
                view.copy_(x)
                for label, op in (("symm_one_shot", "one_shot_all_reduce"), ("symm_two_shot", "two_shot_all_reduce_")):
                    try:
                        fn = getattr(torch.ops.symm_mem, op)
                        row[label] = timed(lambda: fn(view, "sum", group_name))
                    except Exception as e:
                        row[label] = None
                        row[label + "_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rows.append(row)
            if report is not None:
                report.row(collective, row)
            if bar is not None:
                bar.set_postfix_str(f"{collective} {whole} B", refresh=False)
                bar.update(1)
        if plans and collective in pyccl.tuning.PLANS:
            _time_plans(comm, collective, rows, world, dtype, device, rank, timed)
        tables[collective] = rows
    if bar is not None:
        bar.close()
    align_trials(None)
    comm.close()
    nccl.close()
    dist.destroy_process_group()
    return {"tables": tables, "symm_error": symm_error} if rank == 0 else None


def _time_plans(comm, collective, rows, world, dtype, device, rank, timed) -> None:
    """The library plans' columns (pyccl.bench_plans), checked against ProcessGroupNCCL."""
    import torch.distributed as dist

    from .bench_plans import time_library_plans

    def reference(x, out):
        expected = x.clone() if collective == "all_reduce" else torch.empty_like(out)
        _dist_fn(dist, collective, x, expected)()
        return expected

    time_library_plans(comm, collective, rows,
                       make_tensors=lambda nbytes: _tensors(collective, nbytes, world, dtype, device, rank),
                       reference=reference,
                       check=lambda label, got, expected, nbytes: _check(collective, label, got, expected, nbytes),
                       time_graph=timed,
                       ll_max_bytes=comm._engine.ll_max_bytes)


def _plan_columns(rows) -> list:
    return sorted({k for r in rows for k in r if k.startswith("plan:") and not k.endswith(":shape")})


def _write_csv(path: str, tables, world: int, dtype: str) -> None:
    """nccl-tests' columns, one row per implementation: size, count, type, redop,
    time (µs), algbw and busbw (GB/s); #wrong is 0 (every result was checked)."""
    import csv

    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["collective", "implementation", "world", "size", "count", "type", "redop", "time_us",
                    "algbw_GBps", "busbw_GBps", "wrong"])
        for collective, rows in tables.items():
            factor = _BUS_FACTOR[collective](world)
            redop = "sum" if collective in ("all_reduce", "reduce_scatter") else "none"
            for r in rows:
                for impl in (*_COLUMNS, *_plan_columns(rows)):
                    t = r.get(impl)
                    if t is None:
                        continue
                    algbw = r["bytes"] / (t * 1e-6) / 1e9
                    w.writerow([collective, impl, world, r["bytes"], r["count"], dtype, redop, f"{t:.2f}",
                                f"{algbw:.2f}", f"{algbw * factor:.2f}", 0])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=None, help="GPUs (default: all visible)")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    bench_args.add_size_arguments(parser)
    parser.add_argument("--iters", type=int, default=20, help="calls per CUDA graph (eager: calls per trial)")
    parser.add_argument("--trials", type=int, default=15,
                        help="timed trials (median): of 10 graph replays each, or eager runs of --iters calls")
    parser.add_argument("--eager", action="store_true",
                        help="launch the calls one by one instead of replaying a CUDA graph (nccl-tests without -G); "
                             "at small sizes this times the host's launch cost")
    parser.add_argument("--all-algos", action="store_true", help="also time each pyccl algorithm forced")
    parser.add_argument("--plans", action="store_true",
                        help="also time the library's DSL plans (pyccl.algorithms) at several launch shapes")
    parser.add_argument("--collectives", default="all_reduce",
                        help="comma-separated: all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, "
                             "send_recv, or all")
    parser.add_argument("--timeout", type=float, default=560, help="seconds before the ranks are stopped")
    parser.add_argument("--engine", default=None,
                        help="CollectiveEngine settings for the kernel columns, as JSON, e.g. "
                             "'{\"ll_packets_per_block\": 1024}'")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--csv", default=None, help="write one row per (collective, size, implementation) here")
    parser.add_argument("--plot", default=None, help="write the PNG here (needs matplotlib; or later: "
                                                     "python -m pyccl.bench_plot results.json out.png)")
    args = parser.parse_args(argv)
    sizes = bench_args.sizes_from_args(parser, args)
    bench_args.check_counts(parser, args, min_world=1)
    engine_options = bench_args.engine_options(parser, args.engine)
    bench_args.check_output(parser, "--out", args.out)
    bench_args.check_output(parser, "--csv", args.csv)
    bench_args.check_plot(parser, args.plot)
    from ._spawn import run_ranks

    collectives = [c.strip() for c in args.collectives.split(",") if c.strip()]
    if collectives == ["all"]:
        collectives = [c for c in _BUS_FACTOR if args.world != 1 or c != "send_recv"]
    for c in collectives:
        if c not in _BUS_FACTOR:
            parser.error(f"--collectives: {c!r} is not one of {', '.join(_BUS_FACTOR)} (or all)")
    if args.world == 1 and "send_recv" in collectives:
        parser.error("--collectives send_recv: needs --world 2 or more (a rank sends to another)")
    needed = 2 if args.world != 1 else 1
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible < needed:
        print(f"pyccl.bench needs {'a GPU' if needed == 1 else 'at least 2 GPUs'}, and this machine has "
              f"{visible or 'none'} visible" + ("" if needed == 1 else " (--world 1 runs every column on one GPU, "
                                                 "to check that the benchmark runs)"), file=sys.stderr)
        return 2
    world = args.world or torch.cuda.device_count()
    bench_args.check_world_fits(parser, world, torch.cuda.device_count())
    about = {"gpu": "?", "world": world, "dtype": args.dtype, "date": str(datetime.date.today()),
             "mode": "eager" if args.eager else "graph", "iters": args.iters, "trials": args.trials}
    # Rank 0 prints each row as it is timed, and keeps the JSON of the rows so far at --out.
    try:
        res = run_ranks(_bench_rank, world, args=(collectives, sizes, args.dtype, args.iters, args.trials,
                                                  args.all_algos, False, engine_options, args.plans, args.eager,
                                                  Report(about, args.out)),
                        timeout=args.timeout)[0]
    except RankFailure as e:
        kept = f"; they are in {args.out} (\"complete\": false)" if args.out else ""
        print(f"pyccl.bench stopped: {e}\nThe rows above were measured before it stopped{kept}.", file=sys.stderr)
        return 1
    about["gpu"] = torch.cuda.get_device_name(0)
    for collective, rows in res["tables"].items():
        for c in _plan_columns(rows):
            cells = ", ".join(f"{r['bytes']}: {r[c]:.2f} ({r[c + ':shape'][0]} x {r[c + ':shape'][1]})"
                              for r in rows if r.get(c) is not None)
            print(f"# {c} us (instances x threads): {cells}")
        errors = {k: v for r in rows for k, v in r.items() if k.endswith("_error")}
        for k, v in errors.items():
            print(f"# {k}: {v}")
    # The JSON first: the plot can be drawn again from it (python -m pyccl.bench_plot).
    if args.out:
        _write_results(args.out, about, True, res["tables"], symm_error=res["symm_error"])
    if args.csv:
        _write_csv(args.csv, res["tables"], world, args.dtype)
    if args.plot:
        from .bench_plot import plot

        plot({**about, **res}, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
