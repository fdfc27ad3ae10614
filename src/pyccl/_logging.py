"""The ``pyccl`` logger; its level follows PYCCL_LOG_LEVEL like the C++ core's."""

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
_env = os.environ.get("PYCCL_LOG_LEVEL", "").upper()
if _env:
    logger.setLevel(_LEVELS.get(_env, logging.WARNING))
