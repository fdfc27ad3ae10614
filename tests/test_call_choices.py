"""The automatic choice of a collective call is memoized per communicator
(pyccl.selection._Call): a memoized choice is the one a fresh call makes,
and every source the choice depends on that can change between calls
invalidates it at the next call."""

import random

import pytest
import torch
import torch.distributed as dist

import pyccl
from pyccl import selection
from pyccl.errors import InvalidArgumentError


@pytest.fixture
def comm():
    c = pyccl.Communicator(dist.HashStore(), 0, 1, device="cpu", name="choices")
    yield c
    c.close()


@pytest.fixture
def counted(monkeypatch):
    """Counts the calls that compute a choice instead of reading the memo."""
    made = []
    choose = selection._Call._choose

    def counting(self, *args):
        made.append(args[0])
        return choose(self, *args)

    monkeypatch.setattr(selection._Call, "_choose", counting)
    monkeypatch.delenv("PYCCL_ALGO", raising=False)
    monkeypatch.delenv("PYCCL_NCCL_MIN_BYTES", raising=False)
    return made


def _fields(call):
    return (call.algorithm, call.forced, call.tuned_plan, call.spans_nodes, call.use_nccl, call.nccl_here,
            call.nbytes)


def test_a_memoized_choice_is_the_fresh_one(comm, counted):
    x = torch.randn(random.randrange(1, 5000))
    first = selection._Call("all_reduce", x, None, comm, None)
    again = selection._Call("all_reduce", x, None, comm, None)
    assert len(counted) == 1 and _fields(again) == _fields(first)
    assert first.nbytes == x.numel() * 4
    gathered = selection._Call("all_gather", x, None, comm, None, gathers=True)
    assert gathered.nbytes == x.numel() * 4 * comm.world_size and len(counted) == 2
    forced = selection._Call("all_reduce", x, None, comm, "2pa_ll")
    assert forced.algorithm == "2pa_ll" and forced.forced and not first.forced and len(counted) == 3


def test_each_changing_source_invalidates_the_memo(comm, counted, monkeypatch):
    x = torch.randn(1000)
    selection._Call("all_reduce", x, None, comm, None)
    selection._Call("all_reduce", torch.randn(1001), None, comm, None)  # another size
    selection._Call("all_reduce", x.to(torch.bfloat16), None, comm, None)  # another dtype
    selection._Call("reduce_scatter", x, None, comm, None)  # another collective
    assert len(counted) == 4
    monkeypatch.setenv("PYCCL_ALGO", "all_reduce=1pa_ll")
    assert selection._Call("all_reduce", x, None, comm, None).algorithm == "1pa_ll"
    monkeypatch.setenv("PYCCL_ALGO", "all_reduce=2pa_hb")  # changed again: the next call sees it
    assert selection._Call("all_reduce", x, None, comm, None).algorithm == "2pa_hb"
    monkeypatch.delenv("PYCCL_ALGO")
    assert selection._Call("all_reduce", x, None, comm, None).algorithm is None
    assert len(counted) == 6  # the unset value's choice was still memoized
    monkeypatch.setenv("PYCCL_NCCL_MIN_BYTES", "4096")
    selection._Call("all_reduce", x, None, comm, None)
    monkeypatch.setitem(selection.NCCL_MIN_BYTES, "all_reduce", 1 << 10)
    selection._Call("all_reduce", x, None, comm, None)
    assert len(counted) == 8


def test_a_bad_choice_raises_at_every_call_and_is_not_memoized(comm, counted, monkeypatch):
    x = torch.randn(64)
    for _ in range(2):
        with pytest.raises(InvalidArgumentError, match="'algorithm'"):
            selection._Call("all_reduce", x, None, comm, "warp")
        with pytest.raises(InvalidArgumentError, match="'algorithm'"):
            selection._Call("all_reduce", x, None, comm, ["2pa_ll"])  # unhashable: still named
    monkeypatch.setenv("PYCCL_ALGO", "all_reduce=warp")
    for _ in range(2):
        with pytest.raises(InvalidArgumentError, match="PYCCL_ALGO"):
            selection._Call("all_reduce", x, None, comm, None)
    assert comm.__dict__.get("_call_choices", {}) == {}
    monkeypatch.delenv("PYCCL_ALGO")
    with pytest.raises(pyccl.errors.ClosedError):
        closed = pyccl.Communicator(dist.HashStore(), 0, 1, device="cpu", name="closed")
        closed.close()
        selection._Call("all_reduce", x, None, closed, None)


def test_the_memo_is_bounded(comm, counted, monkeypatch):
    monkeypatch.setattr(selection, "_CHOICES_KEPT", 8)
    for n in range(1, 30):
        selection._Call("all_reduce", torch.randn(n), None, comm, None)
        assert len(comm.__dict__["_call_choices"]) <= 8
    assert len(counted) == 29


