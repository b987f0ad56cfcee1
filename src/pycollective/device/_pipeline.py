"""Staging device buffers through pinned host memory: whole buffers, and allreduce in chunks.

Whole buffers (:class:`Mirrors`): every device buffer of a call gets a
pinned host mirror; :meth:`Mirrors.copy_in` copies them to the host (after
the caller's stream has produced them), the host collective runs on the
mirrors, :meth:`Mirrors.copy_out` copies the written ones back and makes the
caller's stream wait for that.  Used by every collective but allreduce, and
by allreduce with mpi4py buffer specifications.

Allreduce in chunks (:func:`allreduce`): the reduction of a chunk is itself
a collective across ranks, so the chunks must be the same on every rank:
their bounds are derived from the element count and the element size only
(:func:`chunk_bounds`), and ranks first agree on the count and the chunk
length (one small host allreduce) when there is more than one chunk, so a
rank with another count raises on every rank before any chunk moves.  Each
chunk has a slot of a pinned buffer (three slots in turn); while the host
reduces chunk k (pycollective's own algorithms, across ranks), the copy to
the host of chunk k+1 runs on one side stream and the copy back of chunk
k-1 on another.  A slot is reused only after its copy back has finished.
The first copy waits for an event recorded on the caller's stream (the
producer's work comes first); the caller's stream waits for the last copy
back, which the host has also synchronized, before the call returns.
"""

import numpy as np
from mpi4py import MPI

from ..runtime import env as _env
from ..data.partition import chunk_bounds as _even_bounds
from . import _pool

SLOTS = 3
# Bytes per chunk: _env.GPU_CHUNK_BYTES (8 MiB), large enough that a chunk's host
# reduction is not dominated by its per-call cost, small enough that the first
# copy and the last copy back, which nothing overlaps, are short.  Cutting a
# 4 MB buffer into four chunks, so that its copies overlap too, took twice as
# long on the GPU machine (docs/results/gpu.md).


def chunk_bytes():
    return _env.GPU_CHUNK_BYTES.get()


