"""shm's compiled steps from Python: the glue and the prepared repeated calls.

``algorithms/shm/allreduce.py`` is the algorithm (its protocol, the Python steps, the single
copy, the state, the cost); the small and sliced paths also run as one
compiled call each (:mod:`._small`, :mod:`._mid`).  This module is what
stands between the two: which calls the compiled steps run
(:func:`compiled`, :func:`mid_compiled`), their arguments (the slot views,
the targets and header sets of :meth:`NodeGroup.compiled_step`), and what
follows them in Python (a slow rank's wait with the deadline, ranks that
disagree, a rank that went the longer way, headers that differ).

:class:`RepeatedSmall` and :class:`RepeatedMid` are the same calls prepared
for one dtype and size (the registry's ``repeated``), with the fast way of
``collectives.plans.run`` (``fast``: the call numbered, its compiled step,
no call record unless the step hands the call back).  The fast way passes
the arrays that stay the same call after call (flags, boards, header sets,
slots, agreement template, fingerprint) by address, in control words built
once per plan and slots (``_small.prepared_step``, ``_mid.prepared_step``):
three arrays and three integers to type on entry instead of 13 or 18
arguments, 5-15 % of a call below 1 MiB (docs/results/entry.md).
"""

import functools
import time
from typing import Callable, NamedTuple, Tuple

import numpy as np

from ...data.partition import chunk_bounds
from ...node.group import DOUBLE_LIMIT, FP_WORDS, PARITY
from ...node.views import address, as_writable
from ...runtime.watch import FP_OP
from . import mid as _mid, small as _small
from .stores import Stores

__all__ = ["REPLICATE_BYTES", "COMPILED", "compiled", "data_buffers", "small_data", "small_agreed",
           "mid_compiled", "mid_data", "mid_agreed", "repeated"]

REPLICATE_BYTES = 4 << 10     # up to this, every rank reduces the whole vector
_F16 = np.dtype(np.float16)
COMPILED = {np.dtype(t) for t in ("float16", "float32", "float64", "int8", "int16", "int32",
                                  "int64", "uint8", "uint16", "uint32", "uint64")}


def data_buffers(src, dst, half):
    """``src`` and ``dst`` as the compiled steps take them: a read-only send buffer as a
    writable alias of its memory (numba would compile the whole step again for its type;
    the steps only read it), float16 (``half``) as its uint16 bit patterns."""
    src = as_writable(src)
    if half:
        return src.view(np.uint16), dst.view(np.uint16)
    return src, dst


# --- the small path (up to REPLICATE_BYTES, one sync) in compiled code --------------------

def compiled(state, call, dst, board=None):
    """Whether :mod:`._small` runs this call: a small size whose slots are big enough
    already, a compiled dtype, and (with ``board``) the agreement on the node's own board."""
    node = state.node
    return (state.error is None and call is not None and dst.nbytes <= REPLICATE_BYTES
            and node.capacity >= 2 * dst.nbytes and dst.dtype in COMPILED
            and (board is None or getattr(board, "group", None) is node.group))


def small_data(node, call, src, dst):
    """The small path's data step in compiled code (the slots are big enough already)."""
    group = node.group
    target, publish, checking = group.compiled_step(call, check=True)
    if checking is None:  # an earlier step of the call compared them: again, no harm
        checking = group.header_set()
    offset, _ = node.begin(dst.nbytes)
    half = dst.dtype == _F16
    src, dst = data_buffers(src, dst, half)
    rows = node.rows(offset, dst.size, dst.dtype)
    op = call.fingerprint[FP_OP]
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


def small_agreed(node, call, src, dst, values, board):
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
    return _small_folded(SmallCall(node, board, step, target, rows, headers, board.take()),
                         call, src, dst, values)


