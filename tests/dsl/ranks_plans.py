"""Per-rank bodies of the plan-interpreter tests; host mode or GPUs."""

from __future__ import annotations

import os
import random

import torch

import pyccl
import pyccl.algorithms as algorithms
from pyccl.dsl import AllGather, MemoryChannel, Plan, Program, plan_format
from pyccl.plans import PlanRunner
from ranks_collectives import TOLERANCE, _setup, error_scale, rank_input

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
# Words of a packed op before its source chunks, and before its destination chunks.
_OP_SRCS = plan_format.OP_OFFSET["srcs"]
_OP_DSTS = plan_format.OP_OFFSET["dsts"]


def _expected(collective, inputs, op: str, rank: int) -> torch.Tensor:
    """The float64 result of the plan's collective on `rank` (inputs flattened)."""
    stack = torch.stack([x.to(torch.float64) for x in inputs])
    red = {"sum": stack.sum(0), "max": stack.max(0).values, "min": stack.min(0).values,
           "prod": stack.prod(0)}.get(op)
    world = len(inputs)
    name = collective["name"]
    if name == "allreduce":
        return red
    if name == "reducescatter":
        return red.reshape(world, -1)[rank]
    if name == "allgather":
        return torch.cat([x.to(torch.float64) for x in inputs])
    if name == "alltoall":
        return torch.cat([x.to(torch.float64).reshape(world, -1)[rank] for x in inputs])
    raise AssertionError(name)


def library_plans(rank, world, store, on_gpu, seed, calls, max_elems):
    """Every library plan run by the interpreter on random sizes, dtypes and
    ops, back to back, checked against float64. Returns the failures."""
    comm, device = _setup(store, rank, world, on_gpu)
    rng = random.Random(seed)
    bad = []
    for name, build in sorted(algorithms.LIBRARY.items()):
        for instances in (1, 2):
            bad += _plan_cases(name, build(world, instances=instances).lower(), comm, device, rng, seed, calls,
                               max_elems)
    record = comm.device_error()
    comm.close()
    return bad, record


def allgather_long(num_ranks: int, chunks: int = 64):
    """An all-gather of `chunks` chunks per rank, one put and one copy per
    chunk: 2 x chunks ops on one thread block, more than the kernel stages in
    shared memory at once (it then runs them through a one-op window)."""
    from pyccl.dsl import AllGather, Program, all_pairs_memory_channels, signal_and_wait

    with Program("allgather_long", AllGather(num_ranks, chunks=chunks), protocol="hb") as p:
        chans = all_pairs_memory_channels(num_ranks)
        for r in range(num_ranks):
            peers = [(r + k) % num_ranks for k in range(1, num_ranks)]
            for k in range(chunks):
                for q in peers:
                    chans[(q, r)].put(p.output(q)[r * chunks + k], p.input(r)[k], tb=0)
                p.output(r)[r * chunks + k].copy(p.input(r)[k], tb=0)
            signal_and_wait(chans, r, peers, tb=0)
    return p


def long_plan(rank, world, store, on_gpu, seed):
    """allgather_long, run on random sizes and dtypes against the reference. Returns the failures."""
    comm, device = _setup(store, rank, world, on_gpu)
    plan = allgather_long(world).lower()
    assert max(len(tb["ops"]) for tb in plan.ranks[rank]["threadblocks"]) > 120
    bad = _plan_cases("allgather_long", plan, comm, device, random.Random(seed), seed, 4, 64 * 300)
    comm.close()
    return bad


