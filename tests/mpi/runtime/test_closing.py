"""A freed communicator's private duplicate is freed only once no message of it is in flight.

The side channel's notices are sent without waiting and read only by a rank
that waits; one still on its way when the duplicate was freed reached the
next communicator MPI gave the same context id (Open MPI aborted the job when
that one had fewer ranks).
"""

import time

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective.runtime import closing, watch
from pycollective.runtime.context import get_context


def _reap_all():
    """Parked duplicates left after waiting (at most 30 s) for the peers' last messages."""
    return closing.reap(wait=30.0)


@pytest.mark.mpi(min_size=2)
def test_a_notice_sent_after_a_peer_freed_is_received_before_the_duplicate_is_freed():
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    before = _reap_all()
    for round_ in range(4):
        dup = world.Dup()
        x = np.arange(5.0) + rank
        pycollective.allreduce(x, np.empty_like(x), comm=dup)
        ctx = get_context(dup)
        if rank == 0:
            dup.Free()  # rank 0 is done with it first ...
        world.Barrier()
        if rank != 0:
            # ... while the others were still waiting in a call: their roll
            # records go out to rank 0, which has freed its side already.
            watch._send_all(ctx, watch.Notice("here", rank, ctx.calls, ()))
            dup.Free()
        # Every rank's duplicate is freed once all have closed, rank 0's only
        # after it has taken the others' notices.
        assert _reap_all() == before, f"rank {rank}: a private duplicate is still parked"
        # Nothing of the freed duplicate reaches the communicators made next,
        # however MPI hands out context ids: smaller ones, and one as large.
        for comm in (world.Split(rank % 2, rank), world.Dup()):
            comm.Barrier()
            stray = comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
            value = comm.bcast(("round", round_), root=0)
            comm.Free()
            assert not stray, f"rank {rank}: a message of a freed communicator arrived"
            assert value == ("round", round_)


@pytest.mark.mpi(min_size=2)
def test_freed_duplicates_leave_nothing_parked_and_calls_go_on():
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    before = _reap_all()
    for _ in range(3):
        comms = {"world": world.Dup(), "parity": world.Split(rank % 2, rank)}
        want = {"world": sum(range(size)),
                "parity": sum(q for q in range(size) if q % 2 == rank % 2)}
        for name, comm in comms.items():
            x = np.full(7, float(rank))
            out = pycollective.allreduce(x, np.empty_like(x), comm=comm)
            assert np.all(out == want[name]), name
        for comm in comms.values():
            comm.Free()
    assert _reap_all() == before


def test_a_one_rank_duplicate_is_freed_at_once():
    before = closing.reap()
    closing.close(MPI.COMM_SELF.Dup())
    assert closing.parked() == before
