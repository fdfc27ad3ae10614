"""torch.ops.pyccl.*: custom ops with fake implementations (host mode)."""

import torch

import pyccl  # noqa: F401
import ranks_ops as ro
from pyccl._spawn import run_ranks


def test_ops_are_registered_with_fake_implementations():
    for name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"):
        assert hasattr(torch.ops.pyccl, name), name


def test_opcheck_passes_for_every_op():
    for bad in run_ranks(ro.opcheck_all, 2, args=(False,), timeout=300):
        assert bad == {}


def test_compiled_tensor_parallel_mlp():
    assert run_ranks(ro.compiled_mlp, 2, args=(False,), timeout=300) == [True, True]
