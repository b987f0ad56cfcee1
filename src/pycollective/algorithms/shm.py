"""Shared-memory allreduce: every rank reduces its slice straight from the others' memory.

All ranks of the communicator must share memory (one node).  With M elements
split by :func:`~pycollective.partition` into N slices, rank i owns slice i:
it combines slice i of all N inputs, operands in rank order 0..N-1, and
every rank then copies the other slices of the result.  No data travel in
point-to-point messages; there are two ways to reach the others' memory.

Single copy (messages above ``SINGLE_COPY_BYTES`` = 8 MiB, where the system
allows it): each rank publishes the addresses and size of its ``src`` and
``dst`` in its header of the node's control segment; sync; rank i reads
slice i of every other rank's ``src`` with ``process_vm_readv`` (Linux
cross-memory attach), block by block and peer by peer, each block just
before the kernel folds it into ``dst`` so that the kernel reads it back
from cache (:func:`~pycollective.algorithms._node.cross_reduce`); sync; rank i reads
slice q of rank q's ``dst`` straight into its own ``dst`` for every q != i;
sync (nobody returns, and lets its ``dst`` change, while others read it).
Nothing is staged through shared memory and the caller's buffers are read
where they are.  Whether the system allows it is probed once per
communicator and agreed by all ranks; ``PYCOLLECTIVE_SHM_CMA=0`` turns it off.
The shared segments, the barrier and the cross-memory reader live in
``_shmem.py`` and ``_cma.py``; this module is the algorithm.

Shared slots (smaller messages, or no cross-memory reads): each rank owns a
slot of a shared segment (:class:`~pycollective._shmem.SharedSlots`) big
enough for the whole vector; slot q is a plain numpy view on every rank.

1. Copy-in: rank i copies its input *except its own slice* into its slot.  Its
   own slice is only ever read by itself, from its private ``src``.
2. Sync.
3. Reduce: rank i combines slice i of all N inputs (its own from ``src``)
   into slot_i[slice i], block by block (``BLOCK_BYTES``) so the partial
   result stays in cache across the N-1 kernel passes, and copies each block
   into ``dst`` while it is still in cache.
4. Sync.
5. Copy-out: rank i copies slice q from slot_q into ``dst`` for every q != i.
6. Above 1 MiB, a last sync, so that the next call's copy-in cannot
   overwrite a slot another rank is still copying out.  Smaller messages
   skip it: the window holds two regions used alternately, and a rank can
   only reach the copy-in of call k+2 (same region as call k) after every
   rank has entered call k+1's first sync, i.e. finished call k.

From 4 KiB to 1 MiB, once the slots are big enough, steps 1-5 are one compiled call
(:mod:`._mid`; in Python they are a dozen calls, most of the time at tens
of KB): same targets, headers and left fold, so a call may mix it with the
Python steps; a wait that runs long is handed back to Python (the deadline,
the side channel) and the compiled call resumes after it.

Small messages (up to ``_REPLICATE_BYTES`` = 4 KiB) take a shorter path:
every rank copies its whole input into its slot, one sync, and every rank
reduces the whole vector itself, operands in rank order 0..N-1.

Results are bitwise identical on all ranks: each element is computed once
(sliced paths) or by the same operations on the same bits everywhere (small
path).

Sync is the node group's :class:`~pycollective._shmem.FlagBarrier`: memory
fences around counters in shared memory, a few cache-line transfers instead
of an ``MPI_Barrier``; waiting ranks keep MPI progress going, yield the core
(and, where ranks outnumber cores, sleep in ``futex(2)`` until the awaited
counter moves) and raise a timeout naming a stalled peer.  The first
sync of every call compares every rank's header (call number, count, dtype,
op, algorithm), so ranks that disagree raise before any rank reads another's
data, with or without the agreement step.

Slots are cached in the context (one state per communicator) and only grow:
growing is collective, and the decision depends only on the message size in
bytes, which the header check makes sure is the same on all ranks.  Grown
slots are kept for later calls (a training loop reduces the same sizes every
step); they are freed with the communicator.

If the communicator spans several nodes, "shm" is not usable: its
registration's ``usable(ctx)`` says why, so the automatic choice and the
benchmark leave it out, and an explicit ``algorithm="shm"`` raises the same
``ValueError`` on every rank (every rank finds its node smaller than the
communicator, without exchanging a message); use "hierarchical" there.
The ranks-per-node emulation of "hierarchical" does not apply to "shm".

Cost (s bytes per element, f = (N-1)/N): 2-3 syncs of ⌈log2 N⌉α each, the
reads (or copy-in) and the copy-out of f·M·s bytes each (charged at β: on one
node a transfer *is* a memory copy), and the reduction of f·M·s bytes at γ:
(2 + [M·s > limit])·⌈log2 N⌉·α + 2·f·M·s·β + f·M·s·γ.
"""

