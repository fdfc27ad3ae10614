"""All-reduce in the DSL: one-phase all-pairs with LL packets and with HB (1PA), two-phase
all-pairs with LL packets and with HB (2PA, pulling and pushing), as the hand-written kernels of the
same names (csrc/algorithms/allreduce.cu), and the two-phase ring
with overlapped reduction (2PR)."""

from __future__ import annotations

from ..dsl import AllReduce, PortChannel, Program, all_pairs_memory_channels, signal_and_wait


def allreduce_1pa_ll(num_ranks: int, instances: int = 1) -> Program:
    """1PA LL: every rank sends its whole input to every peer as LL packets
    (into slot r of the peer's scratch), copies it to its output and reduces
    every peer's packets into it at once. No signal or wait: the packets'
    flags order the data, and they also tell each rank that every peer has
    entered the call, so calls need no barrier."""
    n = num_ranks
    with Program("allreduce_1pa_ll", AllReduce(n, chunks=1, in_place=False), protocol="ll",
                 instances=instances) as p:
        chans = all_pairs_memory_channels(n)
        for r in range(n):
            for k in range(1, n):
                q = (r + k) % n
                chans[(q, r)].put_packets(p.scratch(q, n)[r], p.input(r)[0], tb=0)
            p.output(r)[0].copy(p.input(r)[0], tb=0)
            for k in range(1, n):
                q = (r + k) % n
                p.output(r)[0].reduce_packets(p.scratch(r, n)[q], tb=0)
    return p


def allreduce_1pa_hb(num_ranks: int, instances: int = 1) -> Program:
    """1PA HB, as the hand-written kernel (``1pa_hb``): every rank puts its
    whole input into slot r of every peer's scratch and tells its peers; each
    rank then reduces its own input with every peer's copy (local reads only)
    into its output. One signal and wait, no result stores: on 2 ranks it
    sends what 2PA sends, on n ranks n / 2 times as much. Lowering makes
    the copy of the input the reduction's start (``init``: never copied). The
    wait also orders call k + 1's puts after every peer's reduction of call
    k - 1, which used the same half of the scratch (double-buffered by call
    parity), so calls need no barrier."""
    n = num_ranks
    with Program("allreduce_1pa_hb", AllReduce(n, chunks=1, in_place=False), protocol="hb",
                 instances=instances) as p:
        chans = all_pairs_memory_channels(n)
        for r in range(n):
            peers = [(r + k) % n for k in range(1, n)]
            mine = p.scratch(r, n)  # slot q: rank q's input
            for q in peers:
                chans[(q, r)].put(p.scratch(q, n)[r], p.input(r)[0], tb=0)
            signal_and_wait(chans, r, peers, tb=0)  # pushed
            p.output(r)[0].copy(p.input(r)[0], tb=0)
            p.output(r)[0].reduce(*[mine[q] for q in peers], tb=0)
    return p


def allreduce_2pa_hb_pull(num_ranks: int, instances: int = 1) -> Program:
    """2PA HB, as the hand-written kernel pulls (``hb_push=False``): every
    rank stages its input in its scratch and tells its peers; rank r reduces
    chunk r reading every peer's staged chunk r at once, keeps the result in
    its scratch and tells its peers; every rank then pulls each other chunk
    from its owner's scratch."""
    n = num_ranks
    with Program("allreduce_2pa_hb_pull", AllReduce(n, chunks=n, in_place=False), protocol="hb",
                 instances=instances) as p:
        chans = all_pairs_memory_channels(n)
        for r in range(n):
            peers = [(r + k) % n for k in range(1, n)]
            mine = p.scratch(r, n)
            mine[0:n].copy(p.input(r)[0:n], tb=0)
            signal_and_wait(chans, r, peers, tb=0)  # staged
            for q in peers:  # reduce-scatter: chunk r of every rank, read at once
                chans[(q, r)].reduce(mine[r], p.scratch(q, n)[r], tb=0)
            p.output(r)[r].copy(mine[r], tb=0)
            signal_and_wait(chans, r, peers, tb=0)  # reduced
            for q in peers:  # all-gather: chunk q from its owner
                chans[(q, r)].get(p.output(r)[q], p.scratch(q, n)[q], tb=0)
    return p


