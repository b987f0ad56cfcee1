"""Shared-memory primitives (pycollective.node.group) on several ranks."""

import os
import time

import numpy as np
import pytest
from mpi4py import MPI

from pycollective.node import cma as _cma
from pycollective.node.atomics import CAN_SLEEP
from pycollective.runtime.context import get_context
from pycollective._errors import ConfigurationError
from pycollective.node.group import NodeGroup, wait_modes, whole_node

WAITS = [False, True] if CAN_SLEEP else [False]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("sleep", WAITS)
def test_shared_memory_sync_keeps_mpi_progress(sleep):
    """A rank waiting in the flag barrier must keep driving MPI progress.

    Rank 1's synchronous send completes only when rank 0's progress engine
    matches it with the receive rank 0 posted; rank 0 makes no MPI call
    between posting it and entering the barrier, and rank 1 enters the
    barrier only after its send completed.  Without the Iprobe in
    FlagBarrier.sync this deadlocks (the launcher's timeout ends the job);
    the speed benchmark hung that way after a large ring_pipelined call.
    Sleeping waits must come back to it between their bounded sleeps.
    """
    world = MPI.COMM_WORLD
    r = world.Get_rank()
    comm = world.Split(0 if r < 2 else 1, r)
    p2p = comm.Dup()
    barrier = NodeGroup(comm, progress=p2p).barrier
    barrier.set_sleep(sleep)
    try:
        if r < 2:
            buf = np.zeros(4, np.int64)
            if r == 0:
                req = p2p.Irecv(buf, source=1, tag=5)
                barrier.sync()
                req.Wait()
                assert np.array_equal(buf, [1, 2, 3, 4])
            else:
                p2p.Issend(np.array([1, 2, 3, 4], np.int64), dest=0, tag=5).Wait()
                barrier.sync()
        else:
            barrier.sync()
    finally:
        p2p.Free()
        comm.Free()


@pytest.mark.mpi(min_size=2)
def test_sleeping_and_spinning_ranks_see_each_others_stores():
    """Even ranks sleep, odd ranks spin; every sync shows every rank's store of that round."""
    comm = MPI.COMM_WORLD
    group = NodeGroup(comm, progress=None)
    rank, size = group.rank, group.size
    group.barrier.set_sleep(rank % 2 == 0, wakes=True)
    # Two columns used alternately: a rank writes round i + 1 while a slow
    # rank still reads round i, but reaches round i + 2's column only after
    # every rank has passed the sync of round i + 1.
    board = group.ok[:, 1:3]
    for i in range(1, 401):
        if rank == i % size and i % 50 == 0:
            time.sleep(0.01)  # now and then a rank comes late: the others go to sleep
        board[rank, i & 1] = i
        group.barrier.sync()
        assert np.all(board[:, i & 1] == i), (i, board[:, i & 1])


@pytest.mark.mpi(min_size=2)
@pytest.mark.skipif(not CAN_SLEEP, reason="futex(2) waits are Linux-only")
def test_a_sleeping_wait_outlasts_its_sleeps():
    """A rank 0.3 s late: the others sleep many bounded sleeps and then pass together."""
    comm = MPI.COMM_WORLD
    group = NodeGroup(comm, progress=None)
    group.barrier.set_sleep(True)
    group.barrier.sync()
    t0 = time.monotonic()
    if group.rank == 0:
        time.sleep(0.3)
    group.barrier.sync()
    waited = time.monotonic() - t0
    assert waited > 0.25
    comm.Barrier()  # every rank is out of its wait: nobody is counted asleep any more
    assert all(int(group.barrier.words[q * 8 + 1]) == 0 for q in range(group.size))


@pytest.mark.mpi(min_size=2)
def test_the_wait_setting_is_checked_on_every_rank(monkeypatch):
    """A bad PYCOLLECTIVE_SHM_WAIT on one rank raises the same error on every rank."""
    comm = MPI.COMM_WORLD
    if comm.Get_rank() == 1:
        monkeypatch.setenv("PYCOLLECTIVE_SHM_WAIT", "nap")
    with pytest.raises(ConfigurationError, match=r"node rank 1: PYCOLLECTIVE_SHM_WAIT='nap'"):
        wait_modes(comm)
    monkeypatch.setenv("PYCOLLECTIVE_SHM_WAIT", "spin")
    assert wait_modes(comm) == (False, False)
    monkeypatch.setenv("PYCOLLECTIVE_SHM_WAIT", "sleep")
    assert wait_modes(comm) == (True, True)
    if comm.Get_rank() == 0:  # one rank sleeps: every rank's raises must wake it
        monkeypatch.setenv("PYCOLLECTIVE_SHM_WAIT", "spin")
    assert wait_modes(comm) == (comm.Get_rank() != 0, True)
    monkeypatch.setenv("PYCOLLECTIVE_SHM_WAIT", "auto")
    cpus = len(os.sched_getaffinity(0))
    if comm.Get_size() > os.cpu_count():
        assert wait_modes(comm) == (True, True)  # more ranks than the machine has CPUs
    elif comm.Get_size() <= cpus:
        assert wait_modes(comm) == (False, False)  # every rank may have a CPU of its own


@pytest.mark.mpi(min_size=2)
def test_cross_memory_reads_only_inside_what_a_peer_published():
    """shm's single copy reads the others' buffers by address (_cma.CrossMemory);
    a read outside what the owner published is refused before it reaches the kernel."""
    comm = MPI.COMM_WORLD.Dup()
    cross = None
    try:
        group = whole_node(get_context(comm))  # the same answer on every rank
        if group is None or not _cma.available():
            pytest.skip("no cross-memory attach here")
        cross = _cma.CrossMemory(group)
        if not cross.probe():
            pytest.skip("cross-memory attach is not permitted between these ranks")
        r, n = group.rank, group.size
        right = (r + 1) % n
        src = np.arange(8, dtype=np.int64) + 100 * r
        dst = np.zeros(8, np.int64)
        cross.publish(src, dst)
        group.sync()
        got = np.empty(3, np.int64)
        cross.read(right, cross.SRC, 2 * 8, got)
        refused = []
        for offset, out in ((6 * 8, got), (-8, got), (0, np.zeros(9, np.int64))):
            try:
                cross.read(right, cross.DST, offset, out)
            except ValueError as exc:
                refused.append("refusing" in str(exc))
        group.sync()  # nobody reads `src` any more
    finally:
        if cross is not None:
            cross.free()
        comm.Free()
    assert got.tolist() == [100 * right + 2, 100 * right + 3, 100 * right + 4]
    assert refused == [True, True, True]
