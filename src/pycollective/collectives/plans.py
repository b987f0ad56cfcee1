"""The repeated-call fast path of ``allreduce``.

A training loop calls allreduce with the same (algorithm, op, dtype, count)
on the same communicator every step.  Once a call of that shape has passed
every check, what it resolved to is kept in the communicator's context as a
:class:`Plan`, and a later call of the same shape only re-checks what can
change between calls: the buffers themselves (plain C-contiguous numpy
arrays, writable recvbuf, same dtype and size, no partial overlap).
Anything else goes the full way, and so does any call after a settings
change (``set_check``, ``set_timeout``, ``set_segment_bytes``; environment
variables are read when a shape is first seen).  Agreement still runs (the
same vector, one small reduction); when the reduced vector is not what
agreeing ranks produce, the full verdict raises the same error as the full
path would.  Where the algorithm's prepared call has a fast way (``Plan.fast``,
"shm" below 1 MiB), the call is numbered and run without a call record until
it needs one.  This module is the plan cache: :func:`lookup` finds a call's
plan, :func:`remember` keeps one, :func:`run` runs a call from it (and is
the only place that writes a plan's arrays: each call's number into the
agreement template the fast way reads by address).
"""

from typing import Callable, NamedTuple, Optional

import numpy as np
from mpi4py import MPI

from . import auto as _auto
from ..runtime import settings as _settings, watch as _watch
from .agree import Facts, fact_values, needs_agreement, prepared, verdict
from .call import enter, leave, run_algorithm
from ..runtime.context import Context, Key, find_context
from ..runtime.registry import Algorithm
from ..runtime import threads as _threads
from .. import timeline as _timeline

__all__ = ["Plan", "PlanCache", "lookup", "remember", "run"]

_MEMO = Key("fastpath")
_LIMIT = 1024


class PlanCache(dict):
    """One communicator's plans: (algorithm, op, dtype, count, timeout) -> :class:`Plan`.

    A dict (its lookup is the dict's own, in C); :func:`remember` starts a
    new one when it holds ``_LIMIT`` shapes (a sweep over sizes).
    """

    __slots__ = ()


class Plan(NamedTuple):
    """What a call of one shape resolved to; reused by later calls of that shape."""

    algo: Algorithm
    kernel: Callable
    template: np.ndarray               # this rank's agreement vector (the call number apart)
    facts: Facts
    auto: Optional["_auto.AutoState"]  # the state that chose ``algo``; None if named
    settings: "_settings.Settings"     # what the call runs with
    fingerprint: tuple                 # the call's fingerprint (side channel, headers)
    words: np.ndarray                  # the fingerprint as header words
    tag_offset: int                    # added to the algorithm's tags
    epoch: int                         # settings epoch it was resolved in
    agreement: bool                    # whether the call runs the agreement step
    run: Callable                      # run(ctx, call, values, src, dst) -> agreed?
    fast: Optional[Callable]           # fast(number, plan, src, dst) -> None or the rest


def _op_key(op):
    if type(op) is str:
        return op
    if type(op) is MPI.Op:
        return op.handle
    return None


def lookup(sendbuf, recvbuf, op, comm, algorithm, timeout) -> Optional[tuple]:
    """``(ctx, plan, src, dst)`` when this call has the shape of an earlier good one (the
    context, its :class:`Plan` and the flat buffers), else None.  A plain tuple: a named
    one costs 0.2 us more to make, a few percent of a small call."""
    if comm is None:
        comm = MPI.COMM_WORLD
    elif type(comm) is not MPI.Intracomm:
        return None
    if type(recvbuf) is not np.ndarray:
        return None
    ctx = find_context(comm)
    if ctx is None:
        return None
    memo = ctx.peek(_MEMO)
    if memo is None:
        return None
    try:
        # Per calling thread: its name is in the plan's fingerprint and agreement (_threads).
        plan = memo.get((algorithm, _op_key(op), recvbuf.dtype, recvbuf.size, timeout,
                         _threads.code()))
    except TypeError:  # an unhashable timeout: the full path says what is wrong
        return None
    if plan is None or plan.epoch != _settings.epoch or (
            plan.auto is not None and ctx.peek(_auto.KEY) is not plan.auto):
        return None
    flags = recvbuf.flags
    if not (flags.c_contiguous and flags.writeable):
        return None
    dst = recvbuf if recvbuf.ndim == 1 else recvbuf.reshape(-1)
    if sendbuf is MPI.IN_PLACE or sendbuf is recvbuf:
        return ctx, plan, dst, dst
    if type(sendbuf) is not np.ndarray:
        return None
    sflags = sendbuf.flags
    # Two arrays that each own their memory are two allocations: they cannot
    # overlap, and saying so costs a tenth of np.may_share_memory (0.3 us).
    if (not sflags.c_contiguous or sendbuf.dtype != recvbuf.dtype
            or sendbuf.size != recvbuf.size
            or not (sflags.owndata and flags.owndata or not np.may_share_memory(sendbuf, recvbuf))):
        return None
    return ctx, plan, (sendbuf if sendbuf.ndim == 1 else sendbuf.reshape(-1)), dst


