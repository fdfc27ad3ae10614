"""Per-rank bodies of the tests of how an engine chooses its algorithms:
tuning tables, forced algorithms, options that must agree across ranks, and
the engines of process groups."""

from __future__ import annotations

import datetime
import os

import torch

import pyccl
from ranks_collectives import _setup, check_reduction, rank_input, reference


def engine_choices(rank, world, store):
    """The automatic choice of an engine given a tuning table's kernel entries
    (what the process group's engine gets), checked and run; and the table
    errors, each naming its option."""
    comm, device = _setup(store, rank, world, False)
    choices = {"all_reduce": [(2048, "1pa_ll"), (16384, "1pa_hb"), (None, "2pa_ll")],
               "all_reduce_symmetric": [(1024, "1pa_ll"), (None, "2pa_hb")],
               "all_gather": [(1024, "hb"), (None, "ll")]}
    engine = pyccl._C.CollectiveEngine(comm._comm, kernel_choices=choices)
    comm._use_engine(engine)
    picked = {n: engine.select(n) for n in (100, 2048, 2049, 16384, 1 << 20)}
    # Symmetric (and graph) buffers take the symmetric entries, not the zero-copy threshold.
    picked.update({f"sym{n}": engine.select(n, symmetric=True) for n in (1000, 1025, 1 << 20)})
    picked.update({f"ag{n}": engine.select_exchange("all_gather", n) for n in (512, 4096)})
    picked["rs"] = engine.select_exchange("reduce_scatter", 4096)  # no entries: the threshold rule
    bad = []
    for i, n in enumerate((300, 3000, 9000)):  # 1PA LL, 1PA HB, 2PA LL by the table
        inputs = [rank_input(23, i, r, n, torch.float32, "sum") for r in range(world)]
        y = pyccl.all_reduce(inputs[rank], comm=comm)
        bad += check_reduction(comm, y, inputs, "sum", (n,))
    errors = {}
    for label, table in [("order", {"all_reduce": [(4096, "1pa_ll"), (1024, "2pa_hb")]}),
                         ("name", {"all_reduce": [(None, "ring")]}),
                         ("ll_max", {"all_reduce": [(1 << 30, "1pa_ll")]}),
                         ("sym_ll_max", {"all_reduce_symmetric": [(1 << 30, "1pa_ll")]}),
                         ("collective", {"gather": [(None, "ll")]})]:
        try:
            pyccl._C.CollectiveEngine(comm._comm, kernel_choices=table).close()
            errors[label] = "accepted"
        except ValueError as e:
            errors[label] = str(e)
    comm.close()
    return picked, bad, errors


def engine_options_must_agree(rank, world, store, on_gpu):
    """Engines made with options that differ on the last rank: every rank
    raises the same error, naming the option and both values, before any
    scratch is allocated; then engines whose options agree (launch aside)
    run a random all-reduce on the same communicator."""
    comm, device = _setup(store, rank, world, on_gpu)
    last = rank == world - 1
    cases = {
        "scalar": {"ll_max_bytes": 8192 if last else 16384},
        "exchange": {"exchange_ll_threshold_bytes": [512, 512, 512, 1024 if last else 512]},
        "table_length": {"kernel_choices": {"all_reduce": [(2048, "1pa_ll")] + ([] if last else [(None, "2pa_hb")])}},
        "table_entry": {"kernel_choices": {"all_gather": [(4096 if last else 2048, "ll"), (None, "hb")]}},
        "p2p_default": {"p2p_ll_max_bytes": 1024 if last else None},
        "setting": {"agreed_settings": {"PYCCL_ALGO (environment)": "1pa_ll" if last else "", "other": "same"}},
    }
    errors = {}
    for label, options in cases.items():
        try:
            pyccl._C.CollectiveEngine(comm._comm, **options).close()
            errors[label] = "accepted"
        except ValueError as e:
            errors[label] = str(e)
    # programmatic_launch changes only how kernels are launched: it may differ.
    engine = pyccl._C.CollectiveEngine(comm._comm, ll_blocks=3, programmatic_launch=last)
    engine.close()
    seed = 31 + world
    inputs = [rank_input(seed, 0, r, 5003, torch.float32, "sum").to(device) for r in range(world)]
    y = pyccl.all_reduce(inputs[rank], comm=comm)
    bad = check_reduction(comm, y.cpu(), [x.cpu() for x in inputs], "sum", (5003,))
    comm.close()
    return errors, bad


