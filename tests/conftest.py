"""The tests, one folder per layer (core, channels, collectives, dispatch, dsl,
across_nodes, torch, integrations, package), each holding the rank bodies
(``ranks_*.py``) its tests run in other processes; ``ranks.py`` and
``gpu_sharing.py`` here serve them all."""

import os
import sys

import pytest

# Every layer's folder is importable by module name, from any test and from the rank processes (the forkserver
# keeps the sys.path of its first use, which comes after this).
_HERE = os.path.dirname(os.path.abspath(__file__))
for _entry in sorted(os.scandir(_HERE), key=lambda e: e.name):
    if _entry.is_dir() and not _entry.name.startswith((".", "_")) and _entry.path not in sys.path:
        sys.path.append(_entry.path)

# NVLink SHARP (multicast) stays off wherever these tests run.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import pyccl  # noqa: E402
from gpu_sharing import SHARE_ENV, physical_gpu_count, shared_world  # noqa: E402

# Set before any rank process starts, which inherits them.
if shared_world():
    os.environ["PYCCL_ALLOW_SHARED_GPU"] = "1"
    # NCCL refuses ranks that share a GPU: the backend keeps no NCCL delegate, so every size runs pyccl's kernels.
    os.environ.setdefault("PYCCL_NCCL_DELEGATE", "0")


def gpu_count() -> int:
    """GPUs the GPU tests may use: those visible, or PYCCL_TEST_SHARE_GPU's number (gpu_sharing.py)."""
    return shared_world() or physical_gpu_count()


def _chosen_worlds() -> set | None:
    """PYCCL_TEST_WORLDS="6,8" runs the GPU tests at those world sizes only."""
    value = os.environ.get("PYCCL_TEST_WORLDS", "").strip()
    if not value:
        return None
    try:
        return {int(w) for w in value.split(",")}
    except ValueError:
        raise pytest.UsageError(f"PYCCL_TEST_WORLDS={value!r}: expected world sizes separated by commas, e.g. 6,8")


def gpu_worlds(*worlds: int, least: int = 2) -> list:
    """The world sizes of `worlds` that the visible GPUs can run (and that
    PYCCL_TEST_WORLDS names, when set). With fewer than `least` GPUs it is
    [least], which @requires_gpus(least) then skips with the reason, so a
    parametrized GPU test needs no skip of its own."""
    chosen = _chosen_worlds()
    fits = [w for w in worlds if w <= max(gpu_count(), least) and (chosen is None or w in chosen)]
    return fits if fits or chosen is not None else [least]


def largest_gpu_world(*worlds: int) -> int:
    """The largest of `worlds` that gpu_worlds keeps, for a test run at one size."""
    return max(gpu_worlds(*worlds) or [min(worlds)])


def slowed(seconds: float) -> float:
    """A test's time limit, times PYCCL_TEST_SLOWDOWN (scripts/sanitize_tests.py
    raises it: under a sanitizer the ranks run many times slower)."""
    return seconds * float(os.environ.get("PYCCL_TEST_SLOWDOWN", "1"))


def shared_rounds(rounds: int) -> int:
    """A round-trip test's round count: `rounds`, or a fiftieth of it (at least
    100) where PYCCL_TEST_SHARE_GPU time-slices the ranks on one GPU and every
    round waits for a context switch (about a millisecond)."""
    return max(100, rounds // 50) if shared_world() else rounds


def requires_gpus(n: int, own: bool = False):
    """The ``gpu`` marker of a test (or of one parameter, in ``pytest.param(...,
    marks=...)``) that needs n GPUs: it is skipped, saying why, unless this
    build has CUDA and at least n GPUs are visible (``-m gpu`` or ``-m "not
    gpu"`` select by it). With `own`, each rank needs a GPU of its own: the
    test skips where PYCCL_TEST_SHARE_GPU puts several ranks on one GPU."""
    return pytest.mark.gpu(n=n, own=own)


def host_and_gpu(gpus: int = 2, own: bool = False) -> list:
    """The two places a test of a topic runs, for ``@pytest.mark.parametrize("gpu", host_and_gpu())``:
    False in host mode (CPU processes, everywhere), True on GPUs (the ``gpu`` marker of
    requires_gpus(gpus, own), so skipped, saying why, where they are missing)."""
    return [on_host(id="host"), on_gpus(id="gpu", gpus=gpus, own=own)]


def on_host(*values, id: str):
    """One parameter set of a test run in host mode: ``(False, *values)``."""
    return pytest.param(False, *values, id=id)


def on_gpus(*values, id: str, gpus: int = 2, own: bool = False):
    """One parameter set of a test run on GPUs: ``(True, *values)``, marked requires_gpus(gpus, own)."""
    return pytest.param(True, *values, id=id, marks=requires_gpus(gpus, own))


def host_and_gpu_worlds(host, gpu, gpus: int = 2, own: bool = False) -> list:
    """``(gpu, world)`` for ``@pytest.mark.parametrize("gpu, world", ...)``: host mode at each world
    size of `host`, GPUs at each of gpu_worlds(*gpu, least=gpus) (as host_and_gpu marks them)."""
    return ([on_host(w, id=f"host-{w}") for w in host]
            + [on_gpus(w, id=f"gpu-{w}", gpus=gpus, own=own) for w in gpu_worlds(*gpu, least=gpus)])


def _gpu_skip_reason(n: int, own: bool):
    """Why a test marked ``gpu`` (requires_gpus) cannot run here; None where it can."""
    if not pyccl._C.cuda_built():
        return "pyccl was built without CUDA"
    if own and shared_world():
        return f"needs a GPU per rank; {SHARE_ENV} puts several ranks on one"
    if gpu_count() < n:
        return f"needs {n} CUDA GPU(s), {gpu_count()} visible"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        mark = item.get_closest_marker("gpu")
        if mark is not None:
            reason = _gpu_skip_reason(mark.kwargs.get("n", 1), mark.kwargs.get("own", False))
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=reason))
