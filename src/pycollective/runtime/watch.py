"""Bounded waits, and the side channel that says who is missing when a wait runs long.

Every wait inside the library -- on point-to-point requests, on counters in
shared memory, on the agreement step, on a lock -- goes through a
:class:`Waiter`.  It spins briefly, then yields the core (ranks often
outnumber cores), and while it waits it watches the clock:

* after ``ROLL_AFTER_S`` of one wait it sends this rank's *roll record*
  (call number, fingerprint of the call: collective, count, dtype, op,
  algorithm, and the settings that must match) to every other rank of the
  communicator, once per call;
* it reads the records and notices other ranks sent.  A record of the same
  call with another fingerprint is a mismatch: raise at once, naming which
  rank called what (this is what catches a mismatch when the per-call
  agreement is off).  A notice that another rank failed or timed out in
  this call raises here too, so every rank raises;
* after ``PYCOLLECTIVE_STALL_WARN_S`` it warns (:class:`StallWarning`)
  naming the ranks it has not heard from, and keeps waiting;
* after the call's timeout (``PYCOLLECTIVE_TIMEOUT_S``, the communicator's
  or the call's own) without progress it raises :class:`CollectiveTimeout`
  naming the ranks that did not arrive -- those that never answered the
  roll call (stopped, dead, skipped the call, busy elsewhere) and those
  still in an earlier call -- and tells the others, who raise the same.

The side channel is the context's private communicator with its own tag
(reserved in the registry), never a receive the algorithms post, so it does
not depend on the stuck collective.  A rank that raises marks the
communicator broken: later calls raise :class:`CommunicatorBroken` at once.
The timeout bounds each wait, i.e. the longest time without progress, so a
huge collective that keeps moving is never cut short.
"""

import os
import sys
import threading
import time
import warnings
from typing import NamedTuple, Optional, Sequence

import numpy as np
from mpi4py import MPI

from . import hosts as _hosts, settings as _settings, threads as _threads
from .._errors import (CollectiveError, CollectiveMismatch, CollectiveTimeout, CommunicatorBroken,
                       PeerFailed, StallWarning)
from ..data.kernels import DTYPE_NAMES
from ..data.ops import OPS
from .registry import names, reserve_tags
from .. import timeline as _timeline

__all__ = ["CollectiveTimeout", "Call", "Waiter", "current", "begin", "end", "waitall", "fail",
           "arrive", "TAG_NOTICE", "ROLL_AFTER_S"]

TAG_NOTICE, = reserve_tags("side channel (_watch.py)", (250,))
ROLL_AFTER_S = 1.0        # a wait this long sends this rank's roll record (once per call)
_SPINS = 4                # Test calls before a waiter starts yielding and watching the clock
# (yielding at once costs a system call when the core is free, and lets the
# rank we wait for run when ranks outnumber cores, which measured faster for
# small messages than spinning 64 times first)
_ABSENT_S = 1.0          # a gap between two polls this long: the rank itself was not running
_BEHIND_GRACE_S = 1.0    # at the timeout, how long more to wait for the verdict of a rank
                         # that is still in an earlier call (see Waiter._time_out)
_IO_EVERY_S = 1e-3        # how often a waiting rank reads the side channel
_ERRORS = {cls.__name__: cls for cls in (CollectiveError, CollectiveTimeout, CollectiveMismatch,
                                         PeerFailed, CommunicatorBroken)}

_local = threading.local()


class Call:
    """One collective call in progress on one rank (thread-local while it runs)."""

    __slots__ = ("ctx", "what", "number", "fingerprint", "fingerprint_words", "settings",
                 "tag_offset", "rolled", "heard", "warned", "outer")

    def __init__(self, ctx, what, number, fingerprint, settings, tag_offset, words=None):
        self.ctx, self.what, self.number = ctx, what, number
        self.fingerprint, self.settings, self.tag_offset = fingerprint, settings, tag_offset
        # The fingerprint as the int64 words of a shared-memory header (padded).
        self.fingerprint_words = words if words is not None else fingerprint_words(fingerprint)
        self.rolled = self.warned = False
        self.heard = {}  # rank -> (call number, fingerprint) from roll records
        self.outer = None  # the call this one runs inside, if any (see begin)

    def title(self):
        return f"{self.what} call #{self.number} on {self.ctx.label}"


def current() -> Optional[Call]:
    """The call this thread is running, if any."""
    return getattr(_local, "call", None)


