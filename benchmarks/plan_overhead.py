"""The plan interpreter's fixed cost per call, on 4 GPUs, bf16, CUDA graph of
20 calls (median of 7): a plan that only copies its input to its output,
beside torch's copy of the same tensor, the 1PA LL kernel and the 1PA LL plan
at several instance counts and block sizes.

    python benchmarks/plan_overhead.py [--world 4]
"""

import argparse

import torch

import pyccl
import pyccl.algorithms as algorithms
from pyccl._spawn import run_ranks
from pyccl.bench_timing import time_graph
from pyccl.dsl import AllReduce, Program
from pyccl.plans import PlanRunner

SIZES = (1 << 10, 16 << 10, 64 << 10)


def copy_only(num_ranks: int, instances: int = 1) -> Program:
    """Not an all-reduce: every rank copies its input to its output (one op)."""
    with Program("copy_only", AllReduce(num_ranks, chunks=1, in_place=False), protocol="ll",
                 instances=instances) as p:
        for r in range(num_ranks):
            p.output(r)[0].copy(p.input(r)[0], tb=0)
    return p


def body(rank, world, store):
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    comm = pyccl.Communicator(store, rank, world, device=device, name="plan_overhead")
    rows = []
    for n in SIZES:
        x = torch.randn(n // 2, device=device).to(torch.bfloat16)
        y = torch.empty_like(x)
        rows.append((n, "torch copy_", time_graph(lambda: y.copy_(x), 20, 7)))
        rows.append((n, "kernel 1pa_ll",
                     time_graph(lambda: pyccl.all_reduce(x, out=y, comm=comm, algorithm="1pa_ll"), 20, 7)))
        programs = [(f"plan copy-only x{k}", copy_only(world, k)) for k in (1, 4)]
        programs += [(f"plan 1pa x{k}", algorithms.allreduce_allpairs_ll(world, instances=k)) for k in (1, 4, 16)]
        for name, program in programs:
            for threads in (256, 512):
                run = PlanRunner(program.lower(), comm, max_bytes=n, threads=threads)
                rows.append((n, f"{name} t{threads}", time_graph(lambda: run(x, out=y), 20, 7)))
                run.close()
    comm.close()
    return rows if rank == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    args = parser.parse_args()
    print("| bytes | what | µs |")
    print("|---:|---|---:|")
    for n, what, us in run_ranks(body, args.world, timeout=300)[0]:
        print(f"| {n} | {what} | {us:.2f} |")


if __name__ == "__main__":
    main()
