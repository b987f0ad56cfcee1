"""The end of a private communicator: no message of it may outlive it.

A context's private communicator carries, besides the algorithms' messages
(each received inside its call), the side channel's notices (``watch.py``),
which a rank sends without waiting and a peer reads only while it waits.  A
notice nobody read is still on its way when the communicator is freed, and
MPI gives the freed context id to a later communicator: Open MPI keeps a
message for a context id it does not know and delivers it to the next
communicator that gets the id -- a sub-communicator of fewer ranks aborts the
job ("PML OB1 received a message from a rank outside the valid range"), one of
as many ranks can match it in a collective (MPI_ERR_TRUNCATE, or wrong data).

So a private communicator is not freed at once.  :func:`close` sends every
peer a last, empty message (``TAG_CLOSE``) and parks the communicator; it is
freed once every peer's last message is in -- receiving, in order, whatever
that peer sent before it (MPI does not let a later message from one sender
overtake an earlier one that the same receive matches) -- and this rank's own
sends are done.  Nothing here waits: :func:`reap` polls the parked
communicators (on every close and every new context) and frees the finished
ones.  A peer that never closes (dead, or broken away) leaves its communicator
unfreed, so its id is not reused while the job runs.  At exit :func:`release`
frees them all at once: no communicator is made after it, so nothing can land
on a reused id, and the peers still running have this rank's last messages.
"""

import threading
import time

from mpi4py import MPI

from .registry import reserve_tags

__all__ = ["close", "reap", "release", "parked", "TAG_CLOSE"]

TAG_CLOSE, = reserve_tags("closing a private communicator (runtime/closing.py)", (251,))


class _Parked:
    __slots__ = ("comm", "waiting", "sends")

    def __init__(self, comm, waiting, sends):
        self.comm = comm
        self.waiting = waiting    # peers whose last message has not come
        self.sends = sends        # this rank's last messages and notices still pending

    def poll(self):
        """Receive what arrived from the peers still closing; True once it can be freed."""
        comm, status = self.comm, MPI.Status()
        for q in list(self.waiting):
            while True:
                msg = comm.Improbe(q, MPI.ANY_TAG, status)
                if msg is None:
                    break
                tag = status.Get_tag()
                msg.Recv([bytearray(max(1, status.Get_count(MPI.BYTE))), MPI.BYTE])
                if tag == TAG_CLOSE:
                    self.waiting.discard(q)
                    break
        return not self.waiting and MPI.Request.Testall(self.sends)


_PARKED = []   # waiting for peers' last messages
_LOST = []     # MPI failed on them (a peer died): never freed while the job runs
_lock = threading.Lock()


def close(comm, pending=()):
    """Free ``comm`` (a private communicator) once no message of it is in flight.

    Every rank of ``comm`` calls this, from its context's ``free``.

    Args:
        comm: the communicator; the caller lets go of it.
        pending: this rank's side-channel sends not yet completed.
    """
    rank = comm.Get_rank()
    peers = {q for q in range(comm.Get_size()) if q != rank}
    empty = bytearray(1)
    rec = _Parked(comm, peers, list(pending))
    try:
        rec.sends += [comm.Isend([empty, 0, MPI.BYTE], q, TAG_CLOSE) for q in peers]
    except MPI.Exception:
        with _lock:
            _LOST.append(rec)
        return
    with _lock:
        _PARKED.append(rec)
    reap()


def reap(wait=0.0):
    """Free the parked communicators whose peers have all closed.

    Args:
        wait: seconds to keep polling while some are left (tests).

    Returns:
        How many are still parked.
    """
    deadline = time.monotonic() + wait
    while True:
        done = []
        with _lock:
            for rec in list(_PARKED):
                try:
                    if rec.poll():
                        done.append(rec)
                        _PARKED.remove(rec)
                except MPI.Exception:
                    _PARKED.remove(rec)
                    _LOST.append(rec)
            left = len(_PARKED)
        for rec in done:  # outside the lock: a communicator's delete callbacks may close others
            rec.comm.Free()
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(1e-3)


def release():
    """Free every parked communicator now, finished or not (at exit, before MPI_Finalize).

    Waiting there for a peer's last message would hold a job whose other rank
    raised, or waits in a call, until MPI_Abort or the launcher's limit.
    """
    with _lock:
        left, _PARKED[:], _LOST[:] = _PARKED + _LOST, [], []
    for rec in left:
        try:
            rec.poll()
            for req in rec.sends:
                if not req.Test():
                    req.Cancel()
            rec.comm.Free()
        except MPI.Exception:
            pass  # a peer died: MPI_Finalize is what is left to do


def parked():
    """How many private communicators are parked (tests)."""
    with _lock:
        return len(_PARKED)