class SmallCall(NamedTuple):
    """A call of the small path's folded step: what its compiled step is given besides the
    call's own facts and buffers, and what the Python after it needs."""

    node: object              # the slots (``node.group`` syncs them)
    board: object             # the agreement board (``SharedMax``)
    step: Callable            # ``_small.agreed_step`` or its two-byte-float twin
    target: int               # the sync's barrier target
    rows: np.ndarray          # the region's slot rows
    headers: np.ndarray       # the call's header set
    rows_board: np.ndarray    # the board's rows this call posts its agreement row into


def _small_folded(s: SmallCall, call, src, dst, values):
    """:func:`small_agreed` once its target, slot rows and header set are known."""
    group = s.node.group
    half = s.step is _small.agreed_step_half
    data_src, data_dst = data_buffers(src, dst, half)
    verdict = s.step(group.barrier.words, group.rank, group.size, s.target, s.rows_board, values,
                     s.rows, data_src, s.headers, call.number, call.fingerprint_words, data_dst,
                     call.fingerprint[FP_OP])
    return _small_after(s, call, src, dst, values, verdict)


def _small_after(s: SmallCall, call, src, dst, values, verdict):
    """What follows the folded step's compiled call: done, a slow rank, a disagreement,
    a rank that went the longer way, or headers that differ."""
    node, group = s.node, s.node.group
    if verdict == _small.DONE:
        node.begin(dst.nbytes)
        return True
    half = s.step is _small.agreed_step_half
    data_dst = dst.view(np.uint16) if half else dst
    op = call.fingerprint[FP_OP]
    if verdict == _small.LATE:
        group.barrier.wait(s.target)  # a slow rank: wait on with the deadline
        verdict = _small.rows_verdict(s.rows_board, values, group.size)
        if verdict == _small.DONE:
            reduce = _small.reduce_half if half else _small.reduce
            verdict = reduce(s.headers, group.rank, group.size, s.rows, data_dst, op)
    if verdict == _small.DISAGREE:
        s.board.fold(s.rows_board, values)
        return False
    if verdict == _small.UNFOLDED:
        # A rank agreed through the board alone and posts its data before its
        # next sync: the data step (posting ours again) meets it there.
        small_data(node, call, src, dst)
        return True
    if verdict == _small.HEADERS_DIFFER:
        group.check(call, s.headers)  # raises, naming who is in which call
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


# --- the sliced path (4 KiB - DOUBLE_LIMIT, two alternating regions) in compiled code -----------

def mid_compiled(node, call, dst):
    """Whether :mod:`._mid` runs this call: a sliced two-region size whose slots are big
    enough already (else the Python path grows them, collectively) and a compiled dtype."""
    nbytes = dst.nbytes
    return (call is not None and REPLICATE_BYTES < nbytes <= DOUBLE_LIMIT
            and node.capacity >= 2 * nbytes and dst.dtype in COMPILED)


def mid_data(node, call, src, dst):
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
                          call.fingerprint_words, call.fingerprint[FP_OP], src, dst, publish,
                          checking)


def _mid_slots(node, dtype, offset):
    """The step's slot arguments for the region at byte ``offset``: the segment as one
    array of ``dtype`` (:meth:`SharedSlots.flat`), the slot stride and the region's base."""
    itemsize = dtype.itemsize
    return node.flat(dtype), node.capacity // itemsize, offset // itemsize


def _mid_call_args(slots, bounds, half, number, words, op, src, dst, publish, checking):
    """(``number``, ``words``, ``op``: the call's number, fingerprint words and op code.)"""
    src, dst = data_buffers(src, dst, half)
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
    """shm's ``agreed`` for the sliced two-region sizes: the agreement row is
    posted with the copy-in (:func:`._mid.agreed_step`), one sync instead of two.

    Returns None where it does not apply (the caller goes on as before), else
    what shm's ``agreed`` returns: False with ``values`` the MAX over the ranks
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
    return _mid_folded(MidCall(node, board, dst.nbytes, first, second, args, headers,
                               board.take()), call, values)


def _mid_agreed_runs(state, call, dst, board):
    """Whether :func:`mid_agreed` runs this call (the same on every rank that makes it)."""
    node = state.node
    return (state.error is None and mid_compiled(node, call, dst)
            and getattr(board, "group", None) is node.group)


class MidCall(NamedTuple):
    """A call of the sliced path's folded step: what its compiled step is given besides the
    call's agreement vector, and what the Python after it needs."""

    node: object              # the slots (``node.group`` syncs them)
    board: object             # the agreement board (``SharedMax``)
    nbytes: int               # the call's bytes per rank
    first: int                # the barrier target of the first sync
    second: int               # and of the second
    args: Tuple               # :func:`._mid.step`'s arguments after the targets
    headers: np.ndarray       # the call's header set
    rows: np.ndarray          # the board's rows this call posts its agreement row into


