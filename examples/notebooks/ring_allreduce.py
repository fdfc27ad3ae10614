# %% [markdown]
# # A ring all-reduce in the pyccl DSL
#
# A new algorithm in a few dozen lines: reduce-scatter around the ring, then
# all-gather around it, over PortChannels (the proxy moves the data, so the
# thread block is free to reduce while a transfer is in flight). It runs on a
# laptop CPU: lowering checks it, the simulator runs it under random
# interleavings and compares with the all-reduce definition.
#
#     python examples/notebooks/ring_allreduce.py [ranks]

# %%
import sys

from pyccl.dsl import AllReduce, PortChannel, Program, simulate, verify


def ring_allreduce(n: int) -> Program:
    with Program("ring_allreduce", AllReduce(n, chunks=n), protocol="hb") as p:
        send = {r: PortChannel((r + 1) % n, r) for r in range(n)}
        for r in range(n):
            prev, inp = (r - 1) % n, p.input(r)
            mine, theirs = p.scratch(r, 2 * n), p.scratch((r + 1) % n, 2 * n)
            # Reduce-scatter: at step s forward chunk (r - s - 1), reduced with what arrived.
            for s in range(n - 1):
                c = (r - s - 1) % n
                if s > 0:
                    send[prev].wait(tb=0)
                    inp[c].reduce(mine[c], tb=0)
                send[r].put(theirs[c], inp[c], tb=0)
                send[r].signal(tb=0)
            send[prev].wait(tb=0)
            inp[r].reduce(mine[r], tb=0)  # chunk r is complete here
            # All-gather: forward the complete chunks (slots n.. of the scratch).
            # No flush is needed before overwriting chunks the proxy sent: each
            # write follows a wait whose signal went around the ring after them.
            for s in range(n - 1):
                c = (r - s) % n
                if s > 0:
                    send[prev].wait(tb=0)
                    inp[c].copy(mine[n + c], tb=0)
                send[r].put(theirs[n + c], inp[c], tb=0)
                send[r].signal(tb=0)
            send[prev].wait(tb=0)
            inp[(r + 1) % n].copy(mine[n + (r + 1) % n], tb=0)
            send[r].flush(tb=0)
    return p


# %%
if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    plan = ring_allreduce(n).lower()
    verify(plan, interleavings=50)
    print(f"{plan.name}: {n} ranks, {sum(len(tb['ops']) for r in plan.ranks for tb in r['threadblocks'])} ops; "
          f"50 interleavings: right result, no deadlock, no race")
    print(simulate(plan, seed=1))
