"""Where the time of a small all-reduce goes: launch, flag round trip, reduction.

A 1 KiB one-phase LL all-reduce (1PA LL) is one kernel that writes the input
as LL16 packets into every peer's scratch, polls the packets the peers wrote
into its own, reduces them in rank order and stores the result. This script
times the parts of that on this machine's GPUs, each on its own (bf16, per
call, medians):

  copy          a torch ``copy_`` of the same bytes captured 20 times in a
                CUDA graph: what one small kernel in a graph costs (launch,
                one load, one store), nothing crossing NVLink;
  exchange      the same bytes as LL16 packets to one peer and back (ranks
                paired 0-1, 2-3, ... all at once), repeated inside one kernel
                (pyccl.primitives.run, one block): the flag round trip of the
                all-reduce, without a launch or a reduction;
  all peers     the same with every peer, one after another: the runner
                waits for each peer's packets in turn (a memory round trip
                each), where the all-reduce polls every peer's at once, so
                this bounds the exchange from above;
  one way       half a one-thread LL16 ping-pong round trip, ranks 0 and 1;
  all-reduce    ``pyccl.all_reduce(algorithm="1pa_ll")`` captured 20 times in a
                CUDA graph, with and without programmatic dependent launch
                (PYCCL_PDL=0), timed as ``pyccl.bench`` times it.

What the all-reduce costs beyond copy + exchange ("rest") is its reduction,
its peers beyond the first, its launch shape (many small blocks) and the
ranks' skew.

    python benchmarks/small_floor.py [--world N] [-b 1K -e 64K] [--out F.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys

import torch

import pyccl
from pyccl._spawn import run_ranks
from pyccl.bench_timing import align_trials_with, doubling_sizes, parse_bytes, size_label, time_graph
from pyccl.primitives import Op, pingpong, run

LL16_EXPANSION = 2  # an LL16 packet carries 8 data bytes in 16
GRAPH_CALLS = 20


def _exchange_ns(comm, rank: int, world: int, nbytes: int, repeat: int, trials: int, pairs: bool) -> float:
    """ns per LL16 exchange of `nbytes` with every peer (`pairs`: with rank ^ 1 only), inside one kernel of
    one block."""
    peers = [rank ^ 1] if pairs else [(rank + k) % world for k in range(1, world)]
    data = torch.randn(world * nbytes // 2, dtype=torch.bfloat16, device=f"cuda:{rank}").view(torch.uint8)
    slot = LL16_EXPANSION * nbytes  # packet bytes one sender leaves in a receiver's scratch
    packets = pyccl.empty(2 * world * slot, dtype=torch.uint8, device=f"cuda:{rank}")
    packets.fill_(0)
    mem, pk = comm.register(data), comm.register(packets)
    channels = {}
    for p in sorted(peers):  # every pair creates its channel in the same order on both sides
        channels[p] = comm.memory_channel(p, mem, pk)
    chans = [channels[p] for p in peers]
    ops = []
    for half in range(2):  # two scratch halves: a round's writes never overtake the peer's reads
        base = half * world * slot
        ops += [Op.put_packets(i, base + rank * slot, 0, nbytes, 1) for i in range(len(peers))]
        ops += [Op.read_packets(i, (1 + i) * nbytes, base + q * slot, nbytes, 1) for i, q in enumerate(peers)]
    threads = min(512, max(32, nbytes // 8))  # a packet per thread up to the runner's 512
    samples = []
    for t in range(trials):
        torch.cuda.synchronize()
        comm.barrier()
        # Flags go up by one per repetition; each trial continues where the last stopped.
        ops_t = [Op(o.code, o.channel, o.a, o.b, o.c, 1 + t * repeat) for o in ops]
        res = run(comm, ops_t, memory=chans, repeat=repeat, blocks=1, threads=threads)
        if res.failures:
            raise RuntimeError(f"exchange of {nbytes} B: {res.failures} waits gave up")
        samples.append(res.elapsed_ns / (2 * repeat))
    return statistics.median(samples)


def _ranks(rank, world, store, sizes, trials, pdl_only):
    torch.cuda.set_device(rank)
    device = f"cuda:{rank}"
    comm = pyccl.Communicator(store, rank, world, device=device, name="floor")
    align_trials_with(comm, device)
    rows = []
    for n in sizes:
        x = torch.randn(n // 2, dtype=torch.bfloat16, device=device)
        y = torch.empty_like(x)
        row = {"bytes": n}
        row["all_reduce_us"] = time_graph(lambda: pyccl.all_reduce(x, out=y, comm=comm, algorithm="1pa_ll"),
                                          GRAPH_CALLS, trials)
        if not pdl_only:
            row["copy_us"] = time_graph(lambda: y.copy_(x), GRAPH_CALLS, trials)
            row["exchange_us"] = _exchange_ns(comm, rank, world, n, 2000, trials, pairs=True) / 1000
            row["all_peers_us"] = _exchange_ns(comm, rank, world, n, 2000, trials, pairs=False) / 1000
        # The timed calls were right: the last one's result against float64.
        pyccl.all_reduce(x, out=y, comm=comm, algorithm="1pa_ll")
        expected = _sum_over_ranks(comm, x, world)
        err = (y.double() - expected).abs().max().item()
        if err > 0.05 * expected.abs().max().item() + 1e-2:
            raise RuntimeError(f"1PA LL all-reduce of {n} B is wrong on rank {rank}: max error {err}")
        rows.append(row)
    latency = None
    if not pdl_only and rank < 2:
        peer_mem = comm.register(pyccl.empty(4096, dtype=torch.uint8, device=device))
        pk = comm.register(pyccl.empty(8192, dtype=torch.uint8, device=device))
        ch = comm.memory_channel(1 - rank, peer_mem, pk)
        rounds, samples = 20000, []
        for t in range(trials):
            torch.cuda.synchronize()
            res = pingpong(comm, ch, "ll16", rounds, initiator=rank == 0, flag_base=1 + t * rounds)
            if res.failures or res.rounds_done != rounds:
                raise RuntimeError(f"ping-pong stopped after {res.rounds_done} of {rounds} rounds")
            samples.append(res.round_trip_ns / 2 / 1000)
        latency = statistics.median(samples)
    torch.cuda.synchronize()
    comm.barrier()
    comm.close()
    return {"rows": rows, "one_way_us": latency}


def _sum_over_ranks(comm, x: torch.Tensor, world: int) -> torch.Tensor:
    """Every rank's `x` summed in float64, through the communicator's all-gather."""
    parts = torch.empty(world * x.numel(), dtype=x.dtype, device=x.device)
    pyccl.all_gather(x, out=parts, comm=comm)
    return parts.view(world, -1).double().sum(0)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=0, help="GPUs to use (default: all)")
    parser.add_argument("-b", "--min-bytes", default="1K")
    parser.add_argument("-e", "--max-bytes", default="16K")
    parser.add_argument("-f", "--step-factor", type=int, default=4)
    parser.add_argument("--trials", type=int, default=15)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    gpus = torch.cuda.device_count()
    world = args.world or gpus
    if world < 2 or world > gpus or world % 2:
        print(f"needs an even --world of at most {gpus} GPUs, got --world {world}", file=sys.stderr)
        return 2
    sizes = doubling_sizes(parse_bytes(args.min_bytes), parse_bytes(args.max_bytes), args.step_factor)
    res = run_ranks(_ranks, world, args=(sizes, args.trials, False), timeout=300)
    no_pdl = run_ranks(_ranks, world, args=(sizes, args.trials, True), timeout=300, env={"PYCCL_PDL": "0"})
    gpu = torch.cuda.get_device_name(0)
    print(f"# where a small all-reduce's time goes: {world} x {gpu}, bf16, {datetime.date.today()}")
    print(f"# one way (LL16 ping-pong, ranks 0-1): {res[0]['one_way_us']:.2f} us")
    print(f"{'size':>8} {'copy':>7} {'exchange':>9} {'sum':>7} {'1PA LL':>7} {'rest':>7} {'PDL off':>8} "
          f"{'all peers':>10}   (us)")
    table = []
    for i, n in enumerate(sizes):
        # Per size the slowest rank's figure: every rank waits for it.
        get = lambda key, runs=res: max(r["rows"][i][key] for r in runs)  # noqa: E731
        row = {"bytes": n, "copy_us": get("copy_us"), "exchange_us": get("exchange_us"),
               "all_peers_us": get("all_peers_us"),
               "all_reduce_us": get("all_reduce_us"), "all_reduce_no_pdl_us": get("all_reduce_us", no_pdl)}
        parts = row["copy_us"] + row["exchange_us"]
        print(f"{size_label(n):>8} {row['copy_us']:7.2f} {row['exchange_us']:9.2f} {parts:7.2f} "
              f"{row['all_reduce_us']:7.2f} {row['all_reduce_us'] - parts:7.2f} {row['all_reduce_no_pdl_us']:8.2f} "
              f"{row['all_peers_us']:10.2f}")
        table.append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": gpu, "world": world, "date": str(datetime.date.today()),
                       "one_way_us": res[0]["one_way_us"], "rows": table}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
