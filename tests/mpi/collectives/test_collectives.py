"""reduce_scatter and allgather: the two ring halves as collectives of their own."""

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from _data import (MPI_OPS, bitwise_equal, counts_for, exact_reduce, exact_values)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", ["float32", "int64", "float16"])
def test_reduce_scatter(layouts, dtype):
    failures = []
    for label, comm in layouts:
        n, r = comm.Get_size(), comm.Get_rank()
        for op in ("sum", "prod", "max", "min"):
            for count in counts_for(n):
                everyone = [exact_values(q, count, dtype, op) for q in range(n)]
                expected = exact_reduce(everyone, op, dtype)
                offset, length = pycollective.partition(count, n, r)
                send = everyone[r]
                original = send.copy()
                out = np.full(length, 7, dtype)
                pycollective.reduce_scatter(send, out, MPI_OPS[op], comm=comm)
                where = f"{label} N={n} {op} count={count}"
                if not bitwise_equal(out, expected[offset:offset + length]):
                    failures.append(f"{where}: wrong chunk")
                if not bitwise_equal(send, original):
                    failures.append(f"{where}: sendbuf modified")
                inplace = send.copy()
                pycollective.reduce_scatter(MPI.IN_PLACE, inplace, op, comm=comm)
                if not bitwise_equal(inplace[offset:offset + length],
                                     expected[offset:offset + length]):
                    failures.append(f"{where}: wrong chunk in place")
                rest = np.ones(count, bool)
                rest[offset:offset + length] = False
                if not bitwise_equal(inplace[rest], original[rest]):
                    failures.append(f"{where}: in place changed other chunks")
    assert not failures, f"{len(failures)} failures: " + "; ".join(failures[:5])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", ["float64", "int32", "uint8"])
def test_allgather(layouts, dtype):
    failures = []
    for label, comm in layouts:
        n, r = comm.Get_size(), comm.Get_rank()
        for count in counts_for(n):
            full = exact_values(1000, count, dtype, "sum")  # the same vector on every rank
            offset, length = pycollective.partition(count, n, r)
            mine = full[offset:offset + length].copy()
            out = np.full(count, 3, dtype)
            pycollective.allgather(mine, out, comm=comm)
            if not bitwise_equal(out, full):
                failures.append(f"{label} N={n} count={count}")
            inplace = np.full(count, 3, dtype)
            inplace[offset:offset + length] = mine
            pycollective.allgather(MPI.IN_PLACE, inplace, comm=comm)
            if not bitwise_equal(inplace, full):
                failures.append(f"{label} N={n} count={count} in place")
    assert not failures, f"{len(failures)} failures: " + "; ".join(failures[:5])


@pytest.mark.mpi(min_size=2)
def test_reduce_scatter_then_allgather_is_allreduce():
    comm = MPI.COMM_WORLD
    n, r = comm.Get_size(), comm.Get_rank()
    count = 10007
    everyone = [exact_values(q, count, "int32", "sum") for q in range(n)]
    offset, length = pycollective.partition(count, n, r)
    chunk = np.empty(length, np.int32)
    pycollective.reduce_scatter(everyone[r], chunk, comm=comm)
    full = np.empty(count, np.int32)
    pycollective.allgather(chunk, full, comm=comm)
    assert np.array_equal(full, exact_reduce(everyone, "sum", "int32"))


@pytest.mark.mpi(min_size=2)
def test_chunk_size_errors_on_every_rank():
    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    with pytest.raises(ValueError, match="chunk"):
        pycollective.reduce_scatter(np.zeros(10 * n), np.zeros(10 * n), comm=comm)
    with pytest.raises(ValueError, match="chunk"):
        pycollective.allgather(np.zeros(3), np.zeros(10 * n), comm=comm)
