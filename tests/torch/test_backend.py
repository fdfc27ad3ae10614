"""The torch.distributed backend "pyccl", in host mode (CPU processes) and on GPUs."""

import datetime
import random
import re
import socket

import pytest
import torch.distributed as dist

import pyccl  # noqa: F401
import ranks_backend as rb
from conftest import gpu_count, host_and_gpu, host_and_gpu_worlds, requires_gpus
from pyccl._spawn import run_ranks


def test_backend_is_registered_for_cuda_and_cpu():
    assert "PYCCL" in dist.Backend._plugins
    assert set(dist.Backend.backend_capability["pyccl"]) == {"cuda", "cpu"}


@pytest.mark.parametrize("gpu, world", host_and_gpu_worlds((2, 3, 4), (2, 4, 6, 8)))
def test_every_op_through_the_backend(gpu, world):
    seed = random.randrange(1 << 20)
    backend = "cuda:pyccl,cpu:pyccl" if gpu else "cpu:pyccl"
    for bad in run_ranks(rb.every_op, world, args=(backend, gpu, seed), timeout=300):
        assert bad == [], f"seed {seed}: {bad}"


@pytest.mark.parametrize("gpu, world", host_and_gpu_worlds((2, 3), (2, 4)))
def test_batch_isend_irecv_runs_its_ops_together(gpu, world):
    # Every rank receives before it sends: one by one, the first receive would wait forever. On GPUs 12 MB
    # sends, past the kernels' 8 MiB buffer: a send waits for its receive, so the ring needs the group.
    seed = random.randrange(1 << 20)
    if gpu:
        args = ("cuda:pyccl,cpu:pyccl", True, seed, 3_000_001, 5)
    else:
        args = ("cpu:pyccl", False, seed, 300_001)
    for bad in run_ranks(rb.coalesced_p2p, world, args=args, timeout=300):
        assert bad == [], f"seed {seed}: {bad}"


@pytest.mark.parametrize("gpu", host_and_gpu())
def test_functional_collectives_eager_and_compiled(gpu):
    world, backend = (min(gpu_count(), 4), "cuda:pyccl") if gpu else (2, "cpu:pyccl")
    for bad in run_ranks(rb.functional_and_compile, world, args=(backend, gpu), timeout=400 if gpu else 300):
        assert bad == []


@requires_gpus(2, own=True)
def test_graph_captured_through_the_backend_and_nccl_hand_off():
    for bad in run_ranks(rb.gpu_extras, min(gpu_count(), 4), args=(300,), timeout=300):
        assert bad == []


@requires_gpus(2)
def test_ranks_with_different_nccl_thresholds_are_refused_at_set_up():
    world = min(gpu_count(), 4)
    out = run_ranks(rb.thresholds_must_agree, world, timeout=300)
    for kind, message in out:
        assert kind == "ValueError", (kind, message)
        assert "PYCCL_NCCL_MIN_BYTES" in message and f"rank {world - 1} has '4096'" in message, message
    assert len(set(out)) == 1  # every rank alike


@requires_gpus(2, own=True)
@pytest.mark.parametrize("backend", ["pyccl", "cpu:pyccl,cuda:pyccl"])
def test_backend_without_set_device_binds_to_the_tensors_gpu(backend):
    # Ranks never call torch.cuda.set_device: the group binds at its first CUDA op, to that op's GPU.
    seed = random.randrange(1 << 20)
    for bad in run_ranks(rb.without_set_device, 2, args=(backend, seed), timeout=300):
        assert bad == [], f"seed {seed}: {bad}"


def test_backend_rejects_bad_input_with_clear_errors():
    for out in run_ranks(rb.bad_input, 2, timeout=120):
        assert out["dtype"][0] == "TypeError" and "int16" in out["dtype"][1]
        assert out["op"][0] == "TypeError" and "BAND" in out["op"][1]
        assert out["contiguous"][0] == "ValueError" and "contiguous" in out["contiguous"][1]
        assert out["out_size"][0] == "ValueError" and "'out'" in out["out_size"][1]
        assert out["splits"][0] == "ValueError" and "'input_split_sizes'" in out["splits"][1]
        assert out["gather_list"][0] == "ValueError" and "'gather_list'" in out["gather_list"][1]
        assert out["after"] == [2.0, 2.0, 2.0]
        assert out["overlap"][0] == "ValueError" and "'out'" in out["overlap"][1] and "chunk" in out["overlap"][1]
        assert out["gathered"] == [1.0, 1.0, 2.0, 2.0]