def remember(ctx: Context, algorithm: str, op, timeout, algo: Algorithm, kernel: Callable,
             dst: np.ndarray, facts: Facts, call) -> None:
    """Keep what a full-path call of this shape resolved to (``call``: its _watch.Call).

    A timed trial of auto's tuning is kept as a plan whose run asks the tuner
    for each call's candidate (``Trial.tuning``) until the shape is decided,
    when that run drops it: the next call goes the full way and keeps the
    decision.  An untimed trial is not kept.
    """
    key = _op_key(op)
    trial = isinstance(algo, _auto.Trial)
    if key is None or trial and algo.tuning is None:
        return
    try:
        hash(timeout)
    except TypeError:
        return
    memo = ctx.peek(_MEMO)
    if memo is None or len(memo) >= _LIMIT:
        memo = ctx.put(_MEMO, PlanCache())
    template = fact_values(ctx.rank, None, facts, 0)  # words 0-1: each call writes its number
    auto = ctx.peek(_auto.KEY) if algorithm == "auto" else None
    shape = (algorithm, key, dst.dtype, dst.size, timeout, call.fingerprint[8])
    if trial:
        def forget(memo=memo):
            if memo.get(shape) is plan:
                del memo[shape]
        # the run passes the agreement on to each candidate that needs it
        agreement, run = True, algo.tuning(kernel, dst, call.settings, forget)
    else:
        agreement = needs_agreement(call.settings, algo)
        run = prepared(ctx, algo, kernel, dst, agreement)
    plan = memo[shape] = Plan(
        algo, kernel, template, facts, auto, call.settings,
        call.fingerprint, call.fingerprint_words, call.tag_offset, _settings.epoch,
        agreement, run, None if trial else getattr(run, "fast", None))


def run(ctx, plan, src, dst) -> None:
    """An allreduce of a remembered shape (what :func:`lookup` returned): its plan, its
    agreement, its run.

    Where the plan has a fast way (``plan.fast``) and
    the communicator is free, the call is numbered and run without a call
    record; the record is made only if the fast way hands the call back
    unfinished (a slow rank, a disagreement, an exception), and what follows
    is the same as on the way below.  For "shm" below 1 MiB that is a quarter
    of a small call's time (about 3 us of Python at N = 2; a contended lock,
    a broken communicator and plans without a fast way go the way below).
    """
    timeline = _timeline.ACTIVE
    if timeline is not None:  # timeline hook: what the call runs
        timeline.about(algorithm=plan.algo.name, number=ctx.calls + 1, comm=ctx,
                       count=plan.fingerprint[_watch.FP_COUNT], dtype=src.dtype, repeated=True)
    fast = plan.fast
    if fast is not None and ctx.broken is None and ctx.lock.acquire(False):
        try:
            number = ctx.next_call()
            values = plan.template
            values[0], values[1] = number, -number  # the plan's own: calls hold the lock
            if timeline is not None:  # timeline hook: the compiled step (ended below)
                timeline.open("compiled step", "step")
            try:
                rest = fast(number, plan, src, dst)
            except BaseException as exc:  # broken off midway: the communicator breaks
                rest = _reraise(exc)
            if timeline is not None:
                timeline.close()
            if rest is not None:
                _run_rest(ctx, plan, number, rest, src, dst)
        finally:
            ctx.lock.release()
        return
    call = enter(ctx, "allreduce", plan.fingerprint, plan.settings, plan.words, plan.tag_offset)
    try:
        _run_recorded(ctx, plan, call, plan.run, src, dst)
    finally:
        leave(call)


def _run_rest(ctx, plan, number, rest, src, dst):
    """The rest of a call the fast way handed back: ``rest(ctx, call, values, src, dst)``
    with the call's record, as :func:`run`'s other way runs ``plan.run``."""
    call = _watch.begin(ctx, "allreduce", plan.fingerprint, plan.settings, plan.tag_offset,
                        plan.words, number=number)
    try:
        _run_recorded(ctx, plan, call, rest, src, dst)
    finally:
        _watch.end(call)


def _run_recorded(ctx, plan, call, run, src, dst):
    """``run(ctx, call, values, src, dst)`` with ``call``'s own copy of the agreement vector
    (a disagreement overwrites it with the MAX); the verdict if the ranks disagree."""
    values = None
    if plan.agreement:
        values = plan.template.copy()
        values[0], values[1] = call.number, -call.number
    if not run_algorithm(call, run, ctx, call, values, src, dst):
        verdict(ctx, "allreduce", None, plan.facts, values)


def _reraise(exc):
    def rest(*_):
        raise exc
    return rest
