"""The HB kernels, pull against push, on plain (unregistered) tensors: every
variant on its own collective engine of one communicator, timed in turn at
each size (bf16, CUDA graph, median of the rounds), with NCCL called directly
measured in the same run (and, for the all-reduce, pyccl's zero-copy kernel on
symmetric buffers).

Collectives: the 2PA HB all-reduce and the HB all-gather, reduce-scatter and
all-to-all. Sizes are the whole buffer, as nccl-tests counts them (the
all-gather's output, the reduce-scatter's input).

Variants (CollectiveEngine keywords):
- pull, a round per launch, 256 threads: the exchanges' kernels before their
  rounds moved into one launch;
- pull: every round of the message in one launch;
- push: the same, with stores into the peers' scratch instead of loads
  (256 threads per block below hb_piece_bytes, hb_large_threads from there);
- push with 256 and with 512 threads per block at every size.

Every result is checked: data movement bit for bit, reductions against a
float64 sum of every rank's input.

    python benchmarks/hb_push.py [--world 4] [--collectives all_reduce,all_gather]
        [--min-bytes 1M] [--max-bytes 256M] [--json PATH]
"""

import argparse
import json

import torch

import pyccl
from pyccl._nccl import NcclComm
from pyccl._spawn import run_ranks
from pyccl.bench_timing import align_trials_with, doubling_sizes, parse_bytes, size_label, time_in_turn

M = 1 << 20
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
VARIANTS = {
    "pull, round per launch": {"hb_push": False, "hb_rounds_per_launch": 1, "hb_large_threads": 256},
    "pull": {"hb_push": False},
    "push": {"hb_push": True},
    "push, 256 threads": {"hb_push": True, "hb_large_threads": 256},
    "push, 512 threads": {"hb_push": True, "hb_threads": 512},
}
ROUNDS = 3  # the variants are timed in turn this many times; the table takes the median
# bf16 rounding of a sum of `world` standard normals: a few ulps near 8.
REDUCE_TOLERANCE = 0.25


def _iters(nbytes: int) -> int:
    return 20 if nbytes <= 16 * M else 5


def _rank_input(rank: int, numel: int, device: torch.device) -> torch.Tensor:
    """Rank `rank`'s input, the same wherever it is drawn (every rank checks against all of them)."""
    g = torch.Generator(device=device)
    g.manual_seed(7919 * (rank + 1) + numel)
    return torch.randn(numel, generator=g, device=device).to(torch.bfloat16)