def allreduce_2pa_hb(num_ranks: int, instances: int = 1) -> Program:
    """2PA HB, as the hand-written kernel pushes (``hb_push=True``, its
    default): every rank puts chunk q of its input into slot r of rank q's
    scratch and tells its peers; rank r reduces its own input chunk with its
    slots (local reads only) into its output and into slot n + r of every
    peer's scratch in the same pass, and tells them; every rank then copies
    each other chunk from its own scratch. Lowering makes the copy of the
    input chunk the reduction's start (``init``: never copied) and fuses the
    reduction and the puts of its result into one ``reduce_put``. Only stores
    cross the links. ``reduce_put`` stores into peer memory: the plan runs
    within a node."""
    n = num_ranks
    with Program("allreduce_2pa_hb", AllReduce(n, chunks=n, in_place=False), protocol="hb",
                 instances=instances) as p:
        chans = all_pairs_memory_channels(n)
        for r in range(n):
            peers = [(r + k) % n for k in range(1, n)]
            mine = p.scratch(r, 2 * n)  # slot q: chunk r of rank q; slot n + q: rank q's result
            for q in peers:  # reduce-scatter: chunk q to its owner
                chans[(q, r)].put(p.scratch(q, 2 * n)[r], p.input(r)[q], tb=0)
            signal_and_wait(chans, r, peers, tb=0)  # pushed
            p.output(r)[r].copy(p.input(r)[r], tb=0)
            p.output(r)[r].reduce(*[mine[q] for q in peers], tb=0)
            for q in peers:  # all-gather: the reduced chunk to every peer
                chans[(q, r)].put(p.scratch(q, 2 * n)[n + r], p.output(r)[r], tb=0)
            signal_and_wait(chans, r, peers, tb=0)  # reduced
            for q in peers:
                p.output(r)[q].copy(mine[n + q], tb=0)
    return p


def allreduce_2pa_ll(num_ranks: int, instances: int = 1) -> Program:
    """2PA LL: chunk q of every input goes to rank q as LL packets (scratch slot
    = sender), rank q reduces them into its output chunk q and sends the result
    to every rank as packets (second scratch region); every rank unpacks the
    other ranks' results. Half the traffic of 1PA, one more hop, no signals."""
    n = num_ranks
    with Program("allreduce_2pa_ll", AllReduce(n, chunks=n, in_place=False), protocol="ll",
                 instances=instances) as p:
        chans = all_pairs_memory_channels(n)
        for r in range(n):
            peers = [(r + k) % n for k in range(1, n)]
            mine = p.scratch(r, 2 * n)
            for q in peers:
                chans[(q, r)].put_packets(p.scratch(q, 2 * n)[r], p.input(r)[q], tb=0)
            p.output(r)[r].copy(p.input(r)[r], tb=0)
            for q in peers:
                p.output(r)[r].reduce_packets(mine[q], tb=0)
            for q in peers:
                chans[(q, r)].put_packets(p.scratch(q, 2 * n)[n + r], p.output(r)[r], tb=0)
            for q in peers:
                p.output(r)[q].unpack(mine[n + q], tb=0)
    return p


def allreduce_ring(num_ranks: int, instances: int = 1) -> Program:
    """2PR with overlap: a ring reduce-scatter then a ring all-gather over
    PortChannels, each chunk in two halves so that the reduction (or copy) of
    one half overlaps the transfer of the other (MSCCL++ paper, Figure 6)."""
    n = num_ranks
    with Program("allreduce_ring", AllReduce(n, chunks=2 * n), protocol="hb", instances=instances) as p:
        send = {r: PortChannel((r + 1) % n, r) for r in range(n)}
        for r in range(n):
            prev, inp = (r - 1) % n, p.input(r)
            mine, theirs = p.scratch(r, 4 * n), p.scratch((r + 1) % n, 4 * n)
            # Reduce-scatter: at step s forward chunk (r - s - 1), each half once it is reduced.
            for s in range(n - 1):
                c = (r - s - 1) % n
                for h in (0, 1):
                    if s > 0:
                        send[prev].wait(tb=0)
                        inp[2 * c + h].reduce(mine[2 * c + h], tb=0)
                    send[r].put(theirs[2 * c + h], inp[2 * c + h], tb=0)
                    send[r].signal(tb=0)
            # All-gather: chunk r completes here, then every complete chunk goes around.
            for s in range(n - 1):
                c = (r - s) % n
                for h in (0, 1):
                    send[prev].wait(tb=0)
                    if s == 0:
                        inp[2 * c + h].reduce(mine[2 * c + h], tb=0)
                    else:
                        inp[2 * c + h].copy(mine[2 * n + 2 * c + h], tb=0)
                    send[r].put(theirs[2 * n + 2 * c + h], inp[2 * c + h], tb=0)
                    send[r].signal(tb=0)
            last = (r + 1) % n
            for h in (0, 1):
                send[prev].wait(tb=0)
                inp[2 * last + h].copy(mine[2 * n + 2 * last + h], tb=0)
            send[r].flush(tb=0)
    return p
