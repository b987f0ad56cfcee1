"""The library's private side of a user communicator.

Each user communicator gets, on first use, a ``Dup()`` cached as an MPI
attribute on it, so library messages can never match the caller's own
messages, and the duplicate is freed when the caller frees the communicator.
The first call on a communicator is therefore collective (as every
pycollective call is anyway).

The context also keeps scratch buffers for received chunks so that steady
training loops do not allocate on every call.  Large scratch (above
``_KEEP_BYTES``) is not kept: holding on to hundreds of MB after one large
call would surprise a user more than one allocation per large call costs.
"""

import numpy as np
from mpi4py import MPI

__all__ = ["get_context"]

_KEEP_BYTES = 64 << 20


class Context:
    """Private communicator, rank, size and scratch space of one user comm."""

    __slots__ = ("comm", "rank", "size", "_scratch", "cache")

    def __init__(self, comm):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self._scratch = {}
        # Per-communicator state an algorithm builds once (sub-communicators,
        # shared windows, persistent requests), keyed by the algorithm.  Each
        # value may have a ``free()`` method, called when the context dies.
        self.cache = {}

    def scratch(self, slot, count, dtype):
        """Return an uninitialised array of ``count`` ``dtype`` elements.

        Distinct ``slot`` values give non-overlapping buffers; the same slot
        returns the same memory on later calls.
        """
        nbytes = count * np.dtype(dtype).itemsize
        if nbytes > _KEEP_BYTES:
            return np.empty(count, dtype)
        buf = self._scratch.get(slot)
        if buf is None or buf.nbytes < nbytes:
            buf = self._scratch[slot] = np.empty(max(nbytes, 4096), np.uint8)
        return buf[:nbytes].view(dtype)

    def cached(self, key, make):
        """``self.cache[key]``, built by ``make(self)`` on first use.

        ``make`` is often collective (windows, sub-communicators), so every
        rank must ask for the same key at the same point.
        """
        value = self.cache.get(key)
        if value is None:
            value = self.cache[key] = make(self)
        return value

    def free(self):
        self._scratch.clear()
        for value in self.cache.values():
            free = getattr(value, "free", None)
            if free is not None:
                free()
        self.cache.clear()
        if self.comm != MPI.COMM_NULL:
            self.comm.Free()


def _delete(comm, keyval, ctx):
    # Called by MPI when the user's communicator is freed.
    if not MPI.Is_finalized():
        ctx.free()


_KEYVAL = None


def get_context(comm):
    """Return the cached :class:`Context` of ``comm`` (collective on first use)."""
    global _KEYVAL
    if _KEYVAL is None:
        _KEYVAL = MPI.Comm.Create_keyval(delete_fn=_delete)
    ctx = comm.Get_attr(_KEYVAL)
    if ctx is None:
        # A plain Intracomm handle: a wrapped pycollective.Comm passed as comm
        # must not route the library's own traffic back through the wrapper.
        ctx = Context(MPI.Intracomm(comm).Dup())
        comm.Set_attr(_KEYVAL, ctx)
    return ctx