def begin(ctx, what, fingerprint, settings, tag_offset=0, words=None, number=None) -> Call:
    """Number a new call on ``ctx`` and make it this thread's current call.

    The caller holds ``ctx.lock``, so numbers follow the order of calls on
    the communicator, which MPI requires to be the same on every rank.
    ``number``: the call was numbered already (:meth:`Context.next_call`, by a caller
    that needs its record only now: the repeated call's fast way, ``collectives/plans.py``).
    """
    if number is None:
        number = ctx.next_call()
    call = Call(ctx, what, number, fingerprint, settings, tag_offset, words)
    # A call made inside another (the first-use measurement runs shm on a duplicate
    # communicator inside the first automatic call): end() gives the outer one back.
    call.outer = getattr(_local, "call", None)
    _local.call = call
    if _timeline.ACTIVE is not None and fingerprint:  # timeline hook: the call's facts
        _timeline.ACTIVE.about(number=number, comm=ctx, count=fingerprint[1],
                               dtype=_dtype_name(fingerprint))
    return call


def _dtype_name(fp):
    """The dtype a fingerprint names (the gathers and bcast move bytes: an itemsize)."""
    if COLLECTIVES[fp[0]] in ("allgather", "allgatherv", "bcast"):
        return "bytes" if fp[2] < 0 else f"{fp[2]}-byte items"
    return DTYPE_NAMES[fp[2]] if 0 <= fp[2] < len(DTYPE_NAMES) else "?"


def end(call: Call) -> None:
    """Leave ``call``: this thread's current call is again the one it ran inside, if any."""
    _local.call = call.outer


# --- fingerprints ------------------------------------------------------------------------
#
# A call's fingerprint is a tuple of small integers, the same on every rank
# that makes the same call with the same arguments and settings.  It travels
# in roll records and in the headers of the shared-memory algorithms, and
# part of it is folded into the message tags of the point-to-point ones, so
# that messages of ranks that disagree can never match each other.

# At most 8 (3 bits of the tag code below); append, never reorder.
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "bcast", "reduce", "allgatherv",
               "reduce_scatterv", "barrier")
FIELDS = ("collective", "count", "dtype", "op", "algorithm", "check", "segment_bytes",
          "timeout_ms", "thread")  # thread: the calling thread's name, hashed (_threads)


# Where each field sits in a fingerprint (the order :func:`fingerprint` builds).
FP_WHAT, FP_COUNT, FP_DTYPE, FP_OP, FP_ALGORITHM = 0, 1, 2, 3, 4


def fingerprint(what, count, dtype_code, op_code, algo_code, settings) -> tuple:
    """The fingerprint of one call (codes: indexes into the tables :func:`describe` uses)."""
    timeout_ms = -1 if settings.timeout is None else int(settings.timeout * 1000)
    return (COLLECTIVES.index(what), int(count), dtype_code, op_code, algo_code,
            int(settings.check), int(settings.segment_bytes), timeout_ms, _threads.code())


def fingerprint_words(fp):
    """``fp`` as 9 int64 words (a shared-memory header's words 1..9)."""
    words = np.zeros(9, np.int64)
    words[:len(fp)] = fp
    return words


def describe(fp) -> str:
    """``allreduce(count=10, dtype=float32, op=sum, algorithm=ring, ...)`` from a fingerprint."""
    if not fp:
        return "(invalid arguments)"

    def pick(table, i, none="-"):
        return table[i] if 0 <= i < len(table) else none

    what, count, dtype, op, algo, check, segment, timeout = fp[:8]
    name = pick(COLLECTIVES, what, "?")
    algos = names(name)
    # The gathers and bcast move bytes, not reduced elements: their
    # fingerprints carry an itemsize (gathers) or nothing (bcast) instead.
    if name in ("allgather", "allgatherv"):
        fields = [f"count={count}", f"itemsize={dtype}"]
    elif name == "bcast":
        fields = [f"bytes={count}"]
    elif name == "barrier":
        fields = []
    else:
        fields = [f"count={count}", f"dtype={pick(DTYPE_NAMES, dtype)}",
                  f"op={pick(OPS, op)}"]
    if algos:
        fields.append(f"algorithm={'auto' if algo == len(algos) else pick(algos, algo)}")
    fields += [f"check={'on' if check else 'off'}", f"segment_bytes={segment}",
               f"timeout={'none' if timeout < 0 else f'{timeout / 1000:g} s'}"]
    if len(fp) > 8:
        fields.append(f"thread={_threads.describe(fp[8])}")
    return f"{name}({', '.join(fields)})"