def test_collectives_run_the_memoized_choice(comm):
    """Host mode, one rank: the calls that hit the memo give the same results."""
    for _ in range(3):
        x = torch.randn(777)
        assert torch.equal(pyccl.all_reduce(x, comm=comm), x)
        assert torch.equal(pyccl.all_gather(x, comm=comm), x)
        assert torch.equal(pyccl.reduce_scatter(x, comm=comm), x)


def test_host_mode_follows_a_tuning_file_set_between_calls(comm, counted, monkeypatch, tmp_path):
    import json

    from pyccl import tuning

    monkeypatch.setattr(selection, "_tables", {})  # this process's table look-ups stay in this test
    monkeypatch.delenv("PYCCL_TUNING_FILE", raising=False)
    x = torch.randn(1024)
    assert selection._Call("all_reduce", x, None, comm, None).algorithm is None
    table = tuning.build_table({"all_reduce": [{"bytes": 4096, "pyccl_2pa_ll": 1.0, "pyccl_1pa_ll": 2.0}]},
                               gpu="host", world=1, dtype="float32", date="today", command="test")
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    monkeypatch.setenv("PYCCL_TUNING_FILE", str(path))
    assert selection._Call("all_reduce", x, None, comm, None).algorithm == "2pa_ll"
    assert len(counted) == 2


class _CountingEngine:
    """The communicator's engine, with its symmetric-buffer look-ups counted."""

    def __init__(self, engine) -> None:
        self.engine, self.looked_up, self.launched = engine, 0, []

    def is_symmetric(self, tensor) -> bool:
        self.looked_up += 1
        return self.engine.is_symmetric(tensor)

    def all_reduce(self, *args):
        self.launched.append(args[4:])
        return self.engine.all_reduce(*args)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_the_symmetric_choice_is_memoized_and_made_by_the_engine_at_the_launch(comm, monkeypatch):
    """An automatic all-reduce gives the engine both choices, plain and symmetric, and asks nothing per call;
    the engine takes the symmetric one only where the tensors are symmetric buffers (2PA HB: zero-copy)."""
    monkeypatch.delenv("PYCCL_ALGO", raising=False)
    monkeypatch.delenv("PYCCL_NCCL_MIN_BYTES", raising=False)
    made = []
    monkeypatch.setattr(selection, "_symmetric_choice", lambda *args: made.append(1) or "2pa_hb")
    n = random.randrange(100, 3000)
    a = pyccl.symmetric_empty(n, comm=comm)
    b = pyccl.symmetric_empty(n, comm=comm)
    engine = comm._engine
    counting = comm._engine = _CountingEngine(engine)
    try:
        zero_copy = engine.zero_copy_calls
        for _ in range(3):
            a.copy_(torch.randn(n))
            assert torch.equal(pyccl.all_reduce(a, out=b, comm=comm), a)
        assert engine.zero_copy_calls == zero_copy + 3
        x = torch.randn(n)
        assert torch.equal(pyccl.all_reduce(x, comm=comm), x)  # plain tensors: the plain choice, staged
        assert engine.zero_copy_calls == zero_copy + 3
        assert len(made) == 1 and counting.looked_up == 0
        assert all(launch[1] == "2pa_hb" for launch in counting.launched)
        # A forced algorithm holds for symmetric buffers too: no symmetric choice.
        assert torch.equal(pyccl.all_reduce(a, out=b, comm=comm, algorithm="2pa_ll"), a)
        assert counting.launched[-1] == ("2pa_ll", None) and engine.zero_copy_calls == zero_copy + 3
        # A symmetric choice that would leave the engine (NCCL) is settled before the launch, by asking.
        monkeypatch.setattr(selection, "_symmetric_choice", lambda *args: "nccl")
        y = torch.randn(n + 1)  # a new size: a new choice
        assert torch.equal(pyccl.all_reduce(y, comm=comm), y)
        assert counting.looked_up >= 1 and counting.launched[-1][1] is None
    finally:
        comm._engine = engine


def test_the_engine_takes_its_symmetric_algorithm_for_symmetric_buffers_only(comm):
    n = random.randrange(100, 3000)
    a, b = pyccl.symmetric_empty(n, comm=comm), pyccl.symmetric_empty(n, comm=comm)
    engine = comm._engine
    before = engine.zero_copy_calls
    a.copy_(torch.randn(n))
    engine.all_reduce(comm._comm, a, b, "sum", "1pa_ll", "2pa_hb")
    assert torch.equal(b, a) and engine.zero_copy_calls == before + 1
    x, y = torch.randn(n), torch.empty(n)
    engine.all_reduce(comm._comm, x, y, "sum", "1pa_ll", "2pa_hb")
    assert torch.equal(y, x) and engine.zero_copy_calls == before + 1
    engine.all_reduce(comm._comm, a, b, "sum", "2pa_hb", "2pa_ll")  # the symmetric one wins: staged
    assert engine.zero_copy_calls == before + 1
    with pytest.raises(InvalidArgumentError, match="'symmetric_algorithm'"):
        engine.all_reduce(comm._comm, a, b, "sum", None, "warp")
