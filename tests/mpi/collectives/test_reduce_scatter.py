"""reduce_scatter: every algorithm, exact answers, every communicator size, both block layouts.

Data depend on rank and index (tests/mpi/_data.py) and are exact in every
dtype, so each rank's block must equal its part of the exact reduction bit
for bit, and the input must be untouched (in place: every element outside
this rank's block).  Blocks come from :func:`pycollective.partition` or,
for counts 1, N+1, 13 and 1000, from caller counts that are uneven, put
empty blocks first, or give everything to one rank.
"""

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective.runtime import settings as _settings
from pycollective.data.partition import chunk_bounds
from _data import MPI_OPS, bitwise_equal, counts_for, exact_reduce, exact_values

# Every op with float32, and each other dtype with two ops: every algorithm
# meets every op and every dtype (the kernels themselves are checked bit for
# bit against numpy in tests/data/test_kernels.py); "auto" picks one of the
# registered algorithms, so it runs with float32 only.
OPS_OF = {"float32": ["sum", "prod", "max", "min"], "int64": ["sum", "max"],
          "float16": ["prod", "min"]}
CASES = [(a, d) for a in pycollective.algorithms("reduce_scatter") for d in OPS_OF] + \
    [("auto", "float32")]


def layouts_of(count, n):
    """``(label, counts or None)``: partition's blocks, then (for a few counts) caller counts."""
    found = [("partition", None)]
    if count in (1, n + 1, 13, 1000):  # uneven, empty blocks first, or all on one rank
        found.append(("reversed", [pycollective.partition(count, n, n - 1 - q)[1]
                                   for q in range(n)]))
        found.append(("all on last", [0] * (n - 1) + [count]))
    return found


def _bounds(counts, count, n):
    if counts is None:
        return chunk_bounds(count, n)
    return [sum(counts[:q]) for q in range(n + 1)]


def check(comm, algorithm, dtype, op, count, counts, failures, where):
    n, r = comm.Get_size(), comm.Get_rank()
    everyone = [exact_values(q, count, dtype, op) for q in range(n)]
    expected = exact_reduce(everyone, op, dtype)
    b = _bounds(counts, count, n)
    lo, hi = b[r], b[r + 1]
    send = everyone[r]
    original = send.copy()
    out = np.full(hi - lo, 7, dtype)
    assert pycollective.reduce_scatter(send, out, MPI_OPS[op], counts=counts, comm=comm,
                                       algorithm=algorithm) is out
    if not bitwise_equal(out, expected[lo:hi]):
        failures.append(f"{where}: {int(np.count_nonzero(out != expected[lo:hi]))} wrong")
    if not bitwise_equal(send, original):
        failures.append(f"{where}: sendbuf modified")
    inplace = send.copy()
    pycollective.reduce_scatter(MPI.IN_PLACE, inplace, op, counts=counts, comm=comm,
                                algorithm=algorithm)
    if not bitwise_equal(inplace[lo:hi], expected[lo:hi]):
        failures.append(f"{where} in place: wrong block")
    rest = np.ones(count, bool)
    rest[lo:hi] = False
    if not bitwise_equal(inplace[rest], original[rest]):
        failures.append(f"{where} in place: other blocks changed")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm, dtype", CASES)
def test_exact_matrix(layouts, algorithm, dtype):
    """Ops x counts 0,1,N-1,N,N+1,13,1000,10007 x block layouts x in place x sizes 1..W."""
    failures = []
    for label, comm in layouts:
        n = comm.Get_size()
        for op in OPS_OF[dtype]:
            for count in counts_for(n):
                for name, counts in layouts_of(count, n):
                    check(comm, algorithm, dtype, op, count, counts, failures,
                          f"{label} N={n} {op} count={count} {name}")
    assert not failures, f"{len(failures)} failures, first: " + "; ".join(failures[:5])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm", pycollective.algorithms("reduce_scatter"))
def test_large_and_segmented(algorithm):
    """Above the shared-memory algorithms' 1 MiB switch, and many pipeline segments."""
    comm = MPI.COMM_WORLD
    failures = []
    old = _settings.set_segment_bytes(64 << 10)  # 37 segments per block at 2 ranks
    try:
        for dtype, op in (("float64", "sum"), ("int32", "max")):
            count = 300_007
            for name, counts in layouts_of(count, comm.Get_size())[:2]:
                check(comm, algorithm, dtype, op, count, counts, failures, f"{dtype} {op} {name}")
    finally:
        _settings.set_segment_bytes(old)
    assert not failures, "; ".join(failures[:5])


@pytest.mark.mpi(min_size=2)
def test_counts_that_do_not_fit_raise_on_every_rank():
    comm = MPI.COMM_WORLD
    n, r = comm.Get_size(), comm.Get_rank()
    x = np.arange(10 * n, dtype=np.float64)
    with pytest.raises(ValueError, match="add up to"):
        pycollective.reduce_scatter(x, np.zeros(10), counts=[10] * (n - 1) + [9], comm=comm)
    with pytest.raises(ValueError, match="entries"):
        pycollective.reduce_scatter(x, np.zeros(10), counts=[10] * (n + 1), comm=comm)
    # Counts that differ on one rank: every rank raises naming them.
    counts = [10] * n if r else [11] + [10] * (n - 2) + [9]
    mine = np.zeros(counts[r])
    with pytest.raises(ValueError, match="counts"):
        pycollective.reduce_scatter(x, mine, counts=counts, comm=comm)
    with pytest.raises(ValueError, match="unknown algorithm"):
        pycollective.reduce_scatter(x, np.zeros(10), comm=comm, algorithm="butterfly")
    out = np.zeros(10)
    pycollective.reduce_scatter(x, out, comm=comm)  # still usable
    assert np.array_equal(out, n * x[10 * r:10 * r + 10])
