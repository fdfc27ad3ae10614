"""Collective benchmark, nccl-tests style: ``python -m pyccl.bench``.

For each message size, every implementation runs the same all-reduce
captured in a CUDA graph (``--iters`` calls per graph), replayed ``--trials``
times; the table gives the median time per call and the ratio to NCCL
(through ProcessGroupNCCL), measured in the same run on the same GPUs:

- pyccl through a torch group (``pyccl``: its kernels by size, the group's
  NCCL from ``PYCCL_NCCL_MIN_BYTES``), pyccl's kernels alone (``pyccl_kernels``),
  and each kernel forced (``--all-algos``);
- NCCL through ``torch.distributed`` (ProcessGroupNCCL);
- torch symmetric memory's one-shot and two-shot all-reduce, where available
  (multicast stays off: ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``).

Each result is checked against NCCL's before it is timed.

    python -m pyccl.bench --world 4 --dtype bfloat16 --min-bytes 1K --max-bytes 256M
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys

import torch

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_bytes(text: str) -> int:
    t = text.strip().upper().rstrip("B").rstrip("I")
    unit = t[-1] if t and t[-1] in _UNITS else ""
    return int(float(t[: len(t) - len(unit)] if unit else t) * _UNITS[unit])


def _time_graph(fn, iters: int, trials: int) -> float:
    """Median µs per call of `fn` captured `iters` times in one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / iters)
    del graph
    return statistics.median(times)


def _bench_rank(rank, world, store, sizes, dtype_name, iters, trials, all_algos):
    import torch.distributed as dist

    import pyccl

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", store=store, rank=rank, world_size=world, device_id=device)
    dtype = getattr(torch, dtype_name)
    comm = pyccl.Communicator(store, rank, world, device=device, name="bench")
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
    rows = []
    for nbytes in sizes:
        n = max(1, nbytes // torch.tensor([], dtype=dtype).element_size())
        gen = torch.Generator(device=device).manual_seed(1234 + rank)
        x = torch.randn(n, generator=gen, device=device, dtype=torch.float32).to(dtype)
        out = torch.empty_like(x)
        ref = x.clone()
        dist.all_reduce(ref)
        row = {"bytes": n * x.element_size()}
        # "pyccl": the torch-group path (size-based choice, NCCL from PYCCL_NCCL_MIN_BYTES);
        # "pyccl_kernels": pyccl's own kernels only (size-based choice between them).
        candidates = {"pyccl": None, "pyccl_kernels": None}
        if all_algos:
            candidates["pyccl_1pa_ll"] = "1pa_ll"
            candidates["pyccl_2pa_hb"] = "2pa_hb"
        for label, algo in candidates.items():
            if algo == "1pa_ll" and row["bytes"] > comm_engine_ll_max(comm):
                continue
            use = None if label == "pyccl" else comm
            pyccl.all_reduce(x, out=out, comm=use, algorithm=algo)
            torch.cuda.synchronize()
            tol = 2e-2 if dtype != torch.float32 else 1e-4
            if not torch.allclose(out.float(), ref.float(), rtol=tol, atol=tol * ref.float().abs().max().item()):
                raise AssertionError(f"{label}: wrong result at {row['bytes']} bytes")
            row[label] = _time_graph(lambda: pyccl.all_reduce(x, out=out, comm=use, algorithm=algo), iters, trials)
        row["pyccl_algo"] = ("nccl" if row["bytes"] >= pyccl.collectives._nccl_min_bytes()
                             else comm._allreduce_engine.select(row["bytes"]))
        buf = x.clone()
        row["nccl"] = _time_graph(lambda: dist.all_reduce(buf), iters, trials)
        if symm is not None:
            view = symm[:n]
            view.copy_(x)
            for label, op in (("symm_one_shot", "one_shot_all_reduce"), ("symm_two_shot", "two_shot_all_reduce_")):
                try:
                    fn = getattr(torch.ops.symm_mem, op)
                    row[label] = _time_graph(lambda: fn(view, "sum", group_name), iters, trials)
                except Exception as e:
                    row[label] = None
                    row[label + "_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
    comm.close()
    dist.destroy_process_group()
    return {"rows": rows, "symm_error": symm_error} if rank == 0 else None


def comm_engine_ll_max(comm) -> int:
    import pyccl

    if getattr(comm, "_allreduce_engine", None) is None:
        pyccl.all_reduce(torch.ones(8, device=comm.device), comm=comm)
    return comm._allreduce_engine.ll_max_bytes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=None, help="GPUs (default: all visible)")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--min-bytes", default="1K")
    parser.add_argument("--max-bytes", default="256M")
    parser.add_argument("--iters", type=int, default=20, help="calls per CUDA graph")
    parser.add_argument("--trials", type=int, default=15, help="graph replays (median)")
    parser.add_argument("--all-algos", action="store_true", help="also time each pyccl algorithm forced")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        print("pyccl.bench needs at least 2 GPUs", file=sys.stderr)
        return 2
    world = args.world or torch.cuda.device_count()
    sizes = []
    n = parse_bytes(args.min_bytes)
    while n <= parse_bytes(args.max_bytes):
        sizes.append(n)
        n *= 2
    from ._spawn import run_ranks

    res = run_ranks(_bench_rank, world, args=(sizes, args.dtype, args.iters, args.trials, args.all_algos),
                    timeout=560)[0]
    gpu = torch.cuda.get_device_name(0)
    print(f"# pyccl all-reduce, {world} x {gpu}, {args.dtype}, CUDA graph ({args.iters} calls/graph, "
          f"median of {args.trials} replays), {datetime.date.today()}")
    if res["symm_error"]:
        print(f"# torch symmetric memory unavailable: {res['symm_error']}")
    cols = ["pyccl", "pyccl_kernels", "pyccl_1pa_ll", "pyccl_2pa_hb", "nccl", "symm_one_shot", "symm_two_shot"]
    cols = [c for c in cols if any(r.get(c) is not None for r in res["rows"])]
    print(f"{'bytes':>11} " + " ".join(f"{c + ' us':>17}" for c in cols) + f" {'algo':>7} {'NCCL/pyccl':>10} {'best other/pyccl':>16}")
    for r in res["rows"]:
        vals = " ".join(f"{r[c]:>17.2f}" if r.get(c) is not None else f"{'-':>17}" for c in cols)
        others = [r[c] for c in ("nccl", "symm_one_shot", "symm_two_shot") if r.get(c) is not None]
        print(f"{r['bytes']:>11} {vals} {r['pyccl_algo']:>7} {r['nccl'] / r['pyccl']:>10.2f} "
              f"{min(others) / r['pyccl']:>16.2f}")
    errors = {k: v for r in res["rows"] for k, v in r.items() if k.endswith("_error")}
    for k, v in errors.items():
        print(f"# {k}: {v}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": gpu, "world": world, "dtype": args.dtype, "date": str(datetime.date.today()), **res},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