def _mid_folded(m: MidCall, call, values):
    """:func:`mid_agreed` once its targets and :func:`._mid.step`'s arguments are known."""
    group = m.node.group
    verdict, phase = _mid.agreed_step(group.barrier.words, group.rank, group.size, m.first,
                                      m.second, m.rows, values, *m.args, 0)
    return _mid_after(m, call, values, verdict, phase)


def _mid_after(m: MidCall, call, values, verdict, phase):
    """What follows :func:`._mid.agreed_step`: done, a slow rank, a disagreement, a rank
    that went the longer way, or headers that differ."""
    node, first, second, args, headers = m.node, m.first, m.second, m.args, m.headers
    group = node.group
    words = group.barrier.words
    late = verdict == _mid.LATE and phase == 1  # before the rows were compared
    if late:
        group.barrier.wait(first)  # a slow rank: wait on with the deadline
        verdict = _small.rows_verdict(m.rows, values, group.size)
    if verdict == _mid.DISAGREE:
        m.board.fold(m.rows, values)
        return False
    node.begin(m.nbytes)  # the call proceeds: its region is taken
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
    """The N + 1 slice bounds as int64 (shared by every caller: nothing writes them).

    Left writable: :func:`._mid.prepared_step` views them by address as a
    writable array, and the same array type as an argument here lets it reuse
    the step ``_mid.agreed_step`` compiled for the first call (a read-only
    one would be a second compile of the whole step, 4-7 s on a fresh install).
    """
    return np.array(chunk_bounds(count, size), np.int64)


# --- prepared repeated calls (the registry's ``repeated``) ---------------------------------

class _Repeated:
    """shm's agreed call for the repeated calls of one dtype and size (the registry's
    ``repeated``; :mod:`pycollective.collectives.plans` keeps it in the call's plan).

    What :func:`small_agreed` and :func:`mid_agreed` look up on every call
    (the state, the slot views of both regions, the compiled step and its
    arguments) is resolved once; a call does their bookkeeping and the
    compiled step, nothing else in Python.  Until the slots exist, and
    whenever they changed since (grown by a larger call, freed), it resolves
    again; where its path cannot run it runs ``fallback`` (shm's ``agreed``,
    ``fallback(ctx, src, dst, kernel, values, board)``).  ``key``: the context's
    key of shm's state (its ``node``: the slots), looked up, never built, here.
    """

    def __init__(self, ctx, dst, kernel, board, key, fallback):
        self.ctx, self.count, self.kernel, self.board = ctx, dst.size, kernel, board
        self.key, self.fallback = key, fallback
        self.half = dst.dtype == _F16
        self.dtype = np.dtype(np.uint16) if self.half else dst.dtype
        self.node = self.segment = None
        self.views = ()
        # the plan the control words are for, and the words; the arrays behind their
        # addresses stay alive with what holds them here: node.group, views, plan, bounds
        self.plan = self.ctl = None

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
        self.plan = self.ctl = None
        state = ctx.peek(self.key)
        views = () if state is None or state.node is None else self._resolve(state, call, dst)
        if not views:
            return self.fallback(ctx, src, dst, self.kernel, values, self.board)
        node = state.node
        self.node, self.segment, self.views = node, node.segment, views
        return self(ctx, call, values, src, dst)

    def _control(self, plan, words):
        """Control words (``_small.CONTROL_WORDS``'s layout, ``words`` of them) with the
        shared ones filled from the resolved slots' node group and ``plan``; the subclass
        fills its own."""
        group = self.node.group
        flags, boards, headers = group.barrier.words, group.boards, group.headers
        values, fingerprint = plan.template, plan.words
        if not all(a.dtype == np.int64 and a.flags.c_contiguous
                   for a in (flags, boards, headers, values, fingerprint)):
            raise AssertionError("control words need C-contiguous int64 arrays")
        ctl = np.zeros(words, np.int64)
        ctl[_small.FLAGS], ctl[_small.FLAGS_LEN] = address(flags), flags.size
        ctl[_small.RANK], ctl[_small.SIZE] = group.rank, group.size
        ctl[_small.BOARD:_small.BOARD + 2] = address(boards[0]), address(boards[1])
        ctl[_small.BOARD_WIDTH] = boards.shape[2]
        ctl[_small.VALUES], ctl[_small.VALUES_LEN] = address(values), values.size
        ctl[_small.HEADERS:_small.HEADERS + 2] = address(headers[0]), address(headers[1])
        ctl[_small.HEADER_WIDTH] = headers.shape[2]
        ctl[_small.FINGERPRINT] = address(fingerprint)
        ctl[_small.FINGERPRINT_LEN] = fingerprint.size
        self.plan, self.ctl = plan, ctl
        return ctl


