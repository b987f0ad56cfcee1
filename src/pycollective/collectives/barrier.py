"""``barrier``: every rank waits until every rank of the communicator has called it.

On a communicator whose ranks share one node it is one sync of the node's
counters (:class:`~pycollective.node.barrier.FlagBarrier`), the first step of
a numbered call like any shared-memory collective's, in one compiled call
(:func:`~pycollective.node.barrier.opening_sync`): each rank publishes its
header (call number, fingerprint) and, in its counter's cache line, a hash of
both (the call word) before raising the counter; after the wait it compares
the call words, and the headers where they differ, so a rank that called
something else raises :class:`~pycollective.CollectiveMismatch` on every rank
instead of pairing with it.  Where every rank has a core the waiting ranks
poll with a ``pause`` and see the last rank's counter and word in one
cache-line transfer, so they leave within a fraction of a microsecond of each
other; an MPI library's barrier may let them out a microsecond apart
(``docs/results/barrier.md``), which a collective timed right after it then
carries.  Across nodes it is MPI's ``Ibarrier`` on the communicator's private
duplicate, waited for with the call's deadline.

Either way the wait is bounded by the call's timeout and watches the side
channel, as every wait of the library does.  No agreement step: a barrier
has no arguments, and the settings that must match travel in the fingerprint.
"""

from typing import NamedTuple, Optional

import numpy as np

from . import call as _call
from ..node.barrier import ARRIVED, WORDS_DIFFER
from ..node.group import NodeGroup, whole_node
from ..runtime import settings as _settings, threads as _threads, watch as _watch
from ..runtime.context import Context, Key, comm_settings, get_context
from .. import timeline as _timeline

__all__ = ["barrier"]

_KEY = Key("barrier")
_last = None  # (comm as passed, its context, _Prepared, the context's version then)


class _Prepared(NamedTuple):
    """What every barrier on a communicator repeats, made again when a setting changes."""

    epoch: int                  # the settings epoch it was resolved in
    timeout: object             # the call's timeout argument
    thread: int                 # the calling thread's pairing code
    settings: _settings.Settings
    fingerprint: tuple
    words: np.ndarray           # the fingerprint as header words
    tag_offset: int
    group: Optional[NodeGroup]  # None: the ranks span nodes


def barrier(comm=None, *, timeout=_call.DEFAULT) -> None:
    """Return once every rank of ``comm`` has entered ``barrier``.

    Args:
        comm: an mpi4py intracommunicator; ``None`` means ``MPI.COMM_WORLD``.
        timeout: longest wait, in seconds (None or 0: no limit); default as
            for :func:`~pycollective.allreduce`.

    Raises:
        TypeError, ValueError: ``comm`` is not an intracommunicator, or the
            timeout does not parse.
        CollectiveError: a rank did not arrive within the timeout
            (``CollectiveTimeout``, naming it), called another collective
            (``CollectiveMismatch``), or failed (``PeerFailed``); or the
            communicator is unusable since an earlier failure.
    """
    if _timeline.ACTIVE is not None and _timeline.ACTIVE.outside():  # timeline hook: the call
        return _timeline.ACTIVE.traced(barrier, "barrier", (comm,), dict(timeout=timeout))
    global _last
    last = _last
    fast = (last is not None and last[0] is comm and last[1].version == last[3]
            and _holds(last[2], timeout))
    if fast:
        # the barrier before on the same communicator object, nothing since replaced or
        # freed its state (the context's version): its context and prepared call, without
        # looking them up again (a third of a repeated barrier's time was that)
        ctx, p = last[1], last[2]
    else:
        given = comm
        comm = _call.resolve_comm(comm)
        if comm.Get_size() == 1:
            _settings.resolve(timeout)  # a timeout that does not parse raises on one rank too
            return
        ctx = get_context(comm)
        p = ctx.peek(_KEY)
        if p is None or not _holds(p, timeout):
            p = None
            settings = _settings.resolve(timeout,
                                         comm_settings(comm).get("timeout", _call.DEFAULT))
    _call.hold(ctx, "barrier", settings.timeout if p is None else p.settings.timeout)
    try:
        if p is None:  # with the communicator held: the node group's first use is collective
            p = ctx.put(_KEY, _prepare(ctx, settings, timeout))
        if not fast:
            _last = (given, ctx, p, ctx.version)
        number = ctx.next_call()
        if p.group is not None:
            # The fast way: no call record unless a rank is late or called something else.
            target, rows, verdict = p.group.opening_sync(number, p.words)
            if verdict == ARRIVED:
                return
            run, args = _node_finish, (p.group, target, rows, verdict)
        else:
            run, args = _ibarrier, ()
        call = _watch.begin(ctx, "barrier", p.fingerprint, p.settings, p.tag_offset, p.words,
                            number=number)
        try:
            _call.run_algorithm(call, run, ctx, *args)
        finally:
            _watch.end(call)
    finally:
        ctx.lock.release()


def _holds(p: _Prepared, timeout) -> bool:
    """Whether the prepared call ``p`` serves a barrier with ``timeout`` from this thread now."""
    return (p.epoch == _settings.epoch and p.thread == _threads.code()
            and (p.timeout is timeout or p.timeout == timeout))


def _prepare(ctx: Context, settings, timeout) -> _Prepared:
    fp = _watch.fingerprint("barrier", 0, -1, -1, -1, settings)
    return _Prepared(_settings.epoch, timeout, _threads.code(), settings, fp,
                     _watch.fingerprint_words(fp), _watch.tag_offset(fp, _call.tag_ub(ctx)),
                     whole_node(ctx))


def _node_finish(ctx, group, target, rows, verdict):
    """The opening sync in Python, with the call's deadline, where the compiled one stopped."""
    if verdict != WORDS_DIFFER:
        try:
            group.barrier.wait(target)  # a rank is late: wait on with the deadline
        except BaseException:
            group.barrier.withdraw(target)  # a rank arriving after this error must not pass
            raise
    group.check(_watch.current(), rows)  # raises where they differ, naming each rank's call


def _ibarrier(ctx):
    _watch.waitall([ctx.comm.Ibarrier()], waiting_for="every rank to reach the barrier")
