"""Agreement: one small reduction that makes a bad argument raise on every rank.

Before any data move, every rank contributes the call's number, its error
flag and the facts that must be the same everywhere (count, dtype, op,
algorithm, ...).  One element-wise MAX over ``[n, -n, error rank, f1, -f1,
f2, -f2, ...]`` gives both the largest and the smallest value of each; they
differ iff the ranks disagree.  If any rank failed its local checks, that rank's message is
broadcast and every rank raises the same exception type; if the ranks
disagree, every rank raises naming the fact and its range.

The MAX runs through shared memory when every rank of the communicator is
on one node (:class:`~pycollective.node.group.SharedMax`: a write, a flag
barrier, a read; its first sync also compares every rank's call header),
else as one nonblocking ``MPI_Iallreduce`` waited for with a deadline.  An MPI collective costs
several µs at 2 ranks and up to milliseconds when ranks outnumber cores, so
this is most of a small call's overhead.  Which board a communicator uses
is decided on its first agreement, collectively, the same on all ranks.
"""

import functools
from typing import Optional, Sequence, Tuple

import numpy as np
from mpi4py import MPI

from ..runtime import watch as _watch
from ..runtime.context import Key
from .._errors import CollectiveMismatch
from ..node.group import SharedMax, whole_node
from .. import timeline as _timeline
from ..runtime import threads as _threads

__all__ = ["Facts", "agree", "fact_values", "agree_max", "board", "verdict", "needs_agreement",
           "run_checked", "prepared", "MAX_FACTS"]

#: ``((label, int value), ...)``: what every rank must share for one call.
Facts = Sequence[Tuple[str, int]]

MAX_FACTS = 10  # every rank sends the same-length vector, error or not
# The shared board's rows hold the vector and one word more: shm's folded
# step marks there that its data came with the row (algorithms/_small.py).
if 3 + 2 * MAX_FACTS >= SharedMax.WIDTH:
    raise ImportError("pycollective: the agreement vector must leave the board's last word free")
_ERRORS = {"TypeError": TypeError, "ValueError": ValueError}
_BOARD = Key("agree.board")


class _MpiMax:
    """Ranks on several nodes: one MPI_Iallreduce, waited for with a deadline."""

    def __init__(self, comm):
        self.comm = comm

    def max(self, values):
        request = self.comm.Iallreduce(MPI.IN_PLACE, values, op=MPI.MAX)
        _watch.waitall([request], waiting_for="the agreement step")


def _board(ctx):
    group = whole_node(ctx)
    return SharedMax(group) if group is not None else _MpiMax(ctx.comm)


def board(ctx):
    """The communicator's agreement board: a SharedMax on one node, else an MPI reduction."""
    return ctx.cached(_BOARD, _board)


def made_board(ctx):
    """The communicator's agreement board if a call made it already, else None (never
    collective, unlike :func:`board`)."""
    return ctx.peek(_BOARD)


def agree_max(ctx, values: np.ndarray) -> None:
    """Element-wise MAX of the int64 ``values`` over the ranks of ``ctx``, in place."""
    if _timeline.ACTIVE is not None:  # timeline hook: the agreement (ended below)
        _timeline.ACTIVE.open("agreement")
    ctx.cached(_BOARD, _board).max(values)
    if _timeline.ACTIVE is not None:  # timeline hook: the agreement's end
        _timeline.ACTIVE.close()


def fact_values(rank: int, error: Optional[BaseException], facts: Optional[Facts],
                number: int = 0) -> np.ndarray:
    """This rank's contribution to the agreement MAX.

    ``[number, -number, error rank or -1, f1, -f1, f2, -f2, ...]``: the
    call's number (on its communicator) comes first, so that a rank that is
    not in this call's agreement -- its agreement step off, or in another
    call -- shows as a disagreement on the call instead of stale facts.
    """
    values = np.full(3 + 2 * MAX_FACTS, np.iinfo(np.int64).min, np.int64)
    values[0], values[1] = number, -number
    values[2] = rank if error is not None else -1
    if error is None:
        for i, (_, v) in enumerate(facts):
            values[3 + 2 * i], values[4 + 2 * i] = v, -v
    return values


