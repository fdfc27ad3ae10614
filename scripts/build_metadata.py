"""What the build decides of the package's metadata (scikit-build-core's
dynamic metadata, pyproject.toml): the wheel requires the torch it is built
against. pyccl's C++ extension links libtorch's C++ symbols, which change
between torch releases, so the wheel runs with that torch release alone
(pyccl also checks the exact build at import: pyccl/__init__.py)."""

from __future__ import annotations


def dynamic_metadata(field: str, settings: dict) -> list:
    if field != "dependencies" or settings:
        raise RuntimeError(f"scripts/build_metadata.py provides 'dependencies' without settings, not {field!r}")
    import torch

    # tqdm: pyccl.tune's progress bar (pyccl.bench runs without one where it is missing).
    return [f"torch=={torch.__version__.split('+')[0]}", "numpy", "tqdm"]
