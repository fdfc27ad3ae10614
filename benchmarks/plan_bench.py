"""The DSL plan interpreter against the hand-written kernel of the same
algorithm: all-reduce, bf16, CUDA graph of 20 calls, median of 7, on 4 GPUs.

1. Sweep: each plan runs at several instance counts (thread blocks) and
   block sizes; every row goes to the JSON file if one is named.
2. Head to head: for each size, the best launch shape of the sweep (rank
   0's choice) and the kernel are timed in turn, 5 rounds; the table gives
   the medians of the rounds. The kernel's own time drifts by up to a
   microsecond between phases of one run, so only times taken side by side
   are compared. Plans with packet ops are also timed with their any-shape
   form forced (PYCCL_PLAN_GENERIC_PACKETS=1), plans with
   reduce_put_packets with that fusion undone, and plans whose HB reductions
   start from an init with the copy that lowering folded into them put back.

    python benchmarks/plan_bench.py [--world 4] [--plans NAME,...] [--json rows.json]
"""

import argparse
import json
import math
import os
import statistics

import torch

import pyccl
import pyccl.algorithms as algorithms
from pyccl._spawn import run_ranks
from pyccl.bench_timing import time_graph, align_trials_with
from pyccl.dsl import Plan
from pyccl.plans import PlanRunner

K = 1 << 10
M = 1 << 20
# plan, hand-written twin, sizes, instance counts, threads per block
# (the kernels' LL grid is 64 blocks of 1024 threads: the plans get as many
# blocks, and as many threads in 128 blocks of 512)
CASES = (("allreduce_1pa_ll", "1pa_ll", (1 * K, 4 * K, 16 * K, 64 * K, 256 * K), (1, 2, 4, 8, 16, 32, 64),
          (512, 1024)),
         ("allreduce_2pa_ll", "2pa_ll", (64 * K, 256 * K, 1 * M), (8, 16, 32, 64, 128), (512, 1024)),
         ("allreduce_1pa_hb", "1pa_hb", (256 * K, 1 * M, 4 * M, 8 * M), (16, 32, 64, 128), (256, 512)),
         ("allreduce_2pa_hb_pull", "2pa_hb", (256 * K, 1 * M, 4 * M, 16 * M), (16, 32, 64, 128), (256, 512)),
         ("allreduce_2pa_hb", "2pa_hb", (256 * K, 1 * M, 4 * M, 16 * M), (16, 32, 64, 128), (256, 512)))
# Plans whose twin is the pushing form of the kernel (hb_push=True); the others' is the pulling form.
PUSHING_PLANS = ("allreduce_2pa_hb",)
ITERS, TRIALS = 20, 7


ROUNDS = 5


def _without_reduce_put_packets(plan: Plan) -> Plan:
    """`plan` with each reduce_put_packets split back into the reduce_packets and
    the packet puts that lowering fused: the fusion's worth, timed side by side."""
    d = plan.to_dict()
    for r in d["ranks"]:
        for tb in r["threadblocks"]:
            ops = []
            for op in tb["ops"]:
                if op["op"] != "reduce_put_packets":
                    ops.append(op)
                    continue
                reduce = {k: v for k, v in op.items() if k not in ("channels", "dsts")}
                reduce["op"] = "reduce_packets"
                ops += [reduce, {"op": "multi_put_packets", "srcs": [op["dst"]], "channels": op["channels"],
                                 "dsts": op["dsts"], "line": op["line"]}]
            tb["ops"] = ops
    return Plan.from_dict(d)


# Reductions of 16-byte vectors that lowering may start from an init chunk.
HB_REDUCTIONS = ("reduce", "channel_reduce", "multi_reduce", "reduce_put")