def test_mixed_backend_string():
    for rank, (values, backend) in enumerate(run_ranks(rb.mixed_string, 2, timeout=120)):
        assert values == [1.0, 1.0, 1.0]
        assert "pyccl" in backend and "gloo" in backend


def test_autoload_never_breaks_torch_import(monkeypatch, caplog):
    # torch calls this entry point while importing itself: a pyccl that cannot
    # load must only log.
    import sys

    import pyccl_autoload

    monkeypatch.setitem(sys.modules, "pyccl.backend", None)  # makes the import fail
    pyccl_autoload.autoload()
    assert "not registered" in caplog.text and "rebuild it against this torch" in caplog.text
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in caplog.text and caplog.text.count("\n") == 1, caplog.text


def test_communicator_for_a_pyccl_group_is_the_groups_own():
    for bad in run_ranks(rb.one_runtime_per_group, 2, timeout=120):
        assert bad == []


def test_creator_binds_now_only_where_every_rank_chose_its_own_gpu():
    # Ranks of one host on one current device never chose theirs (no set_device): bind at the first op.
    from pyccl.backend import _ranks_chose_their_gpus

    def probe(current_devices):
        store = dist.HashStore()
        size = len(current_devices)
        answers = []
        import unittest.mock as mock

        for rank, dev in enumerate(current_devices):
            with mock.patch("torch.cuda.current_device", return_value=dev):
                store.set(f"pyccl/bind_probe/{rank}", f"{socket.gethostname()}/{dev}")
        for rank, dev in enumerate(current_devices):
            with mock.patch("torch.cuda.current_device", return_value=dev):
                answers.append(_ranks_chose_their_gpus(store, rank, size, datetime.timedelta(seconds=5)))
        assert len(set(answers)) == 1
        return answers[0]

    assert probe([0, 1, 2, 3])
    assert not probe([0, 0])
    assert not probe([0, 1, 1, 3])


def test_creator_learns_its_device_from_the_store_prefix():
    # torch makes the backend with a store prefixed "cuda/" or "cpu/" under the group's.
    from pyccl.backend import _made_for_cuda

    def group_store():
        return dist.PrefixStore("group0/", dist.HashStore())

    assert _made_for_cuda(dist.PrefixStore("cuda/", group_store()), 0)
    assert not _made_for_cuda(dist.PrefixStore("cpu/", group_store()), 0)
    assert not _made_for_cuda(dist.HashStore(), 0)


def test_collective_without_its_peer_times_out_with_a_dist_backend_error():
    out = run_ranks(rb.missing_peer_times_out, 2, args=(3,), timeout=120)
    assert len(out[0]) == 5, out[0]
    kind, seconds, message, is_dist_error, again = out[0]
    assert is_dist_error, (kind, message)
    assert 2.5 <= seconds <= 30, seconds
    assert "all_reduce call 2 " in message and "no signal from rank 1 within the 3000 ms timeout" in message, message
    assert again != "completed" and again < 1.0, again


def test_barrier_without_its_peer_times_out_in_words_torch_looks_for():
    # torch's DistributedTest._test_barrier_timeout matches " (Timed out|closed|timeout) " in the error.
    kind, seconds, message = run_ranks(rb.barrier_without_its_peer, 2, args=(2,), timeout=120)[0]
    assert kind != "completed", message
    assert 1.8 <= seconds <= 4, seconds
    assert re.search(" (Timed out|closed|timeout) ", message), message
    assert "barrier" in message and "1 of 2 ranks" in message, message


def test_default_timeout_is_process_group_nccl_s():
    import datetime

    from torch.distributed import constants

    from pyccl.backend import _group_timeout

    # torch hands non-NCCL backends its 30-minute default when none is given.
    assert _group_timeout(constants.default_pg_timeout) == datetime.timedelta(minutes=10)
    assert _group_timeout(datetime.timedelta(seconds=7)) == datetime.timedelta(seconds=7)
    assert _group_timeout(3.5) == datetime.timedelta(seconds=3.5)
