"""Shared-memory allreduce: every rank reduces its slice straight from the others' memory.

All ranks of the communicator must share memory (one node).  With M elements
split by :func:`~pycollective.partition` into N slices, rank i owns slice i:
it combines slice i of all N inputs, operands in rank order 0..N-1, and
every rank then copies the other slices of the result.  No data travel in
point-to-point messages; there are two ways to reach the others' memory.

Single copy (messages above ``_DOUBLE_LIMIT`` = 1 MiB, where the system
allows it): each rank publishes the addresses of its ``src`` and ``dst`` in
a small shared window; sync; rank i reads slice i of every other rank's
``src`` with ``process_vm_readv`` (Linux cross-memory attach) into a staging
block of about ``_CMA_STAGE_BYTES`` in total, still in cache when the kernel
combines it with its own operand straight into ``dst``; sync; rank i reads
slice q of rank q's ``dst`` straight into its own ``dst`` for every q != i;
sync (nobody returns, and lets its ``dst`` change, while others read it).
Nothing is staged through shared memory and the caller's buffers are read
where they are.  Whether the system allows it is probed once per
communicator and agreed by all ranks; ``PYCOLLECTIVE_SHM_CMA=0`` turns it off.

Shared window (smaller messages, or no cross-memory reads): each rank owns a
slot of a shared window (``MPI.Win.Allocate_shared`` on
``Split_type(COMM_TYPE_SHARED)``) big enough for the whole vector; slot q is
a plain numpy view on every rank.

1. Copy-in: rank i copies its input *except its own slice* into its slot.  Its
   own slice is only ever read by itself, from its private ``src``.
2. Sync.
3. Reduce: rank i combines slice i of all N inputs (its own from ``src``)
   into slot_i[slice i], block by block (``_BLOCK_BYTES``) so the partial
   result stays in cache across the N-1 kernel passes, and copies each block
   into ``dst`` while it is still in cache.
4. Sync.
5. Copy-out: rank i copies slice q from slot_q into ``dst`` for every q != i.
6. Above 1 MiB, a last sync, so that the next call's copy-in cannot
   overwrite a slot another rank is still copying out.  Smaller messages
   skip it: the window holds two regions used alternately, and a rank can
   only reach the copy-in of call k+2 (same region as call k) after every
   rank has entered call k+1's first sync, i.e. finished call k.

Small messages (up to ``_REPLICATE_BYTES`` = 4 KiB) take a shorter path:
every rank copies its whole input into its slot, one sync, and every rank
reduces the whole vector itself, operands in rank order 0..N-1.

Results are bitwise identical on all ranks: each element is computed once
(sliced paths) or by the same operations on the same bits everywhere (small
path).

Sync is :class:`FlagBarrier`: ``Win.Sync`` plus counters in shared memory
(the MPI-3 "synchronise through shared memory" pattern, all windows under a
``Lock_all`` epoch held for their life), which costs a few cache-line
transfers instead of an ``MPI_Barrier``; waiting ranks keep MPI progress
going and yield the core when they spin long.

Windows are cached in the context (``ctx.cache["shm"]``) and only grow:
allocation is collective, and the decision to grow depends only on the
message size in bytes, which the agreement step checks is the same on all
ranks.  A grown window is kept for later calls (a training loop reduces the
same sizes every step); it is freed with the communicator.

If the communicator spans several nodes, "shm" raises the same
``ValueError`` on every rank (every rank finds its node smaller than the
communicator, without exchanging a message; :func:`on_one_node` asks
first); use "hierarchical" there.  The ranks-per-node emulation of
"hierarchical" does not apply to "shm".

Cost (s bytes per element, f = (N-1)/N): 2-3 syncs of ⌈log2 N⌉α each, the
reads (or copy-in) and the copy-out of f·M·s bytes each (charged at β: on one
node a transfer *is* a memory copy), and the reduction of f·M·s bytes at γ:
(2 + [M·s > limit])·⌈log2 N⌉·α + 2·f·M·s·β + f·M·s·γ.
"""

import ctypes
import math
import os

import numpy as np
from mpi4py import MPI

from .._partition import chunk_bounds
from .._registry import register

_BLOCK_BYTES = 128 << 10      # reduction block: N inputs + output stay in a 2 MB L2
_REPLICATE_BYTES = 4 << 10    # up to this, every rank reduces the whole vector
_DOUBLE_LIMIT = 1 << 20       # up to this, alternate two regions (no trailing sync)
_ALIGN = 4096
_CMA_STAGE_BYTES = 4 << 20    # single-copy path: bytes read from the others per block (measured)


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
    ``_api._agree``), without an MPI collective: each rank writes its vector
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


