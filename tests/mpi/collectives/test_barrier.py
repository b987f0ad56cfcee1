"""pycollective.barrier and the drop-in's Barrier: nobody leaves early, mismatches raise.

A barrier that let a rank out before the last one entered would pass any
test that only checks it returns; here every rank arrives at a different
moment of one clock (the ranks share a machine: CLOCK_MONOTONIC) and each
must leave after the last arrival.  Barriers interleave with the
shared-memory allreduce's compiled calls, which number and check their calls
in the same node words, so a slip in the barrier's bookkeeping shows up as a
wrong sum or a mismatch there.
"""

import time

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective.collectives import barrier as _barrier
from pycollective.runtime.context import get_context
from _data import exact_reduce, exact_values

WORLD = MPI.COMM_WORLD


def _halves(comm):
    k = comm.Get_size() // 2 or 1
    return comm.Split(0 if comm.Get_rank() < k else 1, comm.Get_rank())


def _arrivals_then_leave(comm, wait):
    """Rank r arrives r * ``wait`` s late; returns (every arrival, every departure)."""
    rank = comm.Get_rank()
    WORLD.Barrier()
    time.sleep(rank * wait)
    arrived = time.monotonic()
    pycollective.barrier(comm)
    left = time.monotonic()
    return comm.allgather(arrived), comm.allgather(left)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("where", ["world", "halves", "across nodes"])
def test_no_rank_leaves_before_the_last_arrives(where, monkeypatch):
    comm = _halves(WORLD) if where == "halves" else WORLD.Dup()
    try:
        if where == "across nodes":  # the Ibarrier way, as where the ranks span nodes
            monkeypatch.setattr(_barrier, "whole_node", lambda ctx: None)
        for round_ in range(3):
            arrived, left = _arrivals_then_leave(comm, 0.02)
            assert min(left) >= max(arrived), (round_, arrived, left)
        if comm.Get_size() > 1:
            prepared = get_context(comm).peek(_barrier._KEY)
            assert (prepared.group is not None) == (where != "across nodes")
    finally:
        comm.Free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("count", [1, 1000, 10007, 300_000])
def test_barriers_between_allreduces_keep_every_sum_exact(count):
    """Many barriers mixed with repeated allreduces of the compiled shared-memory steps."""
    comm = WORLD.Dup()
    try:
        rank, n = comm.Get_rank(), comm.Get_size()
        x = exact_values(rank, count, "float32", "sum")
        want = exact_reduce([exact_values(q, count, "float32", "sum") for q in range(n)],
                            "sum", "float32")
        out = np.empty_like(x)
        for i in range(40):
            if i % 3 != 2:
                pycollective.barrier(comm)
            out.fill(np.nan)
            pycollective.allreduce(x, out, comm=comm, algorithm="shm")
            assert np.array_equal(out, want), i
            if i % 5 == 0:
                pycollective.barrier(comm, timeout=30)  # another timeout: prepared again
    finally:
        comm.Free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("check", [True, False])
def test_a_rank_in_another_collective_raises_on_every_rank(check):
    """Rank 0 in a barrier, the others in an allreduce: a mismatch everywhere, no pairing.

    Rank 0 compares the node's headers and names both calls.  With the agreement
    on, the others' allreduce finds a rank missing from its agreement step first;
    with it off, they compare the headers too and name the barrier.
    """
    comm = WORLD.Dup()
    previous = pycollective.set_check(check)
    try:
        pycollective.barrier(comm)
        x = np.ones(4, np.float32)
        named = "barrier" if comm.Get_rank() == 0 or not check else "agreement step"
        with pytest.raises(pycollective.CollectiveMismatch, match=named):
            if comm.Get_rank() == 0:
                pycollective.barrier(comm, timeout=20)
            else:
                pycollective.allreduce(x, np.empty_like(x), comm=comm, algorithm="shm",
                                       timeout=20)
        with pytest.raises(pycollective.CommunicatorBroken):
            pycollective.barrier(comm)
    finally:
        pycollective.set_check(previous)
        comm.Free()


@pytest.mark.mpi(min_size=2)
def test_the_drop_in_barrier_is_the_librarys():
    comm = pycollective.Comm(WORLD.Dup())
    try:
        for method in (comm.Barrier, comm.barrier):
            WORLD.Barrier()
            time.sleep(comm.Get_rank() * 0.02)
            arrived = time.monotonic()
            assert method() is None
            left = time.monotonic()
            assert min(comm.allgather(left)) >= max(comm.allgather(arrived))
        # numbered as the library's calls: the context counted both
        assert get_context(comm).calls >= 2
    finally:
        comm.Free()


@pytest.mark.mpi(min_size=2)
def test_a_repeated_barrier_takes_its_shortcut_only_while_it_holds(monkeypatch):
    """A barrier on the communicator object of the barrier before skips finding its
    context and prepared call; another communicator, another timeout argument, a freed
    communicator each go the whole way (and nobody leaves early on either way)."""
    a, b = WORLD.Dup(), WORLD.Dup()
    pycollective.barrier(a)
    real = _barrier.get_context

    def no_lookup(comm):
        raise AssertionError("the repeated barrier looked its context up")
    monkeypatch.setattr(_barrier, "get_context", no_lookup)
    arrived, left = _arrivals_then_leave(a, 0.02)  # the shortcut: no get_context
    assert min(left) >= max(arrived), (arrived, left)
    monkeypatch.setattr(_barrier, "get_context", real)
    for comm, timeout in ((b, _barrier._call.DEFAULT), (a, 30.0), (a, 30.0), (b, 30.0)):
        pycollective.barrier(comm, timeout=timeout)
        assert _barrier._last[0] is comm and _barrier._last[2].timeout == timeout
    arrived, left = _arrivals_then_leave(a, 0.02)
    assert min(left) >= max(arrived), (arrived, left)
    a.Free()
    with pytest.raises(ValueError, match="COMM_NULL"):
        pycollective.barrier(a)
    b.Free()


def test_one_rank_and_bad_arguments():
    pycollective.barrier(MPI.COMM_SELF)
    with pytest.raises(ValueError, match="timeout"):
        pycollective.barrier(MPI.COMM_SELF, timeout=-1)
    with pytest.raises(TypeError):
        pycollective.barrier("world")
