"""All-reduce in the DSL: one-phase all-pairs with LL packets (1PA) and
two-phase all-pairs with HB (2PA), as the hand-written kernels of the same
names (csrc/collectives/allreduce_device.hpp)."""

from __future__ import annotations

from ..dsl import AllReduce, MemoryChannel, Program


def allreduce_allpairs_ll(num_ranks: int, instances: int = 1) -> Program:
    """1PA LL: every rank sends its whole input to every peer as LL packets
    (into slot r of the peer's scratch) and reduces the packets it receives.
    No signal or wait: the packets' flags order the data."""
    n = num_ranks
    with Program("allreduce_allpairs_ll", AllReduce(n, chunks=1), protocol="ll", instances=instances) as p:
        chans = {(q, r): MemoryChannel(q, r) for r in range(n) for q in range(n) if q != r}
        for r in range(n):
            for k in range(1, n):
                q = (r + k) % n
                chans[(q, r)].put_packets(p.scratch(q, n)[r], p.input(r)[0], tb=0)
            for k in range(1, n):
                q = (r + k) % n
                p.output(r)[0].reduce_packets(p.scratch(r, n)[q], tb=0)
    return p


def allreduce_allpairs_hb(num_ranks: int, instances: int = 1) -> Program:
    """2PA HB: chunk q of every input goes to rank q's scratch (slot = sender),
    rank q reduces it into its own chunk q and stores the result into chunk
    q of every rank's buffer (in place)."""
    n = num_ranks
    with Program("allreduce_allpairs_hb", AllReduce(n, chunks=n), protocol="hb", instances=instances) as p:
        chans = {(q, r): MemoryChannel(q, r) for r in range(n) for q in range(n) if q != r}
        for r in range(n):
            peers = [(r + k) % n for k in range(1, n)]
            for q in peers:  # reduce-scatter: my chunk q to rank q
                chans[(q, r)].put(p.scratch(q, n)[r], p.input(r)[q], tb=0)
            for q in peers:
                chans[(q, r)].signal(tb=0)
            for q in peers:
                chans[(r, q)].wait(tb=0)
            for q in peers:
                p.input(r)[r].reduce(p.scratch(r, n)[q], tb=0)
            for q in peers:  # all-gather: the result into every rank's chunk r
                chans[(q, r)].put(p.output(q)[r], p.input(r)[r], tb=0)
            for q in peers:
                chans[(q, r)].signal(tb=0)
            for q in peers:
                chans[(r, q)].wait(tb=0)
    return p
