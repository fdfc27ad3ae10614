"""The flight recorder (Communicator.history, pyccl.dump_history) and the
labels every call carries in the torch profiler, in host mode. The NVTX
ranges need a GPU build and a tool (Nsight Systems); docs/runtime.md."""

import pytest

import pyccl
import ranks_history as rh
from conftest import requires_gpus
from pyccl._spawn import run_ranks


def test_every_call_is_recorded_and_labelled():
    for labels, history, dumped, logged in run_ranks(rh.calls_recorded, 2, timeout=120):
        assert labels == ["pyccl all_gather ll 1024 B #2", "pyccl all_reduce 1pa_ll bfloat16 512 B #1"], labels
        assert [(r["seq"], r["op"], r["algorithm"], r["dtype"], r["bytes"]) for r in history] == [
            (1, "all_reduce", "1pa_ll", "bfloat16", 512),
            (2, "all_gather", "ll", None, 1024),
            (3, "reduce_scatter", "ll", "bfloat16", 512),
            (4, "all_reduce", "2pa_ll", "bfloat16", 512),
        ], history
        assert all(r["state"] == "enqueued" and not r["captured"] for r in history), history
        assert [r["enqueued_us"] for r in history] == sorted(r["enqueued_us"] for r in history)
        assert [(r["name"], r["seq"]) for r in dumped] == [("history", s) for s in (1, 2, 3, 4)], dumped
        # Logged in the format a breaking communicator logs (one formatter, C++'s).
        assert len(logged) == 1 and "the last 4 of 4 calls" in logged[0], logged
        assert "#1 all_reduce 1pa_ll bfloat16 512 B, enqueued" in logged[0], logged
        assert "#4 all_reduce 2pa_ll bfloat16 512 B" in logged[0] and logged[0].endswith("UTC: enqueued"), logged


def test_the_recorder_keeps_the_last_calls_it_is_sized_for():
    out = run_ranks(rh.calls_recorded, 2, timeout=120, env={"PYCCL_HISTORY_SIZE": "2"})
    for _, history, _, _ in out:
        assert [r["seq"] for r in history] == [3, 4], history
    out = run_ranks(rh.calls_recorded, 2, timeout=120, env={"PYCCL_HISTORY_SIZE": "0"})
    for labels, history, _, _ in out:
        assert history == [] and len(labels) == 2, (history, labels)


def test_a_bad_history_size_is_refused_naming_it():
    out = run_ranks(rh.calls_recorded, 2, timeout=120, env={"PYCCL_HISTORY_SIZE": "many"}, expect_failure=True)
    for status, message in out:
        assert status == "error" and "PYCCL_HISTORY_SIZE" in message, message


def test_a_broken_communicator_logs_its_history_with_the_failed_call():
    out = run_ranks(rh.a_failed_call_is_named, 2, timeout=120)
    failure, history, logged = out[0]
    assert failure is not None and "all_reduce call 2" in failure, failure
    assert [(r["seq"], r["state"]) for r in history] == [(1, "before the failure"), (2, "failed")], history
    assert "'history' (rank 0): the last 2 of 2 calls (PYCCL_HISTORY_SIZE)" in logged, logged
    assert "#2 all_reduce 1pa_ll float32 256 B" in logged and ": failed" in logged, logged


def test_dump_history_makes_no_communicator():
    assert pyccl.dump_history() == []
    with pytest.raises(pyccl.InvalidArgumentError, match="'comm'"):
        pyccl.dump_history(comm="world")



@requires_gpus(2)
def test_gpu_calls_are_recorded_and_labelled_captured_ones_too():
    for labels, history, error in run_ranks(rh.gpu_calls_recorded, 2, timeout=180):
        assert labels == ["pyccl all_reduce 1pa_ll bfloat16 1024 B #1"], labels
        assert [(r["seq"], r["op"], r["algorithm"], r["captured"]) for r in history[:2]] == [
            (1, "all_reduce", "1pa_ll", False), (2, "all_reduce", "1pa_ll", True)], history
        assert error <= 0.05, error  # bf16 sums of two N(0, 1) values
