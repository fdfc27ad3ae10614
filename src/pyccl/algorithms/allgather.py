"""All-gather in the DSL: all-pairs (every rank stores its input into every
peer's output) and ring (each chunk travels N-1 hops over PortChannels)."""

from __future__ import annotations

from ..dsl import AllGather, PortChannel, Program, all_pairs_memory_channels, signal_and_wait


def allgather_allpairs(num_ranks: int, instances: int = 1) -> Program:
    n = num_ranks
    with Program("allgather_allpairs", AllGather(n), protocol="hb", instances=instances) as p:
        chans = all_pairs_memory_channels(n)
        for r in range(n):
            peers = [(r + k) % n for k in range(1, n)]
            for q in peers:
                chans[(q, r)].put(p.output(q)[r], p.input(r)[0], tb=0)
            p.output(r)[r].copy(p.input(r)[0], tb=0)
            signal_and_wait(chans, r, peers, tb=0)
    return p


def allgather_ring(num_ranks: int, instances: int = 1) -> Program:
    """Rank r forwards, at step s, the chunk of rank (r - s) to rank r + 1: into
    the next rank's output directly, so no copy is needed on arrival."""
    n = num_ranks
    with Program("allgather_ring", AllGather(n), protocol="hb", instances=instances) as p:
        send = {r: PortChannel((r + 1) % n, r) for r in range(n)}
        for r in range(n):
            nxt, prev = (r + 1) % n, (r - 1) % n
            p.output(r)[r].copy(p.input(r)[0], tb=0)
            for s in range(n - 1):
                c = (r - s) % n
                if s > 0:
                    send[prev].wait(tb=0)  # chunk c arrived from the previous rank
                send[r].put(p.output(nxt)[c], p.output(r)[c], tb=0)
                send[r].signal(tb=0)
            send[prev].wait(tb=0)
            send[r].flush(tb=0)
    return p
