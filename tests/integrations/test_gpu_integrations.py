"""pyccl.integrations on GPUs: GroupCommunicator against float64 on 2-4 GPUs,
in CUDA graphs captured before any eager call, and the vLLM adapter's routing
(pyccl for small messages, the NCCL path for large ones)."""

import random

import pytest

import ranks_integrations as ri
from conftest import gpu_count, gpu_worlds, requires_gpus
from pyccl._spawn import run_ranks


@requires_gpus(2)
@pytest.mark.parametrize("world", gpu_worlds(2, 3, 4, 6, 8))
def test_group_communicator_on_gpus(world):
    seed = random.randrange(1 << 20)
    for bad in run_ranks(ri.collective_cases, world, args=(True, seed), timeout=300):
        assert bad == [], f"seed {seed}: {bad}"


@requires_gpus(2)
def test_group_communicator_in_cuda_graph():
    seed = random.randrange(1 << 20)
    for bad in run_ranks(ri.graph_replays, min(gpu_count(), 4), args=(seed,), timeout=300):
        assert bad == [], f"seed {seed}: {bad}"


@requires_gpus(2, own=True)
def test_vllm_adapter_on_gpus():
    seed = random.randrange(1 << 20)
    for res in run_ranks(ri.vllm_adapter, 2, args=(True, seed), timeout=300):
        assert res["bad"] == [], f"seed {seed}: {res['bad']}"
        assert res["fallback_calls"] == ["all_reduce", "all_gather", "reduce_scatter"]
        assert res["destroyed"] == (True, True, True)
        # Captured inside ca_comm.capture(), as vLLM's graph_capture does: on graph buffers.
        assert res["graph_buffer_calls"] == 1
        assert res["custom_captures"] == 1