def tag_offset(fp, tag_ub) -> int:
    """What to add to an algorithm's tags (below 256) for this call's messages.

    It encodes the collective, dtype, op and algorithm, so messages of ranks
    that disagree on them never match; counts are checked by message size.
    0 when the MPI library's largest tag is too small for it.
    """
    what, _, dtype, op, algo, check = fp[:6]
    # collective 3 + dtype 4 + op 2 + check 1 + algorithm 5 bits: with the 8
    # low bits of the algorithm's tag the largest tag is 2**23 - 1, what Open
    # MPI over UCX allows (MPICH allows 2**29 - 1).
    code = (((((what * 16 + max(dtype, 0)) * 4 + max(op, 0)) * 2 + check) * 32 + algo + 1)
            & 0x7FFF)
    if len(fp) > 8:  # the calling thread: two threads' messages never match (_threads)
        code ^= _threads.tag_bits(fp[8])
    offset = code << 8
    return offset if offset + 255 <= tag_ub else 0


# --- the side channel ------------------------------------------------------------------

class Notice(NamedTuple):
    """What one rank tells the others: it is here (roll), it failed, or it timed out."""

    kind: str                 # "here", "failed"
    rank: int
    number: int               # the call number it is in
    fingerprint: tuple
    error: str = ""           # exception class name, for "failed"
    text: str = ""
    ranks: tuple = ()
    token: int = 0            # the sender's Context.token: one from a freed communicator
                              # whose context id MPI gave this one is not for it


def _send_all(ctx, notice):
    """Tell every other rank; never waits (a stopped rank must not stop us)."""
    notice = notice._replace(token=getattr(ctx, "token", 0))
    for q in range(ctx.size):
        if q != ctx.rank:
            ctx.pending_notices.append(ctx.comm.isend(notice, dest=q, tag=TAG_NOTICE))
    # Completed sends are released; those to a stalled rank stay until it reads them.
    ctx.pending_notices[:] = [r for r in ctx.pending_notices if not r.Test()]


def _raise_broken(ctx, exc):
    ctx.broken = exc  # marks it, and tells fail() the others know already
    raise exc


def fail(call: Call, exc: BaseException) -> CollectiveError:
    """This rank failed in ``call``: mark the communicator broken, tell the others.

    Returns the :class:`CollectiveError` to raise here (``exc`` itself when
    it already is one, else a ``CollectiveError`` naming this rank).
    """
    ctx = call.ctx
    if _timeline.ACTIVE is not None:  # timeline hook: an error, kept before the job can end
        _timeline.ACTIVE.instant("error", error=f"{type(exc).__name__}: {exc}")
        _timeline.flush()
    if isinstance(exc, CollectiveError) and ctx.broken is exc:
        return exc  # raised by the side channel: the others know already
    if isinstance(exc, CollectiveError):
        err, text = exc, str(exc)
    else:
        text = f"{call.title()} failed on rank {ctx.rank}: {type(exc).__name__}: {exc}"
        err = CollectiveError(text, collective=call.what, call=call.number, comm=ctx.label,
                              ranks=(ctx.rank,))
        err.__cause__ = exc
    ctx.broken = err
    if ctx.size > 1:
        try:
            _send_all(ctx, Notice("failed", ctx.rank, call.number, call.fingerprint,
                                  type(err).__name__, text, tuple(getattr(err, "ranks", ()))))
        except MPI.Exception:
            pass  # the communicator itself failed: nothing more to tell
    return err


def _drain(call: Call) -> None:
    """Read every notice that has arrived; raise what they say is wrong with this call."""
    ctx = call.ctx
    comm, status = ctx.comm, MPI.Status()
    # Failures reported for a later call while this rank was finishing the
    # one before (a peer can be a call ahead) count once this call is that one.
    early, ctx.early_notices = ctx.early_notices, []
    for notice in early:
        _take(call, notice)
    token = getattr(ctx, "token", 0)
    while comm.Iprobe(MPI.ANY_SOURCE, TAG_NOTICE, status):
        notice = comm.recv(source=status.Get_source(), tag=TAG_NOTICE)
        if notice.token == token:
            _take(call, notice)


def _take(call: Call, notice: Notice) -> None:
    ctx = call.ctx
    if notice.kind == "failed":
        # A failure in this call, or in one this rank has finished (it was a
        # call ahead: its part was done), breaks the communicator: the peer
        # never comes to this call, so it is raised here, not waited out.
        if notice.number > call.number:
            # The peer is a call ahead: this call may still complete (it may
            # have sent all it had to), so the notice waits for the next call
            # -- unless this one times out first (Waiter._time_out).
            ctx.early_notices.append(notice)
            call.heard[notice.rank] = (notice.number, notice.fingerprint)
            return
        _raise_peer_failure(call, notice)
    call.heard[notice.rank] = (notice.number, notice.fingerprint)
    if notice.number == call.number and notice.fingerprint != call.fingerprint:
        exc = CollectiveMismatch(
            f"{call.title()}: ranks called different collectives or arguments: rank "
            f"{notice.rank} called {describe(notice.fingerprint)}, rank {ctx.rank} called "
            f"{describe(call.fingerprint)}{_threads.hint(call.fingerprint, notice.fingerprint)}",
            collective=call.what, call=call.number,
            comm=ctx.label, ranks=tuple(sorted((notice.rank, ctx.rank))))
        raise fail(call, exc)


