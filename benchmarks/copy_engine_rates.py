"""What the copy engines move between the GPUs of one machine, per GPU and
direction, for the traffic patterns of the collectives: one pair one way,
one pair both ways, one GPU to every other, a ring, and all to all.

Each copy is ``copy_`` of a tensor on one GPU into a tensor on another (the
copy engine, with P2P), on its own stream per (source, destination); the
rate is the busiest sender's bytes over the wall time of all copies, median
of three runs of `--reps` rounds. An all-reduce must send and receive
2(N-1)/N of the message per GPU, so the all-to-all and ring rates bound what
any all-reduce over these links reaches without in-network reduction.

    python benchmarks/copy_engine_rates.py [--mib 64] [--reps 10]
"""

import argparse
import statistics
import time

import torch


def _rate(pairs, src, dst, streams, nbytes, reps, gpus) -> float:
    def once():
        for i, j in pairs:
            with torch.cuda.stream(streams[(i, j)]):
                dst[(i, j)].copy_(src[i], non_blocking=True)

    once()
    for d in range(gpus):
        torch.cuda.synchronize(d)
    start = time.perf_counter()
    for _ in range(reps):
        once()
    for d in range(gpus):
        torch.cuda.synchronize(d)
    seconds = time.perf_counter() - start
    sent = {}
    for i, _ in pairs:
        sent[i] = sent.get(i, 0) + nbytes * reps
    return max(sent.values()) / seconds / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=64, help="bytes per copy, MiB")
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    n = torch.cuda.device_count()
    if n < 2:
        raise SystemExit(f"needs at least 2 GPUs, {n} visible")
    nbytes = args.mib << 20
    src = {i: torch.randn(nbytes // 4, device=f"cuda:{i}") for i in range(n)}
    pairs_all = [(i, j) for i in range(n) for j in range(n) if i != j]
    dst = {(i, j): torch.empty(nbytes // 4, device=f"cuda:{j}") for i, j in pairs_all}
    streams = {(i, j): torch.cuda.Stream(device=i) for i, j in pairs_all}
    patterns = {
        "0 -> 1": [(0, 1)],
        "0 <-> 1": [(0, 1), (1, 0)],
        f"0 -> every other ({n - 1})": [(0, j) for j in range(1, n)],
        f"ring of {n}": [(i, (i + 1) % n) for i in range(n)],
        f"all to all ({n})": pairs_all,
    }
    print(f"| pattern ({n} GPUs, {args.mib} MiB copies) | GB/s per sending GPU |")
    print("|---|---:|")
    for name, pairs in patterns.items():
        rates = [_rate(pairs, src, dst, streams, nbytes, args.reps, n) for _ in range(3)]
        print(f"| {name} | {statistics.median(rates):.1f} |")
    for i, j in pairs_all:  # every copy arrived whole
        if not torch.equal(dst[(i, j)].cpu(), src[i].cpu()):
            raise SystemExit(f"copy {i} -> {j} differs from its source")


if __name__ == "__main__":
    main()
