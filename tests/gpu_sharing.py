"""Which GPU each test rank runs on.

By default rank r runs on GPU r, and a GPU test runs only where there are as
many GPUs as ranks. PYCCL_TEST_SHARE_GPU=N runs the GPU tests as if N GPUs
were visible: rank r runs on GPU r % (the GPUs really visible), so several
ranks share one GPU. The GPU then time-slices between their processes, so a
collective takes milliseconds, but every kernel, flag and packet path runs as
it does across GPUs (peer memory is mapped the same way). It is for checking
results on a machine with fewer GPUs than ranks. Tests that need a GPU per
rank skip (requires_gpus(n, own=True)): NCCL's groups (NCCL refuses shared
GPUs), the whole GPU's memory as a leak measure, a million ping-pong rounds.
conftest.py then sets PYCCL_ALLOW_SHARED_GPU=1, without which a communicator
refuses ranks that share a GPU, and PYCCL_NCCL_DELEGATE=0.
"""

from __future__ import annotations

import os

import pyccl

SHARE_ENV = "PYCCL_TEST_SHARE_GPU"


def physical_gpu_count() -> int:
    """GPUs really visible to this build (0 without CUDA)."""
    return pyccl._C.device_count() if pyccl._C.cuda_built() else 0


def shared_world() -> int:
    """N from PYCCL_TEST_SHARE_GPU=N where at least one GPU is visible, else 0."""
    value = os.environ.get(SHARE_ENV, "").strip()
    if not value or physical_gpu_count() == 0:
        return 0
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"{SHARE_ENV}={value!r}: expected a number of ranks, e.g. 4") from None
    if n < 2:
        raise ValueError(f"{SHARE_ENV}={value!r}: expected at least 2 ranks")
    return n


def rank_gpu(rank: int) -> int:
    """The GPU ordinal of test rank `rank`: its own, or shared (PYCCL_TEST_SHARE_GPU)."""
    return rank % physical_gpu_count() if shared_world() else rank