def _raise_peer_failure(call: Call, notice: Notice) -> None:
    ctx = call.ctx
    cls = _ERRORS.get(notice.error, PeerFailed)
    if cls in (CollectiveError, CommunicatorBroken):
        cls = PeerFailed  # the failure was rank-local there; here a peer failed
    where = "" if notice.number == call.number else f" in call #{notice.number}"
    _raise_broken(ctx, cls(f"{notice.text} (reported by rank {notice.rank}{where} to rank "
                           f"{ctx.rank})", collective=call.what, call=call.number,
                           comm=ctx.label, ranks=notice.ranks or (notice.rank,)))


def _late(call: Call) -> Sequence[int]:
    """Ranks not heard from in this call (never answered, or still in an earlier one)."""
    ctx = call.ctx
    return [q for q in range(ctx.size) if q != ctx.rank
            and (q not in call.heard or call.heard[q][0] < call.number)]


def _elsewhere(call: Call) -> str:
    ahead = {q: n for q, (n, _) in call.heard.items() if n > call.number}
    behind = {q: n for q, (n, _) in call.heard.items() if n < call.number}
    parts = []
    if behind:
        parts.append("still in an earlier call: " + ", ".join(
            f"rank {q} in #{n}" for q, n in sorted(behind.items())))
    if ahead:
        parts.append("already in a later call: " + ", ".join(
            f"rank {q} in #{n}" for q, n in sorted(ahead.items())))
    return ("; " + "; ".join(parts)) if parts else ""


def _caller_level():
    """The ``stacklevel`` that points a warning at the first frame outside the package."""
    level, frame = 1, sys._getframe(1)
    package = os.path.dirname(__file__)
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


class Waiter:
    """The clock and side channel of one wait; :meth:`pause` between polls.

    Args:
        waiting_for: what this wait is for, for messages ("messages from
            rank 3", "the node's ranks").
        call: the call it belongs to (default: this thread's current call).
            Without a call there is no side channel, only the deadline.
    """

    __slots__ = ("call", "t0", "last", "next_io", "timeout", "warn_at", "waiting_for", "spins")

    def __init__(self, waiting_for="the other ranks", call=None):
        self.call = call if call is not None else current()
        self.t0 = time.monotonic()
        self.last = self.t0
        self.next_io = self.t0
        self.waiting_for = waiting_for
        self.spins = 0
        if self.call is not None:
            settings = self.call.settings
            self.timeout, self.warn_at = settings.timeout, settings.stall_warn
        else:
            self.timeout, self.warn_at = _settings.timeout(), None

    def pause(self) -> None:
        """Give way to other ranks, and act on the clock and the side channel."""
        self.spins += 1
        now = time.monotonic()
        if now - self.last > _ABSENT_S:
            # This rank was not running (SIGSTOP, a long descheduling): that
            # time is not time spent waiting.  Without this, a rank resumed
            # after the others gave up times out on its first poll, blaming
            # them, before it has read their notices saying it was the one
            # missing (MPI may need several polls to deliver queued messages).
            self.t0 += now - self.last
        self.last = now
        elapsed = now - self.t0
        call = self.call
        if call is not None and now >= self.next_io:
            self.next_io = now + _IO_EVERY_S
            self._side_channel(call, elapsed)
        if self.timeout is not None and elapsed > self.timeout:
            self._time_out(elapsed)
        # Ranks often outnumber cores: let the rank we wait for run.
        if elapsed < 2e-3:
            os.sched_yield()
        else:
            time.sleep(min(1e-3, elapsed / 200))

    def _side_channel(self, call, elapsed):
        ctx = call.ctx
        if ctx.size == 1:
            return
        _drain(call)
        if not call.rolled and elapsed > ROLL_AFTER_S:
            call.rolled = True
            _send_all(ctx, Notice("here", ctx.rank, call.number, call.fingerprint))
        if self.warn_at is not None and elapsed > self.warn_at and not call.warned:
            call.warned = True
            late = _late(call)
            if _timeline.ACTIVE is not None:  # timeline hook: a stall warning
                _timeline.ACTIVE.instant("stall warning", waited_s=elapsed, late=str(late))
            warnings.warn(StallWarning(
                f"{call.title()}: rank {ctx.rank} has waited {elapsed:.0f} s for "
                f"{self.waiting_for}; no word from ranks {late}{_elsewhere(call)}; still "
                f"waiting (timeout: {self._timeout_text()})"), stacklevel=_caller_level())

    def _timeout_text(self):
        return "none" if self.timeout is None else f"{self.timeout:g} s"

    def _time_out(self, elapsed):
        call = self.call
        if call is None:
            raise CollectiveTimeout(
                f"rank {MPI.COMM_WORLD.Get_rank()} waited {elapsed:.1f} s for "
                f"{self.waiting_for} outside any collective call (PYCOLLECTIVE_TIMEOUT_S)")
        ctx = call.ctx
        _drain(call)
        # A peer that failed in a later call has given up on the communicator:
        # its verdict (which ranks stalled) explains this wait better than this
        # rank's own clock can -- after a SIGSTOP, the clock includes the stop.
        failed = [n for n in ctx.early_notices if n.kind == "failed"]
        if failed:
            ctx.early_notices = []
            _raise_peer_failure(call, failed[0])
        late, hosts = _late(call), getattr(ctx, "hosts", None)
        # A late rank heard from in an earlier call is itself waiting there (a
        # ring's last step lets a rank finish while the one before it still
        # waits for its own receive) and started waiting first: its verdict
        # names the ranks that really stopped.  Give it a moment to arrive;
        # the polls go on reading the side channel.
        if any(q in call.heard for q in late) and elapsed < self.timeout + _BEHIND_GRACE_S:
            return
        exc = CollectiveTimeout(
            f"{call.title()} timed out on rank {ctx.rank} after {elapsed:.1f} s without "
            f"progress waiting for "
            f"{_hosts.waiting_text(hosts, ctx.rank, late, self.waiting_for)}: "
            f"{_hosts.missing(hosts, ctx.rank, late)}"
            f"{_elsewhere(call)}; the communicator is now unusable",
            collective=call.what, call=call.number, comm=ctx.label, ranks=late)
        raise fail(call, exc)


