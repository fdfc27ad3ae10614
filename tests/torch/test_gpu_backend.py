"""The torch.distributed backend "pyccl" on GPUs."""

import random

import pytest

import ranks_backend as rb
from conftest import gpu_count, gpu_worlds, requires_gpus
from pyccl._spawn import run_ranks


@requires_gpus(2)
@pytest.mark.parametrize("world", gpu_worlds(2, 4, 6, 8))
def test_every_op_through_the_backend_on_gpus(world):
    seed = random.randrange(1 << 20)
    for bad in run_ranks(rb.every_op, world, args=("cuda:pyccl,cpu:pyccl", True, seed), timeout=300):
        assert bad == [], f"seed {seed}: {bad}"


@requires_gpus(2)
@pytest.mark.parametrize("world", gpu_worlds(2, 4))
def test_batch_isend_irecv_runs_its_ops_together_on_gpus(world):
    # 12 MB sends, past the kernels' 8 MiB buffer: a send waits for its receive, so the ring needs the group.
    seed = random.randrange(1 << 20)
    for bad in run_ranks(rb.coalesced_p2p, world, args=("cuda:pyccl,cpu:pyccl", True, seed, 3_000_001, 5),
                         timeout=300):
        assert bad == [], f"seed {seed}: {bad}"


@requires_gpus(2)
def test_torch_compile_fullgraph_with_functional_collectives_on_gpus():
    for bad in run_ranks(rb.functional_and_compile, min(gpu_count(), 4), args=("cuda:pyccl", True), timeout=400):
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
