"""The Python side of :mod:`.rsag`: shm's repeated calls up to 4 MiB where ranks have cores.

:func:`repeated` is what shm's ``repeated`` asks first: a :class:`RepeatedRsag`
for a compiled dtype up to ``DOUBLE_LIMIT`` where the step is wanted (``ENABLED``;
by default where no rank of the node sleeps in its waits, i.e. the node's ranks
do not outnumber the CPUs they may run on: ``_barrier.wait_modes``, agreed once
per communicator), else None and the older prepared steps (``steps``).

A repeated call is its bookkeeping (call number, barrier targets, board and
region sides) and one compiled call.  What follows in Python only when the
compiled step hands back:

* ``LATE``: a peer is slow; wait on with the call's deadline and side channel
  (``FlagBarrier.wait``), then resume the step from its phase.
* ``WORDS_DIFFER``: some rank's call word is not this rank's.  The full rows
  and headers say why, the same on every rank: rows that differ are a
  disagreement (``False``: the agreement's verdict raises its named error);
  rows that agree but a rank that posted them without this step's layout
  (the board agreement, or the older folded steps, which after the same
  sync go on with their data step) mean every rank follows with the older
  data step at the call's second target; headers that differ raise
  ``CollectiveMismatch`` through ``NodeGroup.check``.

Slot regions alternate call by call as in the older steps (``SharedSlots.begin``),
so the region is taken, and the parity flipped, only once the call is done.
"""

import functools
import time
from typing import NamedTuple

import numpy as np

from ...node.group import DOUBLE_LIMIT
from ...node.views import address
from . import books as _books, rsag as _rsag, small as _small
from . import steps as _steps
from .stores import Stores

__all__ = ["ENABLED", "repeated", "RepeatedRsag", "wanted"]

# None: where no rank of the node sleeps in its waits; True or False: always or never
# (tests, and benchmarks comparing the two steps; read when a call's plan is made).
ENABLED = None
# From this size a rank chooses while running between plain and non-temporal stores for
# what the others read (``stores.Stores``); below, plain ones, and no call is timed: there
# the choosing costs more than it can win (docs/results/stores.md).
CHOOSE_BYTES = 8 << 10
# Two ranks, calls up to this many bytes (the older small path's bound): each folds the
# whole vector, one wait a call instead of two, and reads as many bytes of the other's slot
# (docs/results/dedicated-cores.md); read when a call's plan is made.
WHOLE_BYTES = _steps.REPLICATE_BYTES
# Calls of up to this many bytes take four regions in turn (``_rsag.BANK``), two inside
# each half of the slot, where a quarter of the slot holds them (the first slots hold
# 1 MiB: a quarter is 256 KiB).
BANKS_BYTES = 256 << 10


def wanted(board):
    """Whether a repeated call on ``board``'s node takes :mod:`.rsag`'s step."""
    if ENABLED is not None:
        return bool(ENABLED)
    group = getattr(board, "group", None)
    return group is not None and not group.barrier.wakes


def repeated(ctx, dst, kernel, board, key, fallback):
    """A :class:`RepeatedRsag` for ``dst``'s dtype and size, or None where it does not apply."""
    if dst.dtype not in _steps.COMPILED or dst.nbytes > DOUBLE_LIMIT or not wanted(board):
        return None
    return RepeatedRsag(ctx, dst, kernel, board, key, fallback)


@functools.lru_cache(maxsize=64)
def _bounds(count, size, itemsize):
    """Shared by every caller (nothing writes them); kept alive by the cache and the caller."""
    return _rsag.line_bounds(count, size, itemsize)


def _rewind(group, number):
    """Leave ``group``'s step count after the call's first sync, as the older steps do
    there, so that their data step (``_shm_steps.small_data``, ``mid_data``) takes the
    call's second target and checks the header set this call published."""
    group.rewind(number, 1)


def _native(dispatcher, *args):
    """The native wrapper numba compiled ``dispatcher`` into for exactly these arguments'
    types, or None (not compiled for them, or a numba without these attributes): it
    unboxes its arguments as those types without checking them, so whoever calls it must
    know that every later call's arguments have the same types (dtype, layout, flags)."""
    try:
        types = tuple(dispatcher.typeof_pyval(a) for a in args)
        return dispatcher.overloads[types].entry_point
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


class RsagCall(NamedTuple):
    """A call of :func:`._rsag.step`: what it is given besides the buffers and the phase."""

    ctl: np.ndarray           # its control words (the call's agreement vector and fingerprint)
    target: int               # the first sync's barrier target (the second is target + 1)
    number: int               # the call's number
    sides: int                # board side | slot parity << 1 | header side << 2 | STREAM


