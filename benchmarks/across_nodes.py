"""All-reduce across nodes on one machine split into two "nodes": pyccl's
automatic choice (2PH LL / HB on the plan interpreter; NVLink inside a node,
the socket transport between) against NCCL forced onto its network path
(NCCL_NET=Socket, NCCL_P2P_DISABLE=1, NCCL_SHM_DISABLE=1), called directly and
through ProcessGroupNCCL, in the same run. bf16, CUDA graphs, medians.

    python benchmarks/across_nodes.py [--world 4] [--json rows.json]

The GPUs split into two nodes of world / 2 (PYCCL_NODE_ID); NCCL's settings
apply to this process only. Both libraries move data across the "nodes"
through TCP on this host's loopback, so the numbers compare the algorithms
and the software paths, not a NIC.
"""

import argparse
import json
import os

import torch

K = 1 << 10
M = 1 << 20
SIZES = (4 * K, 16 * K, 64 * K, 256 * K, 1 * M, 4 * M, 16 * M, 64 * M)
NCCL_NETWORK_ONLY = {"NCCL_NET": "Socket", "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1",
                     "NCCL_NVLS_ENABLE": "0", "NCCL_SOCKET_IFNAME": "lo"}


def _rank(rank, world, store, sizes):
    import torch.distributed as dist

    import pyccl
    from pyccl._nccl import NcclComm
    from pyccl.bench_timing import time_graph

    per_node = world // 2
    os.environ["PYCCL_NODE_ID"] = f"node{rank // per_node}"
    os.environ.update(NCCL_NETWORK_ONLY)
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    comm = pyccl.Communicator(store, rank, world, device=device, name="across")
    dist.init_process_group("nccl", store=dist.PrefixStore("pg/", store), rank=rank, world_size=world,
                            device_id=device)
    nccl = NcclComm(dist.PrefixStore("direct/", store), rank, world, rank)
    rows = []
    for size in sizes:
        x = torch.randn(size // 2, dtype=torch.bfloat16, device=device)
        out = torch.empty_like(x)
        ref = x.double()
        dist.all_reduce(ref)
        y = pyccl.all_reduce(x, comm=comm)  # eager first: the plan's buffers are set up outside the capture
        wrong = int((y.double() - ref).abs().gt(0.05 * ref.abs() + 0.1).sum())
        iters = 10 if size <= M else 3
        row = {"bytes": size, "wrong": wrong,
               "plan": "allreduce_2ph_ll" if size <= pyccl.across_nodes.LL_MAX_BYTES else "allreduce_2ph_hb"}
        row["pyccl_us"] = time_graph(lambda: pyccl.all_reduce(x, comm=comm, out=out), iters, 5)
        if size <= pyccl.across_nodes.LL_MAX_BYTES and per_node > 1:  # 2PH LL in one piece and pipelined
            for pieces, key in ((1, "one_piece"), (2, "pipelined")):
                pyccl.across_nodes.LL_PIPELINE = pieces
                y = pyccl.all_reduce(x, comm=comm)
                row[f"wrong_{key}"] = int((y.double() - ref).abs().gt(0.05 * ref.abs() + 0.1).sum())
                row[f"pyccl_{key}_us"] = time_graph(lambda: pyccl.all_reduce(x, comm=comm, out=out), iters, 5)
            pyccl.across_nodes.LL_PIPELINE = None
        row["nccl_direct_us"] = time_graph(lambda: nccl.all_reduce(x, out), iters, 5)
        row["nccl_pg_us"] = time_graph(lambda: dist.all_reduce(out), iters, 5)
        rows.append(row)
    nccl.close()
    dist.destroy_process_group()
    comm.close()
    return rows


def main() -> None:
    from pyccl._spawn import run_ranks

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=min(4, torch.cuda.device_count()))
    parser.add_argument("--max-bytes", type=int, default=SIZES[-1])
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    if args.world < 2 or args.world % 2:
        parser.error(f"--world must be even and at least 2 (two nodes), got {args.world}")
    sizes = [s for s in SIZES if s <= args.max_bytes]
    rows = run_ranks(_rank, args.world, args=(sizes,), timeout=580)[0]
    print(f"all-reduce, bf16, {args.world} GPUs as 2 nodes x {args.world // 2}, CUDA graph, median us")
    print(f"{'size':>8} {'plan':>17} {'pyccl':>9} {'NCCL direct':>12} {'NCCL PG':>9} {'x direct':>9} "
          f"{'x PG':>6} {'#wrong':>6}")
    for r in rows:
        print(f"{r['bytes']:>8} {r['plan']:>17} {r['pyccl_us']:>9.1f} {r['nccl_direct_us']:>12.1f} "
              f"{r['nccl_pg_us']:>9.1f} {r['nccl_direct_us'] / r['pyccl_us']:>9.2f} "
              f"{r['nccl_pg_us'] / r['pyccl_us']:>6.2f} {r['wrong']:>6}")
    forced = [r for r in rows if "pyccl_pipelined_us" in r]
    if forced:
        print("2PH LL: automatic, one piece, two pieces (pyccl.across_nodes.LL_PIPELINE), us; #wrong of each")
        for r in forced:
            print(f"{r['bytes']:>8} {r['pyccl_us']:>9.1f} {r['pyccl_one_piece_us']:>9.1f} "
                  f"{r['pyccl_pipelined_us']:>9.1f} {r['wrong_one_piece']:>6} {r['wrong_pipelined']:>6}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"world": args.world, "nodes": 2, "env": NCCL_NETWORK_ONLY, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
