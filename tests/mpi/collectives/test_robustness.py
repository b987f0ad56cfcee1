"""Inputs that used to give different bits on different ranks, or wrong data."""

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from _data import Replicas, bitwise_equal, exact_reduce, exact_values

ALGORITHMS = pycollective.algorithms()
BITS = {"float16": np.uint16, "float32": np.uint32, "float64": np.uint64}


def _nan_data(rank, count, dtype):
    """Finite values, with NaNs of both signs and several payloads where ranks meet."""
    x = exact_values(rank, count, dtype, "sum")
    bits = x.view(BITS[dtype])
    kind = np.dtype(BITS[dtype])
    top = 1 << (8 * kind.itemsize - 1)
    mant = {2: 10, 4: 23, 8: 52}[kind.itemsize]
    expo = ((1 << (8 * kind.itemsize - 1 - mant)) - 1) << mant
    # every third element: a NaN on every rank, with a payload and a sign
    # that depend on the rank (and on some ranks only, a number)
    i = np.arange(0, count, 3)
    if rank % 2:
        i = i[i % 9 != 6]
    payload = (1 + (rank * 7 + i) % ((1 << mant) - 1)).astype(kind)
    sign = np.where((i // 3 + rank) % 2 == 1, kind.type(top), kind.type(0))
    bits[i] = sign | kind.type(expo) | payload
    return x


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_nan_results_are_bitwise_identical_on_every_rank(layouts, algorithm, dtype):
    failures = []
    for label, comm in layouts:
        n, r = comm.Get_size(), comm.Get_rank()
        replicas = Replicas()
        for op in ("sum", "prod", "max", "min"):
            for count in (1, n + 1, 1001, 70_001):
                x = _nan_data(r, count, dtype)
                out = pycollective.allreduce(x, np.empty_like(x), op, comm=comm,
                                             algorithm=algorithm)
                replicas.add(f"{label} N={n} {op} count={count}", out)
                if count > 1 and not np.isnan(out[0]) and n > 1 and op in ("sum", "prod"):
                    failures.append(f"{label} N={n} {op}: a NaN input gave a number")
        failures += [f"{where}: replicas differ" for where in replicas.differ(comm)]
    assert not failures, failures[:5]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_ndarray_subclasses_are_reduced_as_plain_arrays(algorithm):
    comm = MPI.COMM_WORLD
    n, r = comm.Get_size(), comm.Get_rank()
    count = 1000 + n
    x = exact_values(r, count, "float64", "sum")
    want = exact_reduce([exact_values(q, count, "float64", "sum") for q in range(n)],
                        "sum", "float64")
    send = np.asmatrix(x)                       # shape (1, count), a 2-D subclass
    recv = np.asmatrix(np.empty_like(x))
    assert pycollective.allreduce(send, recv, comm=comm, algorithm=algorithm) is recv
    assert bitwise_equal(np.asarray(recv).reshape(-1), want)
    inplace = np.asmatrix(x.copy())
    pycollective.allreduce(MPI.IN_PLACE, inplace, comm=comm, algorithm=algorithm)
    assert bitwise_equal(np.asarray(inplace).reshape(-1), want)
    assert bitwise_equal(np.asarray(send).reshape(-1), x)  # the send buffer is untouched


@pytest.mark.mpi(min_size=2)
def test_masked_arrays_are_refused_on_every_rank():
    comm = MPI.COMM_WORLD
    x = np.ma.masked_array(np.arange(10.0), mask=[0, 1] * 5)
    with pytest.raises(TypeError, match="masked array"):
        pycollective.allreduce(x, np.empty(10), comm=comm)
