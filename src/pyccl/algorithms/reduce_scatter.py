"""Reduce-scatter in the DSL: the ring with overlapped reduction of the
MSCCL++ paper (Figure 6), over PortChannels.

Each chunk is split in two halves. At step s rank r forwards chunk
c = (r - s - 1) mod N to rank r + 1 (into slot c of its scratch). Before
sending a half it waits for that half of the previous step's chunk, which is
this one, and reduces it: the reduction of one half overlaps the transfer of
the other, which the proxy carries while the thread block works.
"""

from __future__ import annotations

from ..dsl import PortChannel, Program, ReduceScatter


def reduce_scatter_ring(num_ranks: int, instances: int = 1) -> Program:
    n = num_ranks
    with Program("reduce_scatter_ring", ReduceScatter(n, chunks=2), protocol="hb", instances=instances) as p:
        send = {r: PortChannel((r + 1) % n, r) for r in range(n)}
        for r in range(n):
            prev = (r - 1) % n
            scratch, inp = p.scratch(r, 2 * n), p.input(r)
            nxt_scratch = p.scratch((r + 1) % n, 2 * n)
            for s in range(n - 1):
                c = (r - s - 1) % n
                for h in (0, 1):
                    if s > 0:
                        send[prev].wait(tb=0)  # half h of chunk c, sent by the previous rank at step s - 1
                        inp[2 * c + h].reduce(scratch[2 * c + h], tb=0)
                    send[r].put(nxt_scratch[2 * c + h], inp[2 * c + h], tb=0)
                    send[r].signal(tb=0)
            for h in (0, 1):  # the last arrivals complete chunk r
                send[prev].wait(tb=0)
                inp[2 * r + h].reduce(scratch[2 * r + h], tb=0)
                p.output(r)[h].copy(inp[2 * r + h], tb=0)
            send[r].flush(tb=0)
    return p
