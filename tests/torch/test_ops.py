"""torch.ops.pyccl.*: custom ops with fake implementations, in host mode and on
GPUs: opcheck, inputs that require grad, the kernel choices run on the engine,
and a tensor-parallel MLP under torch.compile(fullgraph=True) with inductor.
On GPUs the default group is NCCL's where every rank has its own GPU, gloo's
where ranks share one (PYCCL_TEST_SHARE_GPU): the ops run on pyccl either way."""

import pytest
import torch

import pyccl  # noqa: F401
import ranks_ops as ro
from conftest import gpu_count, host_and_gpu, host_and_gpu_worlds, requires_gpus
from pyccl._spawn import run_ranks


def test_ops_are_registered_with_fake_implementations():
    for name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"):
        assert hasattr(torch.ops.pyccl, name), name


@pytest.mark.parametrize("gpu", host_and_gpu())
def test_opcheck_passes_for_every_op(gpu):
    for bad in run_ranks(ro.opcheck_all, min(gpu_count(), 4) if gpu else 2, args=(gpu,), timeout=300):
        assert bad == {}


@pytest.mark.parametrize("gpu, world", host_and_gpu_worlds((2,), (2, 4, 8)))
def test_compiled_tensor_parallel_mlp(gpu, world):
    assert run_ranks(ro.compiled_mlp, world, args=(gpu,), timeout=400 if gpu else 300) == [True] * world


def test_gather_and_scatter_shapes_follow_group_size_not_a_lookup():
    # The output shape comes from the group_size argument, which is in the traced
    # graph: a graph compiled (and cached) for one group size is not reused for another.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert torch.ops.pyccl.all_gather(torch.empty(5, 3), 4, "no-such-group").shape == (20, 3)
        assert torch.ops.pyccl.all_gather(torch.empty(5, 3), 2, "no-such-group").shape == (10, 3)
        assert torch.ops.pyccl.reduce_scatter(torch.empty(8, 3), "sum", 4, "no-such-group").shape == (2, 3)


def test_a_wrong_group_size_is_refused():
    for message in run_ranks(ro.wrong_group_size, 2, args=(False,), timeout=300):
        assert "group_size is 3" in message and "2 ranks" in message, message


@pytest.mark.parametrize("gpu", host_and_gpu())
def test_ops_run_on_inputs_that_require_grad_and_refuse_backward(gpu):
    for bad in run_ranks(ro.no_backward, 2, args=(gpu,), timeout=300):
        assert bad == []


@pytest.mark.parametrize("gpu", host_and_gpu())
def test_all_reduce_op_runs_kernel_choices_straight_on_the_engine(gpu):
    for taken in run_ranks(ro.all_reduce_routes, 2, args=(gpu,), timeout=300):
        assert taken == ro.ALL_REDUCE_ROUTES


@pytest.mark.parametrize("gpu", host_and_gpu())
def test_other_ops_run_kernel_choices_straight_on_the_engine(gpu):
    for taken in run_ranks(ro.other_op_routes, 2, args=(gpu,), timeout=300):
        assert taken == ro.OTHER_OP_ROUTES


@requires_gpus(2)
def test_all_reduce_op_captured_in_a_cuda_graph_after_an_eager_call():
    assert run_ranks(ro.captured_all_reduce_op, 2, args=(True,), timeout=300) == [(20, "engine")] * 2
