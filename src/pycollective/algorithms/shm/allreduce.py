"""Shared-memory allreduce: every rank reduces its slice straight from the others' memory.

All ranks of the communicator must share memory (one node).  With M elements
split by :func:`~pycollective.partition` into N slices, rank i owns slice i:
it combines slice i of all N inputs, operands in rank order 0..N-1, and
every rank then copies the other slices of the result.  No data travel in
point-to-point messages; there are two ways to reach the others' memory.

Single copy (messages above ``DOUBLE_LIMIT``, 4 MiB, where the system allows it and a size's
timed calls chose it where every rank has a core, see :mod:`.ways`; above
``SINGLE_COPY_BYTES`` = 8 MiB where ranks outnumber cores): each rank
publishes the addresses and size of its ``src`` and ``dst`` in its header
of the node's control segment; sync; rank i reads
slice i of every other rank's ``src`` with ``process_vm_readv`` (Linux
cross-memory attach), block by block and peer by peer, each block just
before the kernel folds it into ``dst`` so that the kernel reads it back
from cache (:func:`~pycollective.algorithms.shm.common.cross_reduce`); sync; rank i reads
slice q of rank q's ``dst`` straight into its own ``dst`` for every q != i;
sync (nobody returns, and lets its ``dst`` change, while others read it).
Nothing is staged through shared memory and the caller's buffers are read
where they are.  Whether the system allows it is probed once per
communicator and agreed by all ranks; ``PYCOLLECTIVE_SHM_CMA=0`` turns it off.
The shared segments, the barrier and the cross-memory reader live in
``node/group.py`` and ``node/cma.py``, the compiled steps' Python side in
``algorithms/shm/steps.py``; this module is the algorithm.

Shared slots (smaller messages, or no cross-memory reads): each rank owns a
slot of a shared segment (:class:`~pycollective.node.group.SharedSlots`) big
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
6. Above 4 MiB, a last sync, so that the next call's copy-in cannot
   overwrite a slot another rank is still copying out.  Smaller messages
   skip it: the window holds two regions used alternately, and a rank can
   only reach the copy-in of call k+2 (same region as call k) after every
   rank has entered call k+1's first sync, i.e. finished call k.

Above 4 MiB steps 1 and 3 write the slot with plain or non-temporal stores
(past this core's cache, for the other cores to read from memory; in step
3 the block is then reduced into ``dst`` and copied from there into the
slot), the kind chosen per size: by timing the calls where each rank has a
core, by size where ranks outnumber cores (``_ShmState.stores_for``).  The
sync after each orders the stores before its counter.

From 4 KiB to 4 MiB, once the slots are big enough, steps 1-5 are one compiled call
(:mod:`._mid`; in Python they are a dozen calls, most of the time at tens
of KB): same targets, headers and left fold, so a call may mix it with the
Python steps; a wait that runs long is handed back to Python (the deadline,
the side channel) and the compiled call resumes after it.

Shared allocations (``pycollective.shared_empty``, :mod:`~pycollective.node.arrays`): in the
calls above 4 MiB, which end with a sync, each rank also publishes where its
``src`` and ``dst`` lie in the node's shared allocations.  Peer by peer, a
shared ``src`` is read as a view (no copy-in into the slot, no
``process_vm_readv``), and a rank with a shared ``dst`` reduces its slice
into it, from where the others copy it; other buffers go as above.

Repeated calls up to 4 MiB, where every rank of the node has a core of its
own, take one compiled reduce-scatter-allgather step instead of the two
below (:mod:`.rsag`, :mod:`.rsag_steps`, docs/shm-rsag.md): 64-byte aligned
slices, one metadata line per peer, waits that poll without system calls.

Small messages (up to ``REPLICATE_BYTES`` = 4 KiB) take a shorter path:
every rank copies its whole input into its slot, one sync, and every rank
reduces the whole vector itself, operands in rank order 0..N-1.

Results are bitwise identical on all ranks: each element is computed once
(sliced paths) or by the same operations on the same bits everywhere (small
path).

Sync is the node group's :class:`~pycollective.node.group.FlagBarrier`: memory
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

import math
import time

import numpy as np

from ...node import cma as _cma, arrays as _arrays
from ...runtime import env as _env, watch as _watch
from ...runtime.context import Key
from ..._errors import ConfigurationError
from ...data.partition import chunk_bounds
from ...runtime.registry import register
from ...node.group import (DOUBLE_LIMIT, SharedSlots, copy_in, copy_out, reduce_block,
                           reduce_own_slice, whole_node)
from ... import timeline as _timeline
# Through the module, not its names: tests stand its gates aside by patching them.
from . import mid as _mid
from . import rsag_steps as _rsag_steps, steps as _steps, stores as _stores, ways as _ways
from .common import cross_reduce, reduce_range
from .steps import REPLICATE_BYTES
# Above this, single copy where the system allows it (else the slots), where ranks
# outnumber cores: each process_vm_readv pins the peer's pages one by one, which the
# slots beat up to here there (docs/results/fastway.md).  Where every rank has a core,
# each size above DOUBLE_LIMIT times both ways and the ranks agree on one (ways.Way);
# this is the way of its first call.  The other node collectives keep
# common.CMA_BYTES: for them the two were about level.
SINGLE_COPY_BYTES = 8 << 20
# Up to this the ways are timed (above it: the single copy): the slots' trial calls grow
# every rank's slot to the size, memory the node keeps.
CHOOSE_BYTES = 16 << 20
_SIZES_KEPT = 64  # sizes whose choice of stores a communicator keeps
# From this size, where ranks outnumber cores, the slot path writes its slot
# with non-temporal stores (``_ShmState.stores_for``): from here they were
# never slower, below it they won or lost by launch (docs/results/streamed.md).
STREAM_BYTES = 3 << 20
_STATE = Key("shm")


def shm_allreduce_on(node, src, dst, kernel, shared=None, stores=None):
    """The algorithm above on the :class:`SharedSlots` ``node`` (all ranks of the collective).

    The first sync of the call (inside ``begin`` when the slots grow, else
    the one after the copy-in) compares every rank's header, so no rank
    reads the others' slots unless all agree on count, dtype, op and call.
    ``shared``: the context's :class:`~pycollective.node.arrays.Registry`, if any.
    ``stores``: a :class:`~pycollective.algorithms.shm.stores.Stores` for this size, which says
    whether a call above ``DOUBLE_LIMIT`` writes the slot with plain or
    non-temporal stores (see ``_ShmState.stores_for``); plain stores if None.
    """
    nbytes = dst.nbytes
    offset, trailing = node.begin(nbytes)
    slots = node.slots(offset, nbytes, dst.dtype)
    rank = node.rank
    if nbytes <= REPLICATE_BYTES:
        slots[rank][...] = src
        node.sync()
        reduce_block(kernel, slots, dst)
        return
    bounds = chunk_bounds(dst.size, node.size)
    if shared is not None and trailing:
        _shared_on(node, shared, src, dst, kernel, slots, bounds)
        return
    kind, started = stores.next() if stores is not None and trailing else (0, 0.0)
    copy = _mid.stream_copy if kind else None
    if _timeline.ACTIVE is not None:  # timeline hook: the step (ended after it)
        _timeline.ACTIVE.open("copy-in", "copy")
    copy_in(src, slots[rank], rank, bounds, copy)
    if _timeline.ACTIVE is not None:
        _timeline.ACTIVE.close()
    node.sync()  # its fence orders the non-temporal stores before the counter
    reduce_own_slice(kernel, src, slots, rank, bounds, dst, copy)
    node.sync()
    if _timeline.ACTIVE is not None:  # timeline hook: the step (ended after it)
        _timeline.ACTIVE.open("copy-out", "copy")
    copy_out(dst, slots, rank, bounds)
    if _timeline.ACTIVE is not None:
        _timeline.ACTIVE.close()
    if trailing:
        node.sync()
    if started:
        stores.took(kind, time.perf_counter() - started)


def _shared_on(node, shared, src, dst, kernel, slots, bounds):
    """The slots' way with shared allocations read in place (calls with a trailing sync).

    Peer by peer: a rank whose ``src`` is a shared allocation skips its
    copy-in and the others read its ``src``; a rank whose ``dst`` is one
    reduces its slice straight into it and the others copy from there.  Any
    other buffer goes through the slots as above.
    """
    rank = node.rank
    own_src, own_dst = shared.publish(src, dst)
    if not own_src:
        if _timeline.ACTIVE is not None:  # timeline hook: the step (ended after it)
            _timeline.ACTIVE.open("copy-in", "copy")
        copy_in(src, slots[rank], rank, bounds)
        if _timeline.ACTIVE is not None:
            _timeline.ACTIVE.close()
    node.sync()  # every rank's row published (and the headers checked)
    srcs, dsts = shared.peer_buffers(dst.size, dst.dtype)
    lo, hi = bounds[rank], bounds[rank + 1]
    operands = [slots[q] if x is None else x for q, x in enumerate(srcs)]
    if own_dst:
        reduce_range(node, src, dst[lo:hi], lo, hi, kernel, operands)
    else:
        reduce_range(node, src, slots[rank][lo:hi], lo, hi, kernel, operands,
                     copy_to=dst[lo:hi])
    node.sync()
    if _timeline.ACTIVE is not None:  # timeline hook: the step (ended after it)
        _timeline.ACTIVE.open("copy-out", "copy")
    for q, x in enumerate(dsts):
        qlo, qhi = bounds[q], bounds[q + 1]
        if q != rank and qhi > qlo:
            dst[qlo:qhi] = (slots[q] if x is None else x)[qlo:qhi]
    if _timeline.ACTIVE is not None:
        _timeline.ACTIVE.close()
    node.sync()  # nobody returns (and lets its buffers change) while others read them


# --- single copy through the kernel (Linux cross-memory attach) ---------------

def cma_allreduce_on(cross, src, dst, kernel, shared=None):
    """Single-copy variant: the reduce reads the others' ``src``, the copy-out their ``dst``
    (in place where they are shared allocations, ``shared`` the context's registry)."""
    n, r = cross.size, cross.rank
    bounds = chunk_bounds(dst.size, n)
    itemsize = dst.itemsize
    cross.publish(src, dst)
    if shared is not None:
        shared.publish(src, dst)
    cross.group.sync()  # the call's first: every header checked before any read
    srcs = dsts = None
    if shared is not None:
        srcs, dsts = shared.peer_buffers(dst.size, dst.dtype)
    lo, hi = bounds[r], bounds[r + 1]
    cross_reduce(cross, src, dst[lo:hi], lo, hi, kernel, direct=srcs)
    cross.group.sync()
    if _timeline.ACTIVE is not None:  # timeline hook: the copy-out (ended after it)
        _timeline.ACTIVE.open("copy-out", "copy")
    for q in range(n):
        qlo, qhi = bounds[q], bounds[q + 1]
        if q != r and qhi > qlo:
            if dsts is not None and dsts[q] is not None:
                dst[qlo:qhi] = dsts[q][qlo:qhi]
            else:
                cross.read(q, cross.DST, qlo * itemsize, dst[qlo:qhi])
    if _timeline.ACTIVE is not None:
        _timeline.ACTIVE.close()
    cross.group.sync()  # nobody returns (and lets its dst change) while others read it


class _ShmState:
    """Cached per communicator: the node's slots, or why there can be none."""

    def __init__(self, ctx):
        group = whole_node(ctx)
        self.node = self.cross = None
        self.stores, self.ways = {}, {}
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

    def stores_for(self, nbytes):
        """The slot path's :class:`~pycollective.algorithms.shm.stores.Stores` for calls of ``nbytes`` above
        ``DOUBLE_LIMIT`` (None below: those run :mod:`._mid` or need no choice).

        There the slots no longer fit a core's 2 MiB L2 beside the input and
        output, and whoever reads a slot runs on another core.  With a core
        per rank each rank chooses while it runs, as the repeated calls below
        4 MiB do.  Where ranks outnumber cores a call's time is too noisy to
        choose from, and the kind is fixed by size: non-temporal stores from
        ``STREAM_BYTES`` (docs/results/streamed.md).  Every call above 4 MiB is
        timed: a clock read beside 100 µs or more.
        """
        if nbytes <= DOUBLE_LIMIT:
            return None
        stores = self.stores.get(nbytes)
        if stores is None:
            if len(self.stores) >= _SIZES_KEPT:  # a sweep over sizes: start afresh
                self.stores.clear()
            group = self.node.group
            stores = self.stores[nbytes] = _stores.Stores(
                chooses=not group.barrier.sleep, fixed=int(nbytes >= STREAM_BYTES), every=1,
                shared=group.stores_word("slots", nbytes))
        return stores

    def way_for(self, nbytes):
        """The :class:`~pycollective.algorithms.shm.ways.Way` of calls of ``nbytes`` above
        ``DOUBLE_LIMIT`` where the single copy is allowed (None elsewhere: the slots).

        It chooses by timing up to ``CHOOSE_BYTES`` where every rank of the node
        has a core: ``wakes`` is false on every rank then, and true on every
        rank where any rank's waits sleep, so every rank makes the same choice
        of choosing.
        """
        if self.cross is None or nbytes <= DOUBLE_LIMIT:
            return None
        way = self.ways.get(nbytes)
        if way is None:
            if len(self.ways) >= _SIZES_KEPT:  # a sweep over sizes: start afresh (every rank)
                self.ways.clear()
            chooses = _times_ways(nbytes, not self.node.group.barrier.wakes)
            way = self.ways[nbytes] = _ways.Way(int(nbytes > SINGLE_COPY_BYTES), chooses)
        return way

    def single_copy(self, nbytes):
        """Whether calls of ``nbytes`` take the single copy now (asks, counts no call)."""
        way = self.way_for(nbytes)
        if way is None:
            return False
        if _ways.FORCE_WAY is not None:
            return _ways.FORCE_WAY == _ways.SINGLE
        return bool(way.fixed if way.decided is None else way.decided)

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
    way = state.way_for(dst.nbytes)
    if way is not None:
        _large(state, way, ctx, src, dst, kernel)
    elif _steps.compiled(state, call, dst):
        if _timeline.ACTIVE is not None:  # timeline hook: the compiled step (ended after it)
            _timeline.ACTIVE.open("compiled step", "step")
        _steps.small_data(state.node, call, src, dst)
        if _timeline.ACTIVE is not None:
            _timeline.ACTIVE.close()
    elif _steps.mid_compiled(state.node, call, dst):
        if _timeline.ACTIVE is not None:  # timeline hook: the compiled step (ended after it)
            _timeline.ACTIVE.open("compiled step", "step")
        _steps.mid_data(state.node, call, src, dst)
        if _timeline.ACTIVE is not None:
            _timeline.ACTIVE.close()
    else:
        shm_allreduce_on(state.node, src, dst, kernel, _arrays.registry_of(state.node.group, ctx),
                         state.stores_for(dst.nbytes))


def _large(state, way, ctx, src, dst, kernel):
    """A call above ``DOUBLE_LIMIT`` where the single copy is allowed: the way ``way`` says,
    timed while it chooses; after its last trial every rank agrees on the way."""
    shared = _arrays.registry_of(state.node.group, ctx)
    single, started = way.next()
    if single:
        cma_allreduce_on(state.cross, src, dst, kernel, shared)
    else:
        shm_allreduce_on(state.node, src, dst, kernel, shared, state.stores_for(dst.nbytes))
    if started and way.took(single, time.perf_counter() - started):
        slowest = np.array(way.times(), np.int64)
        state.node.group.max_of(slowest)
        way.decide(slowest.tolist())


def shm_agreed(ctx, src, dst, kernel, values, board):
    """shm with the agreement in the same compiled step (the registry's ``agreed``).

    Small messages take :func:`~pycollective.algorithms.shm.steps.small_agreed`: the agreement row
    and the data posted together, one synchronisation; the sliced sizes up
    to 4 MiB :func:`~pycollective.algorithms.shm.steps.mid_agreed`, the row posted with the
    copy-in; larger ones (or slots not grown yet) run the agreement through
    the board, then the algorithm.  Either way the first sync is the
    agreement's, with the same target, board and header as the Python path's.
    """
    state = _state(ctx)
    call = _watch.current()
    if _steps.compiled(state, call, dst, board):
        return _steps.small_agreed(state.node, call, src, dst, values, board)
    done = _steps.mid_agreed(state, call, src, dst, values, board)
    if done is not None:
        return done
    before = values.tobytes()
    if _timeline.ACTIVE is not None:  # timeline hook: the agreement (ended below)
        _timeline.ACTIVE.open("agreement")
    board.max(values)
    if _timeline.ACTIVE is not None:
        _timeline.ACTIVE.close()
    if values.tobytes() != before:
        return False
    shm_allreduce(ctx, src, dst, kernel)
    return True


def shm_repeated(ctx, dst, kernel, board):
    """The registry's ``repeated``: the reduce-scatter-allgather step where ranks have
    cores of their own (:mod:`.rsag`), else a prepared small or sliced path, else None."""
    return (_rsag_steps.repeated(ctx, dst, kernel, board, _STATE, shm_agreed)
            or _steps.repeated(ctx, dst, kernel, board, _STATE, shm_agreed))


def shm_cost(nranks, count, itemsize, alpha, beta, gamma):
    """α-β-γ time of :func:`shm_allreduce` (see the essay above)."""
    nbytes = count * itemsize
    sync = math.ceil(math.log2(nranks)) * alpha
    if nbytes <= REPLICATE_BYTES:
        return sync + nbytes * beta + (nranks - 1) * nbytes * gamma
    moved = (nranks - 1) / nranks * nbytes
    syncs = 2 + (nbytes > DOUBLE_LIMIT)
    return syncs * sync + 2 * moved * beta + moved * gamma


def _times_ways(nbytes, own_cores):
    """Whether a size's first calls time the slots and the single copy in turn
    (``ways.Way``): above ``DOUBLE_LIMIT``, up to ``CHOOSE_BYTES``, every rank a core."""
    return bool(own_cores) and DOUBLE_LIMIT < nbytes <= CHOOSE_BYTES


def shm_settling(layout, nbytes):
    """Calls of ``nbytes`` before shm's take the way and the stores they keep, told by the
    layout: where every rank has a core, the ways' trials (:func:`_times_ways`) and, from
    ``rsag_steps.CHOOSE_BYTES`` up to ``CHOOSE_BYTES``, the turns in which the stores'
    two kinds are tried (``stores.Stores.PROBE``; a shape whose family settled already
    tries none).  auto's trials and the first-use measurement time the calls after them.
    (Where the single copy is not allowed the calls have no ways to time: counting them
    anyway only leaves the trials a few more calls.)"""
    own = layout.ranks_per_core <= 1
    calls = _ways.Way.LAST_TRIAL if _times_ways(nbytes, own) else 0
    if own and _rsag_steps.CHOOSE_BYTES <= nbytes <= CHOOSE_BYTES:
        calls += _stores.Stores.PROBE
    return calls


register("shm", shm_allreduce,
         "one node: ranks reduce their slice straight from the others' shared-memory slots",
         cost=shm_cost, usable=on_one_node, agreed=shm_agreed, verifies_arguments=True,
         layout_aware=True, repeated=shm_repeated, settling=shm_settling)
