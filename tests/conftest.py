import os

import pytest

# NVLink SHARP (multicast) stays off wherever these tests run.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import pyccl  # noqa: E402


def gpu_count() -> int:
    return pyccl._C.device_count() if pyccl._C.cuda_built() else 0


def gpu_worlds(*worlds: int, least: int = 2) -> list:
    """The world sizes of `worlds` that the visible GPUs can run. With fewer
    than `least` GPUs it is [least], which @requires_gpus(least) then skips
    with the reason, so a parametrized GPU test needs no skip of its own."""
    return [w for w in worlds if w <= max(gpu_count(), least)]


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
