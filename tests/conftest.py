import os

import pytest

# NVLink SHARP (multicast) stays off wherever these tests run.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import pyccl  # noqa: E402


def gpu_count() -> int:
    return pyccl._C.device_count() if pyccl._C.cuda_built() else 0


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


def requires_gpus(n: int):
    """Skips (saying why) unless this build has CUDA and at least n GPUs are visible."""
    if not pyccl._C.cuda_built():
        reason = "pyccl was built without CUDA"
    else:
        reason = f"needs {n} CUDA GPU(s), {gpu_count()} visible"
    return pytest.mark.skipif(gpu_count() < n, reason=reason)
