"""``shm`` above DOUBLE_LIMIT per rank: the slots or the single copy, chosen by timing both where
every rank has a core (``shm.ways.Way``), agreed by every rank.

* each call of a size right, bit for bit, while its first calls try both ways and after
  the ranks settle on one; every rank takes the same way from then on;
* where the ranks outnumber their cores (CI's 4 and 8 ranks on 2 cores) no call below
  ``SINGLE_COPY_BYTES`` takes the single copy;
* the two ways give the same bits on rounding data, NaN included.
"""

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective.runtime.context import get_context
from pycollective.algorithms.shm import allreduce as shm, ways as _ways
from _data import bitwise_equal, check_allreduce, random_values

COUNT = 1_100_007  # float32: 4.4 MB per rank, above DOUBLE_LIMIT, below SINGLE_COPY_BYTES
LARGER = 1_800_001  # 7.2 MB: more blocks of the single copy, still below SINGLE_COPY_BYTES


def _ways_taken(monkeypatch):
    """The way (0: slots, 1: single copy) of each of this rank's shm calls above DOUBLE_LIMIT."""
    taken = []
    slots, single = shm.shm_allreduce_on, shm.cma_allreduce_on
    monkeypatch.setattr(shm, "shm_allreduce_on",
                        lambda *a, **k: taken.append(0) or slots(*a, **k))
    monkeypatch.setattr(shm, "cma_allreduce_on",
                        lambda *a, **k: taken.append(1) or single(*a, **k))
    return taken


@pytest.mark.mpi(min_size=2)
def test_a_sizes_calls_try_both_ways_then_every_rank_takes_the_same(monkeypatch):
    comm = MPI.COMM_WORLD.Dup()
    failures = []
    try:
        taken = _ways_taken(monkeypatch)
        for i in range(8):  # two calls each (out of place, in place): 16 calls of the size
            check_allreduce(comm, "shm", "float32", "sum", COUNT, failures, f"call {i}",
                            shift=i)
        assert not failures, f"{len(failures)} failures: " + "; ".join(failures[:5])
        assert len(taken) == 16, taken
        assert comm.allgather(taken) == [taken] * comm.Get_size()  # the same on every rank
        state = shm._state(get_context(comm))
        if state.cross is None:
            assert taken == [0] * 16
            pytest.skip("cross-memory reads are not allowed here: one way only")
        way = state.ways[COUNT * 4]
        if state.node.group.barrier.wakes:  # ranks outnumber cores: by size, no trials
            assert taken == [0] * 16 and way.decided == 0, (taken, way.decided)
            return
        last = way.LAST_TRIAL
        assert taken[:2] == [0, 1]  # the size's fixed way (slots below 8 MiB), then the other
        assert sorted(taken[2:last]) == [0] * way.TRIALS + [1] * way.TRIALS
        assert way.decided in (0, 1) and taken[last:] == [way.decided] * (16 - last), taken
    finally:
        comm.Free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("count", [COUNT, LARGER])
def test_both_ways_give_the_same_bits(monkeypatch, count):
    """Rounding float32 data with NaNs: the slots' result and the single copy's, bit for
    bit the same on every rank."""
    comm = MPI.COMM_WORLD.Dup()
    try:
        pycollective.allreduce(np.zeros(1, np.float32), np.empty(1, np.float32), comm=comm,
                               algorithm="shm")
        state = shm._state(get_context(comm))
        if state.cross is None:
            pytest.skip("cross-memory reads are not allowed here: one way only")
        x = random_values(comm.Get_rank(), count, "float32", "sum", seed=3)
        x[::9973] = np.nan
        results = []
        for way in (_ways.SLOTS, _ways.SINGLE, _ways.SLOTS):
            monkeypatch.setattr(_ways, "FORCE_WAY", way)
            out = np.empty_like(x)
            pycollective.allreduce(x, out, comm=comm, algorithm="shm")
            results.append(out)
        monkeypatch.setattr(_ways, "FORCE_WAY", None)
        assert bitwise_equal(results[0], results[1]) and bitwise_equal(results[0], results[2])
        everyone = comm.allgather(results[1].tobytes())
        assert everyone == [everyone[0]] * comm.Get_size()
        assert np.isnan(results[1][::9973]).all()
    finally:
        comm.Free()
