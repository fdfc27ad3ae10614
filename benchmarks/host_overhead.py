"""What one eager collective call costs the host: µs of CPU per call, per entry point.

In eager mode (no CUDA graph) every collective is a Python call that checks its
arguments, chooses an algorithm and enqueues a kernel. When the host enqueues
slower than the GPU runs, as at small messages, the host's time per call is
the time per call. Each entry point is called ``--calls`` times back to back;
the host's time for the loop (enqueue only: the wait for the GPU is outside
it) is divided by the calls, and the median over ``--trials`` loops kept.
Where every rank has its own GPU, two GPU times per call are given too (CUDA
events): over the same loop (``GPU``, what ``python -m pyccl.bench --eager``
reports: the larger of the host's time and the GPU's), and over the same calls
queued behind a GPU sleep (``queued``: the GPU's own time per call, the host
out of it). Where ``GPU`` is near ``host`` and well above ``queued``, the host
is the bottleneck.

Entry points: ``torch copy_`` (one torch kernel launch from Python, the
floor), ``pyccl.all_reduce`` on the torch group and on a Communicator,
``torch.ops.pyccl.all_reduce``, ``dist.all_reduce`` on a process group whose
backend is pyccl, the collective engine called directly (the C++ floor), and
NCCL: ProcessGroupNCCL and ``ncclAllReduce`` called directly (as vLLM's
pynccl does).

Ranks may share a GPU (``--world`` above the GPUs visible; pyccl is then
allowed to share, ``PYCCL_ALLOW_SHARED_GPU=1``): the host's time per call is
still the host's, but NCCL refuses a shared GPU, so its rows are left out and
no GPU time is given. ``--world 1`` runs every entry point in one process.
``--host`` runs on CPU in host mode (a smoke test: host mode's collectives are
not the GPU's). ``--profile`` adds, per entry point, what torch's profiler
saw in one loop on rank 0: each operator and CUDA runtime call made once or
more per collective call, how many times and its own host µs per call (the
profiler's own cost included: read the counts, and the times against each
other)::

    python benchmarks/host_overhead.py --world 2 --sizes 1K,1M [--profile]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


# A GPU sleep longer than the host takes to enqueue one timed loop (about 10 ms at the H100/H200 SM clock):
# the loop's calls then wait in the queue and run back to back.
_QUEUE_SLEEP_CYCLES = 20_000_000


def _time_in_turn(torch, entries: dict, calls: int, trials: int, on_gpu: bool, gpu_times: bool) -> dict:
    """{label: (median host µs per call, median GPU µs per call or None,
    median queued GPU µs per call or None)}. Each trial times every entry
    point in turn, so that the host's drift (clock, other processes) reaches
    all of them alike."""
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    for fn in entries.values():
        for _ in range(10):
            fn()
    sync()
    host = {label: [] for label in entries}
    gpu = {label: [] for label in entries}
    queued = {label: [] for label in entries}
    for _ in range(trials):
        for label, fn in entries.items():
            if gpu_times:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            host[label].append((time.perf_counter() - t0) * 1e6 / calls)
            if gpu_times:
                end.record()
                end.synchronize()
                gpu[label].append(start.elapsed_time(end) * 1000 / calls)
                # The same calls queued: the first waits for the peers (their hosts reach it at other times) and
                # is left out; the rest run back to back.
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda._sleep(_QUEUE_SLEEP_CYCLES)
                fn()
                start.record()
                for _ in range(calls - 1):
                    fn()
                end.record()
                end.synchronize()
                queued[label].append(start.elapsed_time(end) * 1000 / max(1, calls - 1))
            sync()
    return {label: (statistics.median(host[label]), statistics.median(gpu[label]) if gpu_times else None,
                    statistics.median(queued[label]) if gpu_times else None)
            for label in entries}


def _profile(torch, entries: dict, calls: int) -> dict:
    """{label: [(event, times per call, own host µs per call)]}: the events
    torch's profiler records at least once per call over `calls` calls of each
    entry point, most costly first."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    found = {}
    for label, fn in entries.items():
        with profile(activities=activities) as prof:
            for _ in range(calls):
                fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        rows = [(e.key, e.count / calls, e.self_cpu_time_total / calls) for e in prof.key_averages()
                if e.count >= calls and e.self_cpu_time_total > 0]
        found[label] = sorted(rows, key=lambda r: -r[2])
    return found


