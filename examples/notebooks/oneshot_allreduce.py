# %% [markdown]
# # A one-shot all-reduce that pulls, in the pyccl DSL
#
# A new algorithm in a few dozen lines. Every rank reads every peer's input
# over NVLink (MemoryChannel.reduce) and reduces it into its own output.
# There is one hop and no scratch. The message is split over `tbs` thread
# blocks, and each has its own channels to every peer. It runs on a laptop
# CPU: lowering checks it, and the simulator runs it under random
# interleavings against the all-reduce definition. `pyccl.plans.PlanRunner`
# runs the same plan on CPU processes (host mode) or on GPUs.
#
#     python examples/notebooks/oneshot_allreduce.py [ranks] [thread blocks]

# %%
import sys

from pyccl.dsl import AllReduce, MemoryChannel, Program, simulate, verify


def oneshot_allreduce(n: int, tbs: int = 2) -> Program:
    with Program("oneshot_allreduce", AllReduce(n, chunks=tbs, in_place=False)) as p:
        # One channel per (peer, thread block): a channel side belongs to one thread block.
        ch = {(q, r, t): MemoryChannel(q, r) for r in range(n) for q in range(n) if q != r for t in range(tbs)}
        for r in range(n):
            peers = [(r + k) % n for k in range(1, n)]
            for t in range(tbs):
                for q in peers:  # "my input is in place" (the executor stages it before the ops)
                    ch[(q, r, t)].signal(tb=t)
                for q in peers:
                    ch[(r, q, t)].wait(tb=t)
                p.output(r)[t].copy(p.input(r)[t], tb=t)
                for q in peers:  # pull chunk t of every peer's input and reduce it here
                    ch[(q, r, t)].reduce(p.output(r)[t], p.input(q)[t], tb=t)
    return p


# %%
if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    tbs = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    plan = oneshot_allreduce(n, tbs).lower()
    verify(plan, interleavings=50)
    print(f"{plan.name}: {n} ranks x {tbs} thread blocks, "
          f"{sum(len(tb['ops']) for r in plan.ranks for tb in r['threadblocks'])} ops; "
          f"50 interleavings: right result, no deadlock, no race")
    print(simulate(plan, seed=1))
