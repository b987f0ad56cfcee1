"""The small-message path of "shm" as compiled code, the agreement included.

For a vector of at most 4 KiB every rank copies its input into its slot and
every rank reduces all slots in rank order (see ``algorithms/shm/allreduce.py``).  In Python that
is a dozen calls and two synchronisations per allreduce; here each step of
the same protocol is one compiled call:

* the data step: :func:`post_data` writes the input into this rank's slot
  (and the header, if this is the call's first step) and raises the counter;
  ``wait_own``; :func:`reduce` compares every rank's header with this
  rank's and only then reduces all slots into ``dst``.
* both in one (check on, the repeated call's fast path):
  :func:`agreed_step` writes the agreement row, the input and the header,
  raises the counter once, waits once, and reduces only if every rank's
  row equals this rank's (:func:`rows_verdict`).  One synchronisation per
  call instead of two: on two cores with four or eight ranks each one
  costs a scheduling slice.

A repeated call (the fast path's) runs :func:`prepared_step`: the same
folded step, its arrays passed by address in one array of control words
(see the comment above it), because entering a compiled call costs about
0.15 µs per array argument.

The steps, their barrier targets and what each publishes are exactly those
of the Python path (``SharedMax.max`` then ``shm_allreduce_on``), so ranks
that take different paths for the same call still meet: the folded step is
the call's first sync, like the agreement's, and a rank that disagrees (on
the Python path, say, because its count is larger) reads the same board
rows after it.  Nobody reads a slot before every row is seen equal, so a
disagreement leaves every rank's data unread.  Ranks that agree may still
take different paths (one rank's buffer is not a plain array, so it misses
the fast path; two threads' calls reach the fast path in different orders):
a folded row says so in its last word, and unless every rank's does
(``UNFOLDED``), the folded ranks go on with the data step, whose sync is
the one the others post their data before.  The reduction is the same
left fold by the same kernels, so results are bitwise the same.
"""

import numba
import numpy as np

from ...node.atomics import raise_own, wait_own
from ...data.kernels import _max, _max_f16, _min, _min_f16, _prod, _prod_f16, _sum, _sum_f16
from ...node.views import strided, view, writable_view

__all__ = ["data_step", "data_step_half", "agreed_step", "agreed_step_half",
           "rows_verdict", "rows_agree", "reduce", "reduce_half", "DONE", "DISAGREE",
           "HEADERS_DIFFER", "LATE", "UNFOLDED", "all_folded", "prepared_step",
           "prepared_step_half", "controlled", "CONTROL_WORDS"]

DONE, DISAGREE, HEADERS_DIFFER, LATE, UNFOLDED = 0, 1, 2, 3, 4
HEADER_WORDS = 10  # call number + fingerprint

_jit = numba.njit(cache=True, nogil=True)


@_jit
def _header(headers, rank, number, fingerprint):
    headers[rank, 0] = number
    for j in range(fingerprint.shape[0]):
        headers[rank, 1 + j] = fingerprint[j]


@_jit
def _row(board, rank, values):
    k = values.shape[0]
    for j in range(k):
        board[rank, j] = values[j]
    for j in range(k, board.shape[1]):
        board[rank, j] = 0


@_jit
def _row_folded(board, rank, values):
    """The agreement row, its last word 1: "my data are posted with it" (the
    Python agreement and the unfolded steps leave it 0; no fact reaches it)."""
    _row(board, rank, values)
    board[rank, board.shape[1] - 1] = 1


@_jit
def all_folded(board, size):
    """After the first sync: True iff every rank posted its data with its row."""
    last = board.shape[1] - 1
    for q in range(size):
        if board[q, last] != 1:
            return False
    return True


@_jit
def rows_agree(board, values, size):
    """After the agreement step's wait: True iff every rank's row equals ``values``."""
    k = values.shape[0]
    for q in range(size):
        for j in range(k):
            if board[q, j] != values[j]:
                return False
    return True


@_jit
def post_data(flags, rank, target, rows, src, headers, publish, number, fingerprint):
    """The data step's writes (and the header, if this is the call's first step)."""
    for i in range(src.shape[0]):
        rows[rank, i] = src[i]
    if publish:
        _header(headers, rank, number, fingerprint)
    raise_own(flags, rank, target)