def waitall(requests, statuses=None, waiting_for="messages") -> None:
    """``MPI.Request.Waitall``, bounded by the call's timeout and watching the side channel.

    On a failure the requests still pending are cancelled where MPI allows,
    so no late message lands in a buffer the caller gets back.
    """
    # timeline hook: waiting for peers (ended below), from the first test: the tests
    # progress the transfers (a large message is copied inside them)
    recording = _timeline.ACTIVE is not None
    if recording:
        _timeline.ACTIVE.open("wait")
    for _ in range(_SPINS + 1):
        if MPI.Request.Testall(requests, statuses):
            if recording:
                _timeline.ACTIVE.close()
            return
    waiter = Waiter(waiting_for)
    try:
        while not MPI.Request.Testall(requests, statuses):
            waiter.pause()
    except BaseException:
        _cancel(requests)
        raise
    if recording:  # timeline hook: the wait's end
        _timeline.ACTIVE.close()


def _cancel(requests):
    for req in requests:
        try:
            if req != MPI.REQUEST_NULL:
                req.Cancel()
        except MPI.Exception:
            pass
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        try:
            if MPI.Request.Testall(requests):
                return
        except MPI.Exception:
            return
        os.sched_yield()


def arrive(comm, what) -> None:
    """Wait, bounded, until every rank of ``comm`` is here (a nonblocking barrier).

    Called before the blocking MPI collectives that build per-communicator
    state (splits, shared segments), which cannot be bounded themselves: once
    every rank has arrived they complete promptly.
    """
    if comm.Get_size() > 1:
        waitall([comm.Ibarrier()], waiting_for=f"every rank to reach {what}")


def broken_error(ctx, what="a collective") -> CommunicatorBroken:
    """The error of a call on a communicator that an earlier failure broke.

    The other ranks are told too: one of them may not know yet and be
    waiting in this call.
    """
    exc = CommunicatorBroken(
        f"{what} on {ctx.label}: the communicator is unusable since an earlier collective "
        f"failed ({ctx.broken}); free it and use a new communicator, or end the job",
        collective=what, comm=ctx.label, ranks=getattr(ctx.broken, "ranks", ()))
    if ctx.size > 1 and ctx.comm != MPI.COMM_NULL:
        try:
            _send_all(ctx, Notice("failed", ctx.rank, ctx.calls + 1, (), "CommunicatorBroken",
                                  str(exc), exc.ranks))
        except MPI.Exception:
            pass
    return exc
