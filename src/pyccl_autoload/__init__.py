"""torch's ``torch.backends`` entry point for pyccl.

Kept apart from the ``pyccl`` package so that torch stays importable even
where pyccl's compiled core cannot load (a broken or half-built install): the
failure is logged, torch goes on without the "pyccl" backend.
"""

import logging


def autoload() -> None:
    """Registers the torch.distributed backend "pyccl" (imports pyccl)."""
    try:
        from pyccl.backend import register

        register()
    except Exception as e:  # noqa: BLE001 - torch must stay importable
        import torch

        logging.getLogger("pyccl").warning(
            "pyccl: the torch.distributed backend was not registered (%s: %s). torch works without it; to use "
            "pyccl, rebuild it against this torch (%s): bash scripts/setup.sh in its checkout, or pip install "
            "--no-build-isolation <pyccl>. TORCH_DEVICE_BACKEND_AUTOLOAD=0 stops torch from loading it.",
            type(e).__name__, e, getattr(torch, "__version__", "?"))
