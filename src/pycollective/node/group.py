"""Shared memory among the ranks of one node: the group, a MAX board, slots, node steps.

The primitives the shared-memory algorithms ("shm", "hierarchical") and the
agreement step are built from.

* :class:`~pycollective.node.segment.Segment` (its own module): memory mapped by
  every rank of a node, never named in ``/dev/shm`` for longer than the set-up.
* :class:`~pycollective.node.barrier.FlagBarrier` (its own module): the counters'
  barrier, spinning or sleeping.
* :class:`NodeGroup`: the ranks of a communicator that share memory, with a
  small control segment holding a counter per rank (the barrier), a header
  per rank (what this rank is doing: call number and fingerprint, buffer
  addresses and sizes), a mailbox and the agreement board.
* :class:`SharedSlots`: one slot per rank in a data segment that grows on
  demand, with two alternating regions for small messages.
* The node steps of a sliced reduction: :func:`copy_in`,
  :func:`reduce_own_slice`, :func:`copy_out`, :func:`reduce_block`.

Barrier targets are derived from the call number and the step within the
call, so a rank that is in another call, or skipped a step, can never pass a
barrier paired with the wrong step of the others; headers carry the call's
fingerprint, and every rank compares all headers after the first barrier of
a call, so ranks that disagree on the arguments raise instead of reading
each other's data (which is what makes the shared-memory paths safe with the
agreement step off).
"""

import array
import pickle
import zlib

import numpy as np
from mpi4py import MPI

from ..runtime import watch as _watch
from .atomics import STRIDE
from .barrier import FlagBarrier, opening_sync as _opening_sync, wait_modes
from ..runtime.context import Key
from .._errors import CollectiveMismatch
from .segment import Segment
from .. import timeline as _timeline
from ..runtime import threads as _threads

# Segment, FlagBarrier and wait_modes live in their own modules; re-exported
# because the node's users know them from here.
__all__ = ["Segment", "NodeGroup", "whole_node", "FlagBarrier", "SharedSlots", "SharedMax",
           "node_comm", "wait_modes", "reduce_block", "copy_in", "reduce_own_slice", "copy_out",
           "BLOCK_BYTES", "DOUBLE_LIMIT", "STEP_WORDS", "NUMBER", "STEP", "PUBLISHED", "LAST",
           "UNCHECKED", "PARITY", "DIRTY"]

BLOCK_BYTES = 128 << 10      # reduction block: N inputs + output stay in a 2 MB L2
DOUBLE_LIMIT = 4 << 20       # to this: two regions, shm's one step (results/double-limit.md)

# Control segment layout, in int64 words.
_FLAG_WORDS = STRIDE         # one 64-byte cache line per rank: counter, sleepers
FP_WORDS = 16                # a header: call number, fingerprint (9 words), padding
_CMA_WORDS = 8               # per rank: pid, src/dst address, nbytes; src/dst in node.arrays
_OK_WORDS = 8                # per rank: "I mapped the new segment"
_MAIL_WORDS = 64             # rank 0's mailbox (pickled, for segment exchange)
_BOARD_WIDTH = 24            # int64 per agreement row (3 + 2 facts x 10, padded)
_KIND_WORDS = 16             # the kinds of stores the node's first rank chose (stores_word)

# NodeGroup.words: the call whose steps this rank is in, its last step, header sets
# published so far (the next uses set PUBLISHED & 1), the last barrier target, and the
# header set not yet checked (-1: none).
NUMBER, STEP, PUBLISHED, LAST, UNCHECKED = range(5)
STEP_WORDS = 5
# SharedSlots.words
PARITY, DIRTY = 0, 1


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


# The first slots hold 1 MiB each: every call up to 512 KiB per rank (the small and
# reduce-scatter steps use two regions of a slot) then runs without growing them, and
# growing costs a new segment on every rank, many times a small call.  A tmpfs page costs
# memory only once written, so slots sized for calls a program never makes cost nothing.
_FIRST_SLOT = 1 << 20