import functools
import math

import numpy as np

from .. import _cma, _env, _watch
from .._context import Key
from .._errors import ConfigurationError
from .._partition import chunk_bounds
from .._registry import register
from .._shmem import (
    DOUBLE_LIMIT,
    FP_WORDS,
    SharedSlots,
    copy_in,
    copy_out,
    reduce_block,
    reduce_own_slice,
    whole_node,
)
from . import _mid, _small
from ._node import cross_reduce

_REPLICATE_BYTES = 4 << 10    # up to this, every rank reduces the whole vector
# Above this, single copy where the system allows it (else the slots).  Each
# process_vm_readv pins the peer's pages one by one; staged through the slots
# a call of 1.1-3.8 MiB per rank took 0.58-0.79 of the single copy's time at
# N = 4 and 8 and 0.42-1.18 at N = 2 (median 0.85); at 7.6 MiB 0.72-1.30,
# from 15 MiB the single copy is level or ahead (1.2-1.6 at 38 MiB)
# (benchmarks/shm/single_copy.py; docs/results/2026-12-02-fastway.md).  The other
# node collectives keep _node.CMA_BYTES: for them the two were about level.
SINGLE_COPY_BYTES = 8 << 20
_STATE = Key("shm")


def shm_allreduce_on(node, src, dst, kernel):
    """The algorithm above on the :class:`SharedSlots` ``node`` (all ranks of the collective).

    The first sync of the call (inside ``begin`` when the slots grow, else
    the one after the copy-in) compares every rank's header, so no rank
    reads the others' slots unless all agree on count, dtype, op and call.
    """
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

def cma_allreduce_on(cross, src, dst, kernel):
    """Single-copy variant: the reduce reads the others' ``src``, the copy-out their ``dst``."""
    n, r = cross.size, cross.rank
    bounds = chunk_bounds(dst.size, n)
    itemsize = dst.itemsize
    cross.publish(src, dst)
    cross.group.sync()  # the call's first: every header checked before any read
    lo, hi = bounds[r], bounds[r + 1]
    cross_reduce(cross, src, dst[lo:hi], lo, hi, kernel)
    cross.group.sync()
    for q in range(n):
        qlo, qhi = bounds[q], bounds[q + 1]
        if q != r and qhi > qlo:
            cross.read(q, cross.DST, qlo * itemsize, dst[qlo:qhi])
    cross.group.sync()  # nobody returns (and lets its dst change) while others read it


class _ShmState:
    """Cached per communicator: the node's slots, or why there can be none."""

    def __init__(self, ctx):
        group = whole_node(ctx)
        self.node = self.cross = None
        if group is None:
            # Every rank sees its node smaller than the communicator, so every
            # rank takes this branch: the reason is the same everywhere.
            self.error = (
                f"algorithm 'shm' needs all {ctx.size} ranks of the communicator on "
                "one shared-memory node, but the communicator spans several nodes; "
                "use algorithm='hierarchical'")
            return
        self.node = SharedSlots(group)
        self.error = None
        # Same on all ranks: the wish is agreed, and so is the probe.
        if group.all_ok(_cma.available() and _env.SHM_CMA.get()):
            cross = _cma.CrossMemory(group)
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
    return ctx.cached(_STATE, _ShmState)


