"""Bad arguments raise a clear error on every rank, before any message.

After each failing call the private communicator must have no message in
flight (nothing was sent), and a correct call must still work.
"""

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective.runtime import watch as _watch
from pycollective.runtime.context import get_context
from _data import exact_reduce, exact_values

WORLD = MPI.COMM_WORLD


def _nothing_in_flight(comm):
    """No data message left by a call that raised.

    Side-channel notices are allowed (with the agreement off, a rank with a
    bad argument tells the others, who may be waiting in the algorithm);
    they are read and dropped here, as a later stalled call would.
    """
    comm.Barrier()
    private, status = get_context(comm).comm, MPI.Status()
    data = []
    while private.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status):
        if status.Get_tag() != _watch.TAG_NOTICE:
            data.append(status.Get_tag())
            break
        private.recv(source=status.Get_source(), tag=_watch.TAG_NOTICE)
    comm.Barrier()
    assert not data, f"a message (tag {data}) was sent by a call that raised"


def _still_works(comm):
    r, n = comm.Get_rank(), comm.Get_size()
    x = exact_values(r, 257, "int64", "sum")
    out = pycollective.allreduce(x, np.empty_like(x), comm=comm)
    assert np.array_equal(out, exact_reduce([exact_values(q, 257, "int64", "sum")
                                             for q in range(n)], "sum", "int64"))


def _expect(exc, match, call):
    with pytest.raises(exc, match=match):
        call()
    _nothing_in_flight(WORLD)
    _still_works(WORLD)


GOOD = np.arange(10, dtype=np.float32)

BAD_ON_ALL_RANKS = [
    ("unknown algorithm", ValueError, "unknown algorithm 'nope'",
     lambda: pycollective.allreduce(GOOD, np.empty(10, np.float32), algorithm="nope")),
    ("unknown op object", ValueError, "unsupported op",
     lambda: pycollective.allreduce(GOOD, np.empty(10, np.float32), MPI.LAND)),
    ("unknown op name", ValueError, "unsupported op",
     lambda: pycollective.allreduce(GOOD, np.empty(10, np.float32), "xor")),
    ("dtype mismatch", TypeError, "dtype float64 differs",
     lambda: pycollective.allreduce(GOOD, np.empty(10, np.float64))),
    ("size mismatch", ValueError, "recvbuf has 11 elements but sendbuf has 10",
     lambda: pycollective.allreduce(GOOD, np.empty(11, np.float32))),
    ("unsupported dtype", TypeError, "unsupported dtype complex64",
     lambda: pycollective.allreduce(np.zeros(4, np.complex64), np.zeros(4, np.complex64))),
    ("bool dtype", TypeError, "unsupported dtype bool",
     lambda: pycollective.allreduce(np.zeros(4, bool), np.zeros(4, bool))),
    ("non-contiguous send", ValueError, "sendbuf is not contiguous",
     lambda: pycollective.allreduce(np.arange(20.0)[::2], np.empty(10))),
    ("non-contiguous recv", ValueError, "recvbuf is not contiguous",
     lambda: pycollective.allreduce(np.arange(10.0), np.empty(20)[::2])),
    ("read-only recv", ValueError, "recvbuf is read-only",
     lambda: pycollective.allreduce(GOOD, np.frombuffer(bytes(40), np.float32))),
    ("list buffer", TypeError, "sendbuf must be a numpy array",
     lambda: pycollective.allreduce([1.0, 2.0], np.empty(2))),
    ("partial overlap", ValueError, "partially overlap",
     lambda: (lambda a: pycollective.allreduce(a[:10], a[5:15]))(np.zeros(20))),
    ("not a communicator", TypeError, "intracommunicator",
     lambda: pycollective.allreduce(GOOD, np.empty(10, np.float32), comm="world")),
]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("check", [True, False], ids=["agreement", "no-agreement"])
@pytest.mark.parametrize("case", BAD_ON_ALL_RANKS, ids=[c[0] for c in BAD_ON_ALL_RANKS])
def test_bad_argument_on_every_rank(case, check):
    _, exc, match, call = case
    previous = pycollective.set_check(check)
    try:
        _expect(exc, match, call)
    finally:
        pycollective.set_check(previous)


@pytest.mark.mpi(min_size=2)
def test_bad_argument_on_one_rank_raises_everywhere():
    r = WORLD.Get_rank()
    bad_rank = WORLD.Get_size() - 1
    recv = np.empty(10, np.float64 if r == bad_rank else np.float32)
    if r == bad_rank:
        match = "dtype float64 differs"
    else:
        match = f"invalid arguments on rank {bad_rank}: recvbuf dtype float64 differs"
    _expect(TypeError, match, lambda: pycollective.allreduce(GOOD, recv))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("what", ["count", "dtype", "op", "algorithm"])
def test_ranks_that_disagree_raise_everywhere(what):
    r = WORLD.Get_rank()
    count = 10 + (r if what == "count" else 0)
    dtype = np.float64 if (what == "dtype" and r == 0) else np.float32
    op = MPI.MAX if (what == "op" and r == 1) else MPI.SUM
    algorithm = "tree" if (what == "algorithm" and r == 0) else "ring"
    send = np.arange(count, dtype=dtype)
    _expect(ValueError, f"ranks disagree on {what}",
            lambda: pycollective.allreduce(send, np.empty_like(send), op, algorithm=algorithm))


@pytest.mark.mpi(min_size=2)
def test_errors_on_sub_communicators(layouts):
    for label, comm in layouts:
        with pytest.raises(ValueError, match="unknown algorithm"):
            pycollective.allreduce(GOOD, np.empty(10, np.float32), comm=comm, algorithm="x")
        _nothing_in_flight(comm)
        _still_works(comm)


@pytest.mark.mpi(min_size=2)
def test_messages_nobody_took_do_not_outlive_the_communicator():
    """A side-channel notice of a failed call that a rank never read is received
    when the communicator is freed: a later communicator (MPICH reuses context
    ids) must not find it."""
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    found = []
    for _ in range(3):
        comm = world.Dup()
        private = get_context(comm).comm
        if rank == 0:
            for q in range(1, size):
                private.send(("stale notice", q), dest=q, tag=_watch.TAG_NOTICE)
        world.Barrier()
        if rank:  # wait until it is here, and do not take it
            while not private.Iprobe(0, _watch.TAG_NOTICE):
                pass
        world.Barrier()
        comm.Free()
        later = world.Dup()
        for c in (later, get_context(later).comm):
            found.append(bool(c.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)))
        world.Barrier()
        later.Free()
    assert not any(found), found
