"""A reusable pool of pinned host buffers, per backend.

Pinning memory costs far more than copying it (page-locking, a driver
call), so staged calls take their host buffers from here and give them
back: after the first call of a size, no call allocates.  A buffer is given
back only when no copy into or out of it is in flight (the staged call
synchronizes its last events first), so the next call may use it at once.
"""

import threading

from ..runtime import env as _env

_MiB = 1 << 20
_lock = threading.Lock()
_free = {}          # backend -> [Pinned], smallest first
_kept_bytes = 0


def _limit():
    """Bytes of idle pinned buffers kept (PYCOLLECTIVE_GPU_POOL_BYTES, default 1 GiB)."""
    return _env.GPU_POOL_BYTES.get()


def _rounded(nbytes):
    # Powers of two from 1 MiB: calls of nearby sizes share buffers.
    size = _MiB
    while size < nbytes:
        size *= 2
    return size


def take(backend, nbytes):
    """A pinned buffer of at least ``nbytes`` bytes (``.array`` may be longer)."""
    global _kept_bytes
    with _lock:
        buffers = _free.get(backend, [])
        for i, pinned in enumerate(buffers):
            if pinned.array.size >= nbytes:
                del buffers[i]
                _kept_bytes -= pinned.array.size
                return pinned
    return backend.pinned(_rounded(nbytes))


def give(pinned):
    """Give ``pinned`` back (no copy may still use it)."""
    global _kept_bytes
    with _lock:
        buffers = _free.setdefault(pinned.backend, [])
        buffers.append(pinned)
        buffers.sort(key=lambda p: p.array.size)
        _kept_bytes += pinned.array.size
        while _kept_bytes > _limit() and buffers:
            dropped = buffers.pop(0)
            _kept_bytes -= dropped.array.size


def clear():
    """Drop every idle buffer (tests)."""
    global _kept_bytes
    with _lock:
        _free.clear()
        _kept_bytes = 0