def _without_reduction_init(plan: Plan) -> Plan:
    """`plan` with the copy that lowering folded into each HB reduction as its
    init put back: the copy into the chunk the reduction's result goes to, a
    block sync, then the reduction from there. The fold's worth, side by side."""
    d = plan.to_dict()
    for r in d["ranks"]:
        for tb in r["threadblocks"]:
            ops = []
            for op in tb["ops"]:
                if op["op"] not in HB_REDUCTIONS or "init" not in op:
                    ops.append(op)
                    continue
                result = op["srcs"][0] if op["op"] == "reduce_put" else op["dst"]
                ops += [{"op": "copy", "dst": result, "srcs": [op["init"]], "line": op["line"]},
                        {"op": "sync", "line": op["line"]},
                        {k: v for k, v in op.items() if k != "init"}]
            tb["ops"] = ops
    return Plan.from_dict(d)


def _has_reduction_init(plan: Plan) -> bool:
    return any(op["op"] in HB_REDUCTIONS and "init" in op
               for r in plan.to_dict()["ranks"] for tb in r["threadblocks"] for op in tb["ops"])


PACKET_OPS = ("multi_put_packets", "put_packets", "unpack", "multi_unpack", "reduce_packets", "reduce_put_packets")


def _any_shape_runner(plan: Plan, comm, n: int, threads: int) -> PlanRunner:
    """A runner of `plan` whose packet ops take their any-shape form (the
    executor reads PYCCL_PLAN_GENERIC_PACKETS when it is made)."""
    before = os.environ.get("PYCCL_PLAN_GENERIC_PACKETS")
    os.environ["PYCCL_PLAN_GENERIC_PACKETS"] = "1"
    try:
        return PlanRunner(plan, comm, max_bytes=n, threads=threads)
    finally:
        if before is None:
            del os.environ["PYCCL_PLAN_GENERIC_PACKETS"]
        else:
            os.environ["PYCCL_PLAN_GENERIC_PACKETS"] = before


def _kernel_call(x, y, comm, algo, engine):
    def call():
        comm._use_engine(engine)
        pyccl.all_reduce(x, out=y, comm=comm, algorithm=algo)
    return call


