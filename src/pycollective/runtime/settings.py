"""Run-time settings that every rank must share: one home for their values and overrides.

Each setting has an environment variable (:mod:`~pycollective.runtime.env`, read at use) and a
function that overrides it for the process (``set_check``, ``set_timeout``,
``set_segment_bytes``); the timeout can also be set per communicator and per
call.  :func:`resolve` turns them into the :class:`Settings` one call runs
with, which become part of the call's agreed facts and fingerprint.  Every
override bumps :data:`epoch`, so cached call plans notice the change.
"""

import math
from typing import NamedTuple, Optional

from . import env as _env

__all__ = ["Settings", "resolve", "set_check", "check_enabled", "set_timeout", "timeout",
           "set_segment_bytes", "segment_bytes", "parse_timeout", "epoch"]

class _Default:
    """The default of an optional setting argument (shown as ``default``)."""

    def __repr__(self):
        return "default"


_UNSET = _Default()
_check = None          # set_check(); None: PYCOLLECTIVE_CHECK
_timeout = _UNSET      # set_timeout(); unset: PYCOLLECTIVE_TIMEOUT_S
_segment = None        # set_segment_bytes(); None: PYCOLLECTIVE_SEGMENT_BYTES
epoch = 0              # bumped by every override


class Settings(NamedTuple):
    """What a call runs with that must be the same on every rank."""

    check: bool
    timeout: Optional[float]       # seconds without progress; None: no limit
    stall_warn: Optional[float]    # seconds before a StallWarning; None: never
    segment_bytes: int             # ring_pipelined's segment


def _bump():
    global epoch
    epoch += 1


def parse_timeout(seconds) -> Optional[float]:
    """A timeout argument: positive seconds, or None / 0 / inf for no limit.

    Raises:
        ValueError: a negative or non-numeric value.
    """
    if seconds is None:
        return None
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        raise ValueError(f"timeout must be a number of seconds or None, got {seconds!r}") \
            from None
    if value != value or value < 0:
        raise ValueError(f"timeout must be >= 0 seconds (0 or None: no limit), got {seconds!r}")
    return None if value == 0 or math.isinf(value) else value


def check_enabled() -> bool:
    """Whether calls run the agreement step: :func:`set_check`, else ``PYCOLLECTIVE_CHECK``."""
    return _check if _check is not None else _env.CHECK.get()


def set_check(enabled: bool) -> bool:
    """Turn the agreement step on or off for this process; returns the previous setting."""
    global _check
    previous, _check = check_enabled(), bool(enabled)
    _bump()
    return previous


def timeout() -> Optional[float]:
    """The process-wide timeout: :func:`set_timeout`, else ``PYCOLLECTIVE_TIMEOUT_S``."""
    return _env.TIMEOUT_S.get() if _timeout is _UNSET else _timeout


def set_timeout(seconds) -> Optional[float]:
    """Set the process-wide timeout (None or 0: no limit); returns the previous one."""
    global _timeout
    previous, _timeout = timeout(), parse_timeout(seconds)
    _bump()
    return previous


def segment_bytes() -> int:
    """ring_pipelined's segment: :func:`set_segment_bytes`, else ``PYCOLLECTIVE_SEGMENT_BYTES``."""
    return _segment if _segment is not None else _env.SEGMENT_BYTES.get()


def set_segment_bytes(nbytes) -> int:
    """Set ring_pipelined's segment size in bytes; returns the previous one."""
    global _segment
    nbytes = int(nbytes)
    if nbytes <= 0:
        raise ValueError(f"segment size must be positive, got {nbytes}")
    previous, _segment = segment_bytes(), nbytes
    _bump()
    return previous


def resolve(call_timeout=_UNSET, comm_timeout=_UNSET) -> Settings:
    """The settings of one call: the call's timeout, else the communicator's, else the process's.

    Raises:
        ValueError: an environment variable or the timeout does not parse.
    """
    if call_timeout is not _UNSET:
        t = parse_timeout(call_timeout)
    elif comm_timeout is not _UNSET:
        t = comm_timeout
    else:
        t = timeout()
    return Settings(check_enabled(), t, _env.STALL_WARN_S.get(), segment_bytes())


UNSET = _UNSET
