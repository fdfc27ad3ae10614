"""Collectives on communicators that span "nodes" (PYCCL_NODE_ID): 2PH
all-reduce, all-gather and reduce-scatter chosen automatically, the ranks of
other nodes reached through the socket transport (or RDMA). In host mode, and
on GPUs split into two nodes: NVLink (CUDA IPC) inside a node and the socket
transport between them, as on two machines without RDMA."""

import random

import pytest

import ranks_across_nodes as ra
import ranks_plans as rp
from conftest import gpu_worlds, largest_gpu_world, on_gpus, on_host, requires_gpus
from pyccl._spawn import run_ranks


def _per_node(world: int) -> int:
    """GPUs per node where the visible GPUs split into two nodes."""
    return max(1, world // 2)


@pytest.mark.parametrize("gpu, world, gpus_per_node", [
    *(on_host(w, n, id=f"host-{w}x{n}") for w, n in [(2, 1), (4, 2), (6, 2), (9, 3), (10, 5)]),
    *(on_gpus(w, _per_node(w), id=f"gpu-{w}") for w in gpu_worlds(2, 4, 6, 8))])
def test_collectives_across_nodes(gpu, world, gpus_per_node):
    """More than 8 ranks in all runs too in host mode (the plans' tables hold 8 per node)."""
    seed = random.randrange(1 << 20)
    if gpu:
        args = (True, seed, 16, 2_000_000, gpus_per_node)
    else:
        args = (False, seed, 12 if world <= 8 else 6, 100_000 if world <= 8 else 20_000, gpus_per_node)
    for bad, layout, refusals in run_ranks(ra.collectives, world, args=args, timeout=400 if gpu else 300):
        assert bad == [], f"seed {seed}: {bad}"
        assert layout == (world // gpus_per_node, gpus_per_node)
        if not gpu:
            assert "'tensor'" in refusals["dtype"] and "int32" in refusals["dtype"]
            assert "'out'" in refusals["out"]


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


def test_large_puts_cross_in_pieces():
    """The first call (6.4 MB of float32, 2PH HB) puts several MiB to the
    other node: the sender's kernel mirrors and queues it piece by piece and
    the receiver's applies the pieces from its inbox as they land."""
    seed = random.randrange(1 << 20)
    for bad, _, _ in run_ranks(ra.collectives, 2, args=(False, seed, 2, 1_600_000, 1), timeout=300):
        assert bad == [], f"seed {seed}: {bad}"


def test_more_than_eight_ranks_on_one_node_are_refused():
    for message in run_ranks(ra.too_many_on_one_node, 9, timeout=300):
        assert message is not None and "up to 8 ranks on one node" in message, message


def test_interleaved_node_layout_is_refused():
    for message in run_ranks(ra.interleaved_nodes, 4, timeout=120):
        assert message is not None and "numbered node by node" in message, message


@pytest.mark.parametrize("gpu, world, gpus_per_node", [
    on_host(2, 1, id="host-2x1"), on_host(4, 2, id="host-4x2"),
    *(on_gpus(w, _per_node(w), id=f"gpu-{w}", own=True) for w in gpu_worlds(2, 4, 6, 8))])
def test_torch_backend_on_a_group_that_spans_nodes(gpu, world, gpus_per_node):
    """init_process_group("cpu:pyccl") (on GPUs "pyccl") on ranks of several
    "nodes": the three collectives run across nodes; what pyccl does not run
    there is refused with a message that names the op, and on GPUs goes to
    the NCCL delegate instead (an int32 all_reduce, a broadcast)."""
    seed = random.randrange(1 << 20)
    for bad, refusals in run_ranks(ra.torch_group, world, args=(gpu, seed, gpus_per_node), timeout=300):
        assert bad == [], f"seed {seed}: {bad}"
        if gpu:
            assert refusals == {"int_all_reduce": None, "broadcast": None}, refusals
            continue
        assert "spans nodes" in refusals["int_all_reduce"] and "Int" in refusals["int_all_reduce"], refusals
        assert "spans nodes" in refusals["broadcast"] and "broadcast" in refusals["broadcast"], refusals


def test_torchrun_launches_a_group_across_nodes():
    """The recipe of docs/multinode.md, on one host: two torchrun agents of
    two processes each, one "node" each, run examples/torchrun/across_nodes.py
    with the backend "pyccl" (host mode) and every rank reports correct results."""
    results = ra.launch_torchrun(2, 2, lambda node: {"CUDA_VISIBLE_DEVICES": "", "PYCCL_NODE_ID": f"node{node}"})
    ra.check_torchrun(results, 4)


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


RDMA_LOOPBACK = {"PYCCL_RDMA_LOOPBACK": "1"}  # the RDMA transport with memcpy in place of the NIC


@pytest.mark.parametrize("world,gpus_per_node", [(2, 1), (4, 2)])
def test_collectives_across_nodes_over_rdma(world, gpus_per_node):
    """The plans across nodes over the RDMA transport (its stand-in): data,
    records and counts by RDMA WRITE, no receiver thread."""
    seed = random.randrange(1 << 20)
    args = (False, seed, 10, 1_600_000 if world == 2 else 100_000, gpus_per_node)
    for bad, _, _ in run_ranks(ra.collectives, world, args=args, timeout=300, env=RDMA_LOOPBACK):
        assert bad == [], f"seed {seed}: {bad}"


def test_ranks_that_disagree_on_the_plan_transport_are_told():
    for message, _ in run_ranks(ra.plan_transport, 2, args=(("rdma", "socket"), 1000), timeout=120,
                                env=RDMA_LOOPBACK):
        assert message is not None and "PYCCL_PLAN_TRANSPORT alike" in message, message


def test_a_failed_rdma_write_fails_the_call_naming_it():
    """A work request that fails in the "NIC" stops the proxy with the
    transport's error; the call raises instead of waiting for data that
    never comes."""
    env = dict(RDMA_LOOPBACK, PYCCL_RDMA_LOOPBACK_FAIL_AT="3")
    outcomes = run_ranks(ra.plan_transport, 2, args=(("rdma", "rdma"), 300_000), timeout=120, env=env)
    messages = [message for message, _ in outcomes]
    assert all(m is not None for m in messages), messages
    assert any("RDMA transport to rank" in m for m in messages), messages


def test_2ph_ll_is_pipelined_from_its_size(monkeypatch):
    from pyccl import across_nodes

    def plan_name(layout, nbytes):
        return across_nodes._plan_for("all_reduce", layout, nbytes).name

    big = across_nodes.LL_PIPELINE_MIN_BYTES
    assert plan_name((2, 2), 4096).endswith("_pipeline1")
    assert plan_name((2, 2), big).endswith("_pipeline2")
    assert plan_name((2, 1), big).endswith("_pipeline1")  # no local phase to overlap
    assert plan_name((2, 2), across_nodes.LL_MAX_BYTES + 1).startswith("allreduce_2ph_hb")
    monkeypatch.setattr(across_nodes, "LL_PIPELINE", 2)
    assert plan_name((2, 2), 4096).endswith("_pipeline2")
