"""Shared memory among the ranks of one node: barriers, slots, a MAX board, node steps.

The primitives the shared-memory algorithms ("shm", "hierarchical") and the
agreement step are built from.  Everything here works on a communicator
whose ranks share memory (``Split_type(COMM_TYPE_SHARED)``); all
constructors are collective over it.

* :class:`FlagBarrier`: a barrier through counters in a shared window.
* :class:`SharedSlots`: one slot per rank in a shared window that grows on
  demand, with two alternating regions for small messages.
* :class:`SharedMax`: element-wise MAX of a small int64 vector over the
  node's ranks (the agreement step's reduction).
* The node steps of a sliced reduction: :func:`copy_in`,
  :func:`reduce_own_slice`, :func:`copy_out`, :func:`reduce_block`.
"""

import os

import numpy as np
from mpi4py import MPI

__all__ = ["FlagBarrier", "SharedSlots", "SharedMax", "node_comm", "reduce_block", "copy_in",
           "reduce_own_slice", "copy_out", "BLOCK_BYTES", "DOUBLE_LIMIT"]

BLOCK_BYTES = 128 << 10      # reduction block: N inputs + output stay in a 2 MB L2
DOUBLE_LIMIT = 1 << 20       # up to this, alternate two regions (no trailing sync)
_ALIGN = 4096


def node_comm(comm):
    """``comm``'s ranks that share memory with this one, and whether that is all of them.

    Returns:
        ``(node, whole)``: a new communicator (the caller frees it) and
        ``whole``, True iff every rank of ``comm`` is on this node -- the
        same answer on every rank (each rank sees its node smaller than
        ``comm`` exactly when the communicator spans several nodes).
    """
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    return node, node.Get_size() == comm.Get_size()


