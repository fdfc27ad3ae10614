"""Collectives across "nodes" on GPUs: the visible GPUs split into two nodes
(PYCCL_NODE_ID), NVLink (CUDA IPC) inside a node and the socket transport
between them, as on two machines without RDMA."""

import random

import pytest

import ranks_across_nodes as ra
import ranks_plans as rp
from conftest import gpu_worlds, largest_gpu_world, requires_gpus
from pyccl._spawn import run_ranks


def _per_node(world: int) -> int:
    return max(1, world // 2)


@requires_gpus(2)
@pytest.mark.parametrize("world", gpu_worlds(2, 4, 6, 8))
def test_collectives_across_two_nodes_on_gpus(world):
    seed = random.randrange(1 << 20)
    per_node = _per_node(world)
    for bad, layout, _ in run_ranks(ra.collectives, world, args=(True, seed, 16, 2_000_000, per_node),
                                    timeout=400):
        assert bad == [], f"seed {seed}: {bad}"
        assert layout == (world // per_node, per_node)


@requires_gpus(4)
@pytest.mark.parametrize("world,gpus_per_node", [(9, 3), (10, 1)])
def test_more_than_eight_ranks_across_nodes_on_gpus(world, gpus_per_node):
    """Plans over more than 8 ranks (the interpreter's tables hold 8 per node
    and one shared slot for the other nodes): 3 x 3 and 10 x 1 on four GPUs,
    rank r on GPU r % 4, so some GPUs run ranks of several nodes."""
    seed = random.randrange(1 << 20)
    args = (True, seed, 6, 100_000, gpus_per_node, 4)
    for bad, layout, _ in run_ranks(ra.collectives, world, args=args, timeout=400):
        assert bad == [], f"seed {seed}: {bad}"
        assert layout == (world // gpus_per_node, gpus_per_node)


@requires_gpus(2)
@pytest.mark.parametrize("world", gpu_worlds(2, 4, 6, 8))
def test_hierarchical_plans_across_two_nodes_on_gpus(world):
    seed = random.randrange(1 << 20)
    args = (True, seed, 4, 200_000, _per_node(world), True)
    for bad, record in run_ranks(rp.hierarchical_plans, world, args=args, timeout=400):
        assert bad == [], f"seed {seed}: {bad} (device record {record})"


@requires_gpus(2)
def test_all_reduce_across_nodes_in_cuda_graphs():
    world = largest_gpu_world(2, 4, 6, 8)
    seed = random.randrange(1 << 20)
    for bad in run_ranks(ra.graph_replays, world, args=(seed, _per_node(world), 5), timeout=300):
        assert bad == [], f"seed {seed}: {bad}"


@requires_gpus(2, own=True)
@pytest.mark.parametrize("world", gpu_worlds(2, 4, 6, 8))
def test_torch_backend_across_two_nodes_on_gpus(world):
    """The "pyccl" backend on GPUs split into two nodes: the three collectives
    across nodes; an int32 all_reduce and a broadcast on the NCCL delegate."""
    seed = random.randrange(1 << 20)
    for bad, refusals in run_ranks(ra.torch_group, world, args=(True, seed, _per_node(world)), timeout=300):
        assert bad == [], f"seed {seed}: {bad}"
        assert refusals == {"int_all_reduce": None, "broadcast": None}, refusals


@requires_gpus(2, own=True)
def test_torchrun_on_gpus_split_into_two_nodes():
    """docs/multinode.md's recipe: one torchrun agent per "node", each seeing
    its half of the GPUs, backend "pyccl"."""
    world = largest_gpu_world(2, 4, 6, 8)
    per = world // 2

    def env(node):
        return {"CUDA_VISIBLE_DEVICES": ",".join(str(node * per + i) for i in range(per)),
                "PYCCL_NODE_ID": f"node{node}"}

    reports = ra.check_torchrun(ra.launch_torchrun(2, per, env), world)
    assert [node for _, node in reports] == ["node0"] * per + ["node1"] * per, reports
