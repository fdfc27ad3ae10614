"""Faults: a killed rank, a slow rank, ranks that disagree on a call, an abort
from another thread or during a CUDA graph replay, a dead proxy thread. In
each case the surviving ranks raise within the group's timeout, naming the op,
its sequence number and the missing peer, and every process exits."""

import pytest

import ranks_faults as rf
from conftest import gpu_count, requires_gpus
from pyccl._spawn import run_ranks

# GPU runs keep NCCL out of the way: every size goes through pyccl's kernels.
GPU_ENV = {"PYCCL_NCCL_DELEGATE": "0"}


def _survivor_failed_in_time(first, timeout_s, dead_rank):
    kind, message, seconds, is_dist_error = first
    assert is_dist_error, first
    assert seconds <= timeout_s + 5, first
    assert "all_reduce call " in message and "timeout" in message, message
    assert f"no signal from rank {dead_rank}" in message or f"waited on in vain: {dead_rank}" in message \
        or f", {dead_rank}" in message, message


def _killed_rank(on_gpu):
    timeout_s = 3
    world = 3 if not on_gpu else min(3, gpu_count())
    env = GPU_ENV if on_gpu else {}
    out = run_ranks(rf.killed_rank, world, args=(on_gpu, timeout_s), timeout=120, expect_failure=True,
                    dying=[world - 1], env=env)
    assert out[world - 1][0] == "error" and "-9" in out[world - 1][1], out[world - 1]
    for status, value in out[:world - 1]:
        assert status == "ok", value
        first, again, destroy_s = value
        _survivor_failed_in_time(first, timeout_s, world - 1)
        assert again[0] != "ok" and again[3] and again[2] < 1.0, again
        assert "refused" in again[1] and "broken" in again[1], again
        assert destroy_s < 10, destroy_s


def test_killed_rank_host():
    _killed_rank(False)


@requires_gpus(2)
def test_killed_rank_gpu():
    _killed_rank(True)


@pytest.mark.parametrize("on_gpu", [False, pytest.param(True, marks=requires_gpus(2))])
def test_survivors_of_a_stopped_rank_fail_within_the_timeout_and_a_second(on_gpu):
    """A rank stopped (SIGSTOP) in the middle of a loop of all-reduces, so its
    sockets stay open and nothing says it is gone: every survivor raises
    within the timeout plus one second of the stop, naming the call and that
    rank, and the next call fails at once."""
    timeout_s, stop_after_s = 2, 0.3
    world = 3 if not on_gpu else min(3, gpu_count())
    env = GPU_ENV if on_gpu else {}
    out = run_ranks(rf.stopped_rank, world, args=(on_gpu, timeout_s, stop_after_s), timeout=120,
                    expect_failure=True, dying=[world - 1], env=env)
    assert out[world - 1][0] == "error" and "-9" in out[world - 1][1], out[world - 1]
    for status, value in out[:world - 1]:
        assert status == "ok", value
        first, after_stop, again, destroy_s = value
        _survivor_failed_in_time(first, timeout_s, world - 1)
        assert after_stop <= timeout_s + 1, (after_stop, first)
        assert again[0] != "ok" and again[3] and again[2] < 1.0, again
        assert destroy_s < 10, destroy_s


@pytest.mark.parametrize("on_gpu", [False, pytest.param(True, marks=requires_gpus(2))])
def test_slow_rank_within_the_timeout_is_waited_for(on_gpu):
    out = run_ranks(rf.slow_rank, 3 if not on_gpu else 2, args=(on_gpu, 20, 2.0), timeout=120,
                    env=GPU_ENV if on_gpu else {})
    for rank, (first, second, destroy_s) in enumerate(out):
        assert first[0] == "ok" and first[1], (rank, first)
        assert second[0] == "ok" and second[1], (rank, second)
        if rank != len(out) - 1:
            assert first[2] >= 1.5, (rank, first)  # it did wait for the slow rank


@pytest.mark.parametrize("on_gpu,blocking", [(False, False), pytest.param(True, True, marks=requires_gpus(2)),
                                              pytest.param(True, False, marks=requires_gpus(2))])
