"""A timeline of every collective, rank by rank, for Perfetto and ``chrome://tracing``.

Off by default.  Turn it on for a whole job with ``PYCOLLECTIVE_TIMELINE=trace.json``
(every rank, from the import of pycollective to the end of the job), or
around part of a program, on every rank of ``MPI.COMM_WORLD``::

    pycollective.timeline.start("trace.json")   # collective: measures the clock offsets
    ...                                          # every collective on every communicator
    pycollective.timeline.stop()                 # collective: rank 0 writes the file

    with pycollective.timeline.recording("trace.json"):
        ...

The file has one process per rank and a thread per recording thread (the
caller's, the nonblocking helper's); each call is a span named by its
collective, algorithm, count and dtype, with its phases as child spans
(``agreement``, ``wait``, ``reduce``, ``copy-in``/``copy-out``, an
algorithm's own steps) and instants for auto's decisions, errors and stall
warnings.  Times are on rank 0's clock: each rank's offset, measured at the
start, and its error bound are in ``otherData``.  Each thread keeps its last
``capacity`` calls (``PYCOLLECTIVE_TIMELINE_CALLS``, default 100000) in a
ring buffer.  When an exception ends a job, every rank first writes its own
calls to ``PATH.rankN.json``; ``python -m pycollective.timeline merge PATH``
joins them.  ``python -m pycollective.timeline summary PATH`` reads a trace
without a viewer (:mod:`._summary`).

The call path holds no reference to this package's internals: it tests
:data:`ACTIVE` (None when off: one attribute read per call is all it costs)
and, when it is set, calls the recorder's hooks (``traced``, ``about``,
``open``/``close``, ``instant``, ``kernels``).  It imports nothing of
pycollective, so that every layer may report to it; its two settings are read
through :data:`settings`, which pycollective's facade points at
``runtime.env`` (and starts a recording when ``PYCOLLECTIVE_TIMELINE`` is set).

May import: ``_errors``.
"""

import atexit
import contextlib
import os
import sys
import threading

from mpi4py import MPI

from . import _clock, _writer
from ._recorder import Recorder, untimed

__all__ = ["ACTIVE", "start", "stop", "recording", "flush", "discard", "untimed"]

#: The running recorder, or None.  The call path reads it once per call.
ACTIVE = None

GATHER_LIMIT_S = 30.0   # longest wait for the other ranks when writing the file
_EXIT_LIMIT_S = 5.0     # the same at exit after an exception: the job is ending anyway
_state = {}             # path, comm, meta of the recording in progress
_bridge = None          # torch's record_function (set by pycollective.torch), or None
_lock = threading.Lock()
#: Where ``PYCOLLECTIVE_TIMELINE_CALLS`` is read, at each start (``runtime.env``, set by
#: pycollective's facade); None: the default below.
settings = None
DEFAULT_CALLS = 100_000


def start(path, capacity=None):
    """Start recording every collective of this process; collective over ``COMM_WORLD``.

    Args:
        path: the trace file rank 0 writes at :func:`stop` (or at exit).
        capacity: calls kept per thread (the oldest are dropped first);
            default ``PYCOLLECTIVE_TIMELINE_CALLS`` or 100000.

    Raises:
        RuntimeError: if a recording is already running.
    """
    global ACTIVE
    if ACTIVE is not None and not isinstance(ACTIVE, _TorchRanges):
        raise RuntimeError(f"pycollective.timeline is already recording to {_state['path']}")
    if capacity is None:
        capacity = settings.TIMELINE_CALLS.get() if settings is not None else DEFAULT_CALLS
    recorder = Recorder(capacity, bridge=None if _bridge is None else _ranged)
    comm = MPI.COMM_WORLD.Dup()
    measured = _clock.measure(comm)
    offset, error = measured if measured is not None else (0, None)
    _state.update(path=os.fspath(path), comm=comm, recorder=recorder, meta={
        "clock": "time.perf_counter_ns, shifted to rank 0's", "capacity": recorder.capacity,
        "offset": offset, "offset_error": error, "size": comm.Get_size()})
    ACTIVE = recorder


