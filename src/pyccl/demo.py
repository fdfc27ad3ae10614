"""The main job, for now: bring up a communicator over every local GPU (or 4
host-mode processes where fewer than two are visible), register memory,
exchange data through it with peer stores and semaphores, and print what was
checked.

    python -m pyccl.demo [--world-size N] [--host] [--words N]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from typing import Optional, Tuple

import torch

import pyccl
from pyccl._spawn import run_ranks


def _rank_main(rank: int, world_size: int, store, host: bool, words: int, seed: int) -> dict:
    device = "cpu" if host else f"cuda:{rank}"
    if not host:
        torch.cuda.set_device(rank)
    t0 = time.perf_counter()
    comm = pyccl.Communicator(store, rank, world_size, device=device, name="demo")
    setup_s = time.perf_counter() - t0
    report = {"rank": rank, "device": str(comm.device), "setup_ms": setup_s * 1e3,
              "topology": comm.topology()}
    try:
        nbytes = words * 4 * world_size
        # One buffer from pyccl.empty, and on GPUs one from torch's own allocator.
        buffers = {"pyccl.empty": pyccl.empty(words * world_size, dtype=torch.int32, device=device)}
        if not host:
            buffers["torch.empty"] = torch.empty(words * world_size, dtype=torch.int32, device=device)
        report["checks"] = []
        for label, buf in buffers.items():
            buf.fill_(-1)  # a value the exchange never writes
            local = comm.register(buf)
            mapped = comm.exchange(local)
            peers = [p for p in range(world_size) if p != rank and mapped[p] is not None]
            sems = [comm.create_semaphore(p) for p in peers]
            t1 = time.perf_counter()
            mismatches, failures = pyccl._C._selftest_exchange(
                comm._comm, mapped, local, sems, words, seed)
            took = time.perf_counter() - t1
            report["checks"].append({
                "buffer": label, "kind": local.kind, "bytes": nbytes, "peers": peers,
                "mismatches": int(mismatches), "wait_failures": int(failures),
                "exchange_ms": took * 1e3,
            })
            local.release()
        comm.barrier()
    finally:
        comm.close()
    return report


def choose_ranks(host: bool, world_size: int, gpus: int) -> Tuple[bool, int, Optional[str]]:
    """(host mode, ranks, why host mode was taken where it was not asked for)
    for `--host`, `--world-size` (0: every GPU, or 4 in host mode) and the
    number of visible GPUs. A machine with one GPU runs host mode, as a
    collective needs two; asking for more GPUs than are visible is an error."""
    if world_size < 0 or world_size == 1:
        raise ValueError(f"--world-size must be 0 (every GPU, or 4 in host mode) or at least 2, got {world_size}")
    if host:
        return True, world_size or 4, None
    if gpus == 0:
        return True, world_size or 4, "no GPU visible (or pyccl built without CUDA)"
    if gpus == 1 and world_size == 0:
        return True, 4, "one GPU visible, and the demo's exchange needs one GPU per rank"
    if world_size > gpus:
        raise ValueError(f"--world-size {world_size} needs {world_size} GPUs; {gpus} visible (--host for host mode)")
    return False, world_size or gpus, None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-size", type=int, default=0,
                        help="ranks (default: every GPU, or 4 in host mode)")
    parser.add_argument("--host", action="store_true", help="host mode even when GPUs are present")
    parser.add_argument("--words", type=int, default=1 << 20,
                        help="int32 words each rank writes into each peer (default 1Mi)")
    args = parser.parse_args(argv)

    gpus = torch.cuda.device_count() if pyccl.cuda_available() else 0
    try:
        host, world, why = choose_ranks(args.host, args.world_size, gpus)
    except ValueError as e:
        parser.error(str(e))
    if args.words < 1:
        parser.error(f"--words must be at least 1, got {args.words}")
    if why:
        print(f"{why}: running {world} host-mode processes", file=sys.stderr)
    mode = "host mode (CPU)" if host else f"{world} x {torch.cuda.get_device_name(0)}"
    print(f"pyccl {pyccl.__version__}: {world} ranks, {mode}; CUDA build: {pyccl._C.cuda_built()}")
    seed = random.randrange(1 << 31)
    reports = run_ranks(_rank_main, world, args=(host, args.words, seed), timeout=300)

    ok = True
    r0 = reports[0]
    print("topology (rank 0's view):")
    for info in r0["topology"]["ranks"]:
        where = info["device"] if info["device"] >= 0 else "cpu"
        print(f"  rank {info['rank']}: {info['hostname']} device={where} {info['pci_bus_id']} "
              f"same_node={info['same_node']} p2p={info['p2p']}")
    print(f"{'rank':>4} {'buffer':<12} {'kind':<12} {'bytes':>10} {'peers':<10} {'wrong words':>11} "
          f"{'wait failures':>13} {'ms':>8}")
    for rep in reports:
        for c in rep["checks"]:
            bad = c["mismatches"] or c["wait_failures"] or len(c["peers"]) != world - 1
            ok &= not bad
            print(f"{rep['rank']:>4} {c['buffer']:<12} {c['kind']:<12} {c['bytes']:>10} "
                  f"{','.join(map(str, c['peers'])):<10} {c['mismatches']:>11} {c['wait_failures']:>13} "
                  f"{c['exchange_ms']:>8.2f}{'  FAILED' if bad else ''}")
    print(f"checked: each rank wrote {args.words} int32 words into every peer's registered buffer, "
          f"signalled it, waited for its signal, and verified the words it received (seed {seed}).")
    print("RESULT:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