def on_one_node(ctx):
    """None if "shm" can run on ``ctx`` (all ranks share memory), else why not.

    The same on every rank; collective on a context's first use (it builds
    the cached state), so every rank must ask at the same point.
    """
    return _state(ctx).error


def shm_allreduce(ctx, src, dst, kernel):
    state = _state(ctx)
    if state.error is not None:
        raise ConfigurationError(state.error)
    call = _watch.current()
    if state.cross is not None and dst.nbytes > SINGLE_COPY_BYTES:
        cma_allreduce_on(state.cross, src, dst, kernel)
    elif _compiled(state, call, dst):
        _small_data(state.node, call, src, dst)
    elif _mid_compiled(state.node, call, dst):
        _mid_data(state.node, call, src, dst)
    else:
        shm_allreduce_on(state.node, src, dst, kernel)


_F16 = np.dtype(np.float16)
_COMPILED = {np.dtype(t) for t in ("float16", "float32", "float64", "int8", "int16", "int32",
                                   "int64", "uint8", "uint16", "uint32", "uint64")}
_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3}


def shm_agreed(ctx, src, dst, kernel, values, board):
    """shm with the agreement in the same compiled step (the registry's ``agreed``).

    Small messages take :func:`_small_agreed`: the agreement row and the
    data posted together, one synchronisation; the sliced sizes up to 1 MiB
    :func:`mid_agreed`, the row posted with the copy-in; larger ones (or
    slots not grown yet) run the agreement through the board, then the
    algorithm.  Either way the first sync is the agreement's, with the same
    target, board and header as the Python path's.
    """
    state = _state(ctx)
    call = _watch.current()
    if _compiled(state, call, dst, board):
        return _small_agreed(state.node, call, src, dst, values, board)
    done = mid_agreed(state, call, src, dst, values, board)
    if done is not None:
        return done
    before = values.tobytes()
    board.max(values)
    if values.tobytes() != before:
        return False
    shm_allreduce(ctx, src, dst, kernel)
    return True


def _compiled(state, call, dst, board=None):
    node = state.node
    return (state.error is None and call is not None and dst.nbytes <= _REPLICATE_BYTES
            and node.capacity >= 2 * dst.nbytes and dst.dtype in _COMPILED
            and (board is None or getattr(board, "group", None) is node.group))


def _small_data(node, call, src, dst):
    """The small path's data step in compiled code (the slots are big enough already)."""
    group = node.group
    target, publish, checking = group.compiled_step(call, check=True)
    if checking is None:  # an earlier step of the call compared them: again, no harm
        checking = group.header_set()
    offset, _ = node.begin(dst.nbytes)
    half = dst.dtype == _F16
    if half:
        src, dst = src.view(np.uint16), dst.view(np.uint16)
    rows = node.rows(offset, dst.size, dst.dtype)
    op = call.fingerprint[3]
    step = _small.data_step_half if half else _small.data_step
    verdict = step(group.barrier.words, group.rank, group.size, target, rows, src,
                   publish if publish is not None else checking, publish is not None,
                   call.number, call.fingerprint_words, checking, dst, op)
    if verdict == _small.LATE:
        group.barrier.wait(target)  # a slow rank: wait on with the deadline
        reduce = _small.reduce_half if half else _small.reduce
        verdict = reduce(checking, group.rank, group.size, rows, dst, op)
    if verdict == _small.HEADERS_DIFFER:
        group.check(call, checking)  # raises, naming who is in which call