def shared_max_for(comm):
    """A :class:`SharedMax` on ``comm`` if all its ranks share memory, else None (collective)."""
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        if shared.Get_size() != comm.Get_size():
            return None  # the same answer on every rank (see _ShmState)
        return SharedMax(shared)
    finally:
        shared.Free()


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

        Messages up to ``_DOUBLE_LIMIT`` alternate between two halves of the
        slot and leave without a trailing sync ("dirty": a slow rank may still
        read the last region).  A larger message uses the whole slot from
        offset 0, which overlaps both halves, so a dirty window is synced
        first.  Collective; every decision depends only on ``nbytes``.
        """
        if nbytes <= _DOUBLE_LIMIT:
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
    block = max(1, _BLOCK_BYTES // src.itemsize)
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


def shm_allreduce_on(node, src, dst, kernel):
    """The algorithm above on the :class:`SharedSlots` ``node`` (all ranks of the collective)."""
    nbytes = dst.nbytes
    offset, trailing = node.begin(nbytes)
    slots = node.slots(offset, nbytes, dst.dtype)
    rank = node.rank
    if nbytes <= _REPLICATE_BYTES:
        slots[rank][...] = src
        node.sync()
        reduce_block(kernel, slots, dst)
        return
    bounds = chunk_bounds(dst.size, node.size)
    copy_in(src, slots[rank], rank, bounds)
    node.sync()
    reduce_own_slice(kernel, src, slots, rank, bounds, dst)
    node.sync()
    copy_out(dst, slots, rank, bounds)
    if trailing:
        node.sync()


# --- single copy through the kernel (Linux cross-memory attach) ---------------

class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _load_readv():
    try:
        fn = ctypes.CDLL(None, use_errno=True).process_vm_readv
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                   ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong]
    return fn


_readv = _load_readv()
CMA_ENV = "PYCOLLECTIVE_SHM_CMA"


class CrossMemory:
    """Reads of another rank's private memory by address (``process_vm_readv``).

    Ranks publish their buffer addresses in a small shared window; a reader
    copies straight from the owner's array, so no rank has to stage its input
    in shared memory first.  Usable only where the system allows it (Linux,
    same user, ptrace permitted); :meth:`probe` finds out collectively, so all
    ranks take the same path.
    """

    def __init__(self, node):
        self.node = node  # its flag barrier is our sync
        comm = self.comm = node.comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.win = MPI.Win.Allocate_shared(64, 1, comm=comm)
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self.headers = [np.frombuffer(self.win.Shared_query(q)[0], np.int64, 8)
                        for q in range(self.size)]
        self.headers[self.rank][0] = os.getpid()
        self._local, self._remote = _IoVec(), _IoVec()
        self._tmp = np.empty(0, np.uint8)
        self.sync()
        self.pids = [int(h[0]) for h in self.headers]

    def sync(self):
        self.win.Sync()
        self.node.sync()
        self.win.Sync()

    def publish(self, src, dst):
        header = self.headers[self.rank]
        header[1] = src.ctypes.data
        header[2] = dst.ctypes.data

    def read(self, q, address, out):
        """Copy ``out.nbytes`` bytes at ``address`` in rank q's memory into ``out``."""
        done, total, base = 0, out.nbytes, out.ctypes.data
        local, remote = self._local, self._remote
        while done < total:
            local.base, local.len = base + done, total - done
            remote.base, remote.len = address + done, total - done
            got = _readv(self.pids[q], ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
            if got <= 0:
                err = ctypes.get_errno()
                raise OSError(err, f"process_vm_readv from rank {q}: {os.strerror(err)}")
            done += got

    def scratch(self, nbytes):
        if self._tmp.nbytes < nbytes:
            self._tmp = np.empty(nbytes, np.uint8)
        return self._tmp

    def probe(self):
        """True on every rank iff every rank can read its right neighbour's memory."""
        mark = np.array([0x5EED0000 + self.rank], np.int64)
        self.headers[self.rank][1] = mark.ctypes.data
        self.sync()
        right = (self.rank + 1) % self.size
        got = np.zeros(1, np.int64)
        try:
            self.read(right, int(self.headers[right][1]), got)
            ok = int(got[0]) == 0x5EED0000 + right
        except OSError:
            ok = False
        ok = self.comm.allreduce(ok, op=MPI.LAND)  # also keeps `mark` alive until all read
        return ok

    def free(self):
        self.win.Unlock_all()
        self.win.Free()


def cma_allreduce_on(cross, src, dst, kernel):
    """Single-copy variant: the reduce reads the others' ``src``, the copy-out their ``dst``."""
    n, r = cross.size, cross.rank
    bounds = chunk_bounds(dst.size, n)
    itemsize = dst.itemsize
    cross.publish(src, dst)
    cross.sync()
    headers = cross.headers
    srcs = [int(headers[q][1]) for q in range(n)]
    dsts = [int(headers[q][2]) for q in range(n)]
    lo, hi = bounds[r], bounds[r + 1]
    # Fewer, larger reads cost less pinning per byte; the N-1 staged blocks
    # together stay around _CMA_STAGE_BYTES so they are still in cache.
    block_bytes = max(16 << 10, _CMA_STAGE_BYTES // (n - 1))
    block = max(1, block_bytes // itemsize)
    tmp = cross.scratch(n * block * itemsize)
    staged = [tmp[i * block * itemsize:(i + 1) * block * itemsize].view(dst.dtype)
              for i in range(n)]
    # In place, the first kernel pass writes dst before a rank r >= 2 has
    # read its own operand (operands go in rank order), so stage it too.
    own_staged = r >= 2 and np.may_share_memory(src, dst)
    for b in range(lo, hi, block):
        e = min(b + block, hi)
        operands, i = [], 0
        for q in range(n):
            if q == r:
                if own_staged:
                    own = staged[n - 1][:e - b]
                    own[...] = src[b:e]
                    operands.append(own)
                else:
                    operands.append(src[b:e])
            else:
                part = staged[i][:e - b]
                i += 1
                cross.read(q, srcs[q] + b * itemsize, part)
                operands.append(part)
        reduce_block(kernel, operands, dst[b:e])
    cross.sync()
    for q in range(n):
        qlo, qhi = bounds[q], bounds[q + 1]
        if q != r and qhi > qlo:
            cross.read(q, dsts[q] + qlo * itemsize, dst[qlo:qhi])
    cross.sync()  # nobody returns (and lets its dst change) while others read it


class _ShmState:
    """Cached per communicator: the node window, or why there can be none."""

    def __init__(self, ctx):
        shared = ctx.comm.Split_type(MPI.COMM_TYPE_SHARED, key=ctx.rank)
        if shared.Get_size() != ctx.size:
            # Every rank sees its node smaller than the communicator, so every
            # rank takes this branch: the error is the same everywhere.
            shared.Free()
            self.node = self.cross = None
            self.error = (
                f"algorithm 'shm' needs all {ctx.size} ranks of the communicator on "
                "one shared-memory node, but the communicator spans several nodes; "
                "use algorithm='hierarchical'")
        else:
            self.node = SharedSlots(shared)
            self.error = None
            self.cross = None
            wanted = _readv is not None and os.environ.get(CMA_ENV, "1").strip().lower() not in (
                "0", "false", "no", "off")
            # Same on all ranks: the wish is agreed, and so is the probe.
            if ctx.comm.allreduce(wanted, op=MPI.LAND):
                cross = CrossMemory(self.node)
                if cross.probe():
                    self.cross = cross
                else:
                    cross.free()

    def free(self):
        if self.node is not None:
            if self.cross is not None:
                self.cross.free()
                self.cross = None
            self.node.free()
            self.node = None


def _state(ctx):
    return ctx.cached("shm", _ShmState)


def on_one_node(ctx):
    """True iff "shm" can run on ``ctx`` (all ranks share memory); the same on every rank.

    Collective on a context's first use (it builds the cached state), so a
    caller such as the automatic choice must ask on every rank at the same
    point.
    """
    return _state(ctx).error is None


def shm_allreduce(ctx, src, dst, kernel):
    state = _state(ctx)
    if state.error is not None:
        raise ValueError(state.error)
    if state.cross is not None and dst.nbytes > _DOUBLE_LIMIT:
        cma_allreduce_on(state.cross, src, dst, kernel)
    else:
        shm_allreduce_on(state.node, src, dst, kernel)


def shm_cost(nranks, count, itemsize, alpha, beta, gamma):
    """α-β-γ time of :func:`shm_allreduce` (see the essay above)."""
    nbytes = count * itemsize
    sync = math.ceil(math.log2(nranks)) * alpha
    if nbytes <= _REPLICATE_BYTES:
        return sync + nbytes * beta + (nranks - 1) * nbytes * gamma
    moved = (nranks - 1) / nranks * nbytes
    syncs = 2 + (nbytes > _DOUBLE_LIMIT)
    return syncs * sync + 2 * moved * beta + moved * gamma


register("shm", shm_allreduce,
         "one node: ranks reduce their slice straight from the others' shared-memory slots",
         cost=shm_cost)
