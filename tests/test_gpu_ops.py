"""torch.ops.pyccl.* on GPUs: opcheck, and a tensor-parallel MLP under
torch.compile(fullgraph=True) with inductor."""

import pytest

import ranks_ops as ro
from conftest import gpu_count, gpu_worlds, requires_gpus
from pyccl._spawn import run_ranks


@requires_gpus(2, own=True)
def test_opcheck_passes_for_every_op_on_gpus():
    for bad in run_ranks(ro.opcheck_all, min(gpu_count(), 4), args=(True,), timeout=300):
        assert bad == {}


@requires_gpus(2, own=True)
@pytest.mark.parametrize("world", gpu_worlds(2, 4, 8))
def test_compiled_tensor_parallel_mlp_on_gpus(world):
    assert run_ranks(ro.compiled_mlp, world, args=(True,), timeout=400) == [True] * world