def body(rank, world, store, plans):
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    comm = pyccl.Communicator(store, rank, world, device=device, name="plan_bench", collectives=False)
    # The twins are the kernels of the same algorithm: the HB kernel pulls or
    # pushes as the plan does (PUSHING_PLANS).
    engines = {push: pyccl._C.CollectiveEngine(comm._comm, hb_push=push) for push in (False, True)}
    comm._use_engine(engines[False])
    align_trials_with(comm, device)
    rows, head_to_head = [], []
    for name, algo, sizes, instance_counts, thread_counts in CASES:
        if plans and name not in plans:
            continue
        engine = engines[name in PUSHING_PLANS]
        inputs = {n: torch.randn(n // 2, device=device).to(torch.bfloat16) for n in sizes}
        outputs = {n: torch.empty_like(x) for n, x in inputs.items()}
        for n in sizes:
            t = time_graph(_kernel_call(inputs[n], outputs[n], comm, algo, engine), ITERS, TRIALS)
            rows.append({"plan": name, "kernel": algo, "bytes": n, "instances": 0, "threads": 0, "us": t})
        for k in instance_counts:
            plan = algorithms.LIBRARY[name](world, instances=k).lower()
            unit = plan.buffers["input"] * 2  # bf16
            for threads in thread_counts:
                run = PlanRunner(plan, comm, max_bytes=max(sizes), threads=threads)
                for n in sizes:
                    if n % unit:
                        continue
                    x, y = inputs[n], outputs[n]
                    t = time_graph(lambda: run(x, out=y), ITERS, TRIALS)
                    rows.append({"plan": name, "kernel": algo, "bytes": n, "instances": k, "threads": threads, "us": t})
                run.close()
        for n in sizes:
            # Every rank runs rank 0's choice: the calls must match.
            key = f"plan_bench/{name}/{n}"
            if rank == 0:
                best = min((r for r in rows if r["plan"] == name and r["bytes"] == n and r["instances"]),
                           key=lambda r: r["us"])
                store.set(key, json.dumps([best["instances"], best["threads"]]))
            k, threads = json.loads(store.get(key))
            plan = algorithms.LIBRARY[name](world, instances=k).lower()
            run = PlanRunner(plan, comm, max_bytes=n, threads=threads)
            unfused = None
            if plan.count_ops("reduce_put_packets"):
                unfused = PlanRunner(_without_reduce_put_packets(plan), comm, max_bytes=n, threads=threads)
            elif _has_reduction_init(plan):
                unfused = PlanRunner(_without_reduction_init(plan), comm, max_bytes=n, threads=threads)
            any_shape = None
            if any(plan.count_ops(kind) for kind in PACKET_OPS):
                any_shape = _any_shape_runner(plan, comm, n, threads)
            x, y = inputs[n], outputs[n]
            kernel_us, plan_us, unfused_us, any_shape_us = [], [], [], []
            for _ in range(ROUNDS):
                kernel_us.append(time_graph(_kernel_call(x, y, comm, algo, engine), ITERS, TRIALS))
                plan_us.append(time_graph(lambda: run(x, out=y), ITERS, TRIALS))
                if unfused is not None:
                    unfused_us.append(time_graph(lambda: unfused(x, out=y), ITERS, TRIALS))
                if any_shape is not None:
                    any_shape_us.append(time_graph(lambda: any_shape(x, out=y), ITERS, TRIALS))
            for runner in (run, unfused, any_shape):
                if runner is not None:
                    runner.close()
            head_to_head.append({"plan": name, "kernel": algo, "bytes": n, "instances": k, "threads": threads,
                                 "kernel_us": statistics.median(kernel_us), "plan_us": statistics.median(plan_us),
                                 "kernel_rounds": kernel_us, "plan_rounds": plan_us,
                                 "unfused_us": statistics.median(unfused_us) if unfused_us else None,
                                 "any_shape_us": statistics.median(any_shape_us) if any_shape_us else None})
    engines[True].close()  # comm.close() closes the one in use
    comm._use_engine(engines[False])
    comm.close()
    return (rows, head_to_head) if rank == 0 else None


def _size(n: int) -> str:
    return f"{n // M} MiB" if n >= M else f"{n // K} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--plans", default="", help="comma-separated plan names (default: every case)")
    parser.add_argument("--json", help="write every row here")
    args = parser.parse_args()
    plans = [p for p in args.plans.split(",") if p]
    unknown = sorted(set(plans) - {case[0] for case in CASES})
    if unknown:
        parser.error(f"--plans: no case named {', '.join(unknown)}; cases: {', '.join(c[0] for c in CASES)}")
    rows, head_to_head = run_ranks(body, args.world, args=(plans,), timeout=900)[0]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sweep": rows, "head_to_head": head_to_head}, f, indent=1)
    print("| plan (kernel) | size | kernel µs | plan µs (instances x threads) | plan / kernel |")
    print("|---|---:|---:|---:|---:|")
    ratios = {}
    for r in head_to_head:
        ratio = r["plan_us"] / r["kernel_us"]
        ratios.setdefault(r["plan"], []).append(ratio)
        kernel = r["kernel"] + (" push" if r["plan"] in PUSHING_PLANS else " pull" if r["kernel"] == "2pa_hb" else "")
        print(f"| {r['plan']} ({kernel}) | {_size(r['bytes'])} | {r['kernel_us']:.2f} | {r['plan_us']:.2f} "
              f"({r['instances']} x {r['threads']}) | {ratio:.2f} |")
    for r in head_to_head:
        if r.get("unfused_us"):
            what = "the reduce_put_packets fusion" if "ll" in r["kernel"] else "the reduction's init (the copy made)"
            print(f"{r['plan']} {_size(r['bytes'])}: without {what} {r['unfused_us']:.2f} µs "
                  f"(fused {r['plan_us']:.2f})")
    for r in head_to_head:
        if r.get("any_shape_us"):
            print(f"{r['plan']} {_size(r['bytes'])}: packet ops in their any-shape form {r['any_shape_us']:.2f} µs "
                  f"(as chosen {r['plan_us']:.2f})")
    for name, rs in ratios.items():
        print(f"{name}: geometric mean plan / kernel {math.exp(sum(map(math.log, rs)) / len(rs)):.3f}, "
              f"worst {max(rs):.2f}")


if __name__ == "__main__":
    main()
