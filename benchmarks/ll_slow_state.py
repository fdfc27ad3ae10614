"""Forced 1PA LL all-reduce, timed again and again on fresh communicators: how
many CUDA-graph timings (20 calls, median of 5) fall into the slow state that
the measurement history (docs/performance.md#history) explains (hundreds of µs per call, where 9 µs is normal).

Each group times 1, 4, 16 and 64 KiB, then 256 KiB three times, 512 KiB,
128 KiB and 256 KiB twice more, each on fresh random bf16 tensors, and checks
the last result against a float64 sum of every rank's input.

    python benchmarks/ll_slow_state.py [--world 4] [--groups 4] [--slow-us 50]
"""

import argparse

import torch

import pyccl
from pyccl._spawn import run_ranks
from pyccl.bench_timing import time_graph

K = 1 << 10
SIZES = [1 * K, 4 * K, 16 * K, 64 * K, 256 * K, 256 * K, 256 * K, 512 * K, 128 * K, 256 * K, 256 * K]


def body(rank, world, store, group):
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    comm = pyccl.Communicator(store, rank, world, device=device, name=f"ll_slow_state_{group}")
    times = []
    for n in SIZES:
        x = torch.randn(n // 2, device=device).to(torch.bfloat16)
        y = torch.empty_like(x)
        times.append(time_graph(lambda: pyccl.all_reduce(x, out=y, comm=comm, algorithm="1pa_ll"), 20, 5))
    inputs = pyccl.all_gather(x, comm=comm).view(world, -1).double()
    error = float((y.double() - inputs.sum(0)).abs().max())
    comm.close()
    return times, error


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--groups", type=int, default=4, help="fresh communicators, one after the other")
    parser.add_argument("--slow-us", type=float, default=50.0, help="a timing above this is slow")
    args = parser.parse_args()
    slow = total = 0
    worst = 0.0
    print("| group | " + " | ".join(f"{n // K} KiB" for n in SIZES) + " | max error |")
    print("|---" * (len(SIZES) + 2) + "|")
    for group in range(args.groups):
        results = run_ranks(body, args.world, args=(group,), timeout=300)
        times = [max(r[0][i] for r in results) for i in range(len(SIZES))]  # the slowest rank's
        error = max(r[1] for r in results)
        big = [t for n, t in zip(SIZES, times) if n >= 128 * K]
        slow += sum(t > args.slow_us for t in big)
        total += len(big)
        worst = max(worst, *big)
        print(f"| {group} | " + " | ".join(f"{t:.1f}" for t in times) + f" | {error:.3g} |")
    print(f"\nslow timings at 128 KiB and up: {slow} of {total} (above {args.slow_us:g} µs); worst {worst:.1f} µs")


if __name__ == "__main__":
    main()
