"""Timing and sizes for the benchmarks (``pyccl.bench`` and ``benchmarks/``):
medians of CUDA-graph replays or eager launches, trials that start together
on every rank, and nccl-tests' -b/-e/-f sizes."""

from __future__ import annotations

import contextlib
import statistics

import torch

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


#: nccl-tests' bus-bandwidth factor of each collective at world size w (busbw = algbw * factor).
BUS_FACTOR = {"all_reduce": lambda w: 2 * (w - 1) / w, "all_gather": lambda w: (w - 1) / w,
              "reduce_scatter": lambda w: (w - 1) / w, "all_to_all": lambda w: (w - 1) / w,
              "broadcast": lambda w: 1.0, "send_recv": lambda w: 1.0}


def parse_bytes(text: str) -> int:
    """'3000', '4K', '4KiB', '256M', '1G' as bytes; a ValueError naming `text` otherwise."""
    t = text.strip().upper().rstrip("B").rstrip("I")
    unit = t[-1] if t and t[-1] in _UNITS else ""
    try:
        value = float(t[: len(t) - len(unit)] if unit else t)
    except ValueError:
        value = float("nan")
    if not value == value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{text!r} is not a size in bytes (e.g. 3000, 4K, 4KiB, 256M, 1G)")
    return int(value * _UNITS[unit])


# The barrier that starts every rank's trials together (align_trials), if any.
_trial_barrier = None
# A GPU sleep after the barrier, longer than a host takes to enqueue one trial
# (about 200 µs at the H100/H200 SM clock): every rank's replay then starts
# when its sleep ends, whichever host got there first.
_ALIGN_SLEEP_CYCLES = 400_000
# Graph replays per timed trial, back to back, as nccl-tests' -G replays its graph: what a replay costs once at
# its start, whichever implementation runs in it, spreads over this many. With one replay per trial pyccl's
# 1 KiB all-reduce read 3.03 µs per call on 2 x H200, with ten 2.77, and 2.87 under nccl-tests.
REPLAYS_PER_TRIAL = 10


def align_trials(barrier) -> None:
    """Makes every later ``time_graph`` trial of this process start together
    with the other ranks': ``barrier()`` (a collective of this process's
    group, enqueued on the current stream) and a GPU sleep run before the
    trial's start event. None turns it off.

    Without it, the rank whose host launches a trial first waits for the
    others inside its timed region: small collectives then read slower by the
    hosts' launch skew over the graph's calls (0.35 µs per call at 1 KiB on
    2 × H200, 20 calls per graph), on one rank and not the other, and which
    rank that is changes between process groups."""
    global _trial_barrier
    _trial_barrier = barrier


def align_trials_with(comm, device) -> None:
    """align_trials with a one-element 1PA LL all-reduce on the pyccl
    communicator `comm` as the barrier."""
    import pyccl

    one = torch.ones(1, device=device)
    into = torch.empty_like(one)
    align_trials(lambda: pyccl.all_reduce(one, out=into, comm=comm, algorithm="1pa_ll"))


def time_graph(fn, iters: int, trials: int, capture_in=None, check=None, output=None) -> float:
    """Median µs per call of `fn` captured `iters` times in one CUDA graph,
    over `trials` trials of REPLAYS_PER_TRIAL replays each; trials start
    together on every rank where align_trials was called.
    `capture_in`: a context manager the capture runs in (pyccl.graph_capture);
    `check`: called after the first replay (it raises on a wrong result), with
    `output` filled with NaN before that replay, so that only the graph's calls
    can make it right."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with capture_in if capture_in is not None else contextlib.nullcontext():
        with torch.cuda.graph(graph):
            for _ in range(iters):
                fn()
    if output is not None:
        output.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    if check is not None:
        check()

    def replays() -> None:
        for _ in range(REPLAYS_PER_TRIAL):
            graph.replay()

    return _median_per_call(replays, iters * REPLAYS_PER_TRIAL, trials, align_sleep=True, stream=stream)


def time_eager(fn, iters: int, trials: int) -> float:
    """Median µs per call of `fn` launched `iters` times in a row without a
    graph (nccl-tests without -G): where the host takes longer to launch a
    call than the GPU takes to run it, this is the host's time per call.
    Trials start after a barrier where align_trials was called, without the
    GPU sleep of graph mode: the launches are part of what is timed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up
    torch.cuda.synchronize()

    def launch() -> None:
        for _ in range(iters):
            fn()

    return _median_per_call(launch, iters, trials, align_sleep=False, stream=stream)


def _median_per_call(launch, calls: int, trials: int, align_sleep: bool, stream: torch.cuda.Stream) -> float:
    """Median over `trials` of the GPU's µs per call while `launch()` enqueues
    `calls` calls, each trial after the align_trials barrier (and, with
    `align_sleep`, its GPU sleep) where one is set. Everything runs on
    `stream`, a stream of its own as nccl-tests' are: on the legacy default
    stream, NCCL's 1 KiB all-reduce took 11.4 µs per call where it takes 5.9
    on a stream of its own (2 x H200); pyccl's kernels take the same on both
    (docs/performance.md)."""
    times = []
    with torch.cuda.stream(stream):
        for _ in range(trials):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if _trial_barrier is not None:
                _trial_barrier()
                if align_sleep:
                    torch.cuda._sleep(_ALIGN_SLEEP_CYCLES)
            start.record()
            launch()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(times)


def time_in_turn(calls: dict, iters: int, rounds: int, trials: int = 5) -> dict:
    """{name: median µs per call} of each of `calls` (see time_graph), the
    calls timed one after another `rounds` times, so that drift between the
    rounds reaches every call alike."""
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            times[name].append(time_graph(fn, iters, trials))
    return {name: statistics.median(ts) for name, ts in times.items()}


def doubling_sizes(min_bytes: int, max_bytes: int, factor: int = 2) -> list:
    """min_bytes, `factor` times that, and so on while at most max_bytes
    (nccl-tests' -b/-e/-f)."""
    if min_bytes < 1 or max_bytes < min_bytes:
        raise ValueError(f"sizes: need 1 <= min_bytes <= max_bytes, got {min_bytes} and {max_bytes}")
    if factor < 2:
        raise ValueError(f"sizes: the step factor must be at least 2, got {factor}")
    sizes, n = [], min_bytes
    while n <= max_bytes:
        sizes.append(n)
        n *= factor
    return sizes


def size_label(n: int) -> str:
    """`n` bytes as "512 B" / "4 KiB" / "16 MiB" / "1 GiB": the largest unit
    that divides it (other sizes in bytes, so no label rounds)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"
