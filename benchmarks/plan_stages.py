"""Where the plan interpreter's time goes: the 2PA HB all-reduce program cut
after each of its steps (0: one local copy; 1: signal and wait; 2: + staging
copy; 3: + reduction of every peer's chunk and the result copy; 4: + second
signal and wait; 5: + pulls, the whole plan), 64 instances, bf16, CUDA
graph, on 4 GPUs, beside the hand-written 2PA HB kernel in its pulling
form. The partial programs compute nothing useful; only their time matters.

    python benchmarks/plan_stages.py
"""
import torch
import pyccl
from pyccl.dsl import AllReduce, Program, all_pairs_memory_channels, signal_and_wait
from pyccl._spawn import run_ranks
from pyccl.bench import _time_graph
from pyccl.plans import PlanRunner


def prog(n, k, stage):
    with Program(f"stage{stage}", AllReduce(n, chunks=n, in_place=False), protocol="hb", instances=k) as p:
        chans = all_pairs_memory_channels(n)
        for r in range(n):
            peers = [(r + j) % n for j in range(1, n)]
            mine = p.scratch(r, n)
            if stage == 0:
                p.output(r)[r].copy(p.input(r)[r], tb=0)
                continue
            if stage >= 2:
                mine[0:n].copy(p.input(r)[0:n], tb=0)
            signal_and_wait(chans, r, peers, tb=0)
            if stage >= 3:
                for q in peers:
                    chans[(q, r)].reduce(mine[r], p.scratch(q, n)[r], tb=0)
                p.output(r)[r].copy(mine[r], tb=0)
            if stage >= 4:
                signal_and_wait(chans, r, peers, tb=0)
            if stage >= 5:
                for q in peers:
                    chans[(q, r)].get(p.output(r)[q], p.scratch(q, n)[q], tb=0)
    return p


def body(rank, world, store):
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    comm = pyccl.Communicator(store, rank, world, device=device, name="plan_stages", collectives=False)
    comm._engine = pyccl._C.CollectiveEngine(comm._comm, hb_push=False)  # the plan's twin pulls too
    rows = []
    for nbytes in (256 << 10, 4 << 20):
        x = torch.randn(nbytes // 2, device=device).to(torch.bfloat16)
        y = torch.empty_like(x)
        kernel = _time_graph(lambda: pyccl.all_reduce(x, out=y, comm=comm, algorithm="2pa_hb"), 20, 7)
        rows.append(("kernel", 0, 0, nbytes, kernel))
        for k in (64,):
            for stage in range(6):
                run = PlanRunner(prog(world, k, stage).lower(), comm, max_bytes=nbytes, threads=256)
                rows.append(("stage", stage, k, nbytes, _time_graph(lambda: run(x, out=y), 20, 7)))
                run.close()
    comm.close()
    return rows if rank == 0 else None


if __name__ == "__main__":
    print(f"{'what':<8} {'step':>4} {'instances':>9} {'bytes':>9} {'us':>8}")
    for what, stage, k, nbytes, us in run_ranks(body, 4, timeout=300)[0]:
        print(f"{what:<8} {stage:>4} {k:>9} {nbytes:>9} {us:>8.2f}")