def chunk_bounds(count, itemsize, target=None):
    """``[(start, stop)]`` of the chunks of ``count`` elements (no chunk for 0 elements).

    Derived from ``count``, ``itemsize`` and the chunk size only, so every
    rank with the same count gets the same chunks; the chunks are as even
    as possible and none is longer than the target.
    """
    per = max((target or chunk_bytes()) // max(itemsize, 1), 1)
    n = -(-count // per)
    if n == 0:
        return []
    edges = _even_bounds(count, n)
    return list(zip(edges[:-1], edges[1:]))


class _Order:
    """The caller's stream of a buffer, and an event recorded on it when the call started."""

    def __init__(self, buf):
        self.backend = buf.backend
        self.caller = buf.backend.caller_stream(buf)
        self.start = buf.backend.event()
        self.backend.record(self.start, self.caller)


def start_order(buf):
    """Record, on the calling thread, where the caller's stream of ``buf`` stands."""
    return None if buf is None else _Order(buf)


class Mirrors:
    """Pinned host mirrors of a call's device buffers (see the module docstring).

    ``buffers``: the :class:`~._backends.DeviceBuffer` of each device argument.
    Construct on the calling thread (it records the caller's streams);
    :meth:`copy_in` and :meth:`copy_out` may run on another one.
    """

    def __init__(self, buffers):
        self.buffers = list(buffers)
        self.orders = [start_order(b) for b in self.buffers]
        self.pinned = [None] * len(self.buffers)
        self.views = []
        try:
            for i, b in enumerate(self.buffers):
                self.pinned[i] = _pool.take(b.backend, b.nbytes)
                self.views.append(self.pinned[i].array[:b.nbytes].view(b.dtype))
        except BaseException:
            self.release()
            raise

    def copy_in(self):
        """Copy every device buffer into its mirror (the host waits for the copies)."""
        events = []
        for b, order, pinned in zip(self.buffers, self.orders, self.pinned):
            be = b.backend
            side = be.side_stream(b, "d2h")
            be.wait(side, order.start)
            be.d2h(pinned, 0, b, 0, b.nbytes, side)
            ev = be.event()
            be.record(ev, side)
            events.append((be, ev))
        for be, ev in events:
            be.synchronize(ev)

    def copy_out(self, which):
        """Copy the mirrors ``which`` (indices) back; the caller's streams wait for it."""
        events = []
        for i in which:
            b, order, pinned = self.buffers[i], self.orders[i], self.pinned[i]
            be = b.backend
            side = be.side_stream(b, "h2d")
            be.wait(side, order.start)  # after what the caller did to it before the call
            be.h2d(b, 0, pinned, 0, b.nbytes, side)
            ev = be.event()
            be.record(ev, side)
            be.wait(order.caller, ev)
            events.append((be, ev))
        for be, ev in events:
            be.synchronize(ev)

    def release(self):
        for i, pinned in enumerate(self.pinned):
            if pinned is not None:
                _pool.give(pinned)
                self.pinned[i] = None


def allreduce(src, dst, host_call, agree, orders=None):
    """Allreduce with device buffers, staged in chunks (see the module docstring).

    Args:
        src: ``MPI.IN_PLACE``, a :class:`~._backends.DeviceBuffer`, or a flat
            host numpy array (the input, never modified).
        dst: a DeviceBuffer or a flat host numpy array (the result); one of
            ``src``/``dst`` is a DeviceBuffer.
        host_call: ``host_call(host_src_or_IN_PLACE, host_dst)``: the host
            allreduce of one chunk (collective).
        agree: ``agree(values)``: the element-wise MAX over ranks of a small
            int64 array (collective), for the count check.
        orders: ``(src order, dst order)`` from :func:`start_order`, recorded
            on the calling thread (nonblocking calls); None: recorded now.
    """
    in_place = src is MPI.IN_PLACE
    dev_in = dst if in_place else (src if not isinstance(src, np.ndarray) else None)
    dev_out = dst if not isinstance(dst, np.ndarray) else None
    some = dev_in or dev_out
    dtype = some.dtype
    itemsize = dtype.itemsize
    count = dst.count if dev_out is not None else dst.size
    if orders is None:
        orders = (start_order(dev_in), start_order(dev_out) if dev_out is not dev_in else None)
    in_order, out_order = orders
    if out_order is None and dev_out is not None:
        out_order = in_order
    bounds = chunk_bounds(count, itemsize)
    if len(bounds) > 1:
        per = bounds[0][1] - bounds[0][0]
        seen = agree(np.array([count, -count, per, -per], np.int64))
        if seen[0] != -seen[1] or seen[2] != -seen[3]:
            raise ValueError(f"allreduce of device memory: counts differ across ranks (from "
                             f"{-int(seen[1])} to {int(seen[0])} elements; chunks from "
                             f"{-int(seen[3])} to {int(seen[2])})")
    if not bounds:  # nothing to copy, but the collective still agrees with the others
        empty = np.empty(0, dtype)
        host_call(MPI.IN_PLACE if in_place else empty, empty)
        return
    longest = max(b - a for a, b in bounds) * itemsize
    be_in = dev_in.backend if dev_in is not None else None
    be_out = dev_out.backend if dev_out is not None else None
    pinned = _pool.take(some.backend, SLOTS * longest)
    slots = [pinned.array[i * longest:(i + 1) * longest] for i in range(SLOTS)]
    d2h_done, h2d_done = [None] * len(bounds), [None] * len(bounds)
    try:
        if dev_in is not None:
            d2h = be_in.side_stream(dev_in, "d2h")
            be_in.wait(d2h, in_order.start)
        if dev_out is not None:
            h2d = be_out.side_stream(dev_out, "h2d")
            be_out.wait(h2d, out_order.start)

        def free_slot(k):
            # Slot k % SLOTS last held chunk k - SLOTS: its copy back must be done.
            if k >= SLOTS and h2d_done[k - SLOTS] is not None:
                be_out.synchronize(h2d_done[k - SLOTS])

        def fetch(k):
            free_slot(k)
            a, b = bounds[k]
            be_in.d2h(pinned, (k % SLOTS) * longest, dev_in, a * itemsize, (b - a) * itemsize,
                      d2h)
            d2h_done[k] = be_in.event()
            be_in.record(d2h_done[k], d2h)

        if dev_in is not None:
            fetch(0)
        for k, (a, b) in enumerate(bounds):
            if dev_in is not None and k + 1 < len(bounds):
                fetch(k + 1)  # in flight while this chunk is reduced
            slot = slots[k % SLOTS][:(b - a) * itemsize].view(dtype)
            if dev_in is not None:
                be_in.synchronize(d2h_done[k])
                chunk_in = slot
            else:
                chunk_in = src[a:b]
            if dev_out is None:
                host_call(chunk_in, dst[a:b])
                continue
            if chunk_in is slot:
                host_call(MPI.IN_PLACE, slot)
            else:
                free_slot(k)
                host_call(chunk_in, slot)
            be_out.h2d(dev_out, a * itemsize, pinned, (k % SLOTS) * longest,
                       (b - a) * itemsize, h2d)
            h2d_done[k] = be_out.event()
            be_out.record(h2d_done[k], h2d)
        if dev_out is not None:
            be_out.wait(out_order.caller, h2d_done[-1])
    finally:
        # No copy may use the slots once they are back in the pool.
        for be, events in ((be_in, d2h_done), (be_out, h2d_done)):
            for ev in events:
                if ev is not None:
                    be.synchronize(ev)
        _pool.give(pinned)