def test_slow_rank_past_the_timeout_breaks_the_group_everywhere(on_gpu, blocking):
    """Host mode raises in the failing call itself. On GPUs the call returns
    when its kernel gives up, and the failure is raised by the next call; with
    PYCCL_BLOCKING_WAIT=1 the failing call's wait() raises it."""
    world = 3 if not on_gpu else 2
    timeout_s = 1
    env = {**GPU_ENV, "PYCCL_BLOCKING_WAIT": "1" if blocking else "0"} if on_gpu else {}
    out = run_ranks(rf.slow_rank, world, args=(on_gpu, timeout_s, 3.0), timeout=120, env=env)
    for rank, (first, second, destroy_s) in enumerate(out[:-1]):
        if on_gpu and not blocking:
            assert first[0] == "ok" and first[1] is False, first  # the kernel gave up; no data
            assert second[0] != "ok" and second[3] and second[2] < 1.0, second
            assert "refused, all_reduce call 2 " in second[1] and "no signal from rank 1" in second[1], second
            continue
        _survivor_failed_in_time(first, timeout_s, world - 1)
        assert "all_reduce call 2 " in first[1], first
        assert second[0] != "ok" and second[2] < 1.0, second
    # The slow rank arrives after the others gave up: though its peers' data
    # was there, it fails the call with their verdict, and it never hangs.
    first, second, destroy_s = out[-1]
    assert first[0] != "ok" and first[3] and "gave up" in first[1], first
    assert second[0] != "ok" or second[1] is False, second
    assert second[2] <= timeout_s + 5 and destroy_s < 10, (second, destroy_s)


@pytest.mark.parametrize("collective", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                                        "plan"])
@pytest.mark.parametrize("on_gpu", [False, pytest.param(True, marks=requires_gpus(2))])
def test_a_rank_late_past_its_peers_verdict_fails_the_call_too(on_gpu, collective):
    """Rank 1 gives the second call up; rank 0 arrives after that and finds
    rank 1's signals and data already there. It must not report the call done
    (for the plan, which reads rank 1's buffers, its result was wrong): it
    raises, naming the rank that gave up, the op and the call's number."""
    timeout_s, delay_s = 1, 2.5
    out = run_ranks(rf.late_rank_after_a_verdict, 2, args=(on_gpu, collective, timeout_s, delay_s), timeout=120,
                    env=GPU_ENV if on_gpu else {})
    op = "plan" if collective == "plan" else collective
    (late_first, late_again, _), (peer_first, peer_again, _) = out
    if on_gpu:
        # The peer's kernel gave up by itself; its host learns of it by the next call or a synchronize.
        assert peer_first[0] != "ok" or peer_again[0] != "ok", (peer_first, peer_again)
    else:
        assert peer_first[0] == "PycclTimeoutError" and f"{op} call 2 " in peer_first[1], peer_first
    assert late_first[0] != "ok", (late_first, peer_first, peer_again)  # never "done" after its peer gave up
    assert "rank 1 gave up" in late_first[1] and f"{op} call 2 " in late_first[1], late_first
    assert late_first[2] < 1.0, late_first  # refused at once: the verdict was there before the call
    assert late_again[0] != "ok" and "refused" in late_again[1] and late_again[2] < 1.0, late_again


def test_a_groups_timeout_bounds_its_pyccl_calls():
    timeout_s = 2
    out = run_ranks(rf.group_timeout_reaches_pyccl_calls, 2, args=(timeout_s,), timeout=120)
    (first, destroy_s), _ = out
    assert first[0] == "PycclTimeoutError" and first[2] <= timeout_s + 1, first
    assert "all_reduce call 2 " in first[1] and f"within the {timeout_s * 1000} ms timeout" in first[1], first
    assert destroy_s < 10, destroy_s


@pytest.mark.parametrize("on_gpu", [False, pytest.param(True, marks=requires_gpus(4))])
def test_a_late_rank_among_others_is_the_one_named(on_gpu):
    """Small all-reduces poll every peer's packets together: the peers that
    did arrive must not hide the one that did not (rank 1 of 4 here)."""
    world, late, timeout_s = 4, 1, 1
    env = {**GPU_ENV, "PYCCL_BLOCKING_WAIT": "1"} if on_gpu else {}
    out = run_ranks(rf.slow_rank, world, args=(on_gpu, timeout_s, 3.0, late), timeout=120, env=env)
    for rank, (first, second, destroy_s) in enumerate(out):
        if rank == late:
            continue
        _survivor_failed_in_time(first, timeout_s, late)
        assert f"no signal from rank {late} " in first[1], first
        assert destroy_s < 10, destroy_s


