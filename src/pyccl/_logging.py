"""The ``pyccl`` logger; its level follows PYCCL_LOG_LEVEL like the C++ core's.

Where PYCCL_LOG_LEVEL is set, the logger prints its records to stderr itself,
in the C++ core's form (``[pyccl <pid>] INFO module:line message``), and does
not pass them on to the root logger's handlers (no line twice). Where it is
not set, the records go to whatever handlers the application configured
(``logging.getLogger("pyccl")``), warnings and errors to stderr by Python's
default.
"""

from __future__ import annotations

import logging
import os

_LEVELS = {
    "TRACE": logging.DEBUG,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "OFF": logging.CRITICAL + 1,
}

logger = logging.getLogger("pyccl")
_env = os.environ.get("PYCCL_LOG_LEVEL", "").strip().upper()
if _env:
    logger.setLevel(_LEVELS.get(_env, logging.WARNING))
    if not any(getattr(h, "_pyccl", False) for h in logger.handlers):  # once, also if this module is reloaded
        _handler = logging.StreamHandler()
        _handler._pyccl = True  # type: ignore[attr-defined]
        _handler.setFormatter(logging.Formatter(f"[pyccl {os.getpid()}] %(levelname)s %(module)s:%(lineno)d "
                                                "%(message)s"))
        logger.addHandler(_handler)
        logger.propagate = False
