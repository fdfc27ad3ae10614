"""Where the plan interpreter's time goes: the 2PA HB all-reduce program cut
after each of its steps, 64 instances, bf16, CUDA graph, beside the
hand-written 2PA HB kernel of the same direction. The partial programs
compute nothing useful; only their time matters.

Pulling (default): 0: one local copy; 1: signal and wait; 2: + staging copy;
3: + reduction of every peer's chunk and the result copy; 4: + second signal
and wait; 5: + pulls, the whole plan. Pushing (``--push``): 0: the own chunk
into the own slot; 1: + the puts of the other chunks to their owners; 2: +
signal and wait; 3: + the reduction, stored locally only; 4: + the result
into every peer too (the fused reduce_put); 5: + second signal and wait;
6: + the copies out, the whole plan.

    python benchmarks/plan_stages.py [--world 4] [--push]
"""
import argparse

import torch
import pyccl
from pyccl.dsl import AllReduce, Program, all_pairs_memory_channels, signal_and_wait
from pyccl._spawn import run_ranks
from pyccl.bench_timing import time_graph, align_trials_with
from pyccl.plans import PlanRunner

PUSH_STAGES = 7


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


def push_prog(n, k, stage):
    with Program(f"push_stage{stage}", AllReduce(n, chunks=n, in_place=False), protocol="hb", instances=k) as p:
        chans = all_pairs_memory_channels(n)
        for r in range(n):
            peers = [(r + j) % n for j in range(1, n)]
            mine = p.scratch(r, 2 * n)
            if stage >= 1:
                for q in peers:
                    chans[(q, r)].put(p.scratch(q, 2 * n)[r], p.input(r)[q], tb=0)
            mine[r].copy(p.input(r)[r], tb=0)
            if stage >= 2:
                signal_and_wait(chans, r, peers, tb=0)
            if stage >= 3:
                mine[r].reduce(*[mine[q] for q in peers], tb=0)
            if stage >= 4:
                for q in peers:
                    chans[(q, r)].put(p.scratch(q, 2 * n)[n + r], mine[r], tb=0)
            if stage >= 3:
                p.output(r)[r].copy(mine[r], tb=0)
            if stage >= 5:
                signal_and_wait(chans, r, peers, tb=0)
            if stage >= 6:
                for q in peers:
                    p.output(r)[q].copy(mine[n + q], tb=0)
    return p


def body(rank, world, store, push):
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    comm = pyccl.Communicator(store, rank, world, device=device, name="plan_stages", collectives=False)
    comm._use_engine(pyccl._C.CollectiveEngine(comm._comm, hb_push=push))  # the plan's twin
    align_trials_with(comm, device)
    rows = []
    for nbytes in (256 << 10, 1 << 20, 4 << 20):
        x = torch.randn(nbytes // 2, device=device).to(torch.bfloat16)
        y = torch.empty_like(x)
        kernel = time_graph(lambda: pyccl.all_reduce(x, out=y, comm=comm, algorithm="2pa_hb"), 20, 7)
        rows.append(("kernel", 0, 0, nbytes, kernel))
        for k in (64,):
            for stage in range(PUSH_STAGES if push else 6):
                program = push_prog(world, k, stage) if push else prog(world, k, stage)
                run = PlanRunner(program.lower(), comm, max_bytes=nbytes, threads=256)
                rows.append(("stage", stage, k, nbytes, time_graph(lambda: run(x, out=y), 20, 7)))
                run.close()
    comm.close()
    return rows if rank == 0 else None


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--push", action="store_true", help="the pushing program and kernel")
    args = parser.parse_args()
    print(f"{'what':<8} {'step':>4} {'instances':>9} {'bytes':>9} {'us':>8}")
    for what, stage, k, nbytes, us in run_ranks(body, args.world, args=(args.push,), timeout=300)[0]:
        print(f"{what:<8} {stage:>4} {k:>9} {nbytes:>9} {us:>8.2f}")