def _round_capacity(nbytes):
    """Slot bytes for a need of ``nbytes`` (at least _FIRST_SLOT; grows geometrically up
    to 64 MB)."""
    nbytes = max(nbytes, _FIRST_SLOT)
    if nbytes <= 64 << 20:
        return 1 << (nbytes - 1).bit_length()
    step = 16 << 20
    return -(-nbytes // step) * step


# --- the ranks of a node --------------------------------------------------------------------

class NodeGroup:
    """The ranks of a node-local communicator, and their control segment.

    Collective over ``comm`` (whose ranks must share memory) to create; the
    communicator is not kept: later collective steps of the group (growing a
    data segment) go through the barrier and the mailbox.

    Args:
        comm: a communicator whose ranks share memory.
        progress: the communicator the barrier keeps MPI progress on.
    """

    def __init__(self, comm, progress):
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        n = self.size
        parts = [("flags", n * _FLAG_WORDS), ("headers", 2 * n * FP_WORDS),
                 ("cma", n * _CMA_WORDS), ("ok", n * _OK_WORDS), ("mailbox", _MAIL_WORDS),
                 ("boards", 2 * n * _BOARD_WIDTH), ("kinds", _KIND_WORDS)]
        _watch.arrive(comm, "a shared-memory setup")
        self.control = Segment.share(
            8 * sum(size for _, size in parts), self.rank, lambda v: comm.bcast(v, root=0),
            lambda ok: comm.allreduce(bool(ok), op=MPI.LAND))
        w, at, view = self.control.words(), 0, {}
        for name, size in parts:
            view[name], at = w[at:at + size], at + size
        # Two sets of headers, used by alternate publishing calls: a rank can
        # publish its next header before a slower rank has checked the last
        # ones, but not two (it waits for that rank in the next call's sync).
        self.headers = view["headers"].reshape(2, n, FP_WORDS)
        self._header_sets = (self.headers[0], self.headers[1])
        self.cma = view["cma"].reshape(n, _CMA_WORDS)
        self.ok = view["ok"].reshape(n, _OK_WORDS)
        self.mailbox = view["mailbox"]
        self.boards = view["boards"].reshape(2, n, _BOARD_WIDTH)
        self.kinds = memoryview(view["kinds"])  # its items read as Python ints
        sleep, wakes = wait_modes(comm)
        self.barrier = FlagBarrier(view["flags"], self.rank, n, progress, sleep, wakes)
        # The step bookkeeping (see :data:`STEP_WORDS`): words of an array, so that a
        # compiled entry can open a call itself (``algorithms/shm/rsag.py``).
        self.words = array.array("q", [0] * STEP_WORDS)
        self.words[NUMBER], self.words[UNCHECKED] = -1, -1
        self.cma[self.rank, 4:] = -1  # no shared allocation published (see node.arrays)
        comm.Barrier()  # every counter is zero before anyone waits on it

    # -- steps: every call's first sync publishes and checks the headers -------------------

    def sync(self, check=True):
        """All ranks of the node meet; stores before are visible to loads after.

        The first sync of each call also publishes this rank's header (the
        call's number and fingerprint) before it, and the first sync with
        ``check`` compares every rank's header after it (:meth:`check`):
        ranks that disagree raise before anyone reads the others' data.  The
        agreement step syncs without ``check``: it has its own verdict, which
        names a rank's bad argument instead of the difference it makes.
        """
        call = _watch.current()
        w = self.words
        if call is None:
            # Outside any call (setting up, profiling): the next target after
            # the last one, which every rank reaches through the same steps.
            w[LAST] += 1
            self.barrier.sync(w[LAST])
            return
        if call.number != w[NUMBER]:
            w[NUMBER], w[STEP] = call.number, 0
            w[UNCHECKED] = w[PUBLISHED] & 1
            self.publish(call)
        w[STEP] += 1
        last = (call.number << 24) + w[STEP]
        w[LAST] = last
        if _timeline.ACTIVE is not None:  # timeline hook: waiting for the node's ranks
            _timeline.ACTIVE.open("sync", "wait")
        self.barrier.sync(last)
        if _timeline.ACTIVE is not None:  # timeline hook: the sync's end
            _timeline.ACTIVE.close()
        if check and w[UNCHECKED] >= 0:
            rows = self.headers[w[UNCHECKED]]
            w[UNCHECKED] = -1
            self.check(call, rows)

    def compiled_step(self, call, check):
        """The bookkeeping of one :meth:`sync` of ``call`` that compiled code does itself.

        Returns ``(target, publish, checking)``: the barrier target; the
        header set the compiled code must write this rank's header into
        before raising its counter (None unless this is the call's first
        step); the header set it must compare after the wait (None unless
        ``check`` and the headers are not checked yet).  Same state changes
        as :meth:`sync`, so both kinds of step mix within one call.
        """
        publish = None
        w = self.words
        if call.number != w[NUMBER]:
            w[NUMBER], w[STEP] = call.number, 0
            side = w[PUBLISHED] & 1
            publish, w[UNCHECKED] = self.headers[side], side
            w[PUBLISHED] += 1
        w[STEP] += 1
        last = (call.number << 24) + w[STEP]
        w[LAST] = last
        checking = None
        if check and w[UNCHECKED] >= 0:
            checking = self.headers[w[UNCHECKED]]
            w[UNCHECKED] = -1
        return last, publish, checking

    def opening_steps(self, number, steps):
        """:meth:`compiled_step` with ``check`` for the first ``steps`` syncs of a new call
        numbered ``number``, for a caller without a call record (the repeated call's fast
        way, ``algorithms/shm/steps.py``).  Returns the first target (the others follow it
        by one) and which header set to publish into, which the first sync also checks:
        ``headers[side]`` (0 or 1)."""
        w = self.words
        published = w[PUBLISHED]
        w[PUBLISHED] = published + 1
        w[NUMBER] = number
        w[STEP] = steps
        w[UNCHECKED] = -1
        last = (number << 24) + steps
        w[LAST] = last
        return last - steps + 1, published & 1

    def opening_sync(self, number, fingerprint):
        """Call ``number``'s one sync (``collectives.barrier``), compiled: ``node.barrier.
        opening_sync``.  Returns ``(target, rows, verdict)``; a rank still awaited: wait on
        with ``barrier.wait(target)``, then :meth:`check` the header set ``rows``."""
        target, side = self.opening_steps(number, 1)
        rows = self._header_sets[side]
        return target, rows, _opening_sync(self.barrier.words, self.rank, self.size, target,
                                           rows, number, fingerprint, not self.barrier.sleep)

    def rewind(self, number, step):
        """Leave the step count at ``step`` of call ``number``, its headers checked (a
        compiled step that took the call's first ``step`` syncs, handing the rest to an
        older step)."""
        w = self.words
        w[NUMBER], w[STEP], w[UNCHECKED] = number, step, -1
        w[LAST] = (number << 24) + step

    def stores_word(self, family, nbytes):
        """Where the node's first rank publishes the kind of stores its calls of ``nbytes``
        in ``family`` take (``algorithms.shm.stores.Stores``): ``(words, index, leads)``,
        ``leads`` True on that rank.  The same word on every rank; shapes whose names
        collide share one (the choice is then a neighbour's, never a wrong result)."""
        index = zlib.crc32(f"{family}:{nbytes}".encode()) % _KIND_WORDS
        return self.kinds, index, self.rank == 0

    def header_set(self):
        """The header set this rank published last (its current call's)."""
        return self.headers[(self.words[PUBLISHED] - 1) & 1]

    def publish(self, call):
        """Write ``call``'s number and fingerprint into this rank's header; return the set."""
        rows = self.headers[self.words[PUBLISHED] & 1]
        self.words[PUBLISHED] += 1
        mine = rows[self.rank]
        mine[0] = call.number
        mine[1:1 + len(call.fingerprint_words)] = call.fingerprint_words
        return rows

    def check(self, call, rows):
        """Raise :class:`~pycollective.CollectiveMismatch` if any rank's header differs.

        Called after a sync that followed every rank's :meth:`publish`.
        Every rank reads the same headers, so every rank raises.
        """
        if rows.tobytes() == rows[self.rank].tobytes() * self.size:
            return

        def what(row):
            return (f"call #{int(row[0])}: "
                    f"{_watch.describe(tuple(int(v) for v in row[1:1 + len(_watch.FIELDS)]))}")
        mine = rows[self.rank]
        odd = [q for q in range(self.size) if not np.array_equal(rows[q], mine)]
        exc = CollectiveMismatch(
            f"{call.title()}: the ranks sharing this node disagree: node rank {self.rank} is in "
            f"{what(mine)}; " + "; ".join(f"node rank {q} is in {what(rows[q])}" for q in odd)
            + _threads.hint(tuple(int(v) for v in mine[1:1 + len(_watch.FIELDS)]),
                            tuple(int(v) for v in rows[odd[0]][1:1 + len(_watch.FIELDS)])),
            collective=call.what, call=call.number, comm=call.ctx.label, ranks=tuple(odd))
        raise _watch.fail(call, exc)

    # -- collective steps through the mailbox ------------------------------------------------

    def _bcast(self, value):
        if self.rank == 0:
            data = pickle.dumps(value)
            if len(data) > (_MAIL_WORDS - 1) * 8:
                raise ValueError("mailbox message too long")
            self.mailbox[0] = len(data)
            self.mailbox[1:].view(np.uint8)[:len(data)] = np.frombuffer(data, np.uint8)
        self.sync()
        n = int(self.mailbox[0])
        value = pickle.loads(self.mailbox[1:].view(np.uint8)[:n].tobytes())
        self.sync()  # nobody writes the mailbox again before everyone read it
        return value

    def all_ok(self, ok):
        """True on every rank iff ``ok`` on every rank (collective over the group)."""
        self.ok[self.rank, 0] = 1 if ok else 0
        self.sync()
        result = bool(np.all(self.ok[:, 0] == 1))
        self.sync()  # nobody writes its flag again before everyone read them all
        return result

    def max_of(self, values):
        """``values`` (at most 8 int64) replaced by their element-wise max over the group's
        ranks, the same on every rank (collective over the group; a rare step, as
        :meth:`all_ok`, which shares its rows)."""
        k = values.size
        self.ok[self.rank, :k] = values
        self.sync()
        np.max(self.ok[:, :k], axis=0, out=values)
        self.sync()  # nobody writes its row again before everyone read them all

    def new_segment(self, nbytes):
        """A data segment shared by the group (collective over the group)."""
        return Segment.share(nbytes, self.rank, self._bcast, self.all_ok)


_WHOLE = Key("shmem.whole_node")


def whole_node(ctx):
    """The :class:`NodeGroup` of all of ``ctx``'s ranks, or None if they span nodes.

    Cached in the context and shared by the agreement board and the
    shared-memory algorithm (their syncs follow one sequence).  Collective
    on first use; the same answer on every rank.
    """
    group = ctx.cached(_WHOLE, _build_whole)
    return None if group is _NOT_ONE_NODE else group


def _build_whole(ctx):
    _watch.arrive(ctx.comm, "its first shared-memory use")
    node, whole = node_comm(ctx.comm)
    try:
        return NodeGroup(node, ctx.comm) if whole else _NOT_ONE_NODE
    finally:
        node.Free()


class _NotOneNode:
    """Cached marker: the communicator spans nodes."""


_NOT_ONE_NODE = _NotOneNode()


# --- the agreement board ---------------------------------------------------------------------

class SharedMax:
    """Element-wise MAX over a node's ranks of a small int64 vector, through shared memory.

    What the agreement step of every pycollective call needs (see
    ``collectives.agree``), without an MPI collective: each rank writes its vector into
    its row of the board, one sync, each rank reads all rows.  Two boards are
    used alternately, so the next call can write while a slow rank still
    reads the last one (it cannot reach the board of call k+2 before every
    rank has entered call k+1's sync).  When all rows are equal, which is
    the case of agreeing ranks, the maximum is any row, found by one byte
    comparison.
    """

    WIDTH = _BOARD_WIDTH

    def __init__(self, group):
        self.group = group
        # words[0]: the side the next MAX takes (an array's word: compiled entries take it)
        self.words = array.array("q", [0])

    @property
    def parity(self):
        return self.words[0]

    def take(self):
        """The board of this MAX (they alternate); the next MAX takes the other.  Compiled
        steps that post their row with their data take it here too (``algorithms/shm.py``)."""
        return self.group.boards[self.take_side()]

    def take_side(self):
        """:meth:`take`, as which of the two boards it is (``group.boards[side]``)."""
        w = self.words
        side = w[0]
        w[0] = side ^ 1
        return side

    @staticmethod
    def fold(board, values):
        """``values`` = the element-wise max of every rank's row of ``board``."""
        np.max(board[:, :values.size], axis=0, out=values)

    def max(self, values):
        """Replace ``values`` (at most WIDTH int64) by its element-wise max over the ranks."""
        group = self.group
        board = self.take()
        k = values.size
        mine = board[group.rank]
        mine[:k] = values
        mine[k:] = 0
        group.sync(check=False)
        if board[:, :k].tobytes() != values.tobytes() * group.size:
            self.fold(board, values)


# --- slots for data ---------------------------------------------------------------------------

class SharedSlots:
    """One slot per rank of a :class:`NodeGroup` in a data segment that grows on demand.

    All methods are collective over the group when they allocate or sync.
    """

    def __init__(self, group):
        self.group = group
        self.rank, self.size = group.rank, group.size
        self.segment = None
        self.capacity = 0
        self.raw = []          # uint8 view of every rank's whole slot
        self.views = {}        # (offset, nbytes, dtype) -> tuple of typed slot views
        # words[PARITY]: the region the next call up to DOUBLE_LIMIT takes; words[DIRTY]:
        # 1 while a rank may still read the last region.  Words of an array: compiled
        # entries take and flip them (algorithms/shm/rsag.py).
        self.words = array.array("q", [0, 0])

    @property
    def parity(self):
        return self.words[PARITY]

    @parity.setter
    def parity(self, value):
        self.words[PARITY] = value

    @property
    def dirty(self):
        return bool(self.words[DIRTY])

    @dirty.setter
    def dirty(self, value):
        self.words[DIRTY] = bool(value)

    def ensure(self, nbytes):
        """Make every slot hold at least ``nbytes`` (collective when it grows)."""
        if nbytes <= self.capacity:
            return
        capacity = _round_capacity(nbytes)
        # Growing is collective: this sync (the call's first, so it checks
        # that every rank wants the same size) also makes sure no rank still
        # reads the old slots (small path, no trailing sync).
        self.group.sync()
        self.views.clear()
        self.raw = []
        self.segment = None
        self.segment = self.group.new_segment(capacity * self.size)
        data = self.segment.bytes()
        self.raw = [data[q * capacity:(q + 1) * capacity] for q in range(self.size)]
        self.capacity, self.parity, self.dirty = capacity, 0, False

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

    def rows(self, offset, count, dtype):
        """Every rank's slot region as one 2-D array ``[rank, element]`` (cached)."""
        key = ("rows", offset, count, dtype)
        view = self.views.get(key)
        if view is None:
            if len(self.views) > 256:
                self.views.clear()
            dtype = np.dtype(dtype)
            view = self.views[key] = np.ndarray(
                (self.size, count), dtype, buffer=self.segment.mm, offset=offset,
                strides=(self.capacity, dtype.itemsize))
        return view

    def flat(self, dtype):
        """The whole segment as one typed array (every slot, back to back; cached).

        Rank q's slot starts at element ``q * capacity // itemsize``: the
        compiled sliced path indexes it so, one array instead of N views.
        """
        key = ("flat", dtype)
        view = self.views.get(key)
        if view is None:
            view = self.views[key] = self.segment.bytes().view(dtype)
        return view

    def sync(self):
        self.group.sync()

    def begin(self, nbytes):
        """Prepare a call on ``nbytes`` per slot; return (byte offset, needs trailing sync).

        Messages up to ``DOUBLE_LIMIT`` alternate between two halves of the
        slot and leave without a trailing sync ("dirty": a slow rank may still
        read the last region).  A larger message uses the whole slot from
        offset 0, which overlaps both halves, so a dirty window is synced
        first.  Collective; every decision depends only on ``nbytes``, which
        the header check of the call makes sure is the same everywhere.
        """
        if nbytes <= DOUBLE_LIMIT:
            if 2 * nbytes > self.capacity:  # (tested here too: most calls need no frame)
                self.ensure(2 * nbytes)
            w = self.words
            parity = w[PARITY]
            w[PARITY] = parity ^ 1
            w[DIRTY] = 1
            return parity * (self.capacity // 2), False
        self.ensure(nbytes)
        if self.dirty:
            self.sync()
            self.dirty = False
        return 0, True

    def free(self):
        self.views.clear()
        self.raw = []
        self.segment = None


def _operands(src, slots, rank, lo, hi):
    return [src[lo:hi] if q == rank else slot[lo:hi] for q, slot in enumerate(slots)]


def reduce_block(kernel, operands, out):
    """``out = operands[0] op operands[1] op ...`` in that order."""
    kernel(operands[0], operands[1], out)
    for x in operands[2:]:
        kernel(out, x, out)


def copy_in(src, mine, rank, bounds, copy=None):
    """Copy ``src`` into the own slot ``mine``, except this rank's slice.

    ``copy(dst, src)``: how to copy (the slot path above DOUBLE_LIMIT may pass one
    with non-temporal stores, ``algorithms/shm/allreduce.py``); numpy's assignment if None.
    """
    lo, hi = bounds[rank], bounds[rank + 1]
    if lo:
        _assign(mine[:lo], src[:lo], copy)
    if hi < src.size:
        _assign(mine[hi:], src[hi:], copy)


def _assign(dst, src, copy):
    if copy is None:
        dst[...] = src
    else:
        copy(dst, src)


def reduce_own_slice(kernel, src, slots, rank, bounds, dst=None, copy=None):
    """Reduce slice ``rank`` of all inputs into the own slot (and ``dst`` if given).

    With ``copy`` (and ``dst``, not ``src``): each block is reduced into
    ``dst`` and ``copy(slot block, dst block)`` writes it into the slot, so
    that a copy which bypasses this core's cache does so on the slot, which
    only the others read.  ``src`` is ``dst`` in place, and then ``dst``
    cannot take partial results (a later pass would read them as this
    rank's input): the slot does, as without ``copy``.
    """
    lo, hi = bounds[rank], bounds[rank + 1]
    if hi == lo:
        return
    mine = slots[rank]
    block = max(1, BLOCK_BYTES // src.itemsize)
    into_dst = copy is not None and dst is not None and not np.may_share_memory(src, dst)
    for b in range(lo, hi, block):
        e = min(b + block, hi)
        operands = _operands(src, slots, rank, b, e)
        if into_dst:
            reduce_block(kernel, operands, dst[b:e])
            copy(mine[b:e], dst[b:e])  # read back from cache
            continue
        out = mine[b:e]
        reduce_block(kernel, operands, out)
        if dst is not None:
            dst[b:e] = out  # still in cache


def copy_out(dst, slots, rank, bounds, skip_own=True):
    for q, slot in enumerate(slots):
        if q == rank and skip_own:
            continue
        lo, hi = bounds[q], bounds[q + 1]
        if hi > lo:
            dst[lo:hi] = slot[lo:hi]