def _rank(rank, world, store, sizes, calls, trials, on_gpu, own_gpu, profiling=False):
    import torch
    import torch.distributed as dist

    import pyccl

    if on_gpu:
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        if own_gpu:
            dist.init_process_group("cuda:nccl,cpu:gloo", store=store, rank=rank, world_size=world,
                                    device_id=device)
        else:
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    comm = pyccl.Communicator(store, rank, world, device=device, name="host_overhead")
    pyccl.communicator_for(None, device)
    pyccl_group = dist.new_group(backend="pyccl")
    group_name = dist.group.WORLD.group_name
    nccl = None
    if on_gpu and own_gpu:
        from pyccl._nccl import NcclComm

        nccl = NcclComm(store, rank, world, device.index)
    symm = None
    if nccl is not None and world > 1:
        try:  # the reference the eager targets are set against: torch's two-shot on symmetric memory, in place
            import torch.distributed._symmetric_memory as symm_mem

            symm = symm_mem.empty(max(sizes) // 2, dtype=torch.bfloat16, device=device)
            symm_mem.rendezvous(symm, group_name)
        except Exception as e:  # not every build has it
            print(f"rank {rank}: torch symmetric memory left out ({type(e).__name__}: {e})", flush=True)
            symm = None
    rows = []
    for nbytes in sizes:
        gen = torch.Generator(device=device).manual_seed(99 + rank)
        x = torch.randn(max(1, nbytes // 2), generator=gen, device=device).to(torch.bfloat16)
        out = torch.empty_like(x)
        inplace = x.clone()
        expected = x.double()
        # Every entry point's result is checked once before it is timed.
        results = {}
        entries = {
            "torch copy_": lambda: out.copy_(x),
            "pyccl.all_reduce (group)": lambda: pyccl.all_reduce(x, out=out),
            "pyccl.all_reduce (comm)": lambda: pyccl.all_reduce(x, out=out, comm=comm),
            "torch.ops.pyccl.all_reduce": lambda: torch.ops.pyccl.all_reduce(x, "sum", group_name),
            # In place, so max: the result stays the same call after call.
            "dist.all_reduce (pyccl)": lambda: dist.all_reduce(inplace, op=dist.ReduceOp.MAX, group=pyccl_group),
            "engine (C++)": lambda: comm._engine.all_reduce(comm._comm, x, out, "sum", None),
        }
        if nccl is not None:
            entries["dist.all_reduce (NCCL)"] = lambda: dist.all_reduce(inplace, op=dist.ReduceOp.MAX)
            entries["ncclAllReduce"] = lambda: nccl.all_reduce(x, out)
        if symm is not None:
            view = symm[:x.numel()]
            # "sum" alone is offered; in place, the values grow call after call (checked before).
            entries["torch symm-mem two-shot"] = lambda: torch.ops.symm_mem.two_shot_all_reduce_(view, "sum",
                                                                                                 group_name)
        gathered = [torch.empty_like(x, device="cpu") for _ in range(world)]
        dist.all_gather(gathered, x.cpu())  # over gloo: the reference owes nothing to what is timed
        total = sum(g.double() for g in gathered).to(device)
        largest = torch.stack(gathered).double().amax(0).to(device)
        for label, fn in entries.items():
            if label.startswith("dist.all_reduce"):
                inplace.copy_(x)
                fn()
                got = inplace
            elif label == "torch symm-mem two-shot":
                view.copy_(x)
                fn()
                got = view
            elif label == "torch.ops.pyccl.all_reduce":
                got = fn()
            else:
                out.fill_(float("nan"))
                fn()
                got = out
            want = {"torch copy_": expected, "dist.all_reduce (pyccl)": largest,
                    "dist.all_reduce (NCCL)": largest}.get(label, total)
            ok = torch.allclose(got.double(), want, rtol=2e-2, atol=2e-2 * float(want.abs().max()))
            if not ok:
                raise AssertionError(f"{label}: wrong result at {nbytes} bytes")
        for label, (host, gpu, queue) in _time_in_turn(torch, entries, calls, trials, on_gpu,
                                                       on_gpu and own_gpu).items():
            results[label] = {"host_us": host, "gpu_us": gpu, "queued_us": queue}
        if profiling:
            for label, events in _profile(torch, entries, calls).items():
                results[label]["profile"] = events
        rows.append({"bytes": nbytes, "results": results})
    if nccl is not None:
        nccl.close()
    comm.close()
    dist.destroy_process_group()
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=2, help="ranks (may exceed the GPUs: they then share)")
    parser.add_argument("--sizes", default="1K,1M", help="comma-separated message sizes, e.g. 1K,64K,1M")
    parser.add_argument("--calls", type=int, default=100, help="calls per timed loop")
    parser.add_argument("--trials", type=int, default=21, help="timed loops (median)")
    parser.add_argument("--host", action="store_true", help="run on CPU in host mode")
    parser.add_argument("--profile", action="store_true",
                        help="also list each entry point's operators and CUDA runtime calls (torch's profiler)")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)

    import torch

    from pyccl._spawn import run_ranks
    from pyccl.bench_timing import parse_bytes, size_label

    on_gpu = not args.host
    if on_gpu and not torch.cuda.is_available():
        parser.error("no GPU visible: pass --host to run in host mode")
    gpus = torch.cuda.device_count() if on_gpu else 0
    own_gpu = on_gpu and args.world <= gpus
    env = {}
    if on_gpu and not own_gpu:
        env = {"PYCCL_ALLOW_SHARED_GPU": "1", "PYCCL_NCCL_DELEGATE": "0"}
    sizes = [parse_bytes(s) for s in args.sizes.split(",") if s.strip()]
    rows = run_ranks(_rank, args.world, args=(sizes, args.calls, args.trials, on_gpu, own_gpu, args.profile),
                     env=env, timeout=600)[0]
    where = (f"{args.world} rank(s) on {torch.cuda.get_device_name(0)}"
             + ("" if own_gpu else f", sharing {gpus} GPU(s)") if on_gpu else f"{args.world} rank(s), host mode")
    print(f"# eager all-reduce, bf16, {where}; µs per call (rank 0), median of {args.trials} loops of "
          f"{args.calls} calls")
    labels = list(rows[0]["results"])
    print(f"{'entry point':<28}" + "".join(f"{'host ' + size_label(r['bytes']):>14}{'GPU':>8}{'queued':>8}"
                                           for r in rows))
    for label in labels:
        cells = ""
        for r in rows:
            res = r["results"][label]
            gpu = f"{res['gpu_us']:.2f}" if res["gpu_us"] is not None else "-"
            queue = f"{res['queued_us']:.2f}" if res["queued_us"] is not None else "-"
            cells += f"{res['host_us']:>14.2f}{gpu:>8}{queue:>8}"
        print(f"{label:<28}{cells}")
    for r in rows if args.profile else ():
        print(f"\n# {size_label(r['bytes'])}: what torch's profiler saw per call (rank 0): "
              "event, times per call, own host µs per call")
        for label in labels:
            events = r["results"][label].get("profile", [])
            print(f"{label}: " + "; ".join(f"{name} x{times:.0f} {us:.2f}" for name, times, us in events[:12]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"world": args.world, "own_gpu": own_gpu, "where": where, "calls": args.calls,
                       "trials": args.trials, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