def communicator_under_another_algo(rank, world, store):
    """A communicator made while PYCCL_ALGO differs on the last rank: its
    engine refuses on every rank; made again with it alike, it runs."""

    last = rank == world - 1
    if last:
        os.environ["PYCCL_ALGO"] = "2pa_hb"
    threads, kept = len(os.listdir("/proc/self/task")), None  # native threads too
    try:
        pyccl.Communicator(store, rank, world, device="cpu", name="algo",
                           timeout=datetime.timedelta(seconds=60)).close()
        error = "accepted"
    except ValueError as e:
        error, kept = str(e), e  # its traceback holds the refused communicator, as a caller's handler may
    # The refused communicator's threads (its fd server) are gone at once, not when it is collected.
    error_threads = len(os.listdir("/proc/self/task")) - threads
    del kept
    if last:
        del os.environ["PYCCL_ALGO"]
    comm = pyccl.Communicator(store, rank, world, device="cpu", name="algo_again",
                              timeout=datetime.timedelta(seconds=60))
    inputs = [rank_input(7, 0, r, 999, torch.float32, "sum") for r in range(world)]
    bad = check_reduction(comm, pyccl.all_reduce(inputs[rank], comm=comm), inputs, "sum", (999,))
    comm.close()
    return error, error_threads, bad


def engine_choice_by_size(rank, world, store):
    """The automatic choice of a new communicator's own engine, at a few sizes."""
    comm, _ = _setup(store, rank, world, False)
    picked = {n: comm._engine.select(n) for n in (512, 4096, 40_000)}
    picked["ag"] = comm._engine.select_exchange("all_gather", 512)
    comm.close()
    return picked


def group_communicator_with_a_table(rank, world, store):
    """pyccl.all_reduce on a torch group's communicator, made on the first call
    while a tuning table is in force (the new engine looks it up)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    inputs = [rank_input(31, 0, r, 3000, torch.float32, "sum") for r in range(world)]
    y = pyccl.all_reduce(inputs[rank].clone())
    ok = torch.allclose(y.to(torch.float64), reference(inputs, "sum"), rtol=1e-5, atol=1e-4)
    choice = pyccl.collectives.communicator_for(None, torch.device("cpu"))._engine.select(4096)
    dist.destroy_process_group()
    return ok, choice


def communicators_of_destroyed_groups(rank, world, store):
    """pyccl.all_reduce on the torch groups of two init_process_group's in
    turn: the second init's world group gets a new communicator, and making it
    closes those of the groups destroyed before."""
    import torch.distributed as dist

    cpu = torch.device("cpu")
    inputs = [rank_input(37, 0, r, 2000, torch.float32, "sum") for r in range(world)]
    expect = reference(inputs, "sum")

    def right(y):
        return torch.allclose(y.to(torch.float64), expect, rtol=1e-5, atol=1e-4)

    seen = {}
    dist.init_process_group("gloo", store=dist.PrefixStore("first", store), rank=rank, world_size=world)
    sub = dist.new_group(list(range(world)))
    seen["first"] = right(pyccl.all_reduce(inputs[rank].clone())) and right(
        pyccl.all_reduce(inputs[rank].clone(), group=sub))
    first, first_sub = pyccl.communicator_for(None, cpu), pyccl.communicator_for(sub, cpu)
    dist.destroy_process_group(sub)
    seen["world kept"] = right(pyccl.all_reduce(inputs[rank].clone())) and pyccl.communicator_for(None, cpu) is first
    dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.PrefixStore("second", store), rank=rank, world_size=world)
    seen["second"] = right(pyccl.all_reduce(inputs[rank].clone()))
    second = pyccl.communicator_for(None, cpu)
    seen["new communicator"] = second is not first and not second.closed
    seen["destroyed closed"] = first.closed and first_sub.closed
    second.close()  # closed by the user: the next call makes another, whose set-up must not meet this one's keys
    seen["after close"] = right(pyccl.all_reduce(inputs[rank].clone()))
    third = pyccl.communicator_for(None, cpu)
    seen["another communicator"] = third is not second and not third.closed and third.name != second.name
    dist.destroy_process_group()
    return seen
