"""Primitive API benchmark (MSCCL++ paper, Table 1 style), two GPUs.

Put bandwidth of MemoryChannel (HB, SM stores over NVLink) and PortChannel
(copy engine through the proxy) from 1 MiB to 1 GiB, against a plain peer copy
of the same size (cudaMemcpyAsync into the peer's mapped memory) measured in
the same run; and one-way latency of MemoryChannel signal/wait, LL packets
and the PortChannel signal round trip. Medians over repetitions.

    python benchmarks/channel_bench.py [--out results.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time

import torch

import pyccl
from pyccl._spawn import run_ranks
from pyccl.bench_timing import doubling_sizes
from pyccl.primitives import Op, pingpong, run

MiB = 1 << 20
PUTS_PER_ACK = 8


def _bench(rank, world, store, sizes, block_choices, trials, host, rounds):
    device = "cpu" if host else f"cuda:{rank}"
    if not host:
        torch.cuda.set_device(rank)
    comm = pyccl.Communicator(store, rank, world, device=device, name="bench",
                              timeout=datetime.timedelta(seconds=120))
    peer = 1 - rank
    cap = max(sizes)
    buf = pyccl.empty(cap, dtype=torch.uint8) if host else torch.empty(cap, dtype=torch.uint8, device=device)
    buf.copy_(torch.randint(0, 256, (cap,), dtype=torch.uint8))  # never zeros
    packets = pyccl.empty(8192, dtype=torch.uint8, device=device)
    packets.fill_(0)
    mem = comm.register(buf)
    mapped = comm.exchange(mem)
    mch = comm.memory_channel(peer, mem, comm.register(packets))
    pch = comm.port_channel(peer, mem)
    peer_view = comm.tensor(mapped[peer], torch.uint8)
    rows = []

    def sync():
        if not host:
            torch.cuda.synchronize()

    def timed_loop(ops_rank0, ops_rank1, repeat, **kw):
        ops = ops_rank0 if rank == 0 else ops_rank1
        sync()
        comm.barrier()
        res = run(comm, ops, repeat=repeat, **kw)
        assert res.failures == 0, res
        return res.elapsed_ns / repeat

    for n in sizes:
        # Back-to-back puts, PUTS_PER_ACK of them per signal round trip, so the
        # channels stream as the peer copy does (which has no handshake at all).
        repeat = max(2, min(20, (256 * MiB) // (n * PUTS_PER_ACK)))
        row = {"bytes": n}
        # Peer copy (copy engine on GPUs), rank 0 only, CUDA events (host clock in host mode).
        if rank == 0:
            times = []
            copies = repeat * PUTS_PER_ACK
            for _ in range(trials):
                peer_view[:n].copy_(buf[:n])
                if host:
                    t0 = time.perf_counter_ns()
                    for _ in range(copies):
                        peer_view[:n].copy_(buf[:n])
                    times.append((time.perf_counter_ns() - t0) / copies)
                    continue
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(copies):
                    peer_view[:n].copy_(buf[:n])
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e6 / copies)
            row["peer_copy_ns"] = statistics.median(times)
        comm.barrier()
        # MemoryChannel HB: puts by every block, a grid barrier, then signal; the peer acknowledges.
        best = None
        for blocks in block_choices:
            t = statistics.median(
                timed_loop([Op.put(0, 0, 0, n)] * PUTS_PER_ACK + [Op.signal(0), Op.wait(0)],
                           [Op.wait(0), Op.signal(0)], repeat, memory=[mch], blocks=blocks, threads=512)
                for _ in range(trials)) / PUTS_PER_ACK
            if best is None or t < best[0]:
                best = (t, blocks)
        row["memory_put_ns"], row["memory_blocks"] = best
        # PortChannel: puts through the proxy (copy engine), the last with a signal; the peer acknowledges.
        port_ops = [Op.port_put(0, 0, 0, n)] * (PUTS_PER_ACK - 1) + [Op.port_put(0, 0, 0, n, signal=True),
                                                                    Op.port_wait(0)]
        row["port_put_ns"] = statistics.median(
            timed_loop(port_ops, [Op.port_wait(0), Op.port_signal(0)], repeat, port=[pch])
            for _ in range(trials)) / PUTS_PER_ACK
        rows.append(row)

    # Latency: the dedicated one-thread ping-pong loop (kernels/pingpong.hpp).
    lat = {}
    for kind in ("signal", "relaxed_signal", "ll8", "ll16", "port_signal"):
        r = rounds if kind != "port_signal" else max(1, rounds // 10)
        samples = []
        for t in range(trials):
            sync()
            comm.barrier()
            res = pingpong(comm, mch, kind, r, initiator=rank == 0, port_channel=pch,
                           flag_base=1 + t * r)
            assert res.failures == 0 and res.rounds_done == r, res
            samples.append(res.round_trip_ns)
        rt = statistics.median(samples)
        lat[kind] = {"round_trip_ns": rt, "one_way_ns": rt / 2}
    comm.barrier()
    comm.close()
    return {"rows": rows, "latency": lat} if rank == 0 else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--max-bytes", type=int, default=1 << 30)
    parser.add_argument("--host", action="store_true",
                        help="host mode (CPU): checks the script, its figures mean nothing")
    args = parser.parse_args(argv)
    if args.host:
        args.max_bytes = min(args.max_bytes, 4 * MiB)
    elif torch.cuda.device_count() < 2:
        print("needs 2 GPUs (or --host)", file=sys.stderr)
        return 2
    sizes = doubling_sizes(MiB, args.max_bytes)
    blocks = (1, 2) if args.host else (32, 64, 128)
    rounds = 200 if args.host else 20000
    res = run_ranks(_bench, 2, args=(sizes, blocks, args.trials, args.host, rounds), timeout=400)[0]
    gpu = "host mode (CPU)" if args.host else torch.cuda.get_device_name(0)
    print(f"# pyccl channel benchmark, 2 x {gpu}, {datetime.date.today()}")
    print(f"{'bytes':>12} {'peer copy GB/s':>15} {'MemoryChannel GB/s':>19} {'(% copy)':>8} {'blocks':>6} "
          f"{'PortChannel GB/s':>17} {'(% copy)':>8}")
    for r in res["rows"]:
        n = r["bytes"]
        pc = n / r["peer_copy_ns"]
        mc = n / r["memory_put_ns"]
        po = n / r["port_put_ns"]
        print(f"{n:>12} {pc:>15.1f} {mc:>19.1f} {100 * mc / pc:>7.1f}% {r['memory_blocks']:>6} "
              f"{po:>17.1f} {100 * po / pc:>7.1f}%")
    print("latency, one-thread ping-pong loop (one way = half the round trip, median):")
    for k, v in res["latency"].items():
        print(f"  {k:<15} round trip {v['round_trip_ns'] / 1000:7.2f} us   one way {v['one_way_ns'] / 1000:6.2f} us")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": gpu, "date": str(datetime.date.today()), **res}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