@_jit
def _headers_agree(headers, rank, size):
    for q in range(size):
        for j in range(HEADER_WORDS):
            if headers[q, j] != headers[rank, j]:
                return False
    return True


@_jit
def reduce(headers, rank, size, rows, dst, op):
    """After the data step's wait: check the headers, then reduce (op: sum, prod, max, min)."""
    if not _headers_agree(headers, rank, size):
        return HEADERS_DIFFER
    if op == 0:
        _sum(rows[0], rows[1], dst)
        for q in range(2, size):
            _sum(dst, rows[q], dst)
    elif op == 1:
        _prod(rows[0], rows[1], dst)
        for q in range(2, size):
            _prod(dst, rows[q], dst)
    elif op == 2:
        _max(rows[0], rows[1], dst)
        for q in range(2, size):
            _max(dst, rows[q], dst)
    else:
        _min(rows[0], rows[1], dst)
        for q in range(2, size):
            _min(dst, rows[q], dst)
    return DONE


@_jit
def reduce_half(headers, rank, size, rows, dst, op):
    """:func:`reduce` for float16, on the bit patterns (``rows`` and ``dst`` as uint16)."""
    if not _headers_agree(headers, rank, size):
        return HEADERS_DIFFER
    if op == 0:
        _sum_f16(rows[0], rows[1], dst)
        for q in range(2, size):
            _sum_f16(dst, rows[q], dst)
    elif op == 1:
        _prod_f16(rows[0], rows[1], dst)
        for q in range(2, size):
            _prod_f16(dst, rows[q], dst)
    elif op == 2:
        _max_f16(rows[0], rows[1], dst)
        for q in range(2, size):
            _max_f16(dst, rows[q], dst)
    else:
        _min_f16(rows[0], rows[1], dst)
        for q in range(2, size):
            _min_f16(dst, rows[q], dst)
    return DONE


# --- each step as one call (a compiled call costs about a microsecond to enter) --------

@_jit
def data_step(flags, rank, size, target, rows, src, headers, publish, number, fingerprint,
              checking, dst, op):
    """:func:`post_data`, wait, :func:`reduce`: DONE, HEADERS_DIFFER or LATE."""
    post_data(flags, rank, target, rows, src, headers, publish, number, fingerprint)
    if wait_own(flags, rank, size, target) >= 0:
        return LATE
    return reduce(checking, rank, size, rows, dst, op)


@_jit
def data_step_half(flags, rank, size, target, rows, src, headers, publish, number, fingerprint,
                   checking, dst, op):
    """:func:`data_step` for float16 (uint16 views)."""
    post_data(flags, rank, target, rows, src, headers, publish, number, fingerprint)
    if wait_own(flags, rank, size, target) >= 0:
        return LATE
    return reduce_half(checking, rank, size, rows, dst, op)


# --- the agreement and the data in one step ---------------------------------------------------

@_jit
def post_both(flags, rank, target, board, values, rows, src, headers, number, fingerprint):
    """The folded step's writes (agreement row, input, header), then this rank's counter."""
    _row_folded(board, rank, values)
    for i in range(src.shape[0]):
        rows[rank, i] = src[i]
    _header(headers, rank, number, fingerprint)
    raise_own(flags, rank, target)


@_jit
def rows_verdict(board, values, size):
    """After the folded step's wait: DISAGREE unless every row is ``values``;
    UNFOLDED if a rank posted its row alone (its data come with the next
    sync: go on with the data step); else DONE (reduce now)."""
    if not rows_agree(board, values, size):
        return DISAGREE
    if not all_folded(board, size):
        return UNFOLDED
    return DONE


@_jit
def _posted_verdict(flags, rank, size, target, board, values, rows, src, headers, number,
                    fingerprint):
    """:func:`post_both`, wait, :func:`rows_verdict` (LATE if the wait ran out)."""
    post_both(flags, rank, target, board, values, rows, src, headers, number, fingerprint)
    if wait_own(flags, rank, size, target) >= 0:
        return LATE
    return rows_verdict(board, values, size)


