"""The DSL plan interpreter against the hand-written kernel of the same
algorithm: all-reduce, bf16, CUDA graph of 10 calls, median of 5, on 4 GPUs.

    python benchmarks/plan_bench.py
"""

import torch

import pyccl
import pyccl.algorithms as algorithms
from pyccl._spawn import run_ranks
from pyccl.bench import _time_graph
from pyccl.plans import PlanRunner

CASES = (("allreduce_allpairs_ll", "1pa_ll", (4096, 65536)),
         ("allreduce_allpairs_hb", "2pa_hb", (4096, 65536, 1 << 20, 16 << 20)))


def body(rank, world, store):
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    comm = pyccl.Communicator(store, rank, world, device=device, name="plan_bench")
    rows = []
    for name, algo, sizes in CASES:
        run = PlanRunner(algorithms.LIBRARY[name](world).lower(), comm, max_bytes=16 << 20)
        for nbytes in sizes:
            x = torch.randn(nbytes // 2, device=device).to(torch.bfloat16)
            y = torch.empty_like(x)
            t_plan = _time_graph(lambda: run(x, out=y), 10, 5)
            t_kernel = _time_graph(lambda: pyccl.all_reduce(x, out=y, comm=comm, algorithm=algo), 10, 5)
            rows.append((name, algo, nbytes, t_plan, t_kernel))
        run.close()
    comm.close()
    return rows if rank == 0 else None


if __name__ == "__main__":
    print(f"{'plan':<24} {'kernel':<7} {'bytes':>10} {'plan us':>10} {'kernel us':>10}")
    for name, algo, nbytes, t_plan, t_kernel in run_ranks(body, 4, timeout=120)[0]:
        print(f"{name:<24} {algo:<7} {nbytes:>10} {t_plan:>10.2f} {t_kernel:>10.2f}")