def hierarchical_plans(rank, world, store, on_gpu, seed, calls, max_elems, gpus_per_node, split=False):
    """The 2PH plans for world / gpus_per_node "nodes" (PortChannels between
    nodes, MemoryChannels inside), as library_plans runs the others. With
    `split`, each group of gpus_per_node ranks is its own node (PYCCL_NODE_ID):
    no P2P between the groups, so the plans' puts and signals across nodes go
    through the socket transport."""
    if split:
        os.environ["PYCCL_NODE_ID"] = f"node{rank // gpus_per_node}"
    comm, device = _setup(store, rank, world, on_gpu)
    if split:
        reach = [q == rank or comm.can_access_peer(q) for q in range(world)]
        assert reach == [q // gpus_per_node == rank // gpus_per_node for q in range(world)], reach
    rng = random.Random(seed)
    bad = []
    for name, build in sorted(algorithms.HIERARCHICAL.items()):
        # 2PH LL pipelines by default where a node has several GPUs; its one-piece form too.
        variants = [{}, {"pipeline": 1}] if name == "allreduce_2ph_ll" and gpus_per_node > 1 else [{}]
        for instances in (1, 2):
            for options in variants:
                plan = build(world // gpus_per_node, gpus_per_node, instances=instances, **options).lower()
                bad += _plan_cases(plan.name, plan, comm, device, rng, seed, calls, max_elems)
    record = comm.device_error()
    comm.close()
    return bad, record


# Library plans that only put and signal to their peers: they run across nodes.
PUT_ONLY_PLANS = ("allgather_allpairs", "allgather_ring", "allreduce_1pa_hb", "allreduce_ring", "reduce_scatter_ring")


def library_plans_across_nodes(rank, world, store, on_gpu, seed, calls, max_elems, gpus_per_node):
    """Each group of gpus_per_node ranks its own node: the put-only library
    plans run (rings with their entry barrier through the proxy too) and are
    checked; the others, which load or store a peer's memory, are refused at
    creation. Returns (failures, {plan: refusal message})."""
    os.environ["PYCCL_NODE_ID"] = f"node{rank // gpus_per_node}"
    comm, device = _setup(store, rank, world, on_gpu)
    rng = random.Random(seed)
    bad, refused = [], {}
    plans = [(name, build(world, instances=rng.choice((1, 2))).lower())
             for name, build in sorted(algorithms.LIBRARY.items())]
    if world >= 3:
        plans.append(("one_rank_gets", _one_rank_gets(world).lower()))
    for name, plan in plans:
        if name in PUT_ONLY_PLANS:
            bad += _plan_cases(name, plan, comm, device, rng, seed, calls, max_elems)
            continue
        try:
            PlanRunner(plan, comm, max_bytes=4096).close()
            refused[name] = None
        except pyccl.PycclError as e:
            refused[name] = str(e)
    comm.close()
    return bad, refused


def _one_rank_gets(world: int) -> Program:
    """A plan in which rank 1 alone reads another rank's memory (a get from
    rank 2): split into nodes, only rank 1 breaks the rule. Made to be
    refused at creation, never run (no synchronization)."""
    with Program("one_rank_gets", AllGather(world, chunks=1), protocol="hb") as p:
        for r in range(world):
            p.output(r)[r].copy(p.input(r)[0], tb=0)
        MemoryChannel(2, 1).get(p.output(1)[2], p.input(2)[0], tb=0)
    return p


def _plan_cases(name, plan, comm, device, rng, seed, calls, max_elems) -> list:
    """`calls` random calls of `plan` (sizes, dtypes, ops, output modes) against float64; the failures."""
    rank, world = comm.rank, comm.world_size
    unit = plan.buffers["input"]
    # Up to 512 threads take the kernel with more registers, 1024 the other.
    runner = PlanRunner(plan, comm, max_bytes=max_elems * 4 + unit * 4, threads=rng.choice((256, 512, 1024)))
    reduces = plan.collective["name"] in ("allreduce", "reducescatter")
    bad = []
    for i in range(calls):
        dtype = rng.choice(_FLOATS) if reduces else rng.choice(_FLOATS + (torch.int32, torch.uint8))
        op = rng.choice(["sum", "sum", "max", "min", "prod"]) if reduces else "sum"
        n = unit * rng.randrange(1, max(2, max_elems // unit))
        case = (name, plan.instances, i, str(dtype), op, n)
        if dtype in _FLOATS:
            inputs = [rank_input(seed, i, r, n, dtype, op) for r in range(world)]
        else:
            gen = torch.Generator().manual_seed(seed * 7 + i)
            inputs = [torch.randint(0, 100, (n,), generator=gen, dtype=dtype) for _ in range(world)]
        want = _expected(plan.collective, inputs, op, rank)
        # The output: a new tensor, the input itself (all-reduce) or a given one.
        x = inputs[rank].clone().to(device)
        mode = rng.choice(("new", "same", "given") if name.startswith("allreduce") else ("new", "given"))
        out = None if mode == "new" else x if mode == "same" else torch.empty(
            n // unit * plan.buffers["output"], dtype=dtype, device=device)
        y = runner(x, out=out, op=op).cpu()
        case += (mode,)
        if y.numel() != want.numel():
            bad.append(case + ("size", y.numel(), want.numel()))
            continue
        if dtype in _FLOATS:
            rtol, atol = TOLERANCE[dtype]
            ok = torch.allclose(y.to(torch.float64), want, rtol=rtol, atol=atol * error_scale(inputs))
        else:
            ok = torch.equal(y.to(torch.float64), want)
        if not ok:
            bad.append(case + ("wrong",))
    runner.close()
    return bad


def plan_errors(rank, world, store):
    """Bad calls give clear errors; a plan for another world size is refused."""
    comm, device = _setup(store, rank, world, False)
    plan = algorithms.allreduce_2pa_hb_pull(world).lower()
    runner = PlanRunner(plan, comm, max_bytes=4096)
    messages = {"rank": rank}
    for key, call in (("size", lambda: runner(torch.ones(world * 2 + 1))),
                      ("too big", lambda: runner(torch.ones(world * 4096))),
                      ("bogus op", lambda: runner(torch.ones(world * 4), op="mean")),
                      ("out", lambda: runner(torch.ones(world * 4), out=torch.ones(3))),
                      ("out list", lambda: runner(torch.ones(world * 4), out=[torch.ones(world * 4)])),
                      ("comm", lambda: PlanRunner(plan, "comm", max_bytes=4096))):
        try:
            call()
        except pyccl.PycclError as e:
            messages[key] = str(e)
    # avg: the plan's sum, divided by the world size.
    parts = [torch.randn(world * 4, generator=torch.Generator().manual_seed(70 + q)) for q in range(world)]
    mean = torch.stack([p.double() for p in parts]).mean(0)
    messages["avg"] = "mean" if torch.allclose(runner(parts[rank], op="avg").double(), mean, rtol=1e-5,
                                               atol=1e-6) else "wrong"
    try:
        PlanRunner(algorithms.allreduce_2pa_hb_pull(world + 1).lower(), comm, max_bytes=4096)
    except pyccl.InvalidArgumentError as e:
        messages["world"] = str(e)
    # An in-place plan works on the output: a partly overlapping one is refused.
    ring = PlanRunner(algorithms.allreduce_ring(world).lower(), comm, max_bytes=4096)
    both = torch.ones(world * 8 + 2)
    try:
        ring(both[:world * 8], out=both[2:])
    except pyccl.InvalidArgumentError as e:
        messages["overlap"] = str(e)
    ring.close()
    # The executor checks the packed op table too.
    from pyccl import _C
    from pyccl.plans import pack_plan

    def packed(program):
        """The executor's arguments for this rank's part of `program`, and a copy of its op table to edit."""
        args = pack_plan(program.lower(), rank)
        args.pop("reduces")
        return args, args["ops"].clone()

    def refusal(args, ops):
        """The executor's error for `args` with the op table `ops` (None if it took them)."""
        try:
            _C.PlanExecutor(comm._comm, max_chunk_bytes=1024, threads=64, **dict(args, ops=ops))
        except pyccl.InvalidArgumentError as e:
            return str(e)
        return None

    # Pairs must come whole.
    args, ops = packed(algorithms.allreduce_2pa_ll(world))
    ops[0, 2] = ops[0, 3] + 1  # one more source than destinations
    messages["pairs"] = refusal(args, ops)
    # Packets land only in the packet region, which has a slot per scratch chunk.
    args, ops = packed(algorithms.allreduce_2pa_ll(world))
    ops[1, _OP_DSTS + 4 + 1] = 1  # reduce_put_packets' first packet destination into an output chunk
    messages["packets"] = refusal(args, ops)
    # Signals store the count their waits expect: an ordinal past the channel's signals a call is refused.
    args, ops = packed(algorithms.allreduce_2pa_hb_pull(world))
    ops[int((ops[:, 0] == 8).nonzero()[0]), 5] = 99  # the first signal's first ordinal
    messages["ordinal"] = refusal(args, ops)
    # A reduction that starts from an init stores only: the interpreter's op
    # starts from srcs[0] (the init) and stores the result to every dst
    # (srcs[0] of the DSL's reduce_put first); without a source it is refused.
    args, ops = packed(algorithms.allreduce_2pa_hb(world))
    row = int((ops[:, 0] == 15).nonzero()[0])
    messages["reduce_to"] = {"srcs": int(ops[row, 2]), "dsts": int(ops[row, 3]),
                             "start": ops[row, _OP_SRCS:_OP_SRCS + 4].tolist(),
                             "first_dst": ops[row, _OP_DSTS:_OP_DSTS + 4].tolist()}
    ops[row, 2] = 0
    messages["no start"] = refusal(args, ops)
    # A channel signalled from two thread blocks (a hand-edited plan) is refused when packed.
    d = algorithms.allreduce_2pa_hb_pull(world, instances=2).lower().to_dict()
    tbs = d["ranks"][0]["threadblocks"]
    first = next(i for i, op in enumerate(tbs[0]["ops"]) if op["op"] in ("signal", "multi_signal"))
    tbs[1]["ops"].insert(0, tbs[0]["ops"].pop(first))
    try:
        pack_plan(Plan.from_dict(d), rank)
    except pyccl.InvalidArgumentError as e:
        messages["two signallers"] = str(e)
    y = runner(torch.full((world * 4,), float(rank + 1)))  # still works
    messages["sum_ok"] = bool(torch.all(y == world * (world + 1) / 2))
    runner.close()
    comm.close()
    return messages


def too_wide(rank, world, store, seed):
    """A plan of more thread blocks than the GPU holds at once is refused when
    made (its blocks wait on each other), with no buffers exchanged; a plan
    that fits still runs after."""
    comm, device = _setup(store, rank, world, True)
    message = None
    try:
        PlanRunner(algorithms.allreduce_1pa_ll(world, instances=1000).lower(), comm, max_bytes=1 << 20,
                   threads=1024)
    except pyccl.InvalidArgumentError as e:
        message = str(e)
    runner = PlanRunner(algorithms.allreduce_1pa_ll(world, instances=4).lower(), comm, max_bytes=4096)
    inputs = [torch.randn(1024, generator=torch.Generator().manual_seed(seed * 31 + r)) for r in range(world)]
    y = runner(inputs[rank].to(device)).cpu()
    ok = torch.allclose(y.double(), sum(x.double() for x in inputs), rtol=1e-5, atol=1e-5)
    runner.close()
    comm.close()
    return message, ok


def missing_peer(rank, world, store):
    """Rank 1 skips a call: rank 0's call raises a timeout naming the plan within
    the communicator's timeout (2 s), and the communicator is broken after."""
    import time

    comm, _ = _setup(store, rank, world, False, timeout_s=2.0)
    runner = PlanRunner(algorithms.allreduce_2pa_hb_pull(world).lower(), comm, max_bytes=4096)
    runner(torch.ones(world * 4))  # both ranks: set up and one good call
    result = None
    if rank == 0:
        start = time.monotonic()
        try:
            runner(torch.ones(world * 4))
            result = ("completed",)
        except pyccl.PycclTimeoutError as e:
            result = ("timeout", time.monotonic() - start, str(e))
        try:
            runner(torch.ones(world * 4))
            result += ("later call completed",)
        except pyccl.PycclError as e:
            result += (type(e).__name__,)
    store.set(f"plan_done{rank}", "1")
    store.wait([f"plan_done{q}" for q in range(world)])
    return result


def registered(rank, world, store):
    """pyccl.register_algorithm: the plan takes its size range (whole chunks
    only), sum/avg/max, all-gather too; unregistered, the kernels take over."""
    comm, device = _setup(store, rank, world, False)
    ring = pyccl.register_algorithm(algorithms.allreduce_ring(world), "all_reduce", 4096, 1 << 20, world)
    pyccl.register_algorithm(algorithms.allgather_ring(world).lower(), "all_gather", 0, 1 << 20, world)
    bad = []
    unit = 2 * world  # the ring's chunks
    for i, (n, op) in enumerate([(unit * 500, "sum"), (unit * 500, "avg"), (unit * 700, "max"),
                                 (unit * 500 + 1, "sum"), (100, "sum")]):
        inputs = [rank_input(5, i, r, n, torch.float32, op) for r in range(world)]
        before = sum(r.calls for r in getattr(comm, "_plan_runners", {}).values())
        y = pyccl.all_reduce(inputs[rank], op=op, comm=comm)
        used = sum(r.calls for r in getattr(comm, "_plan_runners", {}).values()) - before
        stack = torch.stack([x.double() for x in inputs])
        want = {"sum": stack.sum(0), "avg": stack.mean(0), "max": stack.max(0).values}[op]
        if not torch.allclose(y.double(), want, rtol=1e-5, atol=1e-5 * error_scale(inputs)):
            bad.append((n, op, "wrong"))
        expect_plan = n % unit == 0 and 4096 <= n * 4 <= (1 << 20)
        if used != int(expect_plan):
            bad.append((n, op, "plan used", used))
    g = pyccl.all_gather(torch.full((7,), float(rank)), comm=comm)
    if g.tolist() != [float(q) for q in range(world) for _ in range(7)]:
        bad.append(("all_gather", g.tolist()))
    pyccl.unregister_algorithm(ring)
    before = sum(r.calls for r in comm._plan_runners.values())
    pyccl.all_reduce(torch.ones(unit * 500), comm=comm)
    if sum(r.calls for r in comm._plan_runners.values()) != before:
        bad.append("unregistered plan still used")
    messages = {}
    for key, call in (("collective", lambda: pyccl.register_algorithm(algorithms.allgather_ring(world),
                                                                      "all_reduce", 0, 10, world)),
                      ("world", lambda: pyccl.register_algorithm(algorithms.allreduce_ring(world), "all_reduce",
                                                                 0, 10, world + 1)),
                      ("range", lambda: pyccl.register_algorithm(algorithms.allreduce_ring(world), "all_reduce",
                                                                 10, 5, world))):
        try:
            call()
        except pyccl.InvalidArgumentError as e:
            messages[key] = str(e)
    for e in pyccl.registered_algorithms():
        pyccl.unregister_algorithm(e)
    comm.close()
    return bad, messages


def notebook_example(rank, world, store):
    """examples/notebooks/oneshot_allreduce.py, lowered and run in host mode."""
    import os
    import runpy

    comm, device = _setup(store, rank, world, False)
    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "notebooks", "oneshot_allreduce.py")
    plan = runpy.run_path(path)["oneshot_allreduce"](world, 3).lower()
    runner = PlanRunner(plan, comm, max_bytes=1 << 16)
    bad = []
    for i, n in enumerate((3, 300, 3 * 4001)):
        inputs = [rank_input(9, i, r, n, torch.float32, "sum") for r in range(world)]
        y = runner(inputs[rank].to(device))
        want = torch.stack([x.double() for x in inputs]).sum(0)
        if not torch.allclose(y.double(), want, rtol=1e-5, atol=1e-5 * error_scale(inputs)):
            bad.append(n)
    runner.close()
    comm.close()
    return bad


# The table tuned_plans() runs under (PYCCL_TUNING_FILE): library plans for some
# size ranges, a forced kernel for another, with small launch shapes for CPUs.
TUNED_TABLE = {"version": 1, "gpu": "host", "world": 0, "dtype": "float32", "date": "-", "command": "-",
               "collectives": {
                   "all_reduce": [
                       {"max_bytes": 4096, "algorithm": "plan", "plan": "allreduce_1pa_ll",
                        "instances": 2, "threads": 64},
                       {"max_bytes": 16384, "algorithm": "2pa_hb"},
                       {"max_bytes": None, "algorithm": "plan", "plan": "allreduce_2pa_hb_pull",
                        "instances": 2, "threads": 128}],
                   "all_gather": [{"max_bytes": None, "algorithm": "plan", "plan": "allgather_ring",
                                   "instances": 1, "threads": 64}],
                   "reduce_scatter": [{"max_bytes": None, "algorithm": "plan", "plan": "reduce_scatter_ring",
                                       "instances": 2, "threads": 128}]}}


def tuned_plans(rank, world, store, on_gpu, seed):
    """The automatic choice under TUNED_TABLE: each library plan runs where the
    table names it and its chunks divide the input, the kernels elsewhere
    (including sizes that the plan cannot split), every result against float64.
    Returns the failures."""
    from pyccl.registry import library_plan

    comm, device = _setup(store, rank, world, on_gpu)
    rng = random.Random(seed)
    entries = TUNED_TABLE["collectives"]

    def unit(collective, nbytes):
        entry = next(e for e in entries[collective] if e["max_bytes"] is None or nbytes <= e["max_bytes"])
        if entry["algorithm"] != "plan":
            return None
        return library_plan(entry["plan"], world, entry["instances"]).buffers["input"]

    def plan_calls():
        return sum(r.calls for r in getattr(comm, "_plan_runners", {}).values())

    bad = []
    expected_plans = []
    cases = []
    for collective, elems in (("all_reduce", 600), ("all_reduce", 2000), ("all_reduce", 9000),
                              ("all_gather", 500), ("reduce_scatter", 7000)):
        cases.append((collective, elems))
        cases.append((collective, elems + 1 + rng.randrange(3)))  # usually not whole chunks: the kernels
    for i, (collective, n) in enumerate(cases):
        if collective == "reduce_scatter":
            n -= n % world
        op = "avg" if i % 3 == 2 and collective != "all_gather" else "sum"
        inputs = [rank_input(seed, i, r, n, torch.float32, op) for r in range(world)]
        x = inputs[rank].to(device)
        before = plan_calls()
        fn = {"all_reduce": lambda: pyccl.all_reduce(x, op=op, comm=comm),
              "all_gather": lambda: pyccl.all_gather(x, comm=comm),
              "reduce_scatter": lambda: pyccl.reduce_scatter(x, op=op, comm=comm)}[collective]
        y = fn().cpu().reshape(-1).to(torch.float64)
        used = plan_calls() - before
        want = _expected({"name": collective.replace("_", "")},
                         inputs, "sum", rank)
        if op == "avg":
            want = want / world
        if not torch.allclose(y, want, rtol=1e-5, atol=1e-5 * error_scale(inputs)):
            bad.append((collective, n, op, "wrong"))
        whole = n * 4 * (world if collective == "all_gather" else 1)
        chunks = unit(collective, whole)
        expect = int(chunks is not None and n % chunks == 0)
        expected_plans.append(expect)
        if used != expect:
            bad.append((collective, n, "plan calls", used, "expected", expect))
    if sum(expected_plans) < 4 or all(expected_plans):
        bad.append(("cases do not cover plans and kernels", expected_plans))
    comm.close()
    return bad


def call_threads(rank, world, store):
    """PlanRunner.threads_for of library plans at several sizes and thread
    limits: {(plan, instances, limit, nbytes): threads}, and the error of a bad size."""
    comm, _ = _setup(store, rank, world, False)
    got = {}
    cases = (("allreduce_1pa_ll", 1, 512, (256, 1024, 4096, 64 << 10)),
             ("allreduce_1pa_ll", 2, 512, (1024,)),
             ("allreduce_1pa_ll", 1, 1024, (64 << 10,)),
             ("allreduce_2pa_hb_pull", 1, 512, (256, 1 << 20)),
             ("allreduce_2pa_ll", 4, 256, (1 << 20, 96)))
    for name, instances, limit, sizes in cases:
        runner = PlanRunner(algorithms.LIBRARY[name](world, instances=instances).lower(), comm,
                            max_bytes=max(sizes), threads=limit)
        for n in sizes:
            got[(name, instances, limit, n)] = runner.threads_for(n)
        if name == "allreduce_1pa_ll" and instances == 1 and limit == 512:
            try:
                runner.threads_for(0)
                got["error"] = None
            except pyccl.PycclError as e:
                got["error"] = str(e)
        runner.close()
    comm.close()
    return got