class RepeatedSmall(_Repeated):
    """:func:`small_agreed`, prepared: ``views`` are both regions' slot rows."""

    def __init__(self, ctx, dst, kernel, board, key, fallback):
        super().__init__(ctx, dst, kernel, board, key, fallback)
        self.step = _small.agreed_step_half if self.half else _small.agreed_step
        self.prepared = _small.prepared_step_half if self.half else _small.prepared_step
        self.nbytes = dst.nbytes

    def _resolve(self, state, call, dst):
        if not compiled(state, call, dst, self.board):
            return ()
        node = state.node
        half_capacity = node.capacity // 2  # the two regions begin() alternates
        return tuple(node.rows(p * half_capacity, self.count, self.dtype) for p in (0, 1))

    def __call__(self, ctx, call, values, src, dst):
        node = self.node
        if node is None or node.segment is not self.segment:
            return self._again(ctx, call, values, src, dst)
        target, headers = _folded_step(node.group, call)
        return _small_folded(SmallCall(node, self.board, self.step, target,
                                       self.views[node.parity], headers, self.board.take()),
                             call, src, dst, values)

    def fast(self, number, plan, src, dst):
        """The call numbered ``number`` as one compiled step and its bookkeeping; None once
        done, else the rest (see ``collectives.plans.run``)."""
        node = self.node
        if node is None or node.segment is not self.segment:
            return self  # nothing done yet: the whole call, with its record
        ctl = self.ctl if plan is self.plan else self._prepare(plan)
        group = node.group
        target, side = group.opening_steps(number, 1)
        board_side, parity = self.board.take_side(), node.words[PARITY]
        if self.half:
            src, dst = src.view(np.uint16), dst.view(np.uint16)
        verdict = self.prepared(ctl, src, dst, target, number,
                                board_side | parity << 1 | side << 2)
        if verdict == _small.DONE:
            node.begin(self.nbytes)
            return None
        return functools.partial(self._rest, SmallCall(
            node, self.board, self.step, target, self.views[parity], group.headers[side],
            group.boards[board_side]), verdict)

    def _prepare(self, plan):
        """The control words of :func:`._small.prepared_step` for ``plan``."""
        ctl = self._control(plan, _small.CONTROL_WORDS)
        rows = self.views
        stride, itemsize = rows[0].strides[0], rows[0].itemsize
        if stride % itemsize or rows[0].strides[1] != itemsize:
            raise AssertionError("slot rows must lie whole elements apart")
        ctl[_small.ROWS:_small.ROWS + 2] = address(rows[0]), address(rows[1])
        ctl[_small.ROW_STRIDE], ctl[_small.COUNT] = stride // itemsize, self.count
        ctl[_small.OP] = plan.fingerprint[FP_OP]
        return ctl

    def _rest(self, s, verdict, ctx, call, values, src, dst):
        return _small_after(s, call, src, dst, values, verdict)