def _part(recorder):
    meta = _state["meta"]
    snapshot = recorder.snapshot(now=True)
    dropped = sum(total - len(calls) for _, _, calls, _, total in snapshot)
    part = _writer.events(_state["comm"].Get_rank(), [s[:4] for s in snapshot],
                          meta["offset"], 0)
    return part, dict(meta, dropped=dropped)


def stop(limit_s=GATHER_LIMIT_S):
    """Stop recording; rank 0 writes the file.  Collective over ``COMM_WORLD``.

    Returns the path written (on every rank), or None if nothing was
    recording.  A rank that rank 0 did not hear from within ``limit_s``
    writes its own part instead (``PATH.rankN.json``).
    """
    global ACTIVE
    with _lock:
        recorder = _state.get("recorder")
        if recorder is None:
            return None
        ACTIVE = _TorchRanges() if _bridge is not None else None
        path, comm = _state["path"], _state["comm"]
        part, meta = _part(recorder)
        try:
            if not _writer.gather(comm, path, part, meta, limit_s):
                _writer.write_part(path, comm.Get_rank(), part, meta)
        finally:
            _state.clear()
            comm.Free()
        return path


@contextlib.contextmanager
def recording(path, capacity=None):
    """``start(path)`` ... ``stop()``; collective over ``COMM_WORLD``."""
    start(path, capacity)
    try:
        yield
    finally:
        stop()


def flush():
    """Write this rank's calls so far to ``PATH.rankN.json`` (never waits for others).

    Called on an error in a collective, before anything can end the job.
    """
    recorder = _state.get("recorder")
    if recorder is not None:
        part, meta = _part(recorder)
        _writer.write_part(_state["path"], _state["comm"].Get_rank(), part, meta)


def discard():
    """Stop recording without writing anything (this process only, never waits)."""
    global ACTIVE
    with _lock:
        if _state.get("recorder") is not None:
            ACTIVE = _TorchRanges() if _bridge is not None else None
            _state["comm"].Free()
            _state.clear()


def _at_exit():
    if _state.get("recorder") is None:
        return
    failed = getattr(sys, "last_value", None) is not None
    if failed:
        flush()  # first what cannot be lost; then try for the whole file
    stop(_EXIT_LIMIT_S if failed else GATHER_LIMIT_S)


class _TorchRanges:
    """What :data:`ACTIVE` is, with pycollective.torch imported and no recording running:
    each collective a ``record_function`` range while torch's profiler runs, and nothing
    otherwise (one more call per collective)."""

    __slots__ = ()

    def outside(self):
        return _profiling()

    def traced(self, fn, what, args, kwargs=None):
        with _ranged(what):
            _inside.depth = 1
            try:
                return fn(*args, **(kwargs or {}))
            finally:
                _inside.depth = 0

    def about(self, **info):
        pass

    def open(self, name, category=None):
        pass

    def close(self):
        pass

    def instant(self, name, **args):
        pass

    def kernels(self, args):
        return args


_inside = threading.local()
_profiling = None


def use_torch_profiler(record_function, profiling):
    """Make every collective a ``record_function`` range (``pycollective.torch`` calls this).

    ``profiling()`` says whether torch's profiler is running; only then do
    the ranges cost anything beyond that question.
    """
    global _bridge, _profiling, ACTIVE
    _profiling = lambda: profiling() and not getattr(_inside, "depth", 0)  # noqa: E731
    _bridge = record_function
    if ACTIVE is None:
        ACTIVE = _TorchRanges()
    elif isinstance(ACTIVE, Recorder):
        ACTIVE.bridge = _ranged


def _ranged(what):
    return _bridge(f"pycollective.{what}")


atexit.register(_at_exit)  # registered after mpi4py's MPI_Finalize: runs before it
