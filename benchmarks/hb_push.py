"""2PA HB all-reduce, pull against push, on plain (unregistered) tensors: every
variant on its own collective engine of one communicator, timed in turn at
each size (bf16, CUDA graph, median of the trials), with NCCL called directly
and pyccl's zero-copy kernel on symmetric buffers measured in the same run.

Variants (CollectiveEngine keywords):
- pull, one round per launch: the kernel before rounds moved into it;
- pull: every round of the message in one launch;
- push: the same, with stores into the peers' scratch instead of loads;
- push with 512 threads per block.

Each variant's result is checked against a float64 sum of every rank's input.

    python benchmarks/hb_push.py [--world 4] [--min-bytes 1M] [--max-bytes 256M]
"""

import argparse
import statistics

import torch

import pyccl
from pyccl._nccl import NcclComm
from pyccl._spawn import run_ranks
from pyccl.bench import _time_graph, parse_bytes

M = 1 << 20
VARIANTS = {
    "pull, round per launch": {"hb_push": False, "hb_rounds_per_launch": 1},
    "pull": {"hb_push": False},
    "push": {"hb_push": True},
    "push, 512 threads": {"hb_push": True, "hb_threads": 512},
}
ROUNDS = 3  # the variants are timed in turn this many times; the table takes the median


def _iters(nbytes: int) -> int:
    return 20 if nbytes <= 16 * M else 5


def body(rank, world, store, sizes):
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    torch.manual_seed(1000 + rank)
    comm = pyccl.Communicator(store, rank, world, device=device, name="hb_push")
    engines = {name: pyccl._C.CollectiveEngine(comm._comm, **opts) for name, opts in VARIANTS.items()}
    nccl = NcclComm(store, rank, world, device.index, key="hb_push_nccl")
    sym_in = pyccl.symmetric_empty(max(sizes), dtype=torch.uint8, comm=comm)
    sym_out = pyccl.symmetric_empty(max(sizes), dtype=torch.uint8, comm=comm)
    rows = []
    for nbytes in sizes:
        x = torch.randn(nbytes // 2, device=device).to(torch.bfloat16)
        y = torch.empty_like(x)
        inputs = pyccl.all_gather(x, comm=comm).view(world, -1).double()
        expect = inputs.sum(0)
        calls = {name: (lambda e=e: e.all_reduce(comm._comm, x, y, "sum", "2pa_hb")) for name, e in engines.items()}
        buf = x.clone()
        calls["NCCL direct"] = lambda: nccl.all_reduce(x, buf)
        sx, sy = sym_in[:nbytes].view(torch.bfloat16), sym_out[:nbytes].view(torch.bfloat16)
        sx.copy_(x)
        calls["zero-copy (symmetric)"] = lambda: pyccl.all_reduce(sx, out=sy, comm=comm, algorithm="2pa_hb")
        errors = {}
        for name, fn in calls.items():
            fn()
            got = {"NCCL direct": buf, "zero-copy (symmetric)": sy}.get(name, y)
            torch.cuda.synchronize()
            # bf16 rounding of a sum of `world` terms of size ~3: a few ulps at 8
            errors[name] = float((got.double() - expect).abs().max())
        times = {name: [] for name in calls}
        for _ in range(ROUNDS):
            for name, fn in calls.items():
                times[name].append(_time_graph(fn, _iters(nbytes), 5))
        rows.append({"bytes": nbytes, "us": {k: statistics.median(v) for k, v in times.items()}, "errors": errors})
    for e in engines.values():
        e.close()
    nccl.close()
    comm.close()
    return rows


def _size(n: int) -> str:
    return f"{n // M} MiB" if n >= M else f"{n >> 10} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--min-bytes", type=parse_bytes, default=1 * M)
    parser.add_argument("--max-bytes", type=parse_bytes, default=256 * M)
    args = parser.parse_args()
    sizes, n = [], args.min_bytes
    while n <= args.max_bytes:
        sizes.append(n)
        n *= 2
    rows = run_ranks(body, args.world, args=(sizes,), timeout=900)[0]
    names = list(rows[0]["us"])
    print("| bytes | " + " | ".join(names) + " | NCCL direct / push |")
    print("|---|" + "---:|" * (len(names) + 1))
    for r in rows:
        us = r["us"]
        cells = " | ".join(f"{us[k]:.2f}" for k in names)
        print(f"| {_size(r['bytes'])} | {cells} | {us['NCCL direct'] / us['push']:.2f} |")
    worst = max(max(r["errors"].values()) for r in rows)
    print(f"largest error against the float64 sum, any variant: {worst:.3g}")
    if worst > 0.25:
        raise SystemExit(f"results differ from the float64 sum by {worst:.3g}")


if __name__ == "__main__":
    main()
