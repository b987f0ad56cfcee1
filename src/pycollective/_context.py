"""The library's private side of a user communicator.

Each user communicator gets, on first use, a ``Dup()`` cached as an MPI
attribute on it, so library messages can never match the caller's own
messages, and the duplicate is freed when the caller frees the communicator.
The first call on a communicator is therefore collective (as every
pycollective call is anyway).

The context also holds what the library keeps per communicator: scratch
buffers for received chunks, so that steady training loops do not allocate
on every call (large scratch, above ``_KEEP_BYTES``, is not kept: holding
on to hundreds of MB after one large call would surprise a user more than
one allocation per large call costs), and the state that algorithms, the
automatic choice, the fast path and the nonblocking engine build once.
That state is stored under typed :class:`Key` objects owned by the module
that builds it, so two modules can never overwrite each other's entries.
"""

from typing import Callable, Dict, Generic, Optional, TypeVar

import numpy as np
from mpi4py import MPI

__all__ = ["Context", "Key", "get_context", "find_context"]

_KEEP_BYTES = 64 << 20

T = TypeVar("T")


class Key(Generic[T]):
    """A key of per-communicator state (or of a scratch slot); compared by identity.

    Each module creates its keys once at import (``_STATE = Key("shm")``);
    the name only serves ``repr``.
    """

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return f"Key({self.name!r})"


class Context:
    """Private communicator, rank, size, scratch space and cached state of one user comm."""

    __slots__ = ("comm", "rank", "size", "_scratch", "_cache")

    def __init__(self, comm):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self._scratch: Dict[Key, np.ndarray] = {}
        # Values may have a ``free()`` method, called when the context dies
        # (in reverse order of creation: later state may use earlier state).
        self._cache: Dict[Key, object] = {}

    def scratch(self, slot: Key, count: int, dtype) -> np.ndarray:
        """Return an uninitialised array of ``count`` ``dtype`` elements.

        Distinct ``slot`` keys give non-overlapping buffers; the same slot
        returns the same memory on later calls.
        """
        nbytes = count * np.dtype(dtype).itemsize
        if nbytes > _KEEP_BYTES:
            return np.empty(count, dtype)
        buf = self._scratch.get(slot)
        if buf is None or buf.nbytes < nbytes:
            buf = self._scratch[slot] = np.empty(max(nbytes, 4096), np.uint8)
        return buf[:nbytes].view(dtype)

    def cached(self, key: "Key[T]", make: Callable[["Context"], T]) -> T:
        """The state stored under ``key``, built by ``make(self)`` on first use.

        ``make`` is often collective (windows, sub-communicators), so every
        rank must ask for the same key at the same point.
        """
        value = self._cache.get(key)
        if value is None:
            value = self._cache[key] = make(self)
        return value

    def peek(self, key: "Key[T]") -> Optional[T]:
        """The state under ``key`` if it was built, else None (never collective)."""
        return self._cache.get(key)

    def put(self, key: "Key[T]", value: T) -> T:
        """Store (or replace) the state under ``key``; returns it."""
        self._cache[key] = value
        return value

    def free(self):
        """Free every cached state (newest first), the scratch and the private communicator."""
        self._scratch.clear()
        for value in reversed(list(self._cache.values())):
            free = getattr(value, "free", None)
            if free is not None:
                free()
        self._cache.clear()
        if self.comm != MPI.COMM_NULL:
            self.comm.Free()


def _delete(comm, keyval, ctx):
    # Called by MPI when the user's communicator is freed.
    if not MPI.Is_finalized():
        ctx.free()


_KEYVAL = None


def _keyval():
    global _KEYVAL
    if _KEYVAL is None:
        _KEYVAL = MPI.Comm.Create_keyval(delete_fn=_delete)
    return _KEYVAL


def get_context(comm) -> Context:
    """Return the cached :class:`Context` of ``comm`` (collective on first use)."""
    keyval = _keyval()
    ctx = comm.Get_attr(keyval)
    if ctx is None:
        # A plain Intracomm handle: a wrapped pycollective.Comm passed as comm
        # must not route the library's own traffic back through the wrapper.
        ctx = Context(MPI.Intracomm(comm).Dup())
        comm.Set_attr(keyval, ctx)
    return ctx


def find_context(comm) -> Optional[Context]:
    """The :class:`Context` of ``comm`` if it has one, else None (never collective)."""
    if _KEYVAL is None:
        return None
    try:
        return comm.Get_attr(_KEYVAL)
    except MPI.Exception:  # e.g. a freed communicator: the full path says so
        return None
