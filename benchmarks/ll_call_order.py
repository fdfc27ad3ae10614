"""Forced 1PA LL and 2PA LL all-reduce from 64 KiB to 1 MiB on a fresh
communicator, sizes ascending or descending: CUDA graph of 20 calls (median
of 7) and eager (mean of 20) µs per call. It reproduces a slowdown of 1PA LL
that depends on the order of earlier calls (benchmarks/RESULTS.md).

    python benchmarks/ll_call_order.py [--world 4] [--order up|down]
"""

import argparse
import time

import torch

import pyccl
from pyccl._spawn import run_ranks
from pyccl.bench import _time_graph

SIZES = [64 << 10, 128 << 10, 192 << 10, 256 << 10, 384 << 10, 512 << 10, 1 << 20]


def body(rank, world, store, order):
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    comm = pyccl.Communicator(store, rank, world, device=device, name="ll_call_order")
    rows = []
    for n in SIZES if order == "up" else SIZES[::-1]:
        x = torch.randn(n // 2, device=device).to(torch.bfloat16)
        y = torch.empty_like(x)
        row = [n]
        for algo in ("1pa_ll", "2pa_ll"):
            def fn():
                pyccl.all_reduce(x, out=y, comm=comm, algorithm=algo)
            fn()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            eager = (time.perf_counter() - start) / 20 * 1e6
            row += [algo, _time_graph(fn, 20, 7), eager]
        rows.append(row)
    comm.close()
    return rows if rank == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--order", choices=("up", "down"), default="down")
    args = parser.parse_args()
    print("| bytes | 1PA LL graph | 1PA LL eager | 2PA LL graph | 2PA LL eager |")
    print("|---:|---:|---:|---:|---:|")
    for n, _, g1, e1, _, g2, e2 in run_ranks(body, args.world, args=(args.order,), timeout=300)[0]:
        print(f"| {n} | {g1:.2f} | {e1:.1f} | {g2:.2f} | {e2:.1f} |")


if __name__ == "__main__":
    main()
