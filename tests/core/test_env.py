"""pyccl._env: the environment as os.environ has it, read at every collective call."""

import os

import pytest

from pyccl import _env
from pyccl.errors import InvalidArgumentError


def test_reads_follow_every_change_made_through_os_environ(monkeypatch):
    name = "PYCCL_TEST_ENV_READ"
    monkeypatch.delenv(name, raising=False)
    assert _env.get(name) is None
    monkeypatch.setenv(name, "first")
    assert _env.get(name) == "first" == os.environ.get(name)
    os.environ[name] = "sécond ✓"  # not ASCII: decoded as os.environ decodes it
    assert _env.get(name) == "sécond ✓"
    os.environ.update({name: ""})
    assert _env.get(name) == ""
    del os.environ[name]
    assert _env.get(name) is None


def test_the_selector_reads_pyccl_algo_and_nccl_min_bytes_when_it_is_made(monkeypatch):
    import torch

    from pyccl import _C

    def made():
        return _C.Selector({"world": 2, "nccl_min_bytes": [1 << 40] * 5})

    monkeypatch.delenv("PYCCL_ALGO", raising=False)
    monkeypatch.delenv("PYCCL_NCCL_MIN_BYTES", raising=False)
    assert made().forced("all_reduce") == ""
    monkeypatch.setenv("PYCCL_ALGO", "all_reduce=2pa_ll")
    selector = made()
    assert selector.forced("all_reduce") == "2pa_ll" and selector.forced("all_gather") == ""
    monkeypatch.setenv("PYCCL_ALGO", "all_gather=hb")  # read when made, as NCCL reads its variables
    assert selector.forced("all_reduce") == "2pa_ll"
    assert made().forced("all_reduce") == "" and made().forced("all_gather") == "hb"
    # A bare name: every collective that has it; a collective's own entry wins wherever it stands.
    monkeypatch.setenv("PYCCL_ALGO", "ll, reduce_scatter=hb")
    selector = made()
    assert [selector.forced(c) for c in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")] == \
        ["", "ll", "hb", "ll"]
    for bad, words in (("all_reduce=warp", "all_reduce has 1pa_ll"), ("gather=ll", "not a collective"),
                       ("warp", "not an algorithm of any collective")):
        monkeypatch.setenv("PYCCL_ALGO", bad)
        with pytest.raises(InvalidArgumentError, match=f"PYCCL_ALGO entry '{bad}'.*{words}"):
            made()
    monkeypatch.delenv("PYCCL_ALGO")
    monkeypatch.setenv("PYCCL_NCCL_MIN_BYTES", "4096")
    selector = made()
    assert selector.select("all_gather", torch.float32, 4096, 1024, None, True)[0] == "nccl"
    assert selector.select("all_gather", torch.float32, 4095, 1023, None, True)[0] == "kernel"
    monkeypatch.setenv("PYCCL_NCCL_MIN_BYTES", "-1")
    with pytest.raises(InvalidArgumentError, match="PYCCL_NCCL_MIN_BYTES"):
        made()


def test_raw_values_change_exactly_when_the_variable_is_set(monkeypatch):
    """_env.raw keys the per-communicator memo of collective choices."""
    name = "PYCCL_TEST_ENV_RAW"
    monkeypatch.delenv(name, raising=False)
    assert _env.raw(name) is None
    monkeypatch.setenv(name, "a")
    first = _env.raw(name)
    assert first is not None and _env.raw(name) is first
    assert first != _env.raw("PYCCL_TEST_ENV_OTHER")
    monkeypatch.setenv(name, "b")
    assert _env.raw(name) != first
    monkeypatch.setenv(name, "a")
    assert _env.raw(name) == first  # equal values: the same key
    del os.environ[name]
    assert _env.raw(name) is None


ON_OFF_FLAGS = ["PYCCL_PDL", "PYCCL_PLAN_GENERIC_PACKETS", "PYCCL_RDMA_LOOPBACK", "PYCCL_ENABLE_NVLS",
                "PYCCL_PRELOAD_KERNELS", "PYCCL_ALLOW_SHARED_GPU", "PYCCL_DEBUG", "PYCCL_BLOCKING_WAIT"]


@pytest.mark.parametrize("name", ON_OFF_FLAGS)
def test_an_on_off_variable_neither_on_nor_off_is_refused_when_a_communicator_is_made(monkeypatch, name):
    """Each switch read in C++ takes 1/0 (true/false, yes/no, on/off); before, PYCCL_ALLOW_SHARED_GPU=yes
    read as off and PYCCL_DEBUG=INFO as on, silently."""
    import torch.distributed as dist

    import pyccl

    monkeypatch.setenv(name, "maybe")
    with pytest.raises(InvalidArgumentError, match=f"'{name}'.*got 'maybe'"):
        pyccl.Communicator(dist.HashStore(), 0, 1, device="cpu")
    monkeypatch.setenv(name, "Off")
    pyccl.Communicator(dist.HashStore(), 0, 1, device="cpu").close()


# Settings that take a number or a choice, each with values its rule refuses. Before, PYCCL_IB_TIMEOUT=40 and
# PYCCL_IB_GID_INDEX=300 were cut to their verbs fields' widths, PYCCL_RDMA_LOOPBACK_FAIL_AT=x read as 0, and
# PYCCL_PROXY_SPIN_US and PYCCL_PLAN_TRANSPORT were read only when a proxy started or a plan crossed nodes.
SETTINGS = {
    "PYCCL_PROXY_SPIN_US": (["10ms", "-5", "+5", " 5", "60000001", "99999999999999999999999"], ["0", "60000000"],
                            "must be a whole number of microseconds up to 60000000"),
    "PYCCL_PLAN_TRANSPORT": (["ib", "RDMA", "auto "], ["auto", "rdma", "socket"], "must be auto, rdma or socket"),
    "PYCCL_RDMA_LOOPBACK_FAIL_AT": (["x", "-1", "1e3"], ["0", "1000"], "must be a whole number of work requests"),
    "PYCCL_IB_TIMEOUT": (["32", "40", "0x1f"], ["0", "31"], "must be a whole number up to 31"),
    "PYCCL_IB_GID_INDEX": (["256", "300", "-1"], ["0", "255"], "must be a whole number up to 255"),
}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_a_number_or_choice_setting_outside_its_rule_is_refused_when_a_communicator_is_made(monkeypatch, name):
    import torch.distributed as dist

    import pyccl

    bad_values, good_values, rule = SETTINGS[name]
    for value in bad_values:
        monkeypatch.setenv(name, value)
        with pytest.raises(InvalidArgumentError) as raised:
            pyccl.Communicator(dist.HashStore(), 0, 1, device="cpu")
        assert f"'{name}'" in str(raised.value) and rule in str(raised.value), str(raised.value)
        assert f"got '{value}'" in str(raised.value), str(raised.value)
    for value in good_values:
        monkeypatch.setenv(name, value)
        pyccl.Communicator(dist.HashStore(), 0, 1, device="cpu").close()


def test_python_on_off_variables_and_nccl_min_bytes_are_named(monkeypatch):
    for value, want in (("", True), ("1", True), ("YES", True), ("off", False), ("0", False), (" false ", False)):
        monkeypatch.setenv("PYCCL_TEST_FLAG", value)
        assert _env.flag("PYCCL_TEST_FLAG", True) is want
    monkeypatch.setenv("PYCCL_TEST_FLAG", "2")
    with pytest.raises(InvalidArgumentError, match="'PYCCL_TEST_FLAG'"):
        _env.flag("PYCCL_TEST_FLAG", True)
    # A bad PYCCL_NCCL_MIN_BYTES turned the tuning table off without a word where no NCCL was in reach: it is
    # named where the communicator is made, whose selector reads it.
    import torch
    import torch.distributed as dist

    import pyccl

    monkeypatch.setenv("PYCCL_NCCL_MIN_BYTES", "lots")
    with pytest.raises(InvalidArgumentError, match="PYCCL_NCCL_MIN_BYTES.*'lots'"):
        pyccl.Communicator(dist.HashStore(), 0, 1, device="cpu")
    monkeypatch.setenv("PYCCL_NCCL_MIN_BYTES", "4096")
    comm = pyccl.Communicator(dist.HashStore(), 0, 1, device="cpu")
    x = torch.randn(8)
    assert torch.equal(pyccl.all_reduce(x, comm=comm), x)
    comm.close()
