"""The drop-in's nonblocking collectives: one helper thread per communicator, and Request.

``Iallreduce`` and the other nonblocking forms return a :class:`Request`.
With ``MPI_THREAD_MULTIPLE`` (mpi4py's default) each communicator gets, on
its first nonblocking call, one helper thread with its OWN private duplicate
of the communicator (not the one :func:`pycollective.runtime.context.get_context`
caches for blocking calls, so messages of the two threads can never match
each other and the two never share scratch buffers).  Requests are queued
and run one after the other in submission order, which is the same on every
rank because the calls are collective.  The helper runs the same public
functions; while it waits in MPI or reduces in the numba kernels (compiled
``nogil``) it does not hold the GIL, so the caller's Python and numpy work
(numpy releases the GIL in large operations) proceeds in parallel: that is
the overlap.  Each request is an MPI generalized request completed by the
helper, so ``MPI.Request.Waitall`` (and ``Testall``/``Waitany``) accept them
next to native requests; :meth:`Request.Wait`/:meth:`Request.Test`
additionally re-raise the helper's exception on the caller's thread, and
block on a sleeping event rather than in MPI's busy-polling wait, which
would steal the core the helper needs.  Without ``MPI_THREAD_MULTIPLE`` (and
for the fallbacks) the nonblocking calls are the wrapped communicator's
native ones.  ``Ireduce_scatter`` without counts first gathers every rank's
receive count, blocking, as mpi4py does.
"""

import atexit
import logging
import queue
import sys
import threading
import time

from mpi4py import MPI

from ..runtime import settings as _settings
from ..runtime.context import Key, duplicate, get_context, live_contexts
from .. import timeline as _timeline

__all__ = ["Request"]

logger = logging.getLogger("pycollective")


def thread_multiple():
    """Whether MPI runs threads freely (the helper thread needs it)."""
    return MPI.Query_thread() >= MPI.THREAD_MULTIPLE


class Job:
    """One queued collective (``fn(comm)``) and its completion state."""

    __slots__ = ("fn", "keep", "event", "error", "reported", "greq")

    def __init__(self, fn, keep):
        self.fn = fn
        self.keep = keep  # the caller's buffers (and DLPack capsules) stay alive until completion
        self.event = threading.Event()
        self.error = None
        self.reported = False
        self.greq = None


def _query(status, job):
    # Called by MPI when a Wait/Test completes the generalized request.
    status.Set_source(MPI.ANY_SOURCE)
    status.Set_tag(MPI.ANY_TAG)
    status.Set_cancelled(False)
    status.Set_elements(MPI.BYTE, 0)
    if job.error is not None and not job.reported:
        # Completed by MPI's own Waitall/Testall: report through MPI's error.
        job.reported = True
        logger.error("pycollective nonblocking collective failed: %s: %s",
                     type(job.error).__name__, job.error)
        raise MPI.Exception(MPI.ERR_OTHER)


def _free(job):
    job.keep = None


def _cancel(completed, job):
    pass  # a started collective cannot be cancelled; MPI then completes it normally


class _Engine:
    """Helper thread running queued collectives on a private communicator, in order."""

    def __init__(self, comm):
        # Collective (all ranks reach their first nonblocking call on comm in the
        # same order); done on the caller's thread so no MPI object is created racily.
        # ``comm`` is the context's private communicator; the helper gets its
        # own duplicate of it, so its messages never meet blocking calls'.
        self.comm = duplicate(comm, "the helper of nonblocking collectives",
                              "every rank's first nonblocking collective on this communicator")
        get_context(self.comm)
        self.queue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="pycollective-nonblocking",
                                       daemon=True)
        self.thread.start()

    def request(self, job):
        if job.greq is None:
            job.greq = MPI.Grequest.Start(_query, _free, _cancel, args=(job,))
        request = Request(job.greq)
        request._job = job
        return request

    def submit(self, job):
        request = self.request(job)
        if _timeline.ACTIVE is not None:  # timeline hook: when the caller handed it over
            _timeline.ACTIVE.instant("nonblocking call queued", waiting=self.queue.qsize())
        self.queue.put(job)
        return request

    def run(self, job):
        """Run ``job`` on the calling thread and complete it."""
        if job.greq is None:
            job.greq = MPI.Grequest.Start(_query, _free, _cancel, args=(job,))
        # The closure holds the caller's buffers: let them go once it has run
        # (the request may outlive the call, and nothing else needs them).
        fn, job.fn = job.fn, None
        try:
            fn(self.comm)
        except BaseException as exc:  # noqa: BLE001  (re-raised by Wait)
            job.error = exc
        del fn
        job.greq.Complete()
        job.event.set()

    def _run(self):
        while True:
            job = self.queue.get()
            if job is None:
                return
            self.run(job)
            # Not kept while the thread waits for the next one (its buffers
            # would stay alive until then).
            del job

    def stop(self, limit=None):
        """Let the queued collectives finish, then stop the thread; True if it stopped."""
        if self.thread.is_alive():
            self.queue.put(None)
            self.thread.join(limit)
        return not self.thread.is_alive()

    def free(self):
        self.stop()
        if self.comm != MPI.COMM_NULL:
            self.comm.Free()
            self.comm = MPI.COMM_NULL