def _calls(coll, engines, comm, nccl, world, rank, nbytes, device, sym):
    """{variant: call}, the tensors each call writes, and the expected result."""
    inputs = lambda n: [_rank_input(q, n, device) for q in range(world)]  # noqa: E731
    if coll == "all_reduce":
        everyone = inputs(nbytes // 2)
        x, expect = everyone[rank], torch.stack([t.double() for t in everyone]).sum(0)
        outs = {name: torch.empty_like(x) for name in engines}
        calls = {name: (lambda e=e, y=outs[name]: e.all_reduce(comm._comm, x, y, "sum", "2pa_hb"))
                 for name, e in engines.items()}
        outs["NCCL direct"] = torch.empty_like(x)
        calls["NCCL direct"] = lambda: nccl.all_reduce(x, outs["NCCL direct"])
        sx, sy = sym[0][:nbytes].view(torch.bfloat16), sym[1][:nbytes].view(torch.bfloat16)
        sx.copy_(x)
        outs["zero-copy (symmetric)"] = sy
        calls["zero-copy (symmetric)"] = lambda: pyccl.all_reduce(sx, out=sy, comm=comm, algorithm="2pa_hb")
        return calls, outs, expect
    if coll == "all_gather":
        everyone = inputs(nbytes // 2 // world)
        x, expect, out_numel = everyone[rank], torch.cat(everyone), nbytes // 2
    elif coll == "reduce_scatter":
        n = nbytes // 2 // world
        everyone = inputs(n * world)
        x, out_numel = everyone[rank], n
        expect = torch.stack([t.double() for t in everyone]).sum(0)[rank * n:(rank + 1) * n]
    else:
        n = nbytes // 2 // world
        everyone = inputs(n * world)
        x, out_numel = everyone[rank], n * world
        expect = torch.cat([t[rank * n:(rank + 1) * n] for t in everyone])
    outs = {name: torch.empty(out_numel, dtype=torch.bfloat16, device=device) for name in [*engines, "NCCL direct"]}
    calls = {name: (lambda e=e, y=outs[name]: getattr(e, coll)(comm._comm, x, y, protocol="hb"))
             for name, e in engines.items()}
    calls["NCCL direct"] = lambda: getattr(nccl, coll)(x, outs["NCCL direct"])
    return calls, outs, expect


def _error(coll: str, got: torch.Tensor, expect: torch.Tensor) -> float:
    """Largest deviation: bits that differ for data movement, |error| for reductions."""
    if coll in ("all_reduce", "reduce_scatter"):
        return float((got.double() - expect).abs().max())
    return float((got.view(torch.int16) != expect.view(torch.int16)).sum())


def body(rank, world, store, collectives, sizes):
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    comm = pyccl.Communicator(store, rank, world, device=device, name="hb_push")
    align_trials_with(comm, device)
    engines = {name: pyccl._C.CollectiveEngine(comm._comm, **opts) for name, opts in VARIANTS.items()}
    nccl = NcclComm(store, rank, world, device.index, key="hb_push_nccl")
    sym = (pyccl.symmetric_empty(max(sizes), dtype=torch.uint8, comm=comm),
           pyccl.symmetric_empty(max(sizes), dtype=torch.uint8, comm=comm))
    rows = []
    for coll in collectives:
        for nbytes in sizes:
            calls, outs, expect = _calls(coll, engines, comm, nccl, world, rank, nbytes, device, sym)
            errors = {}
            for name, fn in calls.items():
                outs[name].fill_(float("nan"))
                fn()
                torch.cuda.synchronize()
                errors[name] = _error(coll, outs[name], expect)
            rows.append({"collective": coll, "bytes": nbytes, "errors": errors,
                         "us": time_in_turn(calls, _iters(nbytes), ROUNDS)})
            del calls, outs, expect
    for e in engines.values():
        e.close()
    nccl.close()
    comm.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--collectives", default="all_reduce", help=f"comma-separated, of {', '.join(COLLECTIVES)}")
    parser.add_argument("--min-bytes", type=parse_bytes, default=1 * M)
    parser.add_argument("--max-bytes", type=parse_bytes, default=256 * M)
    parser.add_argument("--json", help="also write the rows (every rank's view is rank 0's) here")
    args = parser.parse_args()
    collectives = [c for c in args.collectives.split(",") if c]
    unknown = sorted(set(collectives) - set(COLLECTIVES))
    if unknown:
        parser.error(f"--collectives: unknown {unknown}; take from {', '.join(COLLECTIVES)}")
    sizes = doubling_sizes(args.min_bytes, args.max_bytes)
    rows = run_ranks(body, args.world, args=(collectives, sizes), timeout=1800)[0]
    worst_bits, worst_error = 0.0, 0.0
    for coll in collectives:
        mine = [r for r in rows if r["collective"] == coll]
        names = list(mine[0]["us"])
        print(f"\n{coll}, {args.world} GPUs, bf16, µs per call")
        print("| bytes | " + " | ".join(names) + " | NCCL direct / push |")
        print("|---|" + "---:|" * (len(names) + 1))
        for r in mine:
            us = r["us"]
            cells = " | ".join(f"{us[k]:.2f}" for k in names)
            print(f"| {size_label(r['bytes'])} | {cells} | {us['NCCL direct'] / us['push']:.2f} |")
            worst = max(r["errors"].values())
            if coll in ("all_reduce", "reduce_scatter"):
                worst_error = max(worst_error, worst)
            else:
                worst_bits = max(worst_bits, worst)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"world": args.world, "variants": VARIANTS, "rows": rows}, f, indent=1)
    print(f"\nlargest error against the float64 sum: {worst_error:.3g}; most wrong elements moved: {worst_bits:.0f}")
    if worst_error > REDUCE_TOLERANCE or worst_bits > 0:
        raise SystemExit(f"wrong results: error {worst_error:.3g}, {worst_bits:.0f} elements moved wrongly")


if __name__ == "__main__":
    main()
