"""pyccl's environment variables, read at every collective call for a fraction of a microsecond.

``os.environ.get`` costs about a microsecond (a method chain that encodes the
name and decodes the value), and an eager collective reads two or three
variables, so that they may change between calls as tests and users expect.
On POSIX, ``os.environ`` keeps its contents in a dict of bytes that every
change made through it updates; reading that dict gives the same answers in a
tenth of the time. Elsewhere (or if that dict is ever missing) this falls back
to ``os.environ.get``.
"""

from __future__ import annotations

import os
import sys
from typing import Dict, Optional

_ENCODING = sys.getfilesystemencoding()


def _environ_bytes() -> Optional[dict]:
    data = getattr(os.environ, "_data", None) if os.name == "posix" else None
    if not isinstance(data, dict) or not all(isinstance(k, bytes) for k in list(data)[:1]):
        return None
    return data


_DATA = _environ_bytes()
_KEYS: Dict[str, bytes] = {}


def get(name: str) -> Optional[str]:
    """``os.environ.get(name)``."""
    value = raw(name)
    if value is None or _DATA is None:
        return value
    return value.decode(_ENCODING, "surrogateescape")


def raw(name: str):
    """The variable's value as ``os.environ`` stores it (bytes on POSIX), or
    None: the same object until the variable is set again, so a cheap key for
    what was computed from it."""
    if _DATA is None:
        return os.environ.get(name)
    key = _KEYS.get(name)
    if key is None:
        key = _KEYS[name] = name.encode(_ENCODING, "surrogateescape")
    return _DATA.get(key)


def lookup(name: str) -> Optional[tuple]:
    """(dict, key) whose ``dict.get(key)`` is :func:`raw`'s answer for ``name``,
    for code that watches the variable from C++; None where :func:`raw` reads
    ``os.environ.get`` instead."""
    if _DATA is None:
        return None
    raw(name)  # encodes the name once, into _KEYS
    return _DATA, _KEYS[name]


_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


def flag(name: str, unset: bool) -> bool:
    """The on/off variable ``name``, with the C++ side's vocabulary: unset or
    empty gives ``unset``; 1/true/yes/on and 0/false/no/off (any case) give
    their value; anything else raises InvalidArgumentError naming it."""
    value = (get(name) or "").strip().lower()
    if not value:
        return unset
    if value in _ON or value in _OFF:
        return value in _ON
    from .errors import InvalidArgumentError

    raise InvalidArgumentError(f"invalid argument '{name}': expected 1 or 0 (also true/false, yes/no, on/off), "
                               f"got {get(name)!r}")
