"""The LL all-reduce kernels at several thread limits (`ll_threads`), side by
side: bf16, CUDA graph of 20 calls, medians of 7 replays, aligned trials, each
size timed at every limit in turn for 3 rounds (medians of the rounds).

A call runs on whole warps for its blocks' packet shares where those are under
a quarter of the limit (CollectiveEngine::llThreadsFor), so the limits differ
only where the shares are larger.

    python benchmarks/ll_threads.py [--world 2]
"""

import argparse

import torch

import pyccl
from pyccl._spawn import run_ranks
from pyccl.bench_timing import align_trials_with, time_in_turn

K = 1024
CASES = (("1pa_ll", (1 * K, 4 * K, 16 * K, 64 * K, 256 * K)), ("2pa_ll", (64 * K, 256 * K, 1024 * K)))
LIMITS = (1024, 512, 256, 128)
ROUNDS = 3


def body(rank, world, store):
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    comm = pyccl.Communicator(store, rank, world, device=device, name="ll_threads", collectives=False)
    engines = {t: pyccl._C.CollectiveEngine(comm._comm, ll_threads=t) for t in LIMITS}
    comm._use_engine(engines[LIMITS[0]])
    align_trials_with(comm, device)
    rows = []
    for algo, sizes in CASES:
        for n in sizes:
            x = torch.randn(n // 2, device=device).to(torch.bfloat16)
            y = torch.empty_like(x)

            def call(t):
                comm._use_engine(engines[t])
                pyccl.all_reduce(x, out=y, comm=comm, algorithm=algo)
            rows.append((algo, n, time_in_turn({t: lambda t=t: call(t) for t in LIMITS}, 20, ROUNDS, trials=7)))
    for t in LIMITS[1:]:
        engines[t].close()
    comm._use_engine(engines[LIMITS[0]])  # comm.close() closes the one in use
    comm.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    args = parser.parse_args()
    rows = run_ranks(body, args.world, timeout=500)[0]
    print("| algorithm | bytes | " + " | ".join(f"ll_threads {t}" for t in LIMITS) + " |")
    print("|---|---:|" + "---:|" * len(LIMITS))
    for algo, n, t in rows:
        print(f"| {algo} | {n} | " + " | ".join(f"{t[k]:.2f}" for k in LIMITS) + " |")


if __name__ == "__main__":
    main()
