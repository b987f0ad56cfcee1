"""A repeated call's bookkeeping, done by its compiled step: numbering, steps, sides.

A prepared shm call (``steps``, ``rsag_steps``) used to number itself and take
its barrier targets, its board, its header set and its slot region in Python
(``Context.next_call``, ``NodeGroup.opening_steps``, ``SharedMax.take_side``,
``SharedSlots.begin``): about a microsecond of attribute writes and method
calls around a step of one or two, more where ranks share a core and each
rank's Python waits for the others'.  Those objects keep that state in
``array.array`` words, so a compiled entry can do the same from their
addresses: :func:`open_call` before the step, :func:`close_call` after it.

The words sit in a step's control words from ``at`` (its layout's
``BOOKS``), :data:`WORDS` of them: the addresses of ``Context.words``,
``NodeGroup.words``, the board's and the slots' words, then what the last
entered call was (its number, first barrier target and sides), which Python
reads when the step hands the call back unfinished.  Whoever fills them
(:func:`fill`) keeps the four objects alive as long as the control words.
"""

import array

import numba
import numpy as np

from ...node.group import DIRTY, LAST, NUMBER, PARITY, PUBLISHED, STEP, STEP_WORDS, UNCHECKED
from ...node.views import address, view

__all__ = ["WORDS", "CALLS_AT", "GROUP_AT", "BOARD_AT", "REGION_AT", "NUMBER_OUT", "TARGET_OUT",
           "SIDES_OUT", "fill", "open_call", "close_call", "entered"]

# offsets from ``at``
CALLS_AT, GROUP_AT, BOARD_AT, REGION_AT, NUMBER_OUT, TARGET_OUT, SIDES_OUT = range(7)
WORDS = 7
STREAM = 8  # the sides' bit for non-temporal stores (rsag.STREAM, the mid step's kind << 3)

_jit = numba.njit(cache=True, nogil=True)


def fill(ctl, at, ctx, group, board, region):
    """Write the addresses of ``ctx``'s, ``group``'s, ``board``'s and ``region``'s words into
    ``ctl[at:]``; returns the four word arrays (for the caller to keep alive)."""
    books = (ctx.words, group.words, board.words, region.words)
    if not all(type(a) is array.array and a.typecode == "q" for a in books):
        raise AssertionError("bookkeeping words need int64 array.arrays")
    for k, words in enumerate(books):
        ctl[at + k] = address(words)
    return books


def entered(ctl, at):
    """``(number, first target, sides)`` of the call last entered with these control words."""
    return ctl[at + NUMBER_OUT], ctl[at + TARGET_OUT], ctl[at + SIDES_OUT]


@_jit
def open_call(ctl, at, values_at, steps, kind):
    """What Python's fast way does before a step (``Context.next_call``, the agreement
    template's number words at ``values_at``, ``NodeGroup.opening_steps(number, steps)``,
    the board's and the region's sides) on the same words: ``(number, first target,
    sides)``, sides as the steps take them (bit 0 the board, 1 the region, 2 the header
    set, 3 ``kind``: non-temporal stores), also kept in ``ctl[at + NUMBER_OUT:]``."""
    calls = view(ctl[at + CALLS_AT], 1, np.int64)
    number = calls[0] + 1
    calls[0] = number
    values = view(values_at, 2, np.int64)
    values[0] = number
    values[1] = -number
    group = view(ctl[at + GROUP_AT], STEP_WORDS, np.int64)
    header_side = group[PUBLISHED] & 1
    group[PUBLISHED] += 1
    group[NUMBER] = number
    group[STEP] = steps
    group[UNCHECKED] = -1
    group[LAST] = (number << 24) + steps
    board = view(ctl[at + BOARD_AT], 1, np.int64)
    board_side = board[0]
    board[0] = board_side ^ 1
    region = view(ctl[at + REGION_AT], 2, np.int64)
    sides = board_side | region[PARITY] << 1 | header_side << 2 | kind * STREAM
    target = (number << 24) + 1
    ctl[at + NUMBER_OUT] = number
    ctl[at + TARGET_OUT] = target
    ctl[at + SIDES_OUT] = sides
    return number, target, sides


@_jit
def close_call(ctl, at, sides):
    """A finished call leaves its region for the next (``SharedSlots.begin``'s flip)."""
    region = view(ctl[at + REGION_AT], 2, np.int64)
    region[PARITY] = (sides >> 1 & 1) ^ 1
    region[DIRTY] = 1
