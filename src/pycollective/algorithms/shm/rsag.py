"""shm's step for ranks with cores of their own: reduce-scatter then allgather, compiled.

For the repeated calls up to 4 MiB (``DOUBLE_LIMIT``; ``rsag_steps.py`` is the Python side),
one compiled call does what :mod:`.small` and :mod:`.mid` do, laid out
for a node where every rank runs on its own core:

0. post: this rank's agreement row and header (its own lines, read by the
   others only when something differs), its input *except its own slice*
   into its slot of the region this call uses, then one word beside its
   counter, the *call word* (the call number mixed with a hash of the
   agreement row and the fingerprint), then the counter to the first
   target.
1. wait for every other counter to reach the target, then compare every
   rank's call word with this rank's: one cache line per peer carries the
   counter and the call word, so a call that agrees reads N-1 metadata lines,
   not six per peer.  A word that differs returns ``WORDS_DIFFER``: Python
   compares the full rows and headers and raises the named error, or
   follows ranks that took the older steps (``rsag_steps``).
2. fold: the owner of each slice (64-byte aligned, :func:`line_bounds`)
   combines that slice of all N inputs, operands in rank order 0..N-1 (its
   own from ``src``), block by block, into the slice of its own slot and
   ``dst``; raise the counter to the second target.

What the others read (the copy-in, the own slice of the result) is written
with plain stores, or, where the call's ``sides`` has ``STREAM``, with
non-temporal ones that go to memory past this core's cache: on machines
whose cores at times read each other's caches several times slower than
memory, each rank chooses while running (``stores.Stores``, from
``rsag_steps.CHOOSE_BYTES``; docs/results/stores.md).  The fold then runs
into ``dst`` and streams each block into the slot.
3. wait for the second target, then copy every other slice of the result
   from its owner's slot into ``dst``.

Two ranks, calls up to ``rsag_steps.WHOLE_BYTES`` (the control word ``WHOLE``): each
posts its whole input and, after the one wait, folds the whole vector into ``dst``
(operands in rank order, the same bits) and is done: no second target, no copy-out.  At
N = 2 that reads as many bytes of the other's memory (M) as the sliced way, with one wait
fewer.  A rank whose wait fails then takes its arrival back (``FlagBarrier.withdraw``).

Each rank reads about 2·M·(N-1)/N elements of the others' memory, where the
small path's every-rank-reduces-all reads M·(N-1).  Every array is a 1-D
C-contiguous view at an address (``node.views.view``), never a strided 2-D
one: numba types those layout 'A' and compiles their loops to scalar code,
while these copies and folds vectorise (``tests/algorithms/test_rsag.py`` reads the
assembly).  The fold is the same left fold by the same kernels
(``data.kernels``) as the older steps', so results are bitwise the same.

Waits: with a core per rank a waiting rank checks every peer still awaited
once per pass, with a ``pause`` between passes and no system call for the
first ``node.atomics.PAUSES`` passes (then a ``sched_yield`` between passes: a peer that
late is not running); after ``SPINS`` passes it hands back to Python (``LATE`` and the phase), which
waits on with the call's deadline and side channel and calls again from
that phase.  Where ranks outnumber cores the waits are ``node.atomics.wait_own``'s
(yields, then sleeps), so an oversubscribed node stays correct.
"""

import numba
import numpy as np

from ...node.atomics import (CALL_WORD, STRIDE, call_word, raise_own, wait_own,
                             poll_counters as _poll)
from ...data.kernels import _max, _max_f16, _min, _min_f16, _prod, _prod_f16, _sum, _sum_f16
from ...node.views import view, writable_view
from .mid import _fold_native as _fold  # the same left fold as the older steps'
from .mid import _ONE, _ZERO, _stream  # constant arguments that compile no literal callees
from . import books as _books

__all__ = ["step", "step_half", "enter", "enter_half", "line_bounds", "call_word", "DONE", "WORDS_DIFFER", "LATE",
           "CONTROL_WORDS", "FOLDED", "LINE_BYTES", "BLOCK_BYTES", "SPINS", "STREAM"]