_ENGINE = Key("comm.engine")
_engine_lock = threading.Lock()


@atexit.register
def _drain_at_exit():
    # Registered after the contexts' exit hook, so it runs before it: the
    # helpers finish what was queued (the other ranks are exiting too and run
    # the same reductions) and stop before any communicator is freed.  A
    # helper still inside MPI when MPI_Finalize runs would crash the process.
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return
    limit = _settings.timeout()
    for ctx in live_contexts():
        engine = ctx.peek(_ENGINE)
        if engine is not None and not engine.stop(limit):
            sys.stderr.write(f"pycollective: rank {MPI.COMM_WORLD.Get_rank()}: a nonblocking "
                             f"collective on "
                             f"{ctx.label} did not finish within {limit} s at exit; "
                             "aborting the job\n")
            sys.stderr.flush()
            MPI.COMM_WORLD.Abort(1)


def engine_for(comm):
    """The helper of ``comm``'s context; collective on its first use (it Dups)."""
    ctx = get_context(MPI.Intracomm(comm))
    with _engine_lock:
        return ctx.cached(_ENGINE, lambda ctx: _Engine(ctx.comm))


class Request(MPI.Request):
    """Request of a pycollective nonblocking collective (an MPI generalized request).

    Works with ``MPI.Request.Waitall``/``Testall`` like any request (a failed
    reduction then raises ``MPI.Exception``); its own :meth:`Wait` and
    :meth:`Test`, and :meth:`Request.Waitall`, re-raise the original Python
    exception and sleep instead of polling while the helper thread works.
    """

    def __new__(cls, request=None):
        self = MPI.Request.__new__(cls, request)
        self._job = None
        return self

    def _finish(self, status):
        job, self._job = self._job, None
        job.reported = True
        MPI.Request.Wait(self, status)  # already complete: frees the request
        if job.error is not None:
            raise job.error

    def Wait(self, status=None):
        """Block until the collective is done; raises its error, if any.

        Returns:
            True, as ``MPI.Request.Wait``.
        """
        job = self._job
        if job is None:
            return MPI.Request.Wait(self, status)
        job.event.wait()
        self._finish(status)
        return True

    def Test(self, status=None):
        """Return True (and complete the request) if the collective is done."""
        job = self._job
        if job is None:
            return MPI.Request.Test(self, status)
        if not job.event.is_set():
            # Hand the GIL to the helper thread: a caller polling Test() in a
            # tight Python loop would otherwise hold it for whole switch
            # intervals (5 ms) while the helper waits to run its next step.
            time.sleep(0)
            return False
        self._finish(status)
        return True

    def wait(self, status=None):
        """As :meth:`Wait`; returns None (no message object), like mpi4py's ``wait``."""
        self.Wait(status)

    def test(self, status=None):
        """As :meth:`Test`; returns ``(flag, None)`` like mpi4py's ``test``."""
        return self.Test(status), None

    @classmethod
    def Waitall(cls, requests, statuses=None):
        """Wait for every request in ``requests`` (pycollective or native), in order.

        Raises:
            The first error of a pycollective request, after all have completed.
        """
        first = None
        for i, request in enumerate(requests):
            status = statuses[i] if statuses is not None else None
            try:
                if isinstance(request, Request):
                    request.Wait(status)
                else:
                    MPI.Request.Wait(request, status)
            except Exception as exc:  # noqa: BLE001  (finish the others first)
                if first is None:
                    first = exc
        if first is not None:
            raise first
        return True
