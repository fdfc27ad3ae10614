"""Per-rank bodies of the selector's tests (host mode)."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

import pyccl
from pyccl import algorithms


def every_entry_point(rank, world, store, scenario, table_path, seed):
    """One "cpu:pyccl" group, the scenario's source of the choice set before
    the group is made; an all-reduce through each entry point, each checked
    against a float64 sum. Returns the failures and the group selector's trace."""
    if scenario == "PYCCL_ALGO":
        os.environ["PYCCL_ALGO"] = "all_reduce=2pa_ll,all_to_all=hb,broadcast=hb"
    elif scenario == "tuning file":
        os.environ["PYCCL_TUNING_FILE"] = table_path
    plan = None
    if scenario == "registered plan":
        plan = pyccl.register_algorithm(algorithms.allreduce_ring(world), "all_reduce", 0, 1 << 20, world)
    dist.init_process_group("cpu:pyccl", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    bad = []
    gen = torch.Generator().manual_seed(seed)
    n = 2 * world * 999  # whole chunks of the ring
    group_name = dist.group.WORLD.group_name
    calls = {
        "dist.all_reduce": lambda x: (dist.all_reduce(x), x)[1],
        "pyccl.all_reduce": lambda x: pyccl.all_reduce(x),
        "torch.ops.pyccl.all_reduce": lambda x: torch.ops.pyccl.all_reduce(x, "sum", group_name),
    }
    ops_before = None
    for name, call in calls.items():
        inputs = [torch.randn(n, generator=gen) for _ in range(world)]
        if name.startswith("torch.ops"):
            ops_before = pyccl._C.op_calls("all_reduce")["engine"]
        got = call(inputs[rank].clone())
        ref = sum(t.double() for t in inputs)
        if not torch.allclose(got.double(), ref, rtol=1e-5, atol=1e-5):
            bad.append((name, (got.double() - ref).abs().max().item()))
    # The exchanges through each entry point (dist's through the backend): bit for bit.
    exchanges = {
        "dist.all_to_all_single": lambda x: (dist.all_to_all_single(y := torch.empty_like(x), x), y)[1],
        "pyccl.all_to_all": lambda x: pyccl.all_to_all(x),
        "torch.ops.pyccl.all_to_all": lambda x: torch.ops.pyccl.all_to_all(x, group_name),
        "dist.broadcast": lambda x: (dist.broadcast(x, src=world - 1), x)[1],
        "pyccl.broadcast": lambda x: pyccl.broadcast(x, src=world - 1),
        "torch.ops.pyccl.broadcast": lambda x: torch.ops.pyccl.broadcast(x, world - 1, group_name),
    }
    for name, call in exchanges.items():
        inputs = [torch.randn(n, generator=gen) for _ in range(world)]
        got = call(inputs[rank].clone())
        ref = (torch.cat([t.chunk(world)[rank] for t in inputs]) if "all_to_all" in name else inputs[world - 1])
        if not torch.equal(got, ref):
            bad.append((name, "wrong result"))
    comm = pyccl.communicator_for(device=torch.device("cpu"))
    trace = comm._selector.trace()
    if plan is not None:
        # One runner for the group, set up at the first call (dist's), run by every entry point; the later calls
        # run it from C++ (torch.ops' kernel counts them as its own).
        runners = list(comm._plan_runners.values())
        if len(runners) != 1 or runners[0].calls != len(calls):
            bad.append(("plan runners", len(runners), [r.calls for r in runners]))
        if ops_before is not None and pyccl._C.op_calls("all_reduce")["engine"] != ops_before + 1:
            bad.append(("torch.ops.pyccl.all_reduce's plan call was not run from C++", ops_before))
    dist.destroy_process_group()
    if plan is not None:
        pyccl.unregister_algorithm(plan)
    return bad, trace


def call_runtime(rank, world, store, seed):
    """A host-mode Communicator's call runtime (pyccl.calls' and
    pyccl.fused_all_reduce_rmsnorm's first step): the kernel choices it runs,
    each checked against float64, and the calls it hands back (None, nothing
    run) for the Python path to run or refuse.
    Returns the failures."""
    bad = []
    gen = torch.Generator().manual_seed(seed + rank)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    with pyccl.Communicator(store, rank, world, device="cpu", name="call_runtime") as comm:
        runtime = comm._runtime
        x = torch.randn(4 * world, 3, generator=gen)
        everyone = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(everyone, x)  # over gloo: the reference owes nothing to what is tested
        total = sum(t.double() for t in everyone)
        ints = [(t * 1000).int() for t in everyone]  # every rank's x, as int32
        before = comm._selector.trace()
        ran = {
            "all_reduce, new output": (runtime.all_reduce(x, None, "sum", None, False), total),
            "all_reduce, into out": (runtime.all_reduce(x, torch.empty_like(x), "SUM", "2pa_ll", False), total),
            "all_gather": (runtime.all_gather(x, None, None, False), torch.cat([t.double() for t in everyone])),
            "all_reduce of int32": (runtime.all_reduce(ints[rank], None, "sum", None, False),
                                               sum(t.double() for t in ints)),
            "reduce_scatter": (runtime.reduce_scatter(x, None, "max", None, False),
                               torch.stack([t.double() for t in everyone]).amax(0).chunk(world)[rank]),
            "all_to_all": (runtime.all_to_all(x, None, None, False),
                           torch.cat([t.double().chunk(world)[rank] for t in everyone])),
            "broadcast from the last rank": (runtime.broadcast(x, world - 1, None, None, False),
                                             everyone[world - 1].double()),
            "broadcast into out, ll": (runtime.broadcast(x, 0, torch.empty_like(x), "ll", False),
                                       everyone[0].double()),
        }
        for name, (got, want) in ran.items():
            if got is None or got.shape != want.shape or not torch.allclose(got.double(), want, rtol=1e-5,
                                                                               atol=1e-5):
                bad.append(f"{name}: {None if got is None else (got.shape, want.shape)}")
        counted = sum(comm._selector.trace().values()) - sum(before.values())
        if counted != len(ran):
            bad.append(f"{counted} choices counted for {len(ran)} calls")
        # The fused all-reduce + residual add + RMSNorm (the engine's own choice of fused kernel).
        part, residual = torch.randn(2 * world, 8, generator=gen), torch.randn(2 * world, 8, generator=gen)
        weight = torch.rand(8, generator=gen) + 0.5
        parts = [torch.empty_like(part) for _ in range(world)]
        dist.all_gather(parts, part)
        want_residual = sum(t.double() for t in parts) + residual.double()
        want_normed = want_residual * torch.rsqrt(want_residual.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.double()
        out, residual_out = torch.empty_like(part), torch.empty_like(residual)
        for name, got in (("fused, new outputs", runtime.fused_all_reduce_rmsnorm(part, residual, weight, 1e-5, None,
                                                                                None, None)),
                          ("fused, into outputs, two_kernel", runtime.fused_all_reduce_rmsnorm(
                              part, residual, weight, 1e-5, out, residual_out, "two_kernel"))):
            if got is None or not (torch.allclose(got[0].double(), want_normed, rtol=1e-4, atol=1e-4)
                                   and torch.allclose(got[1].double(), want_residual, rtol=1e-5, atol=1e-5)):
                bad.append(f"{name}: {'not run' if got is None else 'wrong result'}")
        if not torch.allclose(out.double(), want_normed, rtol=1e-4, atol=1e-4):
            bad.append("fused, into outputs: out not written")
        fused_back = {
            "fused, unfused forced": runtime.fused_all_reduce_rmsnorm(part, residual, weight, 1e-5, None, None,
                                                                      "unfused"),
            "fused, an unknown algorithm": runtime.fused_all_reduce_rmsnorm(part, residual, weight, 1e-5, None,
                                                                            None, "fastest"),
            "fused, eps not a number": runtime.fused_all_reduce_rmsnorm(part, residual, weight, "1e-5", None, None,
                                                                        None),
            "fused, residual not contiguous": runtime.fused_all_reduce_rmsnorm(
                part, residual.t().contiguous().t(), weight, 1e-5, None, None, None),
            "fused, int32 tensors": runtime.fused_all_reduce_rmsnorm(part.int(), residual.int(), weight.int(), 1e-5,
                                                                     None, None, None),
            "fused, weight not a tensor": runtime.fused_all_reduce_rmsnorm(part, residual, [1.0] * 8, 1e-5, None,
                                                                           None, None),
        }
        bad += [f"{name}: ran" for name, got in fused_back.items() if got is not None]
        handed_back = {
            "a torch ReduceOp": runtime.all_reduce(x, None, dist.ReduceOp.SUM, None, False),
            "not contiguous": runtime.all_reduce(x.t(), None, "sum", None, False),
            "an int16 tensor": runtime.all_reduce(x.short(), None, "sum", None, False),
            "forced NCCL without NCCL": runtime.all_reduce(x, None, "sum", "nccl", False),
            "an unknown algorithm": runtime.all_reduce(x, None, "sum", "fastest", False),
            "an unknown op": runtime.all_reduce(x, None, "mean", None, False),
            "out not a tensor": runtime.all_reduce(x, [1.0], "sum", None, False),
            "not a tensor": runtime.all_gather([1.0], None, None, False),
            "rows that do not split": runtime.reduce_scatter(x[:world + 1], None, "sum", None, False),
            "all_to_all, elements that do not split": runtime.all_to_all(x.flatten()[:3 * world + 1], None, None,
                                                                         False),
            "broadcast, src a bool": runtime.broadcast(x, True, None, None, False),
            "broadcast, src not a rank": runtime.broadcast(x, world, None, None, False),
            "broadcast, src not an int": runtime.broadcast(x, 0.0, None, None, False),
        }
        bad += [f"{name}: ran" for name, got in handed_back.items() if got is not None]
        plan = pyccl.register_algorithm(algorithms.allreduce_ring(world), "all_reduce", 0, 1 << 20, world)
        try:
            if runtime.all_reduce(x, None, "sum", None, False) is not None:
                bad.append("a registered plan's call not set up yet: ran")
            # The Python path sets the plan up (every rank at the same call); the runtime then runs it itself.
            first = comm.all_reduce(x)
            runners = list(comm._plan_runners.values())
            before = sum(r.calls for r in runners)
            again = runtime.all_reduce(x, None, "avg", None, False)
            if len(runners) != 1 or not torch.allclose(first.double(), total, rtol=1e-5, atol=1e-5):
                bad.append(f"the plan's first call: {len(runners)} runners set up")
            if again is None or not torch.allclose(again.double(), total / world, rtol=1e-5, atol=1e-5):
                bad.append(f"a registered plan set up, avg: {'not run' if again is None else 'wrong result'}")
            if sum(r.calls for r in runners) != before + 1:
                bad.append("a registered plan set up: the runtime's call did not run the plan")
            overlapping = torch.randn(2 * x.numel(), generator=gen)
            try:
                runtime.all_reduce(overlapping[:x.numel()], overlapping[2:x.numel() + 2], "sum", None, False)
                bad.append("a plan's output overlapping its input: no error")
            except pyccl.InvalidArgumentError as e:
                if "'out'" not in str(e):
                    bad.append(f"a plan's output overlapping its input: {e}")
        finally:
            pyccl.unregister_algorithm(plan)
    if runtime.all_reduce(x, None, "sum", None, False) is not None:
        bad.append("a closed communicator: ran")
    dist.destroy_process_group()
    return bad
