"""What a rank records: per thread, a ring buffer of calls, each with its phases.

A call is recorded whole when it ends, as one tuple: its start and end on
this rank's clock (``time.perf_counter_ns``), its collective, what the call
path told about it (algorithm, communicator, call number, count, dtype),
its phases and its instants.  Phases are opened and closed by the call
path's hooks (:meth:`Recorder.open`, :meth:`Recorder.close`) on a stack, so
they nest as the code runs; a phase still open when its call ends (an
exception went through it) is closed at the call's end.  Only whole calls
go into the ring, so the last call before an exception is never half there.

Memory is bounded by the ring's length (calls per thread) and by
``MAX_PHASES`` per call: a call that opens more (a long pipelined ring)
keeps its first ones and counts the rest.
"""

import collections
import threading
import time

from mpi4py import MPI

MAX_PHASES = 512  # phases kept per call; the rest are counted in the call's "dropped"
# Phases of one name and depth that follow each other within this many ns
# are kept as one (a kernel applied block by block is one "reduce"): the
# gaps so joined count towards the phase, at most this much each.
JOIN_NS = 5_000

_now = time.perf_counter_ns


class Call:
    """One collective call on one thread while it runs."""

    __slots__ = ("what", "t0", "stack", "phases", "instants", "info", "dropped")

    def __init__(self, what, t0):
        self.what, self.t0 = what, t0
        self.stack = []      # open phases: [name, category, start]
        self.phases = []     # closed: (start, end, name, category, depth)
        self.instants = []   # (time, name, args)
        self.info = {}       # algorithm, comm, number, count, dtype, error
        self.dropped = 0


class Track:
    """One thread's recording: its ring of finished calls and the call it is in."""

    __slots__ = ("tid", "name", "calls", "call", "instants", "total")

    def __init__(self, tid, name, capacity):
        self.tid, self.name = tid, name
        self.calls = collections.deque(maxlen=capacity)
        self.call = None
        self.total = 0  # calls recorded; those beyond the ring's length were dropped
        # instants outside any call (auto's decisions made for another thread, ...)
        self.instants = collections.deque(maxlen=capacity)


