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
        logging.getLogger("pyccl").warning("pyccl: the torch.distributed backend was not registered: %s", e)
