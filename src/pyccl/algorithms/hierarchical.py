"""Collectives across nodes in the DSL: the two-phase hierarchical all-reduce
(2PH) of the MSCCL++ paper, in its LL and HB variants, and the hierarchical
all-gather and reduce-scatter (one network hop per chunk, NVLink for the rest).

Ranks are numbered node-major: rank ``node * gpus_per_node + local``. The
input is split into ``gpus_per_node`` parts of ``num_nodes`` chunks each;
local rank j of every node owns part j:

1. local reduce-scatter: inside each node, part j of every GPU is reduced on
   local rank j (MemoryChannel: NVLink);
2. cross-node all-reduce of part j among the GPUs of local index j, one per
   node (PortChannel: the NIC, or sockets);
3. local all-gather: local rank j hands the finished part j to the other GPUs
   of its node.

Each GPU sends ``(num_nodes - 1) / (num_nodes * gpus_per_node)`` of the
message across nodes per direction in the HB variant: every NIC of the node
carries an equal share, the point of the hierarchy (docs/scaling.md).

:mod:`pyccl.across_nodes` chooses these plans for a communicator that spans
nodes; the plan interpreter reaches the other nodes' ranks through the proxy
and the socket transport (docs/multinode.md). Both variants pipeline the
local phases with the cross-node ones (LL over pieces of each part, HB
sub-chunk by sub-chunk).
"""

from __future__ import annotations

from typing import Optional

from ..dsl import AllGather, AllReduce, DSLError, MemoryChannel, PortChannel, Program, ReduceScatter, signal_and_wait

__all__ = ["allgather_hierarchical", "allreduce_2ph_hb", "allreduce_2ph_ll", "reduce_scatter_hierarchical"]


def _layout(num_nodes: int, gpus_per_node: int):
    for name, value in (("num_nodes", num_nodes), ("gpus_per_node", gpus_per_node)):
        if not isinstance(value, int) or value < 1:
            raise DSLError(f"invalid argument '{name}': expected a positive integer, got {value!r}")
    if num_nodes < 2:
        raise DSLError(f"invalid argument 'num_nodes': a hierarchical algorithm needs at least 2 nodes, got "
                       f"{num_nodes} (one node: the all-pairs algorithms)")
    g = gpus_per_node
    rank = lambda node, local: node * g + local  # noqa: E731
    return g, num_nodes, num_nodes * g, rank


def _each_rank(num_nodes: int, g: int, rank):
    """(node, local index, rank, its local peers, the ranks of its local index
    on the other nodes) for every rank."""
    for m in range(num_nodes):
        for j in range(g):
            yield (m, j, rank(m, j), [rank(m, b) for b in range(g) if b != j],
                   [rank(k, j) for k in range(num_nodes) if k != m])


def _channels(num_nodes: int, g: int, rank):
    return _local_channels(num_nodes, g, rank), _cross_channels(num_nodes, g, rank)


def _local_channels(num_nodes: int, g: int, rank) -> dict:
    """A MemoryChannel for every ordered pair of GPUs of one node, keyed (dst, src)."""
    return {(rank(m, a), rank(m, b)): MemoryChannel(rank(m, a), rank(m, b))
            for m in range(num_nodes) for a in range(g) for b in range(g) if a != b}


def _cross_channels(num_nodes: int, g: int, rank) -> dict:
    """A PortChannel between the GPUs of one local index on every pair of nodes, keyed (dst, src)."""
    return {(rank(k, j), rank(m, j)): PortChannel(rank(k, j), rank(m, j))
            for j in range(g) for m in range(num_nodes) for k in range(num_nodes) if k != m}


