"""Bad input fails at the call, naming the argument, and runs nothing."""

import datetime

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import pyccl


@pytest.fixture
def store():
    return dist.HashStore()


def _expect_invalid(arg, fn, *args, **kwargs):
    with pytest.raises(pyccl.InvalidArgumentError) as info:
        fn(*args, **kwargs)
    assert f"'{arg}'" in str(info.value), str(info.value)
    assert isinstance(info.value, ValueError)
    return info.value


@pytest.mark.parametrize("rank", [-1, 2, 7])
def test_rank_out_of_range(store, rank):
    _expect_invalid("rank", pyccl.Communicator, store, rank, 2, device="cpu")


@pytest.mark.parametrize("world", [0, -3])
def test_bad_world_size(store, world):
    _expect_invalid("world_size", pyccl.Communicator, store, 0, world, device="cpu")


def test_non_integer_rank(store):
    _expect_invalid("rank", pyccl.Communicator, store, 0.5, 2, device="cpu")


def test_store_must_be_a_store():
    _expect_invalid("store", pyccl.Communicator, {"not": "a store"}, 0, 1, device="cpu")


def test_bad_timeout(store):
    _expect_invalid("timeout", pyccl.Communicator, store, 0, 1, device="cpu",
                    timeout=datetime.timedelta(seconds=0))


def test_bad_device_kind(store):
    _expect_invalid("device", pyccl.Communicator, store, 0, 1, device="meta")


def test_cuda_device_that_does_not_exist(store):
    n = pyccl._C.device_count()
    _expect_invalid("device", pyccl.Communicator, store, 0, 1, device=f"cuda:{n + 3}")