@pytest.mark.parametrize("variant", ["size", "op"])
@pytest.mark.parametrize("on_gpu", [False, pytest.param(True, marks=requires_gpus(2))])
def test_mismatched_calls_are_named_with_pyccl_debug(on_gpu, variant):
    world = 3 if not on_gpu else 2
    env = {"PYCCL_DEBUG": "1", **(GPU_ENV if on_gpu else {})}
    out = run_ranks(rf.mismatched_call, world, args=(on_gpu, variant), timeout=120, env=env)
    for rank, (first, after) in enumerate(out):
        kind, message, seconds, is_dist_error = first
        assert is_dist_error and seconds < 10, first
        assert "disagree" in message and "rank(s) 1:" in message, message
        others = ", ".join(str(q) for q in range(world) if q != 1)
        assert f"rank(s) {others}: all_reduce float32 x {rf.ELEMENTS} sum (call 1)" in message, message
        if variant == "size":
            assert f"rank(s) 1: all_reduce float32 x {rf.ELEMENTS + 64} sum" in message, message
        else:
            assert "rank(s) 1: all_gather" in message, message
        assert after, "the group must stay usable after a refused call"


# On GPUs the group is torch's NCCL group, which needs a GPU per rank.
@pytest.mark.parametrize("on_gpu", [False, pytest.param(True, marks=requires_gpus(2, own=True))])
def test_fused_calls_with_different_rows_fail_within_the_timeout(on_gpu):
    """Ranks that pass different numbers of rows to the fused all-reduce +
    RMSNorm: the rank whose rows never come raises within the group's timeout
    and names the call (on GPUs, its next call raises it); a rank whose rows all came may return, and its next
    call fails within the timeout too, naming that rank (on GPUs, that call's kernel gives up and the call after
    raises). Under PYCCL_DEBUG=1 every rank refuses the call before anything runs, and the group stays usable."""
    timeout_s = 2
    env = GPU_ENV if on_gpu else {}
    (first0, second0, third0, _, _), (first1, second1, _, _, destroy_s) = run_ranks(
        rf.fused_rows_differ, 2, args=(on_gpu, timeout_s), timeout=120, env=env)
    kind, message, seconds = first1
    assert seconds <= timeout_s + 1, first1
    if on_gpu and kind == "ok":
        # The kernel's wait gave up on the GPU (the synchronize returned after the timeout); the host raises
        # it at the next call, as every GPU-side failure (docs/reliability.md).
        kind, message = second1[:2]
    assert kind == "PycclTimeoutError", (first1, second1)
    assert "fused_all_reduce_rmsnorm call 1" in message and "no signal from rank 0" in message, message
    assert first0[0] in ("ok", "PycclTimeoutError"), first0
    assert second1[0] == "PycclTimeoutError" and second1[2] < 1.0, second1  # broken: refused at once
    assert "fused_all_reduce_rmsnorm call 1" in second1[1], second1
    # Rank 1 is still waiting out the fused call: either its verdict or this call's own timeout names it.
    assert second0[2] <= timeout_s + 1, second0
    if on_gpu and second0[0] == "ok":
        # The all-reduce's kernel gave up on the GPU (rank 1 never joins it): its sum is not there, and the next
        # call raises at once.
        assert second0[1] is False, second0
        assert third0[0] == "PycclTimeoutError" and third0[2] < 1.0, third0
        second0 = third0
    assert second0[0] == "PycclTimeoutError", second0
    assert "rank 1" in second0[1] or "in vain: 1" in second0[1], second0
    assert destroy_s < 10, destroy_s

    checked = run_ranks(rf.fused_rows_differ, 2, args=(on_gpu, timeout_s), timeout=120,
                        env={**env, "PYCCL_DEBUG": "1"})
    for rank, (first, second, third, untouched, _) in enumerate(checked):
        kind, message, seconds = first
        assert kind == "RemoteError" and seconds < timeout_s, first
        assert "disagree" in message and "rank(s) 0: fused_all_reduce_rmsnorm float32 3 x 64 (call 1)" in message
        assert "rank(s) 1: fused_all_reduce_rmsnorm float32 5 x 64 (call 1)" in message, message
        assert untouched, f"rank {rank}: a refused call wrote its output"
        assert second == ("ok", True, second[2]) and third == ("ok", True, third[2]), (second, third)


def test_a_call_checks_timeout_breaks_the_communicator():
    """PYCCL_DEBUG=1, a rank that never makes the call: the check's timeout
    names the op and its number, and the next call fails at once."""
    timeout_s = 1
    out = run_ranks(rf.missing_call_under_call_checks, 2, args=(timeout_s,), timeout=120,
                    env={"PYCCL_DEBUG": "1"})
    first, again = out[0]
    assert first[0] == "PycclTimeoutError" and "all_reduce call 2 " in first[1], first
    assert first[2] <= timeout_s + 2, first
    assert again[0] != "ok" and "refused" in again[1] and again[2] < 0.5, again


