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

A plan with a fast way is also kept under the identity of the call's two
arrays (:func:`bind`, :func:`repeat`): a later call on the same array objects with the
same arguments re-checks only what can change on an array object between
calls (its flags, dtype and size) and runs the fast way, without the
shape's key, the context's plan table or the overlap test.  The arrays are
held by weak references, so keeping them costs the caller no memory.
"""

import weakref
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
from ..data.buffers import as_they_are

__all__ = ["Plan", "PlanCache", "lookup", "remember", "run", "bind", "find_bound",
           "forget_bound", "repeat", "fast_way", "run_found"]

_MEMO = Key("fastpath")
_LIMIT = 1024
# Bound calls (:func:`repeat`): (id(sendbuf), id(recvbuf), algorithm) -> _Bound, for every
# thread (the algorithm in the key: a loop that takes turns among algorithms on the same
# arrays, as a benchmark does, repeats each); each entry names its thread's pairing code.
# When it holds _BOUND_LIMIT, the entries of arrays that died are dropped (they stay until
# then), and all of them if that is not enough; every entry goes stale when a plan is
# kept or dropped (``_generation``): a bound call is a shortcut to a plan, never its owner.
_BOUND: dict = {}
_BOUND_LIMIT = 256
_generation = 0
_code = _threads.code  # the calling thread's pairing code (one global name, not two lookups)


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
    entered: Optional[Callable]        # entered(plan, src, dst) -> None or (number, rest)


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
    if not as_they_are(sendbuf, recvbuf):
        return None
    dst = recvbuf if recvbuf.ndim == 1 else recvbuf.reshape(-1)
    if sendbuf is MPI.IN_PLACE or sendbuf is recvbuf:
        return ctx, plan, dst, dst
    return ctx, plan, (sendbuf if sendbuf.ndim == 1 else sendbuf.reshape(-1)), dst


class _Bound:
    """A checked call on two array objects (see :func:`repeat`): the arguments it was
    made with, the arrays' state then, and the plan it found."""

    __slots__ = ("sender", "recv", "op", "comm", "algorithm", "timeout", "thread", "epoch",
                 "generation", "ctx", "version", "plan", "sflags", "rflags", "dtype", "size",
                 "entry")


def _in_place():
    return MPI.IN_PLACE


# The bound call found or made last, on any thread: a loop on one pair of arrays finds it
# without the table's key (two ids and a tuple: a fifth of the lookup).
_last: Optional[_Bound] = None


def bind(sendbuf, recvbuf, op, comm, algorithm, timeout, found) -> None:
    """Keep a call :func:`lookup` found (``found``) under its arrays' identity (weak
    references: the arrays' own lives are not changed), for :func:`repeat`: where its
    plan has a fast way."""
    ctx, plan = found[0], found[1]
    in_place = sendbuf is MPI.IN_PLACE or sendbuf is recvbuf
    if plan.fast is None:
        return
    if len(_BOUND) >= _BOUND_LIMIT:
        # entries of arrays that died go first; all of them only if that is not enough
        for key in [k for k, old in _BOUND.items() if old.recv() is None]:
            del _BOUND[key]
        if len(_BOUND) >= _BOUND_LIMIT:
            _BOUND.clear()
    b = _Bound()
    b.recv = weakref.ref(recvbuf)
    # the object passed as sendbuf, whichever it was: the array, recvbuf or MPI.IN_PLACE
    b.sender = b.recv if sendbuf is recvbuf else _in_place if in_place else weakref.ref(sendbuf)
    b.op, b.comm, b.algorithm, b.timeout = op, comm, algorithm, timeout
    b.thread, b.epoch, b.generation = _threads.code(), plan.epoch, _generation
    # lookup found plan.auto current; a later auto state, or the context freed (a freed
    # communicator), moves the context's version
    b.ctx, b.version, b.plan = ctx, ctx.version, plan
    b.sflags = None if in_place else sendbuf.flags.num  # None: in place
    b.rflags, b.dtype, b.size = recvbuf.flags.num, recvbuf.dtype, recvbuf.size
    b.entry = None  # the plan's compiled entry for these arrays' types (Plan.entered)
    try:
        _BOUND[id(sendbuf), id(recvbuf), algorithm] = b
    except TypeError:  # an unhashable algorithm: the full path says what is wrong
        return
    global _last
    _last = b  # it replaces any stale one of the same arrays, which find_bound tries first


def forget_bound() -> None:
    """Forget every bound call: the next call on any arrays goes the way of :func:`lookup`
    and binds again (for code that replaces a kept plan, as a benchmark's counting one)."""
    global _generation, _last
    _generation += 1
    _BOUND.clear()
    _last = None


def find_bound(sendbuf, recvbuf, op, comm, algorithm, timeout) -> Optional[_Bound]:
    """The bound call (:func:`bind`) this call repeats, else None.

    What is compared: the arguments by identity (the algorithm's name by value), the
    calling thread's pairing code, the settings epoch, the plan table's generation, the
    context's version (a freed communicator's context, or a new auto state, moves it),
    and of the arrays their flags (writable, contiguous, aligned), dtype and size.
    Everything else the :func:`lookup` that found the call checked cannot change on the
    same two objects.
    """
    global _last
    b = _last
    code = _code()
    # the algorithm by value: two equal names need not be one object (a list of names
    # read from the command line that holds "auto" twice bound each call anew)
    if (b is None or b.recv() is not recvbuf or b.sender() is not sendbuf
            or b.algorithm != algorithm or b.thread != code):
        try:
            b = _BOUND.get((id(sendbuf), id(recvbuf), algorithm))
        except TypeError:
            return None
        if (b is None or b.recv() is not recvbuf or b.sender() is not sendbuf
                or b.algorithm != algorithm or b.thread != code):
            return None
        _last = b
    if (b.op is not op or b.comm is not comm or b.timeout is not timeout
            or b.generation != _generation or b.epoch != _settings.epoch
            or b.version != b.ctx.version
            or recvbuf.flags.num != b.rflags or recvbuf.dtype is not b.dtype
            or recvbuf.size != b.size):
        return None
    if b.sflags is not None and (sendbuf.flags.num != b.sflags or sendbuf.dtype is not b.dtype
                                 or sendbuf.size != b.size):
        return None
    return b


