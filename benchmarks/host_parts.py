"""Where an eager all-reduce's host time goes: µs of CPU per call, part by part (one rank, one process).

Beside ``benchmarks/host_overhead.py`` (the entry points, and NCCL's), this
times the layers between them, each alone:

- ``torch.ops.pyccl.all_reduce`` and ``torch.ops.aten.alias`` (torch's
  dispatcher called from Python, with next to nothing to do: its floor);
- ``dist.all_reduce`` on the pyccl process group, ``ProcessGroup.allreduce``
  (no Python wrapper) and the group's backend called directly; the same two
  on torch's fake process group (torch's own cost, the backend doing nothing);
- the collective engine alone, ``pyccl.all_reduce`` with and without ``out``,
  ``torch.empty_like`` and torch's ``copy_``;
- the other ops with C++ kernels (all_gather, reduce_scatter,
  fused_all_reduce_rmsnorm), each beside the engine's own call.

Each trial times every part in turn (the host's drift reaches all alike);
medians over the trials::

    python benchmarks/host_parts.py [--out F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bytes", type=int, default=1024, help="message size (bf16)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per timed loop")
    parser.add_argument("--trials", type=int, default=9, help="timed loops per part (median)")
    parser.add_argument("--port", type=int, default=29561)
    parser.add_argument("--out", default=None, help="write every loop's time as JSON here")
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import AllreduceOptions
    from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: F401  (the "fake" backend)

    import pyccl

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("pyccl", init_method=f"tcp://127.0.0.1:{args.port}", rank=0, world_size=1)
    group, fake = dist.group.WORLD, dist.new_group(backend="fake")
    name = group.group_name
    x = torch.randn(max(1, args.bytes // 2), device=device).to(torch.bfloat16)
    out, inplace = torch.empty_like(x), x.clone()
    if not torch.equal(torch.ops.pyccl.all_reduce(x, "sum", name), x):  # one rank: the sum is the input
        raise AssertionError("torch.ops.pyccl.all_reduce: wrong result")
    comm = pyccl.communicator_for(None, device)
    hidden = 128 if x.numel() % 128 == 0 else x.numel()
    rows = x.view(-1, hidden)  # the fused op's message: rows of `hidden`, the same bytes
    residual, weight = torch.randn_like(rows), torch.rand(hidden, device=device).to(torch.bfloat16)
    normed, new_residual = torch.empty_like(rows), torch.empty_like(rows)
    backend = group._get_backend(device)
    opts = AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MAX  # in place, call after call: the same result
    parts = {
        "torch copy_": lambda: out.copy_(x),
        "torch.empty_like": lambda: torch.empty_like(x),
        "engine (C++)": lambda: comm._engine.all_reduce(comm._comm, x, out, "sum", None),
        "pyccl.all_reduce, out given": lambda: pyccl.all_reduce(x, out=out),
        "pyccl.all_reduce, new output": lambda: pyccl.all_reduce(x),
        "torch.ops.pyccl.all_reduce": lambda: torch.ops.pyccl.all_reduce(x, "sum", name),
        "torch.ops.aten.alias": lambda: torch.ops.aten.alias(x),
        "dist.all_reduce (pyccl)": lambda: dist.all_reduce(inplace, op=dist.ReduceOp.MAX, group=group),
        "ProcessGroup.allreduce (pyccl)": lambda: group.allreduce([inplace], opts),
        "backend.allreduce (pyccl)": lambda: backend.allreduce([inplace], opts),
        "dist.all_reduce (fake)": lambda: dist.all_reduce(inplace, op=dist.ReduceOp.MAX, group=fake),
        "ProcessGroup.allreduce (fake)": lambda: fake.allreduce([inplace], opts),
        # The other ops with C++ kernels, beside their Python entry points and the engine's own calls.
        "engine all_gather (C++)": lambda: comm._engine.all_gather(comm._comm, x, out, None),
        "pyccl.all_gather, new output": lambda: pyccl.all_gather(x),
        "torch.ops.pyccl.all_gather": lambda: torch.ops.pyccl.all_gather(x, 1, name),
        "engine reduce_scatter (C++)": lambda: comm._engine.reduce_scatter(comm._comm, x, out, "sum", None),
        "torch.ops.pyccl.reduce_scatter": lambda: torch.ops.pyccl.reduce_scatter(x, "sum", 1, name),
        "engine fused norm (C++)": lambda: comm._engine.all_reduce_rmsnorm(comm._comm, rows, residual, weight,
                                                                           normed, new_residual, 1e-6, None),
        "pyccl.fused_all_reduce_rmsnorm": lambda: pyccl.fused_all_reduce_rmsnorm(rows, residual, weight),
        "torch.ops.pyccl.fused_all_reduce_rmsnorm": lambda: torch.ops.pyccl.fused_all_reduce_rmsnorm(
            rows, residual, weight, 1e-6, name),
    }
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for fn in parts.values():
        for _ in range(20):
            fn()
    sync()
    loops = {label: [] for label in parts}
    for _ in range(args.trials):
        for label, fn in parts.items():
            start = time.perf_counter()
            for _ in range(args.calls):
                fn()
            loops[label].append((time.perf_counter() - start) / args.calls * 1e6)
            sync()
    calls = {op: pyccl._C.op_calls(op)
             for op in ("all_reduce", "all_gather", "reduce_scatter", "fused_all_reduce_rmsnorm")}
    engine = statistics.median(loops["engine (C++)"])
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (host mode)"
    print(f"# host µs per call, {args.bytes} B bf16, {where}; median of {args.trials} loops of {args.calls}; "
          "torch.ops.pyccl calls to the engine / to Python: " +
          ", ".join(f"{op} {c['engine']}/{c['python']}" for op, c in calls.items()))
    for label, times in loops.items():
        median = statistics.median(times)
        print(f"{label:42s} {median:7.2f}   ({median / engine:4.2f} × the engine's all-reduce)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": where, "bytes": args.bytes, "loops_us": loops,
                       "op_calls": calls}, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