class RepeatedMid(_Repeated):
    """:func:`mid_agreed`, prepared: ``views`` are both regions' :func:`_mid_slots`."""

    def __init__(self, ctx, dst, kernel, board, key, fallback):
        super().__init__(ctx, dst, kernel, board, key, fallback)
        self.nbytes = dst.nbytes
        self.bounds = None
        self.stores = Stores()

    def _resolve(self, state, call, dst):
        if not _mid_agreed_runs(state, call, dst, self.board):
            return ()
        node = state.node
        group = node.group
        self.stores = Stores(chooses=not group.barrier.sleep,
                             shared=group.stores_word("sliced", self.nbytes))
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
                              call.fingerprint_words, call.fingerprint[FP_OP], src, dst, headers,
                              headers)
        return _mid_folded(MidCall(node, self.board, self.nbytes, first, second, args, headers,
                                   self.board.take()), call, values)

    def fast(self, number, plan, src, dst):
        """:meth:`RepeatedSmall.fast` for the sliced path."""
        node = self.node
        if node is None or node.segment is not self.segment:
            return self
        ctl = self.ctl if plan is self.plan else self._prepare(plan)
        group = node.group
        first, side = group.opening_steps(number, 2)
        board_side, parity = self.board.take_side(), node.words[PARITY]
        data_src, data_dst = (src.view(np.uint16), dst.view(np.uint16)) if self.half \
            else (src, dst)
        kind, started = self.stores.next()
        verdict, phase = _mid.prepared_step(ctl, data_src, data_dst, first, number,
                                            board_side | parity << 1 | side << 2 | kind << 3)
        if verdict == _mid.DONE:
            if started:
                self.stores.took(kind, time.perf_counter() - started)
            node.begin(self.nbytes)
            return None
        headers = group.headers[side]
        args = _mid_call_args(self.views[parity], self.bounds, self.half, number, plan.words,
                              plan.fingerprint[FP_OP], src, dst, headers, headers)
        return functools.partial(self._rest, MidCall(
            node, self.board, self.nbytes, first, first + 1, args, headers,
            group.boards[board_side]), verdict, phase)

    def _prepare(self, plan):
        """The control words of :func:`._mid.prepared_step` for ``plan``."""
        ctl = self._control(plan, _mid.CONTROL_WORDS)
        (flat, stride, base0), (_, _, base1) = self.views
        ctl[_mid.FLAT], ctl[_mid.FLAT_LEN], ctl[_mid.STRIDE] = address(flat), flat.size, stride
        ctl[_mid.BASE:_mid.BASE + 2] = base0, base1
        ctl[_mid.BOUNDS] = address(self.bounds)
        ctl[_small.OP] = plan.fingerprint[FP_OP] + (_mid.HALF if self.half else 0)
        return ctl

    def _rest(self, m, verdict, phase, ctx, call, values, src, dst):
        return _mid_after(m, call, values, verdict, phase)


def repeated(ctx, dst, kernel, board, key, fallback):
    """A prepared small or sliced path for ``dst``'s dtype and size, else None
    (``key``, ``fallback``: see :class:`_Repeated`)."""
    if dst.dtype not in COMPILED or dst.nbytes > DOUBLE_LIMIT:
        return None
    if dst.nbytes <= REPLICATE_BYTES:
        return RepeatedSmall(ctx, dst, kernel, board, key, fallback)
    return RepeatedMid(ctx, dst, kernel, board, key, fallback)