DONE, WORDS_DIFFER, LATE = 0, 1, 2
LINE_BYTES = 64
# Fold block: the partial result and one operand stay in a core's L1 across the N passes.
BLOCK_BYTES = 16 << 10
SPINS = 1 << 16         # polling passes before a wait hands back to Python
# ``sides`` bit: the writes the others read (the copy-in, the own slice of the result) go
# past this core's cache with non-temporal stores (``stores.Stores`` chooses, per call).
STREAM = 8
# ``sides`` bit the step sets itself from the call's number (bit 1 of it): which of the two
# regions inside the slot half of the call's parity, where the control word QUARTER is
# not 0 (calls of up to ``rsag_steps.BANKS_BYTES``).  A repeated call then comes back to
# the same region every fourth call instead of every second: at N = 2 on the Intel VM,
# 24-48 KB calls took 15-30 % less time so (docs/results/dedicated-cores.md).  Consecutive
# calls still take the two halves in turn, so no call writes where the last may be read.
BANK = 16
# The agreement row's last word: "my data are posted in this step's layout".  The
# older folded steps write 1 there, the board agreement 0, so every path tells
# from the rows which layout a peer's data are in (``rsag_steps``).
FOLDED = 2

# Control words: addresses and sizes this step reads, built once per plan and slots; from
# BOOKS, :func:`enter`'s bookkeeping words (``books``).
(FLAGS, RANK, SIZE, COUNT, OP, SLOTS, _SLOTS_1, SLOT_BYTES, BOUNDS, BOARD, _BOARD_1,
 BOARD_WIDTH, VALUES, VALUES_LEN, HEADERS, _HEADERS_1, HEADER_WIDTH, FINGERPRINT,
 FINGERPRINT_LEN, DEDICATED, PASSES, WHOLE, QUARTER, BOOKS) = range(24)
CONTROL_WORDS = BOOKS + _books.WORDS

_jit = numba.njit(cache=True, nogil=True)