def allreduce_2ph_hb(num_nodes: int, gpus_per_node: int, instances: int = 1) -> Program:
    """2PH HB: the local phases read and write the node's GPUs directly (as
    2PA HB); across nodes, local rank j of node m reduces sub-chunk m of part j
    from every node (a reduce-scatter over PortChannels), then sends it to
    every node (the all-gather), so each NIC carries (N - 1) / (N g) of the
    message each way. Both sides are pipelined: each sub-chunk leaves for
    its node as soon as it is reduced locally, and each finished sub-chunk
    goes on to the local peers (NVLink writes) as soon as it arrives."""
    g, n_nodes, n, rank = _layout(num_nodes, gpus_per_node)
    with Program(f"allreduce_2ph_hb_{n_nodes}x{g}", AllReduce(n, chunks=n, in_place=False), protocol="hb",
                 instances=instances) as p:
        local, cross = _channels(n_nodes, g, rank)
        for m, j, r, peers, remotes in _each_rank(n_nodes, g, rank):
            stage = p.scratch(r, n + n_nodes)
            out = p.output(r)
            # 1 + 2a, pipelined: stage the input; then, sub-chunk by sub-chunk of
            # part j, reduce it reading every local peer's stage and start its
            # transfer to its node (slot m there) at once, so that the NIC moves
            # one sub-chunk while NVLink brings the next. Mine (sub-chunk m) last.
            stage[0:n].copy(p.input(r)[0:n], tb=0)
            signal_and_wait(local, r, peers, tb=0)
            for q in remotes + [r]:
                c = j * n_nodes + q // g
                out[c].copy(stage[c], tb=0)
                for peer in peers:
                    local[(peer, r)].reduce(out[c], p.scratch(peer, n + n_nodes)[c], tb=0)
                if q != r:
                    cross[(q, r)].put(p.scratch(q, n + n_nodes)[n + m], out[c], tb=0)
                    cross[(q, r)].signal(tb=0)
            # 2a, the rest: the other nodes' sub-chunk m, reduced into mine.
            for q in remotes:
                cross[(r, q)].wait(tb=0)
                out[j * n_nodes + m].reduce(stage[n + q // g], tb=0)
            # 2b + 3, pipelined: my finished sub-chunk to every node's output
            # and to my local peers' at once; then each other node's sub-chunk
            # of part j to my local peers as soon as it lands.
            mine = j * n_nodes + m
            for q in remotes:
                cross[(q, r)].put(p.output(q)[mine], out[mine], tb=0)
                cross[(q, r)].signal(tb=0)
            for peer in peers:
                local[(peer, r)].put(p.output(peer)[mine], out[mine], tb=0)
            for q in remotes:
                cross[(r, q)].wait(tb=0)
                arrived = j * n_nodes + q // g
                for peer in peers:
                    local[(peer, r)].put(p.output(peer)[arrived], out[arrived], tb=0)
            # My puts are in my peers' outputs, and (the signal follows them)
            # no peer reads my stage any more once it has signalled.
            signal_and_wait(local, r, peers, tb=0)
            for q in remotes:
                cross[(q, r)].flush(tb=0)
    return p


def allreduce_2ph_ll(num_nodes: int, gpus_per_node: int, instances: int = 1,
                     pipeline: Optional[int] = None) -> Program:
    """2PH LL, for small messages: inside the node every hop is LL packets with
    no signal (each local rank packs part j of its input into the owner's
    scratch, the owner reduces the packets as they arrive, and packs the
    finished part back to its peers); across nodes, local rank j sends its
    node's part j to the same local rank of every other node and reduces what
    arrives (all-pairs: one network hop, (N - 1) / g of the message per NIC).

    The three phases are pipelined over `pipeline` pieces of part j (of its N
    chunks; by default 2 with several GPUs per node, 1 with one, where there
    is no local phase to overlap): a piece leaves for the other nodes as soon
    as the local packets of it are reduced, and goes to the local peers as
    soon as the other nodes' partials of it are in, so NVLink and the network
    work at once. Each piece costs one more signal per peer node."""
    g, n_nodes, n, rank = _layout(num_nodes, gpus_per_node)
    if pipeline is None:
        pipeline = min(2, n_nodes) if g > 1 else 1
    if not isinstance(pipeline, int) or not 1 <= pipeline <= n_nodes:
        raise DSLError(f"invalid argument 'pipeline': expected an integer from 1 to num_nodes ({n_nodes}), "
                       f"got {pipeline!r}")
    pieces = [(k * n_nodes // pipeline, (k + 1) * n_nodes // pipeline) for k in range(pipeline)]
    # Scratch per rank, in slots of N chunks: g packet slots (the local
    # reduce-scatter, by sender), the node partial (the cross-node source), N
    # slots of the other nodes' partials (by node), and g packet slots of
    # finished parts (the local all-gather, by sender).
    at = lambda index, piece: slice(index * n_nodes + piece[0], index * n_nodes + piece[1])  # noqa: E731
    rs_slot, partial_slot = (lambda b: b), g
    remote_slot = lambda k: g + 1 + k  # noqa: E731
    ag_slot = lambda b: g + 1 + n_nodes + b  # noqa: E731
    slots = lambda r: p.scratch(r, (2 * g + 1 + n_nodes) * n_nodes)  # noqa: E731
    name = f"allreduce_2ph_ll_{n_nodes}x{g}_pipeline{pipeline}"
    with Program(name, AllReduce(n, chunks=n, in_place=False), protocol="ll", instances=instances) as p:
        local, cross = _channels(n_nodes, g, rank)
        for m, j, r, peers, remotes in _each_rank(n_nodes, g, rank):
            mine, out, x = slots(r), p.output(r), p.input(r)
            # 1. local reduce-scatter in packets: part b of my input to local
            # rank b's slot j, piece by piece in the order the owner reduces them.
            for piece in pieces:
                for q in peers:
                    local[(q, r)].put_packets(slots(q)[at(rs_slot(j), piece)], x[at(q % g, piece)], tb=0)
            # 1 + 2: reduce a piece of part j, then send it to every other node at once.
            for piece in pieces:
                partial = mine[at(partial_slot, piece)]
                partial.copy(x[at(j, piece)], tb=0)
                for q in peers:
                    partial.reduce_packets(mine[at(rs_slot(q % g), piece)], tb=0)
                for q in remotes:
                    cross[(q, r)].put_with_signal(slots(q)[at(remote_slot(m), piece)], partial, tb=0)
            # 2 + 3: a piece of part j, once every node's partial of it is in,
            # goes to my local peers in packets.
            for piece in pieces:
                done = out[at(j, piece)]
                done.copy(mine[at(partial_slot, piece)], tb=0)
                for q in remotes:
                    cross[(r, q)].wait(tb=0)
                    done.reduce(mine[at(remote_slot(q // g), piece)], tb=0)
                for q in peers:
                    local[(q, r)].put_packets(slots(q)[at(ag_slot(j), piece)], done, tb=0)
            for q in peers:
                for piece in pieces:
                    out[at(q % g, piece)].unpack(mine[at(ag_slot(q % g), piece)], tb=0)
            for q in remotes:
                cross[(q, r)].flush(tb=0)
    return p


def allgather_hierarchical(num_nodes: int, gpus_per_node: int, instances: int = 1) -> Program:
    """All-gather in two hops: local rank j of each node first puts its input
    to local rank j of every other node (PortChannel), then hands the N chunks
    of its local index to every GPU of its node (NVLink). Each NIC carries
    (N - 1) chunks each way, where all-pairs across nodes would carry
    (N - 1) g."""
    g, n_nodes, n, rank = _layout(num_nodes, gpus_per_node)
    with Program(f"allgather_hierarchical_{n_nodes}x{g}", AllGather(n), protocol="hb", instances=instances) as p:
        local, cross = _channels(n_nodes, g, rank)
        for m, j, r, peers, remotes in _each_rank(n_nodes, g, rank):
            out = p.output(r)
            for q in remotes:
                cross[(q, r)].put(p.output(q)[r], p.input(r)[0], tb=0)
                cross[(q, r)].signal(tb=0)
            out[r].copy(p.input(r)[0], tb=0)
            for q in remotes:
                cross[(r, q)].wait(tb=0)
            # Every chunk of my local index (mine and the other nodes') to my local peers.
            for q in peers:
                for k in range(n_nodes):
                    local[(q, r)].put(p.output(q)[rank(k, j)], out[rank(k, j)], tb=0)
            signal_and_wait(local, r, peers, tb=0)
            for q in remotes:
                cross[(q, r)].flush(tb=0)
    return p


def reduce_scatter_hierarchical(num_nodes: int, gpus_per_node: int, instances: int = 1) -> Program:
    """Reduce-scatter in two hops: inside each node, local rank j reduces the
    chunks bound for local rank j of every node over the node's GPUs (NVLink
    reads of their staged inputs), sending each other node's partial on as
    soon as it is reduced (PortChannel); then it reduces the other nodes'
    partials of its own chunk. Each NIC carries (N - 1) chunks each way."""
    g, n_nodes, n, rank = _layout(num_nodes, gpus_per_node)
    with Program(f"reduce_scatter_hierarchical_{n_nodes}x{g}", ReduceScatter(n), protocol="hb",
                 instances=instances) as p:
        local, cross = _channels(n_nodes, g, rank)
        stages = lambda q: p.scratch(q, n + n_nodes)  # noqa: E731  staged input, then a slot per node
        for m, j, r, peers, remotes in _each_rank(n_nodes, g, rank):
            stage = stages(r)
            stage[0:n].copy(p.input(r)[0:n], tb=0)
            signal_and_wait(local, r, peers, tb=0)
            for c in remotes + [r]:  # the other nodes' chunks first: they leave while mine is reduced
                for peer in peers:
                    local[(peer, r)].reduce(stage[c], stages(peer)[c], tb=0)
                if c != r:
                    cross[(c, r)].put(stages(c)[n + m], stage[c], tb=0)
                    cross[(c, r)].signal(tb=0)
            for q in remotes:
                cross[(r, q)].wait(tb=0)
                stage[r].reduce(stage[n + q // g], tb=0)
            p.output(r)[0].copy(stage[r], tb=0)
            for q in remotes:
                cross[(q, r)].flush(tb=0)
            # No local peer may leave (and reuse its stage) while another still reads it.
            signal_and_wait(local, r, peers, tb=0)
    return p