def _small_agreed(node, call, src, dst, values, board):
    """The agreement and the small path's data in one compiled step; False if ranks disagree.

    The data go into the slot region ``begin`` would give, but the region is
    taken (``begin``, which alternates them) only once every rank's row is
    seen equal: after a disagreement, which every rank sees and raises, the
    communicator stays usable and all ranks must still use the same region
    next.  Writing the region early is safe: its last readers finished the
    call before last, since every rank entered the last call's sync.
    """
    target, headers = _folded_step(node.group, call)
    offset = node.parity * (node.capacity // 2)  # what begin() returns below
    half = dst.dtype == _F16
    rows = node.rows(offset, dst.size, np.uint16 if half else dst.dtype)
    step = _small.agreed_step_half if half else _small.agreed_step
    return _small_agreed_step(node, call, src, dst, values, board, step, target, rows, headers)


def _small_agreed_step(node, call, src, dst, values, board, step, target, rows, headers):
    """:func:`_small_agreed` once its target, slot rows and header set are known."""
    group = node.group
    rows_board = board.take()
    half = step is _small.agreed_step_half
    data_src, data_dst = (src.view(np.uint16), dst.view(np.uint16)) if half else (src, dst)
    verdict = step(group.barrier.words, group.rank, group.size, target, rows_board, values, rows,
                   data_src, headers, call.number, call.fingerprint_words, data_dst,
                   call.fingerprint[3])
    return _small_after(node, call, src, dst, values, board, step, target, rows, headers,
                        rows_board, verdict)


def _small_after(node, call, src, dst, values, board, step, target, rows, headers, rows_board,
                 verdict):
    """What follows the folded step's compiled call: done, a slow rank, a disagreement,
    a rank that went the longer way, or headers that differ."""
    group = node.group
    if verdict == _small.DONE:
        node.begin(dst.nbytes)
        return True
    half = step is _small.agreed_step_half
    data_dst = dst.view(np.uint16) if half else dst
    op = call.fingerprint[3]
    if verdict == _small.LATE:
        group.barrier.wait(target)  # a slow rank: wait on with the deadline
        verdict = _small.rows_verdict(rows_board, values, group.size)
        if verdict == _small.DONE:
            reduce = _small.reduce_half if half else _small.reduce
            verdict = reduce(headers, group.rank, group.size, rows, data_dst, op)
    if verdict == _small.DISAGREE:
        board.fold(rows_board, values)
        return False
    if verdict == _small.UNFOLDED:
        # A rank agreed through the board alone and posts its data before its
        # next sync: the data step (posting ours again) meets it there.
        _small_data(node, call, src, dst)
        return True
    if verdict == _small.HEADERS_DIFFER:
        group.check(call, headers)  # raises, naming who is in which call
    node.begin(dst.nbytes)
    return True


def _folded_step(group, call):
    """The target and the call's header set of a step that folds the agreement in.

    The header set is the one published now (the call's first step, as on
    the fast path), else the one published earlier in the call and written
    again alike (auto's trials, whose call agreed first).
    """
    target, publish, checking = group.compiled_step(call, check=True)
    if publish is not None:
        return target, publish
    return target, checking if checking is not None else group.header_set()


# --- the sliced path (4 KiB - 1 MiB, two alternating regions) in compiled code -----------

def _mid_compiled(node, call, dst):
    """Whether :mod:`._mid` runs this call: a sliced two-region size whose slots are big
    enough already (else the Python path grows them, collectively) and a compiled dtype."""
    nbytes = dst.nbytes
    return (call is not None and _REPLICATE_BYTES < nbytes <= DOUBLE_LIMIT
            and node.capacity >= 2 * nbytes and dst.dtype in _COMPILED)


def _mid_data(node, call, src, dst):
    """The sliced path's steps in compiled code, with :meth:`NodeGroup.compiled_step`'s
    targets and header sets (one per sync, as the Python path's two syncs)."""
    group = node.group
    first, publish, checking = group.compiled_step(call, check=True)
    second, _, _ = group.compiled_step(call, check=True)
    if checking is None:  # an earlier step of the call compared them: again, no harm
        checking = group.header_set()
    offset, _ = node.begin(dst.nbytes)
    args = _mid_args(node, call, offset, src, dst, publish, checking)
    verdict, phase = _mid.step(group.barrier.words, group.rank, group.size, 0, first, second,
                               *args)
    _mid_resume(group, call, verdict, phase, first, second, args, checking)


def _mid_args(node, call, offset, src, dst, publish, checking):
    """:func:`._mid.step`'s arguments after the targets: slots, buffers, headers, op."""
    half = dst.dtype == _F16
    slots = _mid_slots(node, np.dtype(np.uint16) if half else dst.dtype, offset)
    return _mid_call_args(slots, _slice_bounds(dst.size, node.size), half, call.number,
                          call.fingerprint_words, call.fingerprint[3], src, dst, publish,
                          checking)


def _mid_slots(node, dtype, offset):
    """The step's slot arguments for the region at byte ``offset``: the segment as one
    array of ``dtype`` (:meth:`SharedSlots.flat`), the slot stride and the region's base."""
    itemsize = dtype.itemsize
    return node.flat(dtype), node.capacity // itemsize, offset // itemsize


def _mid_call_args(slots, bounds, half, number, words, op, src, dst, publish, checking):
    """(``number``, ``words``, ``op``: the call's number, fingerprint words and op code.)"""
    if half:
        src, dst = src.view(np.uint16), dst.view(np.uint16)
    flat, stride, base = slots
    return (flat, stride, base, src, dst, bounds,
            _NO_HEADERS if publish is None else publish, number, words,
            _NO_HEADERS if checking is None else checking, op + (_mid.HALF if half else 0))


def _mid_resume(group, call, verdict, phase, first, second, args, checking):
    """After a compiled step: wait on (with the deadline) and resume; raise on a mismatch."""
    while verdict == _mid.LATE:
        group.barrier.wait(first if phase == 1 else second)  # a slow rank
        verdict, phase = _mid.step(group.barrier.words, group.rank, group.size, phase, first,
                                   second, *args)
    if verdict == _mid.HEADERS_DIFFER:
        group.check(call, checking)  # raises, naming who is in which call


def mid_agreed(state, call, src, dst, values, board):
    """:func:`shm_agreed` for the sliced two-region sizes: the agreement row is
    posted with the copy-in (:func:`._mid.agreed_step`), one sync instead of two.

    Returns None where it does not apply (the caller goes on as before), else
    what ``shm_agreed`` returns: False with ``values`` the MAX over the ranks
    when they disagree, True once the allreduce is done.  Ranks that make
    the same call decide alike, and ranks that disagree meet at the first
    target whichever of the small, this or the Python agreement they take.
    """
    if not _mid_agreed_runs(state, call, dst, board):
        return None
    node = state.node
    group = node.group
    first, headers = _folded_step(group, call)
    second, _, _ = group.compiled_step(call, check=True)
    # The region node.begin will hand out; it takes it (flips the parity)
    # only once the ranks are known to agree, so that after a disagreement
    # (a ValueError on every rank, the communicator still usable) every rank
    # still agrees on the parity.
    offset = node.parity * (node.capacity // 2)
    args = _mid_args(node, call, offset, src, dst, headers, headers)
    return _mid_agreed_step(node, call, dst.nbytes, values, board, first, second, args, headers)


def _mid_agreed_runs(state, call, dst, board):
    """Whether :func:`mid_agreed` runs this call (the same on every rank that makes it)."""
    node = state.node
    return (state.error is None and _mid_compiled(node, call, dst)
            and getattr(board, "group", None) is node.group)


def _mid_agreed_step(node, call, nbytes, values, board, first, second, args, headers):
    """:func:`mid_agreed` once its targets and :func:`._mid.step`'s arguments are known."""
    group = node.group
    rows = board.take()
    verdict, phase = _mid.agreed_step(group.barrier.words, group.rank, group.size, first, second,
                                      rows, values, *args)
    return _mid_after(node, call, nbytes, values, board, first, second, args, headers, rows,
                      verdict, phase)


def _mid_after(node, call, nbytes, values, board, first, second, args, headers, rows, verdict,
               phase):
    """What follows :func:`._mid.agreed_step`: done, a slow rank, a disagreement, a rank
    that went the longer way, or headers that differ."""
    group = node.group
    words = group.barrier.words
    late = verdict == _mid.LATE and phase == 1  # before the rows were compared
    if late:
        group.barrier.wait(first)  # a slow rank: wait on with the deadline
        verdict = _small.rows_verdict(rows, values, group.size)
    if verdict == _mid.DISAGREE:
        board.fold(rows, values)
        return False
    node.begin(nbytes)  # the call proceeds: its region is taken
    if verdict == _mid.UNFOLDED:
        # A rank agreed through the board alone: it copies in before its next
        # sync, the second target here.  Follow its steps from the copy-in
        # (again: the same data into the same place) with targets two and three.
        third, _, _ = group.compiled_step(call, check=True)
        verdict, phase = _mid.step(words, group.rank, group.size, 0, second, third, *args)
        _mid_resume(group, call, verdict, phase, second, third, args, headers)
        return True
    if late:
        verdict, phase = _mid.step(words, group.rank, group.size, 1, first, second, *args)
    _mid_resume(group, call, verdict, phase, first, second, args, headers)
    return True


_NO_HEADERS = np.zeros((0, FP_WORDS), np.int64)  # no header set to write or compare


@functools.lru_cache(maxsize=64)
def _slice_bounds(count, size):
    bounds = np.array(chunk_bounds(count, size), np.int64)
    bounds.flags.writeable = False
    return bounds


class _Repeated:
    """:func:`shm_agreed` for the repeated calls of one dtype and size (the registry's
    ``repeated``; :mod:`pycollective._fastpath` keeps it in the call's plan).

    What :func:`_small_agreed` and :func:`mid_agreed` look up on every call
    (the state, the slot views of both regions, the compiled step and its
    arguments) is resolved once; a call does their bookkeeping and the
    compiled step, nothing else in Python.  Until the slots exist, and
    whenever they changed since (grown by a larger call, freed), it resolves
    again; where its path cannot run it runs :func:`shm_agreed`.
    """

    def __init__(self, ctx, dst, kernel, board):
        self.ctx, self.count, self.kernel, self.board = ctx, dst.size, kernel, board
        self.half = dst.dtype == _F16
        self.dtype = np.dtype(np.uint16) if self.half else dst.dtype
        self.node = self.segment = None
        self.views = ()

    def _resolve(self, state, call, dst):
        """The views of both regions, or () where this path cannot run."""
        raise NotImplementedError

    def __call__(self, ctx, call, values, src, dst):
        """The prepared call on the resolved slots; :meth:`_again` when they changed.
        (Each subclass's own, so a repeated call is one Python frame here, not two.)"""
        raise NotImplementedError

    def _again(self, ctx, call, values, src, dst):
        """Resolve again (first call, slots grown or freed since), then run."""
        self.node, self.segment, self.views = None, None, ()  # drop the old slots' views
        state = ctx.peek(_STATE)
        views = () if state is None or state.node is None else self._resolve(state, call, dst)
        if not views:
            return shm_agreed(ctx, src, dst, self.kernel, values, self.board)
        node = state.node
        self.node, self.segment, self.views = node, node.segment, views
        return self(ctx, call, values, src, dst)


class _RepeatedSmall(_Repeated):
    """:func:`_small_agreed`, prepared: ``views`` are both regions' slot rows."""

    def __init__(self, ctx, dst, kernel, board):
        super().__init__(ctx, dst, kernel, board)
        self.step = _small.agreed_step_half if self.half else _small.agreed_step
        self.nbytes = dst.nbytes

    def _resolve(self, state, call, dst):
        if not _compiled(state, call, dst, self.board):
            return ()
        node = state.node
        half_capacity = node.capacity // 2  # the two regions begin() alternates
        return tuple(node.rows(p * half_capacity, self.count, self.dtype) for p in (0, 1))

    def __call__(self, ctx, call, values, src, dst):
        node = self.node
        if node is None or node.segment is not self.segment:
            return self._again(ctx, call, values, src, dst)
        target, headers = _folded_step(node.group, call)
        return _small_agreed_step(node, call, src, dst, values, self.board, self.step, target,
                                  self.views[node.parity], headers)

    def fast(self, number, plan, src, dst):
        """The call numbered ``number`` as one compiled step and its bookkeeping; None once
        done, else the rest (see ``_call.run_remembered``)."""
        node = self.node
        if node is None or node.segment is not self.segment:
            return self  # nothing done yet: the whole call, with its record
        group = node.group
        target, headers = group.opening_steps(number, 1)
        board = self.board.take()
        rows = self.views[node.parity]
        if self.half:
            src, dst = src.view(np.uint16), dst.view(np.uint16)
        verdict = self.step(group.barrier.words, group.rank, group.size, target, board,
                            plan.template, rows, src, headers, number, plan.words, dst,
                            plan.fingerprint[3])
        if verdict == _small.DONE:
            node.begin(self.nbytes)
            return None
        return functools.partial(self._rest, target, rows, headers, board, verdict)

    def _rest(self, target, rows, headers, board, verdict, ctx, call, values, src, dst):
        return _small_after(self.node, call, src, dst, values, self.board, self.step, target,
                            rows, headers, board, verdict)


class _RepeatedMid(_Repeated):
    """:func:`mid_agreed`, prepared: ``views`` are both regions' :func:`_mid_slots`."""

    def __init__(self, ctx, dst, kernel, board):
        super().__init__(ctx, dst, kernel, board)
        self.nbytes = dst.nbytes
        self.bounds = None

    def _resolve(self, state, call, dst):
        if not _mid_agreed_runs(state, call, dst, self.board):
            return ()
        node = state.node
        self.bounds = _slice_bounds(self.count, node.size)
        return tuple(_mid_slots(node, self.dtype, p * (node.capacity // 2)) for p in (0, 1))

    def __call__(self, ctx, call, values, src, dst):
        node = self.node
        if node is None or node.segment is not self.segment:
            return self._again(ctx, call, values, src, dst)
        group = node.group
        first, headers = _folded_step(group, call)
        second, _, _ = group.compiled_step(call, check=True)
        args = _mid_call_args(self.views[node.parity], self.bounds, self.half, call.number,
                              call.fingerprint_words, call.fingerprint[3], src, dst, headers,
                              headers)
        return _mid_agreed_step(node, call, self.nbytes, values, self.board, first, second,
                                args, headers)

    def fast(self, number, plan, src, dst):
        """:meth:`_RepeatedSmall.fast` for the sliced path."""
        node = self.node
        if node is None or node.segment is not self.segment:
            return self
        group = node.group
        first, headers = group.opening_steps(number, 2)
        args = _mid_call_args(self.views[node.parity], self.bounds, self.half, number,
                              plan.words, plan.fingerprint[3], src, dst, headers, headers)
        rows = self.board.take()
        verdict, phase = _mid.agreed_step(group.barrier.words, group.rank, group.size, first,
                                          first + 1, rows, plan.template, *args)
        if verdict == _mid.DONE:
            node.begin(self.nbytes)
            return None
        return functools.partial(self._rest, first, args, headers, rows, verdict, phase)

    def _rest(self, first, args, headers, rows, verdict, phase, ctx, call, values, src, dst):
        return _mid_after(self.node, call, self.nbytes, values, self.board, first, first + 1,
                          args, headers, rows, verdict, phase)


def shm_repeated(ctx, dst, kernel, board):
    """The registry's ``repeated``: a prepared small or sliced path, else None."""
    if dst.dtype not in _COMPILED or dst.nbytes > DOUBLE_LIMIT:
        return None
    if dst.nbytes <= _REPLICATE_BYTES:
        return _RepeatedSmall(ctx, dst, kernel, board)
    return _RepeatedMid(ctx, dst, kernel, board)


def shm_cost(nranks, count, itemsize, alpha, beta, gamma):
    """α-β-γ time of :func:`shm_allreduce` (see the essay above)."""
    nbytes = count * itemsize
    sync = math.ceil(math.log2(nranks)) * alpha
    if nbytes <= _REPLICATE_BYTES:
        return sync + nbytes * beta + (nranks - 1) * nbytes * gamma
    moved = (nranks - 1) / nranks * nbytes
    syncs = 2 + (nbytes > DOUBLE_LIMIT)
    return syncs * sync + 2 * moved * beta + moved * gamma


register("shm", shm_allreduce,
         "one node: ranks reduce their slice straight from the others' shared-memory slots",
         cost=shm_cost, usable=on_one_node, agreed=shm_agreed, verifies_arguments=True,
         layout_aware=True, repeated=shm_repeated)
