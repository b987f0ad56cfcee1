"""Clock offsets between ranks: each rank's ``perf_counter_ns`` against rank 0's.

Rank 0 and each other rank in turn exchange ``ROUNDS`` ping-pongs: the rank
notes its clock before sending (t0) and when the reply with rank 0's clock
(s) arrives (t1).  With the reply's way as long as the request's, rank 0
read its clock at the rank's (t0 + t1) / 2, so the offset is
``s - (t0 + t1) / 2``; the round with the shortest round trip bounds the
error best (at most half of it), and that half is stated in the file beside
the offset.  On one host every rank reads the same clock and the offsets
come out within the round trip of zero.

Every wait has a deadline: a rank that does not answer leaves its offset
unknown (None), and the writer says so instead of hanging.
"""

import time

import numpy as np
from mpi4py import MPI

ROUNDS = 8
TAG = 0x7E1  # on the recorder's own duplicate of COMM_WORLD: no user message can match

_now = time.perf_counter_ns


def wait(requests, deadline, poll=1e-5):
    """Whether ``requests`` completed before ``deadline`` (time.monotonic); if not, they are
    cancelled: a rank that does not answer never holds the others past their deadline."""
    while not MPI.Request.Testall(requests):
        if time.monotonic() > deadline:
            for request in requests:
                try:
                    request.Cancel()
                except MPI.Exception:
                    pass
            return False
        time.sleep(poll)
    return True


def measure(comm, limit_s=10.0):
    """This rank's ``(offset_ns, error_ns)``: add the offset to its times to get rank 0's
    clock; ``(0, 0)`` on rank 0 and ``None`` when rank 0 did not answer in time.  Collective
    over ``comm``."""
    deadline = time.monotonic() + limit_s
    rank, size = comm.Get_rank(), comm.Get_size()
    out = np.zeros(1, np.int64)
    if rank != 0:
        best = None
        for _ in range(ROUNDS):
            out[0] = 0
            t0 = _now()
            send = comm.Isend(out, 0, TAG)
            reply = np.zeros(1, np.int64)
            recv = comm.Irecv(reply, 0, TAG)
            if not wait([send, recv], deadline):
                return None
            t1 = _now()
            if best is None or t1 - t0 < best[1] - best[0]:
                best = (t0, t1, int(reply[0]))
        t0, t1, s = best
        return s - (t0 + t1) // 2, (t1 - t0) // 2
    ping = np.zeros(1, np.int64)
    for q in range(1, size):
        for _ in range(ROUNDS):
            if not wait([comm.Irecv(ping, q, TAG)], deadline):
                break  # that rank's offset stays unknown (None, on its side)
            out[0] = _now()
            if not wait([comm.Isend(out, q, TAG)], deadline):
                break
    return 0, 0