def repeat(sendbuf, recvbuf, op, comm, algorithm, timeout) -> bool:
    """Run the call on its plan's fast way if it repeats a bound one (:func:`find_bound`)
    and the communicator is free and no timeline records; False when not (nothing done:
    the caller goes the way of :func:`lookup` and :func:`run`).

    A bound call's arrays were checked when it was bound, so a caller may ask this before
    checking its arguments (the drop-in's ``Allreduce`` does)."""
    if _timeline.ACTIVE is not None:
        return False
    b = find_bound(sendbuf, recvbuf, op, comm, algorithm, timeout)
    return b is not None and fast_way(b.ctx, b.plan, sendbuf, recvbuf, None, b)


def run_found(sendbuf, recvbuf, op, comm, algorithm, timeout) -> bool:
    """Run the call on its plan if :func:`lookup` finds one (and :func:`bind` it for the
    next call on the same arrays); False when not (nothing done: the full path)."""
    found = lookup(sendbuf, recvbuf, op, comm, algorithm, timeout)
    if found is None:
        return False
    bind(sendbuf, recvbuf, op, comm, algorithm, timeout, found)
    run(*found)
    return True


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
    global _generation
    _generation += 1  # bound calls go the way of lookup again
    memo = ctx.peek(_MEMO)
    if memo is None or len(memo) >= _LIMIT:
        memo = ctx.put(_MEMO, PlanCache())
    template = fact_values(ctx.rank, None, facts, 0)  # words 0-1: each call writes its number
    auto = ctx.peek(_auto.KEY) if algorithm == "auto" else None
    shape = (algorithm, key, dst.dtype, dst.size, timeout, call.fingerprint[8])
    if trial:
        def forget(memo=memo):
            global _generation
            if memo.get(shape) is plan:
                del memo[shape]
                _generation += 1
        # the run passes the agreement on to each candidate that needs it
        agreement, run = True, algo.tuning(kernel, dst, call.settings, forget)
    else:
        agreement = needs_agreement(call.settings, algo)
        run = prepared(ctx, algo, kernel, dst, agreement)
    plan = memo[shape] = Plan(
        algo, kernel, template, facts, auto, call.settings,
        call.fingerprint, call.fingerprint_words, call.tag_offset, _settings.epoch,
        agreement, run, None if trial else getattr(run, "fast", None),
        None if trial else getattr(run, "entered", None))


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
    if plan.fast is not None and fast_way(ctx, plan, src, dst, timeline):
        return
    call = enter(ctx, "allreduce", plan.fingerprint, plan.settings, plan.words, plan.tag_offset)
    try:
        _run_recorded(ctx, plan, call, plan.run, src, dst)
    finally:
        leave(call)


def fast_way(ctx, plan, src, dst, timeline, bound=None) -> bool:
    """The call on ``plan.entered`` or ``plan.fast`` if the communicator is free and not
    broken (True), else nothing done (False).  ``bound``: the bound call it repeats, where
    ``plan.entered`` keeps what it resolved for those arrays; ``src`` and ``dst`` are then
    the caller's buffers as they came (``MPI.IN_PLACE`` or ``dst`` itself in place), else
    flat already.

    The public ``allreduce`` calls :func:`find_bound` and this itself: every Python frame
    between it and the compiled step costs a repeated small call about a tenth of a
    microsecond and more (docs/results/dedicated-cores.md)."""
    if bound is not None:
        # flat views of shaped arrays, made per call: kept, they would keep the arrays alive
        dst = dst if dst.ndim == 1 else dst.reshape(-1)
        src = dst if bound.sflags is None else src if src.ndim == 1 else src.reshape(-1)
    if ctx.broken is not None or not ctx.lock.acquire(False):
        return False
    try:
        if plan.entered is not None and timeline is None:
            # numbered and booked by the compiled step itself
            try:
                rest = plan.entered(plan, src, dst, bound)
            except BaseException as exc:  # broken off midway: the communicator breaks
                rest = ctx.calls, _reraise(exc)
            if rest is not None:
                _run_rest(ctx, plan, rest[0], rest[1], src, dst)
            return True
        number = ctx.next_call()
        values = plan.template
        values[0], values[1] = number, -number  # the plan's own: calls hold the lock
        if timeline is not None:  # timeline hook: the compiled step (ended below)
            timeline.open("compiled step", "step")
        try:
            rest = plan.fast(number, plan, src, dst)
        except BaseException as exc:  # broken off midway: the communicator breaks
            rest = _reraise(exc)
        if timeline is not None:
            timeline.close()
        if rest is not None:
            _run_rest(ctx, plan, number, rest, src, dst)
    finally:
        ctx.lock.release()
    return True


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
