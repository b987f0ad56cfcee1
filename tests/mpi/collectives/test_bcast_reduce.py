"""bcast and reduce: every algorithm, every communicator size, several roots.

bcast: the root's per-index data must arrive bit for bit on every rank.
reduce: the root must hold the exact reduction (the data are exact in every
dtype), equal to native ``MPI_Reduce``'s, in and out of place; no rank's
input may change.  Roots 0 and N-1, so the trees are also rooted away
from rank 0.
"""

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective.runtime import settings as _settings
from _data import (MPI_OPS, bitwise_equal, counts_for, exact_reduce, exact_values,
                   replicas_identical)
from test_allgather import block

BCAST = pycollective.algorithms("bcast")
REDUCE = pycollective.algorithms("reduce")
# As in test_reduce_scatter.py: every op with float32, two with each other
# dtype; "auto" (one of the registered algorithms) with one dtype.
OPS_OF = {"float32": ["sum", "prod", "max", "min"], "int64": ["sum", "max"],
          "float16": ["prod", "min"]}
REDUCE_CASES = [(a, d) for a in REDUCE for d in OPS_OF] + [("auto", "float32")]
BCAST_CASES = [(a, d) for a in BCAST for d in ("float64", "int8", "complex64")] + \
    [("auto", "int8")]


def roots_of(n):
    """Rank 0 and the last rank: a tree rooted at 0, and one rooted elsewhere."""
    return sorted({0, n - 1})


def check_bcast(comm, algorithm, dtype, count, root, failures, where):
    r = comm.Get_rank()
    data = block(root + 17, count, dtype)
    buf = data.copy() if r == root else np.full(count, 5, dtype)
    assert pycollective.bcast(buf, root=root, comm=comm, algorithm=algorithm) is buf
    if not bitwise_equal(buf, data):
        failures.append(f"{where}: {int(np.count_nonzero(buf != data))} wrong")
    if not replicas_identical(comm, buf):
        failures.append(f"{where}: ranks hold different results")


def check_reduce(comm, algorithm, dtype, op, count, root, failures, where):
    n, r = comm.Get_size(), comm.Get_rank()
    everyone = [exact_values(q, count, dtype, op) for q in range(n)]
    expected = exact_reduce(everyone, op, dtype)
    send = everyone[r]
    original = send.copy()
    native = np.empty_like(send) if r == root else None
    comm.Reduce(send, native, op=MPI_OPS[op], root=root)
    out = np.full_like(send, 9) if r == root else None
    pycollective.reduce(send, out, MPI_OPS[op], root=root, comm=comm, algorithm=algorithm)
    inplace = send.copy()
    pycollective.reduce(MPI.IN_PLACE if r == root else inplace, inplace, op, root=root,
                        comm=comm, algorithm=algorithm)
    if not bitwise_equal(send, original):
        failures.append(f"{where}: sendbuf modified")
    if r == root:
        for label, got in (("", out), (" in place", inplace)):
            if not bitwise_equal(got, expected):
                failures.append(f"{where}{label}: {int(np.count_nonzero(got != expected))} wrong")
            elif not bitwise_equal(got, native):
                failures.append(f"{where}{label}: differs from native MPI_Reduce")
    elif not bitwise_equal(inplace, original):
        failures.append(f"{where}: a non-root's input changed")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm, dtype", BCAST_CASES)
def test_bcast_matrix(layouts, algorithm, dtype):
    """Counts 0,1,N-1,N,N+1,13,1000,10007 x roots x sizes 1..W."""
    failures = []
    for label, comm in layouts:
        n = comm.Get_size()
        for count in counts_for(n):
            for root in roots_of(n):
                check_bcast(comm, algorithm, dtype, count, root, failures,
                            f"{label} N={n} count={count} root={root}")
    assert not failures, f"{len(failures)} failures, first: " + "; ".join(failures[:5])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm, dtype", REDUCE_CASES)
def test_reduce_matrix(layouts, algorithm, dtype):
    """Ops x counts 0,1,N-1,N,N+1,13,1000,10007 x roots x in place x sizes 1..W."""
    failures = []
    for label, comm in layouts:
        n = comm.Get_size()
        for op in OPS_OF[dtype]:
            for count in counts_for(n):
                for root in roots_of(n):
                    check_reduce(comm, algorithm, dtype, op, count, root, failures,
                                 f"{label} N={n} {op} count={count} root={root}")
    assert not failures, f"{len(failures)} failures, first: " + "; ".join(failures[:5])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm", sorted(set(BCAST) | set(REDUCE)))
def test_large_and_segmented(algorithm):
    """Above the shared-memory algorithms' 1 MiB switch, and many pipeline segments."""
    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    failures = []
    old = _settings.set_segment_bytes(64 << 10)
    try:
        for root in (0, n - 1):
            if algorithm in BCAST:
                check_bcast(comm, algorithm, "float64", 300_007, root, failures, f"bcast {root}")
            if algorithm in REDUCE:
                check_reduce(comm, algorithm, "float64", "sum", 300_007, root, failures,
                             f"reduce {root}")
    finally:
        _settings.set_segment_bytes(old)
    assert not failures, "; ".join(failures[:5])


@pytest.mark.mpi(min_size=2)
def test_arguments_that_differ_raise_on_every_rank():
    comm = MPI.COMM_WORLD
    n, r = comm.Get_size(), comm.Get_rank()
    x = np.arange(6.0)
    with pytest.raises(ValueError, match="ranks disagree on root"):
        pycollective.reduce(x, np.empty(6), root=0 if r else n - 1, comm=comm)
    with pytest.raises(ValueError, match="ranks disagree on bytes"):
        pycollective.bcast(np.zeros(6 + (r == 0)), comm=comm)
    with pytest.raises(ValueError, match="root"):
        pycollective.bcast(np.zeros(6), root=n, comm=comm)
    with pytest.raises(ValueError, match="IN_PLACE"):  # in place is for the root only
        pycollective.reduce(MPI.IN_PLACE, x.copy(), root=0, comm=comm)
    ro = np.frombuffer(bytes(48))
    with pytest.raises(ValueError, match="read-only"):  # a read-only buffer must not receive
        pycollective.bcast(ro if r else np.zeros(6), root=0, comm=comm)
    pycollective.bcast(ro if r == 0 else np.zeros(6), root=0, comm=comm)  # but may be sent
    out = np.empty(6) if r == 0 else None
    pycollective.reduce(x, out, root=0, comm=comm)  # still usable
    if r == 0:
        assert np.array_equal(out, n * x)