class RepeatedRsag(_steps._Repeated):
    """The repeated call of one dtype and size through :func:`._rsag.step`."""

    def __init__(self, ctx, dst, kernel, board, key, fallback):
        super().__init__(ctx, dst, kernel, board, key, fallback)
        self.step = _rsag.step_half if self.half else _rsag.step
        self.entry = _rsag.enter_half if self.half else _rsag.enter
        self.natives = {}  # (send flags, receive flags) -> the entry's native wrapper, or False
        self.nbytes = dst.nbytes
        self.base = None  # control words but the plan's (values, fingerprint)
        self.stores = None  # what the others read: plain or non-temporal stores (Stores)

    def _resolve(self, state, call, dst):
        node = state.node
        if not (state.error is None and call is not None and node.capacity >= 2 * self.nbytes
                and getattr(self.board, "group", None) is node.group):
            return ()
        group = node.group
        flags, boards, headers = group.barrier.words, group.boards, group.headers
        if not all(a.dtype == np.int64 and a.flags.c_contiguous
                   for a in (flags, boards, headers)):
            raise AssertionError("control words need C-contiguous int64 arrays")
        segment = node.flat(np.uint8)
        bounds = _bounds(self.count, group.size, self.dtype.itemsize)
        c = np.zeros(_rsag.CONTROL_WORDS, np.int64)
        c[_rsag.FLAGS], c[_rsag.RANK], c[_rsag.SIZE] = address(flags), group.rank, group.size
        c[_rsag.COUNT], c[_rsag.OP] = self.count, 0
        half = node.capacity // 2
        c[_rsag.SLOTS], c[_rsag.SLOTS + 1] = address(segment), address(segment) + half
        c[_rsag.SLOT_BYTES], c[_rsag.BOUNDS] = node.capacity, address(bounds)
        c[_rsag.BOARD], c[_rsag.BOARD + 1] = address(boards[0]), address(boards[1])
        c[_rsag.BOARD_WIDTH] = boards.shape[2]
        c[_rsag.HEADERS], c[_rsag.HEADERS + 1] = address(headers[0]), address(headers[1])
        c[_rsag.HEADER_WIDTH] = headers.shape[2]
        c[_rsag.DEDICATED] = 0 if group.barrier.sleep else 1
        c[_rsag.PASSES] = _rsag.SPINS
        c[_rsag.WHOLE] = group.size == 2 and self.nbytes <= WHOLE_BYTES
        # four regions in turn (see _rsag.BANK), where a quarter of the slot holds the call
        quarter = node.capacity // 4
        c[_rsag.QUARTER] = quarter if self.nbytes <= min(BANKS_BYTES, quarter) else 0
        # the words enter() books a call in (each kept alive by its owner, and here)
        books = _books.fill(c, _rsag.BOOKS, self.ctx, group, self.board, node)
        self.base = c
        self.stores = Stores(chooses=not group.barrier.sleep, family="rsag",
                             shared=group.stores_word("rsag", self.nbytes)) \
            if self.nbytes >= CHOOSE_BYTES else None
        # what the addresses point into, kept alive with this object
        return (segment, bounds, flags, boards, headers) + books

    def _words(self, values, fingerprint, op):
        """The control words for this agreement vector and fingerprint (kept alive by the caller)."""
        if not all(a.dtype == np.int64 and a.flags.c_contiguous for a in (values, fingerprint)):
            raise AssertionError("control words need C-contiguous int64 arrays")
        ctl = self.base.copy()
        ctl[_rsag.VALUES], ctl[_rsag.VALUES_LEN] = address(values), values.size
        ctl[_rsag.FINGERPRINT] = address(fingerprint)
        ctl[_rsag.FINGERPRINT_LEN] = fingerprint.size
        ctl[_rsag.OP] = op
        return ctl

    def fast(self, number, plan, src, dst):
        """The call numbered ``number`` as one compiled step (see ``collectives.plans.run``):
        None once done, else the rest of the call, to run with a call record."""
        node = self.node
        if node is None or node.segment is not self.segment:
            return self  # nothing done yet: the whole call, with its record
        ctl = self.ctl
        if plan is not self.plan:
            ctl = self.ctl = self._words(plan.template, plan.words, plan.fingerprint[3])
            self.plan = plan
        target, side = node.group.opening_steps(number, 2)
        parity = node.parity
        stores = self.stores
        kind, started = (0, 0.0) if stores is None else stores.next()
        sides = self.board.take_side() | parity << 1 | side << 2 | kind * _rsag.STREAM
        src, dst = _steps.data_buffers(src, dst, self.half)
        verdict, phase = self.step(ctl, src, dst, target, number, sides, 0)
        if verdict == _rsag.DONE:
            if started:
                stores.took(kind, time.perf_counter() - started)
            node.parity, node.dirty = parity ^ 1, True  # SharedSlots.begin, grown already
            return None
        return functools.partial(self._rest, RsagCall(ctl, target, number, sides), verdict, phase)

    def entered(self, plan, src, dst, bound=None):
        """The call, numbered and booked by the compiled step itself (:func:`._rsag.enter`;
        the caller holds the communicator's lock, as for :meth:`fast`): None once done,
        else ``(number, rest)``, the rest to run with a call record.  Where the slots or
        the plan changed since the control words were made, Python numbers the call and
        :meth:`fast` runs it.

        ``bound``: a call on array objects whose dtype and flags the caller has found
        unchanged since it was bound (``plans.find_bound``); its ``entry`` keeps the
        entry's native wrapper for those arrays' types (:func:`_native`), which the next
        call enters without numba's typing of each argument (a third of a 1e3 call's
        Python, docs/results/dropin.md)."""
        node = self.node
        if node is None or node.segment is not self.segment or plan is not self.plan:
            number = self.ctx.next_call()
            values = plan.template
            values[0], values[1] = number, -number
            rest = self.fast(number, plan, src, dst)
            return None if rest is None else (number, rest)
        stores = self.stores
        if stores is None:  # below CHOOSE_BYTES: plain stores, nothing timed
            kind = started = 0
        else:
            kind, started = stores.next()
        if self.half:
            src, dst = src.view(np.uint16), dst.view(np.uint16)
        entry = None if bound is None else bound.entry
        if entry is None:
            code = self.entry(self.ctl, src, dst, kind)
            if bound is not None:
                # once per kind of arrays (their flags: the dtype is this object's), after
                # the dispatcher has compiled the entry for them; False: numba's own way
                flags = bound.sflags, bound.rflags
                native = self.natives.get(flags)
                if native is None:
                    native = self.natives[flags] = \
                        _native(self.entry, self.ctl, src, dst, kind) or False
                bound.entry = native or self.entry
        else:
            code = entry(self.ctl, src, dst, kind)
        if code == 0:
            if started:
                stores.took(kind, time.perf_counter() - started)
            return None
        ctl = self.ctl
        number, target, sides = _books.entered(ctl, _rsag.BOOKS)
        r = RsagCall(ctl, int(target), int(number), int(sides))
        return int(number), functools.partial(self._rest, r, code & 15, code >> 4)

    def _rest(self, r, verdict, phase, ctx, call, values, src, dst):
        return self._after(r, call, verdict, phase, values, src, dst)

    def __call__(self, ctx, call, values, src, dst):
        """The call with its record (not the fast way: the first after the slots changed,
        or a busy communicator)."""
        node = self.node
        if node is None or node.segment is not self.segment:
            return self._again(ctx, call, values, src, dst)
        group = node.group
        target, headers = _steps._folded_step(group, call)
        group.compiled_step(call, check=True)  # the second target: target + 1
        side = 0 if address(headers) == address(group.headers[0]) else 1
        ctl = self._words(values, call.fingerprint_words, call.fingerprint[3])
        sides = self.board.take_side() | node.parity << 1 | side << 2
        if self.stores is not None:
            sides |= self.stores.using * _rsag.STREAM
        data_src, data_dst = _steps.data_buffers(src, dst, self.half)
        verdict, phase = self.step(ctl, data_src, data_dst, target, call.number, sides, 0)
        return self._after(RsagCall(ctl, target, call.number, sides), call, verdict, phase,
                           values, src, dst)

    def _after(self, r, call, verdict, phase, values, src, dst):
        """Whatever the compiled step handed back: a slow rank, call words that differ."""
        ctl, target, number, sides = r
        node = self.node
        group = node.group
        data_src, data_dst = _steps.data_buffers(src, dst, self.half)
        while verdict != _rsag.DONE:
            if verdict == _rsag.LATE:
                try:
                    group.barrier.wait(target if phase == 1 else target + 1)  # the deadline
                except BaseException:
                    if ctl[_rsag.WHOLE]:
                        # the one wait of a call that folds the whole vector: a peer
                        # arriving later would fold this rank's posted input and return as
                        # if the call had worked (with two waits it fails on the second)
                        group.barrier.withdraw(target)
                    raise
            else:  # WORDS_DIFFER: the full rows and headers, read alike by every rank
                board = group.boards[sides & 1]
                if not _small.rows_agree(board, values, group.size):
                    self.board.fold(board, values)
                    return False
                if not np.all(board[:, -1] == _rsag.FOLDED):
                    # a rank posted its row without this step's layout: all follow the
                    # older data step, which that rank takes next
                    _rewind(group, number)
                    if self.nbytes <= _steps.REPLICATE_BYTES:
                        _steps.small_data(node, call, src, dst)
                    else:
                        _steps.mid_data(node, call, src, dst)
                    return True
                group.check(call, group.headers[sides >> 2 & 1])  # raises if they differ
            verdict, phase = self.step(ctl, data_src, data_dst, target, number, sides, phase)
        node.parity, node.dirty = (sides >> 1 & 1) ^ 1, True
        return True