def _round_capacity(nbytes):
    """Window bytes per rank for a need of ``nbytes`` (grows geometrically up to 64 MB)."""
    nbytes = max(nbytes, _ALIGN)
    if nbytes <= 64 << 20:
        return 1 << (nbytes - 1).bit_length()
    step = 16 << 20
    return -(-nbytes // step) * step


class FlagBarrier:
    """A barrier through shared memory for the ranks of a node-local communicator.

    The MPI-3 pattern of synchronising with ``Win_sync`` plus a flag: every
    rank has a counter in its own cache line of a shared window; ``sync``
    issues ``Win.Sync`` (a memory barrier: this rank's earlier stores are
    visible before the counter moves), raises its counter, waits until every
    other counter has reached the same value, and issues ``Win.Sync`` again
    (later loads happen after).  A few cache-line transfers instead of an
    MPI_Barrier's messages, which is most of a small allreduce.  Waiting
    ranks yield the core after a short spin, so oversubscribed ranks (more
    ranks than cores) let the rank they wait for run.

    A waiting rank also calls into MPI now and then (``Iprobe``, which
    matches nothing we would take): a rank that has finished an algorithm
    on point-to-point messages may still owe its partner the last step of a
    transfer (MPICH completes a large send only when the receiver's progress
    engine acknowledges it), and a rank spinning here without entering MPI
    would leave that partner waiting for ever while the partner is what
    this rank waits for.  Collective to create.
    """

    def __init__(self, comm):
        self.comm = comm.Dup()  # for Iprobe: nothing is ever sent on it
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.win = MPI.Win.Allocate_shared(64, 1, comm=comm)
        self.win.Lock_all(MPI.MODE_NOCHECK)
        flags = [np.frombuffer(self.win.Shared_query(q)[0], np.int64, 1)
                 for q in range(self.size)]
        flags[self.rank][0] = 0
        self._flag = flags[self.rank]
        self._others = [f for q, f in enumerate(flags) if q != self.rank]
        self._seq = 0
        comm.Barrier()  # every flag is zeroed before anyone waits on it

    def sync(self):
        win = self.win
        win.Sync()
        self._seq = seq = self._seq + 1
        self._flag[0] = seq
        spins = 0
        for flag in self._others:
            while flag[0] < seq:
                spins += 1
                if spins & 15 == 0:
                    self.comm.Iprobe()  # MPI progress for sends still in flight
                    if spins > 64:
                        os.sched_yield()
        win.Sync()

    def free(self):
        if self.win is not None:
            self.win.Unlock_all()
            self.win.Free()
            self.win = None
            self.comm.Free()


class SharedMax:
    """Element-wise MAX over the ranks of a node of a small int64 vector, through shared memory.

    What the agreement step of every pycollective call needs (see
    ``_agree``), without an MPI collective: each rank writes its vector
    into its row of a shared board, one :class:`FlagBarrier` sync, each rank
    reads all rows.  Two boards are used alternately, so the next call can
    write while a slow rank still reads the last one (it cannot reach the
    board of call k+2 before every rank has entered call k+1's sync).  When
    all rows are equal, which is the case of agreeing ranks, the maximum is
    any row, found by one byte comparison.
    """

    WIDTH = 16  # int64 per row: one 128-byte line pair, room for the facts

    def __init__(self, comm):
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.barrier = FlagBarrier(comm)
        nbytes = 2 * self.size * self.WIDTH * 8
        self.win = MPI.Win.Allocate_shared(nbytes if self.rank == 0 else 0, 1, comm=comm)
        self.win.Lock_all(MPI.MODE_NOCHECK)
        board = np.frombuffer(self.win.Shared_query(0)[0], np.int64, nbytes // 8)
        self.boards = board.reshape(2, self.size, self.WIDTH)
        self.parity = 0

    def max(self, values):
        """Replace ``values`` (at most WIDTH int64) by its element-wise max over the ranks."""
        board = self.boards[self.parity]
        self.parity ^= 1
        k = values.size
        mine = board[self.rank]
        mine[:k] = values
        mine[k:] = 0
        self.win.Sync()
        self.barrier.sync()
        self.win.Sync()
        rows = board[:, :k]
        if rows.tobytes() != values.tobytes() * self.size:
            np.max(rows, axis=0, out=values)

    def free(self):
        self.barrier.free()
        if self.win is not None:
            self.win.Unlock_all()
            self.win.Free()
            self.win = None

    @classmethod
    def on(cls, comm):
        """A :class:`SharedMax` on ``comm`` if all its ranks share memory, else None (collective)."""
        node, whole = node_comm(comm)
        try:
            return cls(node) if whole else None
        finally:
            node.Free()


class SharedSlots:
    """A shared window with one slot per rank of a node-local communicator.

    ``comm`` must be a communicator whose ranks share memory; this object
    owns it and frees it in :meth:`free`.  All methods are collective over
    ``comm`` when they allocate or sync.
    """

    def __init__(self, comm):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.win = None
        self.capacity = 0
        self.raw = []          # uint8 view of every rank's whole slot
        self.views = {}        # (offset, nbytes, dtype) -> tuple of typed slot views
        self.parity = 0
        self.dirty = False     # True while a rank may still read the last region
        self.barrier = FlagBarrier(comm)

    def ensure(self, nbytes):
        """Make every slot hold at least ``nbytes`` (collective when it grows)."""
        if nbytes <= self.capacity:
            return
        capacity = _round_capacity(nbytes)
        self._release()
        win = MPI.Win.Allocate_shared(capacity, 1, comm=self.comm)
        win.Lock_all(MPI.MODE_NOCHECK)  # one passive epoch for the window's life
        raw = []
        for q in range(self.size):
            buf, _ = win.Shared_query(q)
            raw.append(np.frombuffer(buf, np.uint8, capacity))
        self.win, self.capacity, self.raw = win, capacity, raw

    def slots(self, offset, nbytes, dtype):
        """Typed views of ``nbytes`` at ``offset`` in every rank's slot (cached)."""
        key = (offset, nbytes, dtype)
        views = self.views.get(key)
        if views is None:
            if len(self.views) > 256:
                self.views.clear()
            views = self.views[key] = tuple(
                raw[offset:offset + nbytes].view(dtype) for raw in self.raw)
        return views

    def sync(self):
        """Make every rank's stores to the window visible to all, then continue together.

        ``Win.Sync`` on the slots around a :class:`FlagBarrier` sync.
        """
        win = self.win
        if win is not None:
            win.Sync()
        self.barrier.sync()
        if win is not None:
            win.Sync()

    def begin(self, nbytes):
        """Prepare a call on ``nbytes`` per slot; return (byte offset, needs trailing sync).

        Messages up to ``DOUBLE_LIMIT`` alternate between two halves of the
        slot and leave without a trailing sync ("dirty": a slow rank may still
        read the last region).  A larger message uses the whole slot from
        offset 0, which overlaps both halves, so a dirty window is synced
        first.  Collective; every decision depends only on ``nbytes``.
        """
        if nbytes <= DOUBLE_LIMIT:
            self.ensure(2 * nbytes)
            offset = self.parity * (self.capacity // 2)
            self.parity ^= 1
            self.dirty = True
            return offset, False
        self.ensure(nbytes)
        if self.dirty:
            self.sync()
            self.dirty = False
        return 0, True

    def _release(self):
        if self.win is not None:
            # Another rank may still be reading our slot (small path, no
            # trailing sync): wait for everyone before the memory goes.
            self.comm.Barrier()
            self.win.Unlock_all()
            self.win.Free()
            self.win, self.capacity, self.raw = None, 0, []
            self.views.clear()
            self.parity = 0
            self.dirty = False

    def free(self):
        self._release()
        if self.barrier is not None:
            self.barrier.free()
            self.barrier = None
        if self.comm != MPI.COMM_NULL:
            self.comm.Free()
            self.comm = MPI.COMM_NULL


def _operands(src, slots, rank, lo, hi):
    return [src[lo:hi] if q == rank else slot[lo:hi] for q, slot in enumerate(slots)]


def reduce_block(kernel, operands, out):
    """``out = operands[0] op operands[1] op ...`` in that order."""
    kernel(operands[0], operands[1], out)
    for x in operands[2:]:
        kernel(out, x, out)


def copy_in(src, mine, rank, bounds):
    """Copy ``src`` into the own slot ``mine``, except this rank's slice."""
    lo, hi = bounds[rank], bounds[rank + 1]
    if lo:
        mine[:lo] = src[:lo]
    if hi < src.size:
        mine[hi:] = src[hi:]


def reduce_own_slice(kernel, src, slots, rank, bounds, dst=None):
    """Reduce slice ``rank`` of all inputs into the own slot (and ``dst`` if given)."""
    lo, hi = bounds[rank], bounds[rank + 1]
    if hi == lo:
        return
    mine = slots[rank]
    block = max(1, BLOCK_BYTES // src.itemsize)
    for b in range(lo, hi, block):
        e = min(b + block, hi)
        out = mine[b:e]
        reduce_block(kernel, _operands(src, slots, rank, b, e), out)
        if dst is not None:
            dst[b:e] = out  # still in cache


def copy_out(dst, slots, rank, bounds, skip_own=True):
    for q, slot in enumerate(slots):
        if q == rank and skip_own:
            continue
        lo, hi = bounds[q], bounds[q + 1]
        if hi > lo:
            dst[lo:hi] = slot[lo:hi]