@_jit
def agreed_step(flags, rank, size, target, board, values, rows, src, headers, number,
                fingerprint, dst, op):
    """:func:`post_both`, wait, :func:`rows_verdict`, then :func:`reduce`: DONE, DISAGREE,
    HEADERS_DIFFER, LATE or UNFOLDED.

    Must be the call's first step (it publishes the header it then checks).
    """
    verdict = _posted_verdict(flags, rank, size, target, board, values, rows, src, headers,
                              number, fingerprint)
    if verdict != DONE:
        return verdict
    return reduce(headers, rank, size, rows, dst, op)


@_jit
def agreed_step_half(flags, rank, size, target, board, values, rows, src, headers, number,
                     fingerprint, dst, op):
    """:func:`agreed_step` for float16 (uint16 views)."""
    verdict = _posted_verdict(flags, rank, size, target, board, values, rows, src, headers,
                              number, fingerprint)
    if verdict != DONE:
        return verdict
    return reduce_half(headers, rank, size, rows, dst, op)


# --- the folded step of a prepared call, its arrays by address ----------------------------
# A repeated call (``algorithms.shm.steps.RepeatedSmall``, ``RepeatedMid``) passes the
# same arrays every time: it keeps their addresses in one int64 array of
# control words, and the step takes its views again inside (``node.views``):
# three arrays and three integers to type on entry instead of 13-18
# arguments.  The arrays that alternate between calls (the agreement
# boards, the header sets, the slot regions) have two words each; ``sides``
# says which one this call uses: bit 0 the board, bit 1 the region, bit 2
# the header set.  Words 0-14 are shared by both paths, the rest are each
# path's own (``ROWS``.. here, ``_mid.FLAT``..).
(FLAGS, FLAGS_LEN, RANK, SIZE, BOARD, _BOARD_1, BOARD_WIDTH, VALUES, VALUES_LEN, HEADERS,
 _HEADERS_1, HEADER_WIDTH, FINGERPRINT, FINGERPRINT_LEN, OP) = range(15)
ROWS, _ROWS_1, ROW_STRIDE, COUNT = range(15, 19)
CONTROL_WORDS = 19


@_jit
def controlled(ctl, sides):
    """The arrays both paths' control words hold: flags, board, values, header set, fingerprint."""
    size = ctl[SIZE]
    flags = view(ctl[FLAGS], ctl[FLAGS_LEN], np.int64)
    board = view(ctl[BOARD + (sides & 1)], (size, ctl[BOARD_WIDTH]), np.int64)
    values = view(ctl[VALUES], ctl[VALUES_LEN], np.int64)
    headers = view(ctl[HEADERS + (sides >> 2 & 1)], (size, ctl[HEADER_WIDTH]), np.int64)
    fingerprint = view(ctl[FINGERPRINT], ctl[FINGERPRINT_LEN], np.int64)
    return flags, board, values, headers, fingerprint


@_jit
def _controlled_rows(ctl, sides, dtype):
    return strided(ctl[ROWS + (sides >> 1 & 1)], ctl[SIZE], ctl[COUNT], ctl[ROW_STRIDE], dtype)


@_jit
def prepared_step(ctl, src, dst, target, number, sides):
    """:func:`agreed_step` with its other arrays at the addresses in ``ctl``."""
    src = writable_view(src, dst.dtype)  # a read-only one would compile the step again
    flags, board, values, headers, fingerprint = controlled(ctl, sides)
    rows = _controlled_rows(ctl, sides, dst.dtype)
    return agreed_step(flags, ctl[RANK], ctl[SIZE], target, board, values, rows, src, headers,
                       number, fingerprint, dst, ctl[OP])


@_jit
def prepared_step_half(ctl, src, dst, target, number, sides):
    """:func:`prepared_step` for float16 (uint16 views)."""
    src = writable_view(src, dst.dtype)  # a read-only one would compile the step again
    flags, board, values, headers, fingerprint = controlled(ctl, sides)
    rows = _controlled_rows(ctl, sides, dst.dtype)
    return agreed_step_half(flags, ctl[RANK], ctl[SIZE], target, board, values, rows, src,
                            headers, number, fingerprint, dst, ctl[OP])
