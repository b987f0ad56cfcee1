"""Public: :func:`shared_empty` and :func:`release`, node memory that ``shm`` reads in place.

The allocations themselves live in :mod:`~pycollective.node.arrays`; this module is the
public, collective side: the communicator's lock (bounded, like a
collective's), every rank's arrival (bounded), then the allocation.
"""

import operator

import numpy as np

from ..data.kernels import as_dtype
from ..runtime import settings as _settings, watch as _watch
from ..node import arrays as _arrays
from .call import hold, resolve_comm
from ..runtime.context import comm_settings, get_context

__all__ = ["shared_empty", "release"]


def _entered(comm, what):
    """``comm``'s context with its lock taken and every rank arrived (both bounded)."""
    comm = resolve_comm(comm)
    ctx = get_context(comm)
    hold(ctx, what, _settings.resolve(_settings.UNSET, comm_settings(comm).get(
        "timeout", _settings.UNSET)).timeout)
    try:
        _watch.arrive(ctx.comm, what)
    except BaseException:
        ctx.lock.release()
        raise
    return ctx


def shared_empty(shape, dtype=np.float32, *, comm=None):
    """An array the other ranks of this node can read in place; collective over ``comm``.

    ``allreduce`` with ``"shm"`` (or ``"auto"`` where it picks ``"shm"``)
    reads the peers' slices of such arrays straight from their memory above
    1 MiB, instead of copying them through the kernel or a shared slot: at
    1e7 float32 0.73 of the time at 4 ranks, 0.77 at 8 on our 2-core
    machine (docs/results/shared.md).  Allocate buffers that are
    reduced again and again (gradient buckets) once, this way.

    Every rank must call it, in the same order as its other collectives on
    ``comm``; shapes and dtypes may differ between ranks.  The contents are
    undefined, as with ``numpy.empty``.  Where ``comm`` spans several nodes
    (or has one rank) the result is a plain ``numpy.empty`` array.  The
    node's memory is held until every rank calls :func:`release` on its
    array, or ``comm`` is freed.
    """
    dtype = as_dtype(dtype)
    shape = ((operator.index(shape),) if isinstance(shape, (int, np.integer))
             else tuple(operator.index(s) for s in shape))
    if any(s < 0 for s in shape):
        raise ValueError(f"shared_empty: negative dimension in shape {shape}")
    if dtype.hasobject:
        raise TypeError("shared_empty: object arrays cannot be shared between processes")
    ctx = _entered(comm, "shared_empty")
    try:
        return _arrays.allocate(ctx, shape, dtype)
    finally:
        ctx.lock.release()


def release(array, *, comm=None) -> bool:
    """Hand back the node memory of a :func:`shared_empty` array; collective over ``comm``.

    Every rank calls it with its own array from the same :func:`shared_empty`
    call.  ``array`` stays valid as this process's memory, copied by
    allreduce like any other buffer.  Returns True if ``array`` lay in a
    shared allocation of ``comm`` on this rank.
    """
    array = np.asarray(array)
    ctx = _entered(comm, "release")
    try:
        return _arrays.forget(ctx, array)
    finally:
        ctx.lock.release()
