"""The public collectives (pycollective.collectives.api) on one rank: COMM_SELF and a one-rank world."""

import numpy as np
import pytest
from mpi4py import MPI

import pycollective

SELF = MPI.COMM_SELF


@pytest.mark.parametrize("algorithm", pycollective.algorithms())
@pytest.mark.parametrize("count", [0, 1, 17])
def test_one_rank_copies(algorithm, count):
    x = np.arange(count, dtype=np.int32) * 3 - 5
    keep = x.copy()
    out = np.full(count, 9, np.int32)
    assert pycollective.allreduce(x, out, MPI.PROD, comm=SELF, algorithm=algorithm) is out
    assert np.array_equal(out, keep) and np.array_equal(x, keep)
    inplace = keep.copy()
    pycollective.allreduce(MPI.IN_PLACE, inplace, "max", comm=SELF, algorithm=algorithm)
    assert np.array_equal(inplace, keep)


def test_default_comm_is_world():
    x = np.arange(5.0)
    out = pycollective.allreduce(x, np.empty(5))
    assert np.array_equal(out, x * MPI.COMM_WORLD.Get_size())


@pytest.mark.parametrize("call, exc, match", [
    (lambda: pycollective.allreduce(np.zeros(3), np.zeros(4), comm=SELF), ValueError, "4 elements"),
    (lambda: pycollective.allreduce(np.zeros(3), np.zeros(3, np.float32), comm=SELF), TypeError, "dtype"),
    (lambda: pycollective.allreduce(np.zeros(3), np.zeros(3), comm=SELF, algorithm="x"), ValueError, "unknown"),
    (lambda: pycollective.allreduce(np.zeros(3), np.zeros(3), MPI.BAND, comm=SELF), ValueError, "op"),
    (lambda: pycollective.allreduce(np.zeros(6)[::2], np.zeros(3), comm=SELF), ValueError, "contiguous"),
    (lambda: pycollective.allreduce(np.zeros(3), np.zeros(3), comm=MPI.Intracomm()), ValueError, "COMM_NULL"),
    (lambda: pycollective.allreduce(np.zeros(3), np.zeros(3), comm=MPI.COMM_NULL), TypeError, "intracommunicator"),
])
def test_errors_on_one_rank(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_reduce_scatter_and_allgather_on_one_rank():
    x = np.arange(7.0)
    out = np.empty(7)
    pycollective.reduce_scatter(x, out, comm=SELF)
    assert np.array_equal(out, x)
    full = np.empty(7)
    pycollective.allgather(x, full, comm=SELF)
    assert np.array_equal(full, x)


def test_set_check_returns_previous():
    previous = pycollective.set_check(False)
    try:
        assert pycollective.set_check(True) is False
    finally:
        pycollective.set_check(previous)