def line_bounds(count, size, itemsize):
    """The N + 1 slice bounds (elements) of ``count`` items over ``size`` owners, every inner
    bound on a 64-byte line of the slot (each owner gets whole lines, within one of the others)."""
    per_line = max(1, LINE_BYTES // itemsize)
    lines = -(-count // per_line)
    return np.array([min(count, (lines * q // size) * per_line) for q in range(size + 1)],
                    np.int64)


@_jit
def _copy(src, dst):
    for i in range(src.shape[0]):
        dst[i] = src[i]


@_jit
def _wait(ctl, flags, target):
    rank, size = ctl[RANK], ctl[SIZE]
    if ctl[DEDICATED]:
        return _poll(flags, rank, size, target, ctl[PASSES])
    return wait_own(flags, rank, size, target)


@_jit
def _slot(ctl, q, sides, dtype):
    """Rank ``q``'s slot in this call's region, as a 1-D C array of ``COUNT`` elements."""
    return view(ctl[SLOTS + (sides >> 1 & 1)] + (sides >> 4 & 1) * ctl[QUARTER]
                + q * ctl[SLOT_BYTES], ctl[COUNT], dtype)


@_jit
def _post(ctl, flags, src, target, number, sides):
    """Phase 0: agreement row, header, input (but the own slice), call word, counter."""
    rank, size = ctl[RANK], ctl[SIZE]
    board = view(ctl[BOARD + (sides & 1)], (size, ctl[BOARD_WIDTH]), np.int64)
    values = view(ctl[VALUES], ctl[VALUES_LEN], np.int64)
    headers = view(ctl[HEADERS + (sides >> 2 & 1)], (size, ctl[HEADER_WIDTH]), np.int64)
    fingerprint = view(ctl[FINGERPRINT], ctl[FINGERPRINT_LEN], np.int64)
    k = values.shape[0]
    width = board.shape[1]
    for j in range(k):
        board[rank, j] = values[j]
    for j in range(k, width - 1):
        board[rank, j] = 0
    board[rank, width - 1] = FOLDED
    headers[rank, 0] = number
    for j in range(fingerprint.shape[0]):
        headers[rank, 1 + j] = fingerprint[j]
    bounds = view(ctl[BOUNDS], size + 1, np.int64)
    lo, hi = bounds[rank], bounds[rank + 1]
    if ctl[WHOLE]:  # the whole input: every rank folds all of it (see _body)
        lo = hi = 0
    mine = _slot(ctl, rank, sides, src.dtype)
    if sides & STREAM:
        _stream(mine[:lo], src[:lo])
        _stream(mine[hi:], src[hi:])
    else:
        _copy(src[:lo], mine[:lo])
        _copy(src[hi:], mine[hi:])
    # the layout in the word too: ranks that would fold differently never agree by it
    flags[rank * STRIDE + CALL_WORD] = call_word(number, values, fingerprint) ^ ctl[WHOLE]
    raise_own(flags, rank, target)  # fences: everything above before the counter


@_jit
def _words_agree(ctl, flags):
    rank, size = ctl[RANK], ctl[SIZE]
    mine = flags[rank * STRIDE + CALL_WORD]
    for q in range(size):
        if flags[q * STRIDE + CALL_WORD] != mine:
            return False
    return True


@_jit
def _fold_half(op, a, b, out):
    if op == 0:
        _sum_f16(a, b, out)
    elif op == 1:
        _prod_f16(a, b, out)
    elif op == 2:
        _max_f16(a, b, out)
    else:
        _min_f16(a, b, out)


@_jit
def _operand(ctl, q, sides, src, b, e):
    if q == ctl[RANK]:
        return src[b:e]
    return _slot(ctl, q, sides, src.dtype)[b:e]


@_jit
def _folds_into_dst(ctl, sides, src, dst):
    """Whether the fold goes into ``dst`` and from there past the cache into the slot
    (non-temporal stores, ``STREAM``).  Not in place on a rank past the first two: its
    own operand is ``dst``, which the fold of operands 0 and 1 would overwrite before
    its turn (ranks 0 and 1 read theirs in that first fold)."""
    return (sides & STREAM) != 0 and (
        src.ctypes.data != dst.ctypes.data or ctl[RANK] <= 1)


@_jit
def _copy_out(ctl, sides, dst):
    """Phase 3: every other owner's slice of the result, from its slot into ``dst``."""
    rank, size = ctl[RANK], ctl[SIZE]
    bounds = view(ctl[BOUNDS], size + 1, np.int64)
    for q in range(size):
        lo, hi = bounds[q], bounds[q + 1]
        if q != rank and hi > lo:
            _copy(_slot(ctl, q, sides, dst.dtype)[lo:hi], dst[lo:hi])


# The two steps differ only in their fold's kernels (float16 on its bit patterns): the
# same body written twice, as numba compiles one function per kernel it calls (the
# whole-vector fold too: one helper for both through mid._fold's overload made the
# fresh-clone suite's 2-rank launch, which compiles the cache, 14-16 s longer).  Each
# body takes the send buffer as a writable view of dst's type and the phase as an int64,
# so that numba compiles it once per dtype: a read-only send buffer, or a caller's
# constant phase (typed as a literal), would each compile the whole body again (three
# bodies per dtype where there is one now; the compile is most of a fresh suite's time).

@_jit
def step(ctl, source, dst, target, number, sides, phase):
    """The call from ``phase`` (0 at first; what a ``LATE`` returned after Python's wait):
    ``(verdict, phase)``, verdict DONE, WORDS_DIFFER or LATE.  ``target``: the first of
    the call's two barrier targets; ``sides``: bit 0 the board, 1 the slot region, 2 the
    header set, 3 (``STREAM``) non-temporal stores for what the others read."""
    # a read-only send buffer is typed apart from the slots' views, which a fold's
    # operands must match
    src = writable_view(source, dst.dtype)
    return _body(ctl, src, dst, target, number, sides | (number >> 1 & 1) * BANK,
                 np.int64(phase))


@_jit
def step_half(ctl, source, dst, target, number, sides, phase):
    """:func:`step` for float16 (``source`` and ``dst`` as uint16)."""
    src = writable_view(source, dst.dtype)
    return _body_half(ctl, src, dst, target, number, sides | (number >> 1 & 1) * BANK,
                      np.int64(phase))


@_jit
def _body(ctl, src, dst, target, number, sides, phase):
    """:func:`step`'s work."""
    flags = view(ctl[FLAGS], ctl[SIZE] * STRIDE, np.int64)
    if phase == 0:
        _post(ctl, flags, src, target, number, sides)
        phase = 1
    if phase == 1:
        if _wait(ctl, flags, target) >= 0:
            return LATE, 1
        if not _words_agree(ctl, flags):
            return WORDS_DIFFER, 2
        phase = 2
    if phase == 2 and ctl[WHOLE]:
        # every rank folds the whole vector into dst, operands in rank order, and is done:
        # one wait a call (what each rank reads of the others' memory at N = 2 is the same)
        op = ctl[OP]
        block = max(1, BLOCK_BYTES // dst.itemsize)
        for b in range(0, dst.shape[0], block):
            e = min(b + block, dst.shape[0])
            _fold(op, _operand(ctl, _ZERO, sides, src, b, e),
                  _operand(ctl, _ONE, sides, src, b, e), dst[b:e])
            for q in range(2, ctl[SIZE]):
                _fold(op, dst[b:e], _operand(ctl, q, sides, src, b, e), dst[b:e])
        return DONE, 3
    if phase == 2:
        rank, size, op = ctl[RANK], ctl[SIZE], ctl[OP]
        bounds = view(ctl[BOUNDS], size + 1, np.int64)
        lo, hi = bounds[rank], bounds[rank + 1]
        mine = _slot(ctl, rank, sides, dst.dtype)
        block = max(1, BLOCK_BYTES // dst.itemsize)
        direct = _folds_into_dst(ctl, sides, src, dst)
        for b in range(lo, hi, block):
            e = min(b + block, hi)
            out = dst[b:e] if direct else mine[b:e]
            _fold(op, _operand(ctl, _ZERO, sides, src, b, e),
                  _operand(ctl, _ONE, sides, src, b, e), out)
            for q in range(2, size):
                _fold(op, out, _operand(ctl, q, sides, src, b, e), out)
            if direct:
                _stream(mine[b:e], out)
            else:
                _copy(out, dst[b:e])  # after the fold: in place, dst[b:e] was an operand
        raise_own(flags, rank, target + 1)
        phase = 3
    if _wait(ctl, flags, target + 1) >= 0:
        return LATE, 3
    _copy_out(ctl, sides, dst)
    return DONE, 3


@_jit
def _body_half(ctl, src, dst, target, number, sides, phase):
    """:func:`step_half`'s work: :func:`_body` with float16's folds."""
    flags = view(ctl[FLAGS], ctl[SIZE] * STRIDE, np.int64)
    if phase == 0:
        _post(ctl, flags, src, target, number, sides)
        phase = 1
    if phase == 1:
        if _wait(ctl, flags, target) >= 0:
            return LATE, 1
        if not _words_agree(ctl, flags):
            return WORDS_DIFFER, 2
        phase = 2
    if phase == 2 and ctl[WHOLE]:
        # every rank folds the whole vector into dst, operands in rank order, and is done:
        # one wait a call (what each rank reads of the others' memory at N = 2 is the same)
        op = ctl[OP]
        block = max(1, BLOCK_BYTES // dst.itemsize)
        for b in range(0, dst.shape[0], block):
            e = min(b + block, dst.shape[0])
            _fold_half(op, _operand(ctl, _ZERO, sides, src, b, e),
                  _operand(ctl, _ONE, sides, src, b, e), dst[b:e])
            for q in range(2, ctl[SIZE]):
                _fold_half(op, dst[b:e], _operand(ctl, q, sides, src, b, e), dst[b:e])
        return DONE, 3
    if phase == 2:
        rank, size, op = ctl[RANK], ctl[SIZE], ctl[OP]
        bounds = view(ctl[BOUNDS], size + 1, np.int64)
        lo, hi = bounds[rank], bounds[rank + 1]
        mine = _slot(ctl, rank, sides, dst.dtype)
        block = max(1, BLOCK_BYTES // dst.itemsize)
        direct = _folds_into_dst(ctl, sides, src, dst)
        for b in range(lo, hi, block):
            e = min(b + block, hi)
            out = dst[b:e] if direct else mine[b:e]
            _fold_half(op, _operand(ctl, _ZERO, sides, src, b, e),
                       _operand(ctl, _ONE, sides, src, b, e), out)
            for q in range(2, size):
                _fold_half(op, out, _operand(ctl, q, sides, src, b, e), out)
            if direct:
                _stream(mine[b:e], out)
            else:
                _copy(out, dst[b:e])
        raise_own(flags, rank, target + 1)
        phase = 3
    if _wait(ctl, flags, target + 1) >= 0:
        return LATE, 3
    _copy_out(ctl, sides, dst)
    return DONE, 3


# --- a repeated call entered here --------------------------------------------------------

# The entries call the steps under names of their own: a compiled caller binds a global
# when it is compiled, and tests wrap ``step`` and ``step_half`` in Python to watch them.
_step, _step_half = step, step_half


@_jit
def enter(ctl, source, dst, kind):
    """A whole repeated call, numbered and booked here (``books.open_call``), then
    :func:`step`: 0 once done, else the step's ``verdict | phase << 4`` (the call's number,
    target and sides: ``books.entered``).  ``kind``: 1 for non-temporal stores (``STREAM``)."""
    number, target, sides = _books.open_call(ctl, BOOKS, ctl[VALUES], 2, kind)
    verdict, phase = _step(ctl, source, dst, target, number, sides, _ZERO)
    if verdict != DONE:
        return verdict | phase << 4
    _books.close_call(ctl, BOOKS, sides)
    return 0


@_jit
def enter_half(ctl, source, dst, kind):
    """:func:`enter` through :func:`step_half` (float16 as uint16)."""
    number, target, sides = _books.open_call(ctl, BOOKS, ctl[VALUES], 2, kind)
    verdict, phase = _step_half(ctl, source, dst, target, number, sides, _ZERO)
    if verdict != DONE:
        return verdict | phase << 4
    _books.close_call(ctl, BOOKS, sides)
    return 0
