"""Point-to-point helpers shared by the algorithm modules: tags, bounded waits, checked sizes.

Tags: every algorithm declares the tags its messages use when it registers
(:func:`pycollective.runtime.registry.register` refuses a tag already taken; the
fold/unfold below reserve theirs here), so even a bug in one algorithm
cannot make its messages match another's.  Each call adds an offset to
those tags that encodes its collective, dtype, op and algorithm
(:func:`pycollective.runtime.watch.tag_offset`): ranks that disagree on them send
messages that can never match, so they stall and the side channel names who
called what, instead of reducing each other's bytes.

Waits: every wait is bounded and watches the side channel
(:func:`pycollective.runtime.watch.waitall`).

Sizes: a receive is checked to bring exactly the bytes it was posted for.
MPI accepts a shorter message into a larger buffer without complaint, so
ranks that disagree on the count would otherwise leave stale bytes in the
result; here they raise, and the side channel tells the others.

Data always travel as raw bytes (``MPI.BYTE``): the reduction happens in our
own kernels, so the MPI library never needs to know the element type, and
dtypes it has no datatype for (float16) move like any other.
"""

import threading

from mpi4py import MPI

from ..runtime import hosts as _hosts, watch as _watch
from .._errors import CollectiveMismatch
from ..runtime.registry import reserve_tags

BYTE = MPI.BYTE


def msg(arr):
    """mpi4py buffer spec for a contiguous array, sent as bytes."""
    return [arr, BYTE]


def tag(base):
    """The tag this call's messages with the algorithm's tag ``base`` carry."""
    call = _watch.current()
    return base + (call.tag_offset if call is not None else 0)


def _mismatch(text):
    call = _watch.current()
    if call is None:
        return CollectiveMismatch(text)
    return CollectiveMismatch(f"{call.title()}: {text} (seen on rank {call.ctx.rank})",
                              collective=call.what, call=call.number, comm=call.ctx.label)


def _check(status, nbytes, source):
    got = status.Get_count(BYTE)
    if got != nbytes:
        raise _mismatch(f"a message from rank {source} brought {got} bytes where {nbytes} "
                        "were expected: the ranks disagree on the count or the dtype")


def _waitall(requests, statuses, receives):
    """``runtime.watch.waitall``; a message longer than its buffer becomes a clear mismatch."""
    try:
        _watch.waitall(requests, statuses, waiting_for=_From(receives))
    except MPI.Exception as exc:
        for status, (nbytes, source) in zip(statuses or (), receives):
            if MPI.Get_error_class(status.Get_error()) == MPI.ERR_TRUNCATE:
                raise _mismatch(f"a message from rank {source} was longer than the {nbytes} "
                                "bytes expected: the ranks disagree on the count or the "
                                "dtype") from exc
        if exc.Get_error_class() == MPI.ERR_TRUNCATE:
            raise _mismatch("a message was longer than the buffer posted for it: the ranks "
                            "disagree on the count or the dtype") from exc
        raise


_statuses = threading.local()


def _status_list(n):
    """``n`` reusable MPI.Status objects of this thread."""
    pool = getattr(_statuses, "pool", None)
    if pool is None or len(pool) < n:
        pool = _statuses.pool = [MPI.Status() for _ in range(max(n, 8))]
    return pool[:n]


class _From:
    """What a wait is for, formatted only if a message needs it."""

    __slots__ = ("receives",)

    def __init__(self, receives):
        self.receives = receives

    def __str__(self):
        sources = sorted({s for _, s in self.receives})
        if not sources:
            return "sends to complete"
        return f"messages from rank{'s' if len(sources) > 1 else ''} {_hosts.call_ranks(sources)}"


def wait(requests, receives=()):
    """Wait (bounded) for ``requests``; check the sizes of the receives among them.

    Args:
        requests: MPI requests, the receives first.
        receives: ``(nbytes, source)`` of each receive, in order.

    Raises:
        CollectiveMismatch: a receive brought another number of bytes.
    """
    statuses = _status_list(len(requests)) if receives else None
    _waitall(requests, statuses, receives)
    for status, (nbytes, source) in zip(statuses or (), receives):
        _check(status, nbytes, source)


def irecv(comm, buf, source, base):
    """``(request, (nbytes, source))`` of a receive of ``buf`` as bytes."""
    return comm.Irecv(msg(buf), source, tag(base)), (buf.nbytes, source)


def isend(comm, buf, dest, base):
    return comm.Isend(msg(buf), dest, tag(base))


def sendrecv(comm, sbuf, dest, rbuf, source, base):
    """Send ``sbuf`` to ``dest`` while receiving exactly ``rbuf.nbytes`` from ``source``."""
    t = tag(base)
    requests = [comm.Irecv(msg(rbuf), source, t), comm.Isend(msg(sbuf), dest, t)]
    statuses = _status_list(2)
    _waitall(requests, statuses, ((rbuf.nbytes, source),))
    _check(statuses[0], rbuf.nbytes, source)


def send(comm, buf, dest, base):
    _waitall([comm.Isend(msg(buf), dest, tag(base))], None, ())


def recv(comm, buf, source, base):
    """Receive exactly ``buf.nbytes`` from ``source``."""
    statuses = _status_list(1)
    _waitall([comm.Irecv(msg(buf), source, tag(base))], statuses, ((buf.nbytes, source),))
    _check(statuses[0], buf.nbytes, source)


TAG_FOLD, TAG_UNFOLD = reserve_tags("fold/unfold (algorithms/_p2p.py)", (91, 92))


def fold_in(ctx, src, dst, kernel, slot):
    """Fold the ranks beyond the largest power of two ``p`` into the first ones.

    Rank ``r >= p`` sends its ``src`` to ``r - p`` and then waits for the
    final result from it (see :func:`unfold_out`): it returns ``(p, None)``
    with ``dst`` already complete.  Rank ``r < N - p`` receives that vector
    (into scratch ``slot``) and reduces it with its own into ``dst``:
    returns ``(p, dst)``.  Other ranks return ``(p, src)``.  The second value
    is the rank's partial vector for the power-of-two core.
    """
    comm, n, r = ctx.comm, ctx.size, ctx.rank
    p = 1 << (n.bit_length() - 1)
    if r >= p:
        send(comm, src, r - p, TAG_FOLD)
        recv(comm, dst, r - p, TAG_UNFOLD)
        return p, None
    if r < n - p:
        tmp = ctx.scratch(slot, dst.size, dst.dtype)
        recv(comm, tmp, r + p, TAG_FOLD)
        kernel(src, tmp, dst)
        return p, dst
    return p, src


def unfold_out(ctx, dst, p):
    """Send the finished ``dst`` back to the rank folded into this one, if any."""
    if ctx.rank < ctx.size - p:
        send(ctx.comm, dst, ctx.rank + p, TAG_UNFOLD)