def test_a_group_under_detail_debug_has_sequence_numbers():
    out = run_ranks(rf.detail_debug_group, 2, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, timeout=120)
    assert all(ok for ok, _ in out), out
    assert out[0][1] == out[1][1] >= 2, out  # two ops counted alike


def test_mismatched_calls_under_torch_distributed_debug_detail():
    out = run_ranks(rf.mismatched_call, 2, args=(False, "size"), timeout=120,
                    env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    for first, after in out:
        assert first[0] != "ok" and "rank(s) 1: all_reduce float32 x 4160 sum" in first[1], first
        assert after


def test_mismatched_direct_calls_are_named():
    out = run_ranks(rf.mismatched_direct_call, 2, timeout=120, env={"PYCCL_DEBUG": "1"})
    for first, after in out:
        assert first[0] == "RemoteError", first
        assert f"rank(s) 0: all_reduce float32 x {rf.ELEMENTS + 16} sum" in first[1], first
        assert f"rank(s) 1: all_reduce float32 x {rf.ELEMENTS} sum" in first[1], first
        assert after


@pytest.mark.parametrize("on_gpu", [False, pytest.param(True, marks=requires_gpus(2))])
def test_abort_from_another_thread_unblocks_a_hung_collective(on_gpu):
    out = run_ranks(rf.abort_unblocks, 2, args=(on_gpu,), timeout=120, env=GPU_ENV if on_gpu else {})
    kind, message, seconds, is_dist_error, destroy_s = out[0]
    assert is_dist_error and "aborted" in message, out[0]
    assert 0.9 <= seconds <= 5, out[0]
    assert destroy_s < 10


@requires_gpus(2)
def test_abort_during_cuda_graph_replay():
    out = run_ranks(rf.abort_during_graph_replay, 2, timeout=180, env=GPU_ENV)
    (replay_s, eager), destroy_s = out[0]
    assert 0.9 <= replay_s <= 10, replay_s  # the abort (at 1 s), not the 60 s timeout, ended it
    kind, message, seconds, is_dist_error = eager
    assert is_dist_error and "aborted" in message and seconds < 1.0, eager
    assert destroy_s < 10 and out[1][1] < 10


@requires_gpus(2)
def test_a_failure_during_graph_replay_is_named_by_the_next_call():
    timeout_s = 2
    out = run_ranks(rf.replayed_failure, 2, args=(timeout_s,), timeout=120, expect_failure=True, dying=[1],
                    env=GPU_ENV)
    status, (eager, destroy_s) = out[0]
    kind, message, seconds, is_dist_error = eager
    assert is_dist_error and seconds < 1.0, eager
    assert "all_reduce call " in message and "captured in a CUDA graph" in message, message
    assert "no signal from rank 1" in message and "refused" in message, message


@requires_gpus(2)
def test_watchdog_tears_down_a_rank_that_only_replays_graphs():
    timeout_s = 2
    out = run_ranks(rf.replayed_failure, 2, args=(timeout_s,), timeout=120, expect_failure=True,
                    dying=[1], env={**GPU_ENV, "PYCCL_ASYNC_ERROR_HANDLING": "1"})
    status, message = out[0]
    assert status == "error" and "code -6" in message, out[0]  # SIGABRT from the watchdog, not a hang


def test_proxy_thread_death_breaks_the_communicator():
    out = run_ranks(rf.proxy_death, 2, timeout=120)
    ran, failure, record, later = out[0]
    assert ran[0] == "ClosedError" and "its proxy thread died: injected: a transfer failed" in ran[1], ran
    assert "proxy thread" in failure and "injected: a transfer failed" in failure, failure
    assert later[0] != "ok" and "refused" in later[1] and "proxy thread" in later[1], later
    ran, failure, record, later = out[1]
    assert ran == ("ok", 1, ran[2]), ran  # its wait for rank 0's signal gave up
    # Rank 0's verdict reached it: its wait stopped at once, not at the timeout, and says why.
    assert record["peer"] == 0 and record["status"] == "aborted" and ran[2] < 1.5, (record, ran)
    assert "rank 0 gave up" in failure and "proxy thread" in failure, failure


def test_a_work_can_be_waited_on_after_its_group_is_gone():
    for waited, success, right in run_ranks(rf.work_outlives_group, 2, timeout=120):
        assert waited and success and right
