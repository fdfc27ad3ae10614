"""The 1PA HB all-reduce against the other kernels, on plain (unregistered)
bf16 tensors: every variant timed in turn at each size (CUDA graph, median of
the rounds), with NCCL called directly and pyccl's zero-copy kernel on
symmetric buffers measured in the same run.

1PA HB: each rank stores its whole input into every peer's staging, one
barrier, and each rank reduces every rank's copy locally. On 2 ranks it sends
what 2PA HB sends, with one barrier fewer and no copy-out; on N ranks it sends
N/2 times as much.

Variants: the library's 1PA LL, 2PA LL and 2PA HB (the default engine), and
1PA HB on engines of several shapes (CollectiveEngine keywords: all 128 blocks
at 256 threads, fewer blocks for small messages through
``one_phase_hb_bytes_per_block``, 512 threads). Every result is checked
against a float64 sum of every rank's input.

    python benchmarks/one_phase_hb.py [--world 2] [--min-bytes 1K] [--max-bytes 64M] [--json PATH]
"""

import argparse
import json

import torch

import pyccl
from pyccl._nccl import NcclComm
from pyccl._spawn import run_ranks
from pyccl.bench_timing import align_trials_with, doubling_sizes, parse_bytes, size_label, time_in_turn

K, M = 1 << 10, 1 << 20
# name: (algorithm, CollectiveEngine keywords or None for the communicator's own engine)
VARIANTS = {
    "1pa_ll": ("1pa_ll", None),
    "2pa_ll": ("2pa_ll", None),
    "2pa_hb": ("2pa_hb", None),
    "1pa_hb": ("1pa_hb", None),
    "1pa_hb, 16K/block": ("1pa_hb", {"one_phase_hb_bytes_per_block": 16 * K}),
    "1pa_hb, 64K/block": ("1pa_hb", {"one_phase_hb_bytes_per_block": 64 * K}),
    "1pa_hb, 512 thr": ("1pa_hb", {"hb_threads": 512}),
    "1pa_hb, 16K/block, 512 thr": ("1pa_hb", {"one_phase_hb_bytes_per_block": 16 * K, "hb_threads": 512}),
}
ROUNDS = 3  # the variants are timed in turn this many times; the table takes the median
# bf16 rounding of a sum of `world` standard normals: a few ulps near 8.
REDUCE_TOLERANCE = 0.25


def _iters(nbytes: int) -> int:
    return 20 if nbytes <= 16 * M else 5


def _runs(name: str, nbytes: int, ll_max: int, world: int) -> bool:
    algo = VARIANTS[name][0]
    if algo == "1pa_ll":
        return nbytes <= ll_max
    if algo == "2pa_ll":
        return nbytes <= 4 * world * ll_max  # far past its range it says nothing new
    return True


def _rank_input(rank: int, numel: int, device: torch.device) -> torch.Tensor:
    """Rank `rank`'s input, the same wherever it is drawn (every rank checks against all of them)."""
    g = torch.Generator(device=device)
    g.manual_seed(7919 * (rank + 1) + numel)
    return torch.randn(numel, generator=g, device=device).to(torch.bfloat16)


def body(rank, world, store, sizes):
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    comm = pyccl.Communicator(store, rank, world, device=device, name="one_phase_hb")
    align_trials_with(comm, device)
    engines = {name: (comm._engine if opts is None else pyccl._C.CollectiveEngine(comm._comm, **opts))
               for name, (_, opts) in VARIANTS.items()}
    nccl = NcclComm(store, rank, world, device.index, key="one_phase_hb_nccl")
    sym = (pyccl.symmetric_empty(max(sizes), dtype=torch.uint8, comm=comm),
           pyccl.symmetric_empty(max(sizes), dtype=torch.uint8, comm=comm))
    ll_max = comm._engine.ll_max_bytes
    rows = []
    for nbytes in sizes:
        everyone = [_rank_input(q, nbytes // 2, device) for q in range(world)]
        x, expect = everyone[rank], torch.stack([t.double() for t in everyone]).sum(0)
        names = [n for n in VARIANTS if _runs(n, nbytes, ll_max, world)]
        outs = {name: torch.empty_like(x) for name in names}
        calls = {name: (lambda e=engines[name], y=outs[name], a=VARIANTS[name][0]:
                        e.all_reduce(comm._comm, x, y, "sum", a)) for name in names}
        outs["NCCL direct"] = torch.empty_like(x)
        calls["NCCL direct"] = lambda: nccl.all_reduce(x, outs["NCCL direct"])
        sx, sy = sym[0][:nbytes].view(torch.bfloat16), sym[1][:nbytes].view(torch.bfloat16)
        sx.copy_(x)
        outs["zero-copy (symmetric)"] = sy
        calls["zero-copy (symmetric)"] = lambda: pyccl.all_reduce(sx, out=sy, comm=comm, algorithm="2pa_hb")
        errors = {}
        for name, fn in calls.items():
            outs[name].fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            errors[name] = float((outs[name].double() - expect).abs().max())
        rows.append({"bytes": nbytes, "errors": errors, "us": time_in_turn(calls, _iters(nbytes), ROUNDS)})
        del calls, outs, everyone, expect
    for name, e in engines.items():
        if e is not comm._engine:
            e.close()
    nccl.close()
    comm.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--min-bytes", type=parse_bytes, default=1 * K)
    parser.add_argument("--max-bytes", type=parse_bytes, default=64 * M)
    parser.add_argument("--json", help="also write the rows (every rank's view is rank 0's) here")
    args = parser.parse_args()
    sizes = doubling_sizes(args.min_bytes, args.max_bytes)
    rows = run_ranks(body, args.world, args=(sizes,), timeout=1800)[0]
    names = [*VARIANTS, "NCCL direct", "zero-copy (symmetric)"]
    print(f"\nall-reduce, {args.world} GPUs, bf16, µs per call")
    print("| bytes | " + " | ".join(names) + " | best 1pa_hb / best other kernel |")
    print("|---|" + "---:|" * (len(names) + 1))
    worst = 0.0
    for r in rows:
        us = r["us"]
        cells = " | ".join(f"{us[k]:.2f}" if k in us else "" for k in names)
        one = min(v for k, v in us.items() if k.startswith("1pa_hb"))
        other = min(us[k] for k in ("1pa_ll", "2pa_ll", "2pa_hb") if k in us)
        print(f"| {size_label(r['bytes'])} | {cells} | {one / other:.2f} |")
        worst = max(worst, *r["errors"].values())
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"world": args.world, "variants": {k: list(v) for k, v in VARIANTS.items()}, "rows": rows},
                      f, indent=1)
    print(f"\nlargest error against the float64 sum: {worst:.3g}")
    if worst > REDUCE_TOLERANCE:
        raise SystemExit(f"wrong results: largest error {worst:.3g}")


if __name__ == "__main__":
    main()
