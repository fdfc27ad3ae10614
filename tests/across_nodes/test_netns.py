"""Two "nodes" as Linux network namespaces on one machine: each its own
network stack (a veth pair between them, 10.231.N.1 and .2), hostname (UTS
namespace) and torchrun agent. pyccl tells the nodes apart by hostname, as on
real machines (no PYCCL_NODE_ID), advertises the veth address, and runs its
collectives across them over the socket transport in host mode.

Needs root (CAP_NET_ADMIN) and iproute2, as CI has; elsewhere it is skipped
saying so. The namespaces are made by the test and deleted after it."""

import os
import random
import shlex
import shutil
import subprocess

import pytest

import ranks_across_nodes as ra


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def two_namespaces():
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None:
        pytest.skip("network namespaces need root and iproute2 (ip, unshare)")
    tag = f"{os.getpid() % 10000}{random.randrange(100)}"
    subnet = 10 + os.getpid() % 240
    names = [f"pyccl{tag}a", f"pyccl{tag}b"]
    veths = [f"pv{tag}a", f"pv{tag}b"]
    addrs = [f"10.231.{subnet}.1", f"10.231.{subnet}.2"]
    try:
        for ns in names:
            _ip("netns", "add", ns)
        _ip("link", "add", veths[0], "type", "veth", "peer", "name", veths[1])
        for ns, veth, addr in zip(names, veths, addrs):
            _ip("link", "set", veth, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", veth)
            _ip("-n", ns, "link", "set", veth, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as e:
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        pytest.skip(f"cannot make network namespaces here: {e.stderr.strip()}")
    try:
        yield names, addrs
    finally:
        for ns in names:  # deleting a namespace deletes its end of the veth pair, and the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not any(ns in left for ns in names), left


def test_collectives_across_network_namespaces(two_namespaces):
    names, addrs = two_namespaces

    def wrap(node, cmd):
        host = f"pyccl-node{node}"
        inner = " ".join(["hostname", host, "&&", "exec", *map(shlex.quote, cmd)])
        return ["ip", "netns", "exec", names[node], "unshare", "--uts", "sh", "-c", inner]

    # Nodes told apart by hostname; the log says how the group was run.
    env = {"CUDA_VISIBLE_DEVICES": "", "PYCCL_NODE_ID": "", "PYCCL_LOG_LEVEL": "info"}
    results = ra.launch_torchrun(2, 2, lambda node: env, master=addrs[0], wrap=wrap)
    reports = ra.check_torchrun(results, 4)
    assert [node for _, node in reports] == ["pyccl-node0"] * 2 + ["pyccl-node1"] * 2, reports
    for _, out in results:
        assert "spans nodes" in out, out[-3000:]
        assert "ranks on other nodes, over the socket transport" in out, out[-3000:]
