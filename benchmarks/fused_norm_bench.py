"""The fused all-reduce + residual add + RMSNorm against the same three steps
unfused, at decode token counts: bf16 rows of `--hidden`, CUDA graph of 20
calls, median of 7 replays, every variant timed in turn for 5 rounds (the
table gives the medians of the rounds).

Variants:
- fused: ``pyccl.fused_all_reduce_rmsnorm`` (automatic choice), and forced
  one-shot / two-shot (one kernel) / two-kernel (pyccl's all-reduce, then its
  add + RMSNorm kernel);
- pyccl + torch: ``pyccl.all_reduce``, then torch's add and ``rms_norm``;
- NCCL direct + torch, ProcessGroupNCCL + torch: the same with NCCL's all-reduce;
- all-reduce only: ``pyccl.all_reduce`` alone, for scale.
With ``--sweep``, the fused kernel also runs at every (segments, threads)
launch shape (one engine each), one-shot and two-shot.

    python benchmarks/fused_norm_bench.py [--world 4] [--hidden 8192] [--sweep] [--json out.json]
        [--engine '{"programmatic_launch": false}']  # CollectiveEngine keywords for every variant
"""

import argparse
import json

import torch
import torch.distributed as dist

import pyccl
from pyccl._nccl import NcclComm
from pyccl._spawn import run_ranks
from pyccl.bench_timing import time_graph, align_trials_with, time_in_turn

TOKENS = (1, 2, 4, 8, 16, 32, 64)
ITERS, TRIALS, ROUNDS = 20, 7, 5
SEGMENTS, THREADS = (2, 4, 8), (128, 256, 512)
EPS = 1e-5


def _unfused(reduce, residual, weight, s, r, out):
    """An all-reduce into s (by `reduce`), then torch's add and rms_norm."""
    def run():
        reduce()
        torch.add(s, residual, out=r)
        out.copy_(torch.nn.functional.rms_norm(r, (r.shape[-1],), weight, EPS))
    return run


def body(rank, world, store, hidden, sweep, engine_options):
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", store=store, rank=rank, world_size=world, device_id=device)
    comm = pyccl.Communicator(store, rank, world, device=device, name="fused_bench", engine_options=engine_options)
    align_trials_with(comm, device)
    nccl = NcclComm(store, rank, world, device.index)
    gen = torch.Generator(device=device).manual_seed(1234 + rank)
    shared = torch.Generator(device=device).manual_seed(99)  # residual and weight: the same on every rank
    weight = (1 + 0.1 * torch.randn(hidden, generator=shared, device=device)).to(torch.bfloat16)
    rows, sweep_rows = [], []
    sweepers = {}
    if sweep:
        for segments in SEGMENTS:
            for threads in THREADS:
                other = pyccl.Communicator(store, rank, world, device=device, name=f"fused_sweep_{segments}_{threads}",
                                           engine_options={"fused_segments": segments, "fused_threads": threads})
                sweepers[(segments, threads)] = other
    for tokens in TOKENS:
        x = torch.randn(tokens, hidden, generator=gen, device=device).to(torch.bfloat16)
        residual = torch.randn(tokens, hidden, generator=shared, device=device).to(torch.bfloat16)
        s, r, out = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
        r2, out2 = torch.empty_like(x), torch.empty_like(x)

        def fused(algo, c=comm):
            return lambda: pyccl.fused_all_reduce_rmsnorm(x, residual, weight, EPS, comm=c, algorithm=algo,
                                                          out=out2, residual_out=r2)
        variants = {
            "fused": fused(None),
            "fused_one_shot": fused("one_shot"),
            "fused_two_kernel": fused("two_kernel"),
            "pyccl_torch": _unfused(lambda: pyccl.all_reduce(x, out=s, comm=comm), residual, weight, s, r, out),
            "nccl_direct_torch": _unfused(lambda: nccl.all_reduce(x, s), residual, weight, s, r, out),
            "nccl_pg_torch": _unfused(lambda: (s.copy_(x), dist.all_reduce(s)), residual, weight, s, r, out),
            "all_reduce_only": lambda: pyccl.all_reduce(x, out=s, comm=comm),
        }
        if tokens >= world:
            variants["fused_two_shot"] = fused("two_shot")
        # The fused results against pyccl + torch's (the norm in fp32 on every path).
        variants["pyccl_torch"]()
        for name in ("fused_one_shot", "fused_two_shot", "fused_two_kernel"):
            if name in variants:
                variants[name]()
                torch.cuda.synchronize()
                if not (torch.allclose(r2.float(), r.float(), rtol=1e-2, atol=5e-2) and
                        torch.allclose(out2.float(), out.float(), rtol=2e-2, atol=5e-2)):
                    raise AssertionError(f"{name} at {tokens} tokens differs from pyccl + torch: "
                                         f"{(out2.float() - out.float()).abs().max().item():.3g}")
        row = {"tokens": tokens, "bytes": x.numel() * 2, "algo": comm._engine.select_fused(tokens, hidden * 2)}
        row.update(time_in_turn(variants, ITERS, ROUNDS, trials=TRIALS))
        rows.append(row)
        for (segments, threads), other in sweepers.items():
            for algo in ("one_shot", "two_shot"):
                if algo == "two_shot" and tokens < world:
                    continue
                us = time_graph(fused(algo, other), ITERS, TRIALS)
                sweep_rows.append({"tokens": tokens, "segments": segments, "threads": threads, "algo": algo, "us": us})
    for other in sweepers.values():
        other.close()
    nccl.close()
    comm.close()
    dist.destroy_process_group()
    return (rows, sweep_rows) if rank == 0 else None


COLUMNS = ("fused", "fused_one_shot", "fused_two_shot", "fused_two_kernel", "pyccl_torch", "nccl_direct_torch",
           "nccl_pg_torch", "all_reduce_only")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=8192)
    parser.add_argument("--sweep", action="store_true", help="also time every (segments, threads) launch shape")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--engine", default="{}", help="CollectiveEngine keywords (JSON) of the main communicator")
    args = parser.parse_args()
    engine = json.loads(args.engine)
    rows, sweep_rows = run_ranks(body, args.world, args=(args.hidden, args.sweep, engine), timeout=900)[0]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"world": args.world, "hidden": args.hidden, "rows": rows, "sweep": sweep_rows}, f, indent=1)
    print(f"world {args.world}, hidden {args.hidden}, bf16, µs per call (CUDA graph); engine {engine}")
    print("| tokens | bytes | auto | " + " | ".join(COLUMNS) + " | pyccl+torch / fused | NCCL+torch / fused |")
    print("|---:|---:|---|" + "---:|" * (len(COLUMNS) + 2))
    for r in rows:
        cells = " | ".join(f"{r[c]:.2f}" if r.get(c) is not None else "–" for c in COLUMNS)
        print(f"| {r['tokens']} | {r['bytes']} | {r['algo']} | {cells} | {r['pyccl_torch'] / r['fused']:.2f} | "
              f"{r['nccl_direct_torch'] / r['fused']:.2f} |")
    if sweep_rows:
        print("\nsweep: best (segments, threads) per tokens and algorithm")
        best = {}
        for s in sweep_rows:
            key = (s["tokens"], s["algo"])
            if key not in best or s["us"] < best[key]["us"]:
                best[key] = s
        for (tokens, algo), s in sorted(best.items()):
            print(f"  {tokens:3d} tokens {algo:8s}: {s['us']:.2f} µs at {s['segments']} x {s['threads']}")


if __name__ == "__main__":
    main()