def verdict(ctx, what: str, error: Optional[BaseException], facts: Optional[Facts],
            values: np.ndarray) -> None:
    """Raise (the same on every rank) what the reduced ``values`` say is wrong."""
    if values[0] != -values[1]:
        call = _watch.current()
        exc = CollectiveMismatch(
            f"{what} call #{call.number if call else '?'} on {ctx.label}: not every rank is in "
            f"this call's agreement step (call numbers from {-values[1]} to {values[0]} across "
            "ranks): a rank has the agreement off (set_check / PYCOLLECTIVE_CHECK) or skipped "
            f"or added a call{_threads.seen_hint()}", collective=what, comm=ctx.label)
        if call is not None:
            raise _watch.fail(call, exc)
        raise exc
    bad = int(values[2])
    if bad >= 0:
        # Every rank is in this agreement (the call numbers agree), so the
        # bad rank takes part in this broadcast of its message.
        info = (type(error).__name__, str(error)) if error is not None else None
        kind, text = ctx.comm.bcast(info, root=bad)
        if error is not None:
            raise error
        raise _ERRORS.get(kind, ValueError)(f"{what}: invalid arguments on rank {bad}: {text}")
    for i, (label, _) in enumerate(facts):
        hi, lo = values[3 + 2 * i], -values[4 + 2 * i]
        if hi != lo and label == _threads.LABEL:
            call = _watch.current()
            exc = CollectiveMismatch(
                f"{what} call #{call.number if call else '?'} on {ctx.label}: the ranks are in "
                f"calls made by different threads ({_threads.describe(lo)} and "
                f"{_threads.describe(hi)} among others; this rank's is "
                f"{_threads.describe(dict(facts)[label])}); nothing was reduced. "
                f"{_threads.ADVICE[0].upper()}{_threads.ADVICE[1:]}",
                collective=what, call=call.number if call else None, comm=ctx.label)
            # Broken here: this rank's other threads' calls would pair up at random too.
            # Every rank of the call raises this now, so no notice is sent (one left
            # unreceived could reach a later communicator that reuses this one's context).
            ctx.broken = exc
            raise exc
        if hi != lo:
            raise ValueError(f"{what}: ranks disagree on {label} "
                             f"(values from {lo} to {hi} across ranks)")


def agree(ctx, what: str, error: Optional[BaseException], facts: Optional[Facts]) -> None:
    """Raise on every rank if any rank has ``error`` or ``facts`` differ across ranks.

    ``facts`` is a tuple of at most :data:`MAX_FACTS` (label, int) pairs
    that every rank must share (None on a rank with an error).
    """
    call = _watch.current()
    values = fact_values(ctx.rank, error, facts, call.number if call is not None else 0)
    agree_max(ctx, values)
    verdict(ctx, what, error, facts, values)


# --- a decided call: the agreement and the algorithm -------------------------------------

def needs_agreement(settings, algo) -> bool:
    """Whether a call runs the agreement step: always, unless it is off and the
    algorithm compares every rank's call itself before reading their data.

    A pure function of the call's settings and algorithm, both part of its
    fingerprint (for ``auto``: a function of the fingerprint and the
    communicator's agreed parameters), so ranks that make the same call
    decide alike.
    """
    return settings.check or not algo.verifies_arguments


def run_checked(ctx, algo, values: Optional[np.ndarray], src, dst, kernel) -> bool:
    """An allreduce whose shape is decided: the agreement on ``values``, then ``algo``.

    ``values`` None: no agreement (:func:`needs_agreement` said so).  An
    algorithm with ``agreed`` exchanges the agreement with its data (one
    synchronisation instead of two); the others run after one MAX.  Returns
    False if the ranks disagree: nothing ran, and ``values`` holds the MAX
    for :func:`verdict`.  The repeated call's fast path runs this, and so do
    auto's timed trials, so that a trial costs what the decided call will.
    """
    if _timeline.ACTIVE is not None:  # timeline hook: the kernel's calls are "reduce" phases
        kernel, = _timeline.ACTIVE.kernels((kernel,))
    if values is None:
        algo.run(ctx, src, dst, kernel)
        return True
    if algo.agreed is not None:
        return algo.agreed(ctx, src, dst, kernel, values, board(ctx))
    agreed = values.tobytes()
    agree_max(ctx, values)
    if values.tobytes() != agreed:
        return False
    algo.run(ctx, src, dst, kernel)
    return True


def prepared(ctx, algo, kernel, dst, agreement):
    """What a repeated call of ``dst``'s shape runs, ``run(ctx, call, values, src, dst)`` ->
    agreed: the algorithm's own preparation (``repeated``) where it has one, else
    :func:`run_checked` (agreement, then the algorithm).  The plan cache keeps one per
    shape (``collectives/plans.py``), and auto's trials run one, so that a trial takes the
    path the decided calls will."""
    if agreement and algo.repeated is not None:
        board = made_board(ctx)  # the call's agreement made it; None: prepare nothing
        run = None if board is None else algo.repeated(ctx, dst, kernel, board)
        if run is not None:
            return run
    return functools.partial(_checked, algo, kernel)


def _checked(algo, kernel, ctx, call, values, src, dst):
    return run_checked(ctx, algo, values, src, dst, kernel)