class Recorder:
    """Records the collectives of every thread of this process (see the package docstring).

    The call path reaches it through ``pycollective.timeline.ACTIVE``; every
    method is safe to call from any thread, and a hook called outside a
    recorded call does nothing (a wait before the first call, setup).
    """

    def __init__(self, capacity, bridge=None):
        self.capacity = int(capacity)
        if self.capacity < 1:
            raise ValueError(f"the ring buffer must hold at least one call, got {capacity}")
        self.origin = _now()
        self.tracks = {}
        self._local = threading.local()
        self._lock = threading.Lock()
        self.bridge = bridge  # torch's record_function, or None (pycollective.torch sets it)
        self._comms = {}      # a call's context -> its name, the same on every rank

    # -- tracks ---------------------------------------------------------------------------

    def _track(self):
        track = getattr(self._local, "track", None)
        if track is None:
            thread = threading.current_thread()
            track = Track(threading.get_ident(), thread.name, self.capacity)
            with self._lock:
                self.tracks[track.tid] = track
            self._local.track = track
        return track

    def _call(self):
        track = getattr(self._local, "track", None)
        return None if track is None else track.call

    # -- the call --------------------------------------------------------------------------

    def outside(self) -> bool:
        """True when this thread is in no recorded call: a public collective starts one."""
        track = getattr(self._local, "track", None)
        return track is None or track.call is None

    def traced(self, fn, what, args, kwargs=None):
        """Run ``fn(*args, **kwargs)`` as one recorded call of collective ``what``."""
        track = self._track()
        call = track.call = Call(what, _now())
        ranged = self.bridge(what) if self.bridge is not None else None
        if ranged is not None:
            ranged.__enter__()
        try:
            return fn(*args, **(kwargs or {}))
        except BaseException as exc:
            call.info["error"] = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            end = _now()
            while call.stack:  # phases an exception went through end with the call
                self._closed(call, call.stack.pop(), end)
            track.call = None
            track.calls.append(_finished(call, end))
            track.total += 1
            if ranged is not None:
                ranged.__exit__(None, None, None)

    def about(self, **info):
        """Facts about this thread's call: algorithm, comm (its context), number, count, dtype."""
        call = self._call()
        if call is not None:
            ctx = info.get("comm")
            if ctx is not None:
                info["comm"] = self._comms.get(ctx) or self._comm_name(ctx)
            call.info.update(info)

    def _comm_name(self, ctx):
        """``world ranks 0-3 #1``: the ranks of ``COMM_WORLD`` in the call's communicator,
        and which communicator of those ranks it is in the order this rank first saw them,
        so that every rank names a communicator alike (its handle differs by rank)."""
        try:
            group = ctx.comm.Get_group()
            world = MPI.COMM_WORLD.Get_group()
            ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), world)
            group.Free()
            world.Free()
        except MPI.Exception:
            ranks = []
        runs, start = [], None
        for i, q in enumerate(ranks):
            if start is None:
                start = q
            if i + 1 == len(ranks) or ranks[i + 1] != q + 1:
                runs.append(f"{start}" if start == q else f"{start}-{q}")
                start = None
        base = f"world ranks {','.join(runs) or '?'}"
        seen = sum(1 for name in self._comms.values() if name.rsplit(" #", 1)[0] == base)
        name = self._comms[ctx] = f"{base} #{seen + 1}"
        return name

    # -- phases and instants --------------------------------------------------------------------

    def open(self, name, category=None):
        """Start phase ``name`` (its ``category``: agreement, wait, reduce, copy, step)."""
        call = self._call()
        if call is not None:
            call.stack.append((name, category or name, _now()))

    def close(self):
        """End the phase opened last."""
        call = self._call()
        if call is not None and call.stack:
            self._closed(call, call.stack.pop(), _now())

    @staticmethod
    def _closed(call, opened, end):
        name, category, start = opened
        depth = len(call.stack) + 1
        if call.phases:
            last = call.phases[-1]
            if last[2] == name and last[4] == depth and start - last[1] <= JOIN_NS:
                call.phases[-1] = (last[0], end, name, category, depth)
                return
        if len(call.phases) >= MAX_PHASES:
            call.dropped += 1
            return
        call.phases.append((start, end, name, category, depth))

    def instant(self, name, **args):
        """A moment worth marking: auto's decision, an error, a stall warning."""
        track = self._track()
        target = track.instants if track.call is None else track.call.instants
        target.append((_now(), name, args))

    def kernels(self, args):
        """``args`` with every callable (the reduction kernel) timed as a "reduce" phase."""
        return tuple(_Timed(self, a) if callable(a) and not isinstance(a, _Timed) else a
                     for a in args)

    # -- what the writer reads ------------------------------------------------------------------

    def snapshot(self, now=False):
        """``[(tid, thread name, [calls], [instants], calls recorded)]``: a copy, safe while
        others record.  ``now``: a call in progress is included as it stands (marked
        unfinished), for a part written on an error before the call ends."""
        with self._lock:
            tracks = list(self.tracks.values())
        out = []
        for t in tracks:
            calls = list(t.calls)
            call = t.call
            if now and call is not None:
                end = _now()
                open_phases = [(start, end, name, category, depth + 1)
                               for depth, (name, category, start) in enumerate(call.stack)]
                calls.append(_finished(call, end, dict(call.info, unfinished=True),
                                       call.phases + open_phases))
            recorded = t.total + len(calls) - len(t.calls)
            out.append((t.tid, t.name, calls, list(t.instants), recorded))
        return out


def _finished(call, end, info=None, phases=None):
    """The record of a call: (start, end, collective, info, phases, instants, phases dropped)."""
    return (call.t0, end, call.what, call.info if info is None else info,
            call.phases if phases is None else phases, list(call.instants), call.dropped)


def untimed(kernel):
    """The kernel :meth:`Recorder.kernels` wrapped, or ``kernel`` itself: a call path that
    runs a compiled loop for a known kernel finds it through the wrapper (and marks its
    loop as a phase of its own), so a recorded call runs the same code as any other."""
    return kernel.kernel if isinstance(kernel, _Timed) else kernel


class _Timed:
    """A kernel whose every application is a "reduce" phase of the call running it."""

    __slots__ = ("recorder", "kernel")

    def __init__(self, recorder, kernel):
        self.recorder, self.kernel = recorder, kernel

    def __call__(self, *args):
        self.recorder.open("reduce")
        try:
            return self.kernel(*args)
        finally:
            self.recorder.close()