def test_single_rank_communicator_and_bad_registrations(store):
    comm = pyccl.Communicator(store, 0, 1, device="cpu")
    assert comm.topology()["p2p"] == [[True]]
    # Size 0.
    _expect_invalid("tensor", comm.register, pyccl.empty(4)[:0])
    with pytest.raises(pyccl.InvalidArgumentError, match="'size'"):
        pyccl.empty(0)
    # Ordinary host memory cannot be shared in host mode.
    err = _expect_invalid("tensor", comm.register, torch.empty(16))
    assert "pyccl.empty" in str(err)
    # Non-contiguous.
    _expect_invalid("tensor", comm.register, pyccl.empty(8, 8)[:, 0])
    # Not a tensor.
    _expect_invalid("tensor", comm.register, [1, 2, 3])
    # Garbage and truncated descriptors.
    _expect_invalid("memory descriptor", comm.import_memory, b"garbage")
    good = comm.register(pyccl.empty(16)).serialize()
    for cut in (1, 8, len(good) // 2, len(good) - 1):
        _expect_invalid("memory descriptor", comm.import_memory, good[:cut])
    # Semaphore with itself / out of range.
    _expect_invalid("peer", comm.create_semaphore, 0)
    _expect_invalid("peer", comm.create_semaphore, 5)
    comm.close()
    with pytest.raises(pyccl.ClosedError, match="destroyed"):
        comm.register(pyccl.empty(4))


def test_collective_arguments_of_the_wrong_kind_are_named(store):
    """What a caller may pass in the wrong place: a communicator as group=, a
    group as comm=, a list as out=, a sparse tensor."""
    comm = pyccl.Communicator(store, 0, 1, device="cpu")
    x = torch.randn(12)
    err = _expect_invalid("group", pyccl.all_reduce, x, group=comm)
    assert "comm=" in str(err)
    _expect_invalid("group", pyccl.all_gather, x, group="world")
    err = _expect_invalid("comm", pyccl.all_reduce, x, comm="world")
    assert "'group'" in str(err)
    for fn in (pyccl.all_reduce, pyccl.all_gather, pyccl.reduce_scatter, pyccl.all_to_all):
        _expect_invalid("out", fn, x, out=[torch.empty(12)], comm=comm)
    _expect_invalid("out", pyccl.broadcast, x, 0, out=x.numpy(), comm=comm)
    err = _expect_invalid("tensor", pyccl.all_reduce, x.to_sparse(), comm=comm)
    assert "sparse" in str(err)
    _expect_invalid("comm", pyccl.send, x, 0, comm="world")
    _expect_invalid("sends", pyccl.send_recv, 5, comm=comm)
    _expect_invalid("comm", pyccl.fused_all_reduce_rmsnorm, x.view(3, 4), x.view(3, 4), x[:4], comm="world")
    _expect_invalid("comm", pyccl.symmetric_empty, 4, comm=3)
    _expect_invalid("group", pyccl.symmetric_empty, 4, group=comm)
    _expect_invalid("tensor", pyccl.is_symmetric, [1.0], comm=comm)
    _expect_invalid("dtype", pyccl.empty, 4, dtype="float32")
    _expect_invalid("name", pyccl.Communicator, store, 0, 1, device="cpu", name="")
    from pyccl.algorithms import allreduce_ring

    _expect_invalid("min_bytes", pyccl.register_algorithm, allreduce_ring(2), "all_reduce", True, 10, 2)
    _expect_invalid("world_size", pyccl.register_algorithm, allreduce_ring(2), "all_reduce", 0, 10, 2.0)
    assert torch.equal(pyccl.all_reduce(x, comm=comm), x)  # the communicator is unharmed
    comm.close()


def test_ranks_data_and_sizes_that_are_not_what_they_seem_are_named(store):
    """A bool is no rank; a meta tensor has no data; an expanded view whose
    copy would not fit memory is refused before anything is allocated."""
    comm = pyccl.Communicator(store, 0, 1, device="cpu")
    x = torch.randn(12)
    _expect_invalid("src", pyccl.broadcast, x, True, comm=comm)
    _expect_invalid("src", pyccl.broadcast, x, False, comm=comm)
    _expect_invalid("dst", pyccl.send, x, True, comm=comm)
    _expect_invalid("src", pyccl.recv, x, False, comm=comm)
    meta = torch.empty(12, device="meta")
    for fn in (pyccl.all_reduce, pyccl.all_gather, pyccl.reduce_scatter, pyccl.all_to_all):
        err = _expect_invalid("tensor", fn, meta, comm=comm)
        assert "meta" in str(err)
    huge = torch.empty(1).expand(2 ** 40)
    for fn in (pyccl.all_reduce, pyccl.all_gather, pyccl.all_to_all):
        err = _expect_invalid("tensor", fn, huge, comm=comm)
        assert "contiguous" in str(err) and "would not fit" in str(err)
    small = torch.randn(1).expand(12)  # an expanded view that fits is refused as any non-contiguous tensor is
    err = _expect_invalid("tensor", pyccl.all_reduce, small, comm=comm)
    assert "must be contiguous" in str(err)
    comm.close()


@pytest.mark.skipif(pyccl._C.device_count() > 0, reason="checks the message on machines without GPUs")
def test_cuda_device_without_gpus_names_device(store):
    err = _expect_invalid("device", pyccl.Communicator, store, 0, 1, device="cuda:0")
    assert "cuda:0" in str(err)


def test_switch_channel_is_off_unless_enabled(store, monkeypatch):
    comm = pyccl.Communicator(store, 0, 1, device="cpu")
    mem = comm.register(pyccl.empty(64))
    monkeypatch.delenv("PYCCL_ENABLE_NVLS", raising=False)
    with pytest.raises(pyccl.UnsupportedError, match="PYCCL_ENABLE_NVLS=1"):
        comm.switch_channel(mem)
    monkeypatch.setenv("PYCCL_ENABLE_NVLS", "1")
    _expect_invalid("comm", comm.switch_channel, mem)  # host mode has no multicast
    comm.close()


def test_rdma_discovery_reports_what_is_missing():
    # Where rdma-core is installed the answer is a (possibly empty) list of
    # device names; where libibverbs cannot be loaded the error names it and
    # the package to install (a fresh process: the library is loaded once).
    try:
        devices = pyccl._C.rdma_devices()
    except pyccl.UnsupportedError as e:
        assert "libibverbs.so.1" in str(e) and "rdma-core" in str(e)
    else:
        assert isinstance(devices, list) and all(isinstance(d, str) for d in devices)
    code = ("import pyccl\n"
            "try:\n    pyccl._C.rdma_devices()\nexcept pyccl.UnsupportedError as e:\n    print(e)\n")
    env = dict(os.environ, PYCCL_IBVERBS_LIBRARY="/nonexistent/libibverbs.so.1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "/nonexistent/libibverbs.so.1 could not be loaded" in out.stdout and "rdma-core" in out.stdout, out


def test_the_module_never_links_libibverbs():
    # libibverbs is loaded at run time only: the extension imports where
    # rdma-core is absent. Its dynamic section must not need it, nor leave an
    # ibv_ symbol for the loader to resolve.
    so = pyccl._C.__file__
    needed = subprocess.run(["readelf", "-d", so], capture_output=True, text=True, check=True).stdout
    assert "libibverbs" not in needed
    undefined = subprocess.run(["nm", "-D", "--undefined-only", so], capture_output=True, text=True, check=True).stdout
    assert [line for line in undefined.splitlines() if "ibv_" in line] == []


def test_unknown_and_unavailable_transports_are_refused():
    from pyccl._spawn import run_ranks

    import ranks_channels as rc
    for messages in run_ranks(rc.transport_errors, 2, timeout=60):
        assert "'transport'" in messages["bogus"]
        # No RDMA NIC on this machine: named as such, or libibverbs where rdma-core is absent.
        assert "no RDMA device" in messages["rdma"] or "libibverbs.so.1 could not be loaded" in messages["rdma"]


@pytest.mark.parametrize("value", ["2", "yes", "-1"])
def test_bad_async_error_handling_is_refused_at_creation(store, monkeypatch, value):
    monkeypatch.setenv("PYCCL_ASYNC_ERROR_HANDLING", value)
    error = _expect_invalid("PYCCL_ASYNC_ERROR_HANDLING", pyccl.Communicator, store, 0, 1, device="cpu")
    assert value in str(error)


@pytest.mark.parametrize("options, arg, says", [
    ({"ll_blocks_typo": 4}, "ll_blocks_typo", "not an engine option"),
    ({"ll_threads": 48}, "ll_threads", "a multiple of 32 in [32, 1024], got 48"),
    ({"ll_threads": "1024"}, "ll_threads", "a whole number"),
    ({"ll_max_bytes": -1}, "ll_max_bytes", "negative"),
    ({"hb_blocks": 1 << 40}, "hb_blocks", "at most 4294967295"),
    ({"hb_blocks": 2000}, "hb_blocks", "at most 1024"),
    ({"hb_push": 1}, "hb_push", "True or False"),
    ({"p2p_ll_max_bytes": 1 << 30}, "p2p_ll_max_bytes", "at most 16 MiB"),
    ({"p2p_ll_lane_bytes": 12}, "p2p_ll_lane_bytes", "a multiple of 8, at most 16 MiB"),
    ({"fused_threads": 100}, "fused_threads", "a multiple of 32, at most 512"),
    ({"ll_blocks": 2, "fused_segments": 3}, "fused_segments", "at most ll_blocks (2)"),
])
def test_engine_options_are_checked_by_their_rows(store, options, arg, says):
    # Every option's type and range come from its row of the options table; each error names the option.
    comm = pyccl.Communicator(store, 0, 1, device="cpu")
    try:
        err = _expect_invalid(arg, pyccl._C.CollectiveEngine, comm._comm, **options)
        assert says in str(err), str(err)
    finally:
        comm.close()


def test_engine_options_none_is_the_default(store):
    comm = pyccl.Communicator(store, 0, 1, device="cpu")
    try:
        default = pyccl._C.CollectiveEngine(comm._comm)
        given = pyccl._C.CollectiveEngine(comm._comm, ll_max_bytes=None, p2p_ll_max_bytes=None, hb_push=None)
        assert given.ll_max_bytes == default.ll_max_bytes == 64 << 10  # host mode's default
        assert given.p2p_ll_max_bytes == default.p2p_ll_max_bytes == 2048
        assert pyccl._C.CollectiveEngine(comm._comm, ll_max_bytes=4096).ll_max_bytes == 4096
        # The docstring lists every keyword, the experiments apart.
        doc = pyccl._C.CollectiveEngine.__init__.__doc__
        assert "ll_max_bytes" in doc.split("Experiments")[0] and "hb_push" in doc.split("Experiments")[1]
    finally:
        comm.close()
