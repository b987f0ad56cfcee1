"""Arrays the ranks of a node read where they are (``pycollective.shared_empty``).

``shm``'s large calls otherwise reach a peer's input and output through a
copy: ``process_vm_readv`` into a cache-sized staging block, or the peer's
copy into its shared slot.  An array from ``shared_empty`` (:mod:`~pycollective.collectives.allocate`) lives in a
segment every rank of the node maps (each rank owns one region of it), so a
peer's slice is an ordinary view and the reduction reads it straight from
memory.  At 1e7 float32 ``shm`` took 0.73 of its time on plain arrays at
N = 4 and 0.77 at N = 8 (docs/results/shared.md).

How a call finds out: each rank writes, before its call's first sync, where
its ``src`` and ``dst`` lie (allocation number and byte offset, or -1) into
its row of the node's address headers (:attr:`NodeGroup.cma`, words 4-7);
after that sync every rank reads every row.  Nothing has to be decided
together: peer by peer, a registered buffer is read in place and any other
buffer the way it always is, so a call may mix both kinds.  These large
paths end with a sync, so no rank returns (and lets its buffers change)
while another still reads them.

Allocation and release are collective over the communicator, so every rank
numbers its allocations alike and holds every rank's region mapped from
``shared_empty`` to ``release`` (or until the communicator is
freed): a rank that publishes allocation k can count on every peer having
it mapped.  An array that outlives ``release`` is plain memory from then
on (its region is no longer registered, so no peer reads it).
"""

import bisect
import math

import numpy as np

from ..runtime.context import Key
from .group import whole_node

__all__ = ["Registry", "registry_of", "allocate", "forget", "NONE"]

NONE = -1
SRC, DST = 0, 2  # column of the allocation number in a row (the offset follows it)
_KEY = Key("shared")


class Registry:
    """The node's shared allocations on this rank (one per communicator, in its context)."""

    def __init__(self, group):
        self.group = group
        self.rank, self.size = group.rank, group.size
        # Rows of the node's address headers: src number, offset, dst number, offset.
        self.rows = group.cma[:, 4:8]  # NONE everywhere since the group was made
        self.entries = {}  # number -> (every rank's region as uint8, region bytes)
        self.spans = []    # (start, end, number) of this rank's regions, sorted by start
        self.next_number = 0

    def allocate(self, region, shape, dtype):
        """This rank's array in a new segment of ``region`` bytes per rank (collective)."""
        segment = self.group.new_segment(region * self.size)
        data = segment.bytes()
        regions = [data[q * region:(q + 1) * region] for q in range(self.size)]
        number, self.next_number = self.next_number, self.next_number + 1
        self.entries[number] = (regions, region)
        start = regions[self.rank].ctypes.data
        bisect.insort(self.spans, (start, start + region, number))
        count = math.prod(shape)
        return regions[self.rank][:count * dtype.itemsize].view(dtype).reshape(shape)

    def locate(self, array):
        """``(number, byte offset)`` of ``array`` in this rank's region, or None."""
        start = array.ctypes.data
        # The last region starting at or before ``start`` is the only candidate
        # (regions are separate mappings, so they do not overlap).
        i = bisect.bisect_right(self.spans, (start, math.inf, math.inf)) - 1
        if i < 0:
            return None
        base, end, number = self.spans[i]
        if start + array.nbytes > end:
            return None
        return number, start - base

    def forget(self, array):
        """Drop the allocation holding ``array``; False if none does."""
        found = self.locate(array)
        if found is None:
            return False
        del self.entries[found[0]]
        self.spans = [span for span in self.spans if span[2] != found[0]]
        return True

    def publish(self, src, dst):
        """Write where this call's ``src`` and ``dst`` lie (before the call's first sync);
        return whether each is a shared allocation."""
        row = self.rows[self.rank]
        shared = []
        for column, array in ((SRC, src), (DST, dst)):
            found = self.locate(array) if array.nbytes else None
            row[column:column + 2] = found if found is not None else (NONE, 0)
            shared.append(found is not None)
        return tuple(shared)

    def peer_buffers(self, count, dtype):
        """``(srcs, dsts)``: :meth:`peers` of both columns."""
        return self.peers(SRC, count, dtype), self.peers(DST, count, dtype)

    def peers(self, column, count, dtype):
        """Per node rank, its published ``src`` (``column`` SRC) or ``dst`` (DST) as a
        view here, or None where that rank's buffer is not a shared allocation (or is
        this rank's own).  After the sync that follows every rank's :meth:`publish`."""
        out = []
        nbytes = count * np.dtype(dtype).itemsize
        for q in range(self.size):
            number, offset = (int(v) for v in self.rows[q, column:column + 2])
            if q == self.rank or number == NONE:
                out.append(None)
                continue
            entry = self.entries.get(number)
            if entry is None or not 0 <= offset <= entry[1] - nbytes:
                # Allocations and releases are collective, so a peer's number is
                # always one this rank holds, unless the ranks released in different
                # orders; then reading on would read memory that is not that buffer.
                raise RuntimeError(
                    f"node rank {q} passed bytes [{offset}, {offset + nbytes}) of shared "
                    f"allocation #{number}, which node rank {self.rank} does not hold "
                    "(pycollective.release must be called by every rank, in the same order)")
            out.append(entry[0][q][offset:offset + nbytes].view(dtype))
        return out

    def free(self):
        self.entries, self.spans = {}, []


def registry_of(group, ctx):
    """The context's :class:`Registry` if it ever allocated, else None (never collective)."""
    registry = ctx.peek(_KEY)
    return registry if registry is not None and registry.group is group else None


def allocate(ctx, shape, dtype):
    """This rank's array of a new node allocation (collective; the caller holds the lock
    and every rank has arrived).  A plain array where the ranks span several nodes."""
    region = max(ctx.comm.allgather(math.prod(shape) * dtype.itemsize))
    group = whole_node(ctx) if ctx.size > 1 else None
    if group is None:
        return np.empty(shape, dtype)
    registry = ctx.cached(_KEY, lambda c: Registry(group))
    return registry.allocate(max(region, 1), shape, dtype)


def forget(ctx, array):
    """Drop the allocation holding ``array`` on every rank (collective; the caller holds
    the lock and every rank has arrived); False where it is no shared allocation.

    Raises:
        ValueError: on every rank, if the ranks' arrays are not all from the same
            allocation (or not all from none): dropping different ones would leave
            a rank unable to read what a peer publishes later.  Nothing is dropped.
    """
    registry = ctx.peek(_KEY)
    found = registry.locate(array) if registry is not None else None
    numbers = ctx.comm.allgather(None if found is None else found[0])
    if len(set(numbers)) > 1:
        def name(number):
            return "plain memory" if number is None else f"shared allocation #{number}"
        raise ValueError(
            f"release on {ctx.label}: the ranks passed arrays of different allocations ("
            + ", ".join(f"rank {q}: {name(v)}" for q, v in enumerate(numbers))
            + "); every rank must release its array of the same shared_empty call")
    return found is not None and registry.forget(array)
