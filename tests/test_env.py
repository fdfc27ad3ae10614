"""pyccl._env: the environment as os.environ has it, read at every collective call."""

import os

import pytest

from pyccl import _env, selection
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


def test_collectives_see_pyccl_algo_change_between_calls(monkeypatch):
    monkeypatch.delenv("PYCCL_ALGO", raising=False)
    assert selection._forced_algorithm("all_reduce", None) is None
    monkeypatch.setenv("PYCCL_ALGO", "all_reduce=2pa_ll")
    assert selection._forced_algorithm("all_reduce", None) == "2pa_ll"
    monkeypatch.setenv("PYCCL_ALGO", "all_gather=hb")
    assert selection._forced_algorithm("all_reduce", None) is None
    assert selection._forced_algorithm("all_gather", None) == "hb"
    monkeypatch.setenv("PYCCL_ALGO", "all_reduce=warp")
    with pytest.raises(InvalidArgumentError, match="PYCCL_ALGO"):
        selection._forced_algorithm("all_reduce", None)
    monkeypatch.setenv("PYCCL_NCCL_MIN_BYTES", "4096")
    assert selection._nccl_min_bytes("all_gather") == 4096
    monkeypatch.setenv("PYCCL_NCCL_MIN_BYTES", "-1")
    with pytest.raises(InvalidArgumentError, match="PYCCL_NCCL_MIN_BYTES"):
        selection._nccl_min_bytes("all_reduce")


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
