"""torch.ops.pyccl.* on GPUs: opcheck, inputs that require grad, and a
tensor-parallel MLP under torch.compile(fullgraph=True) with inductor. The
default group is NCCL's where every rank has its own GPU, gloo's where ranks
share one (PYCCL_TEST_SHARE_GPU): the ops run on pyccl either way."""

import pytest

import ranks_ops as ro
from conftest import gpu_count, gpu_worlds, requires_gpus
from pyccl._spawn import run_ranks


@requires_gpus(2)
def test_opcheck_passes_for_every_op_on_gpus():
    for bad in run_ranks(ro.opcheck_all, min(gpu_count(), 4), args=(True,), timeout=300):
        assert bad == {}


@requires_gpus(2)
def test_ops_run_on_inputs_that_require_grad_and_refuse_backward_on_gpus():
    for bad in run_ranks(ro.no_backward, 2, args=(True,), timeout=300):
        assert bad == []


@requires_gpus(2)
@pytest.mark.parametrize("world", gpu_worlds(2, 4, 8))
def test_compiled_tensor_parallel_mlp_on_gpus(world):
    assert run_ranks(ro.compiled_mlp, world, args=(True,), timeout=400) == [True] * world


@requires_gpus(2)
def test_all_reduce_op_runs_kernel_choices_straight_on_the_engine_on_gpus():
    for taken in run_ranks(ro.all_reduce_routes, 2, args=(True,), timeout=300):
        assert taken == ro.ALL_REDUCE_ROUTES


@requires_gpus(2)
def test_other_ops_run_kernel_choices_straight_on_the_engine_on_gpus():
    for taken in run_ranks(ro.other_op_routes, 2, args=(True,), timeout=300):
        assert taken == ro.OTHER_OP_ROUTES


@requires_gpus(2)
def test_all_reduce_op_captured_in_a_cuda_graph_after_an_eager_call():
    assert run_ranks(ro.captured_all_reduce_op, 2, args=(True,), timeout=300) == [(20, "engine")] * 2
