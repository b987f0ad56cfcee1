"""allgather and allgatherv: every algorithm, every communicator size, any block layout.

Each rank's block is data that depend on the rank and the index, so a block
delivered to the wrong place or taken from the wrong rank shows; every rank
must end with the same bytes (native ``MPI_Allgatherv``'s), elements
outside the blocks untouched, the send buffer unchanged.  Layouts:
:func:`pycollective.partition`'s, and counts/displacements with gaps,
blocks in reverse rank order and empty blocks.
"""

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective.runtime import settings as _settings
from _data import bitwise_equal, counts_for, exact_values, replicas_identical

ALGORITHMS = pycollective.algorithms("allgather")
# "auto" picks one of the registered algorithms: one dtype suffices for it.
CASES = [(a, d) for a in ALGORITHMS for d in ("float64", "int8", "complex64")] + \
    [("auto", "int8")]


def block(rank, count, dtype):
    """Per-rank, per-index values of any dtype (complex: two different parts)."""
    if np.dtype(dtype).kind == "c":
        x = exact_values(rank, count, "float64", "sum")
        return (x + 1j * (3 * x + 1)).astype(dtype)
    return exact_values(rank, count, dtype, "sum")


def layouts_of(count, n):
    """``(label, counts, displs)``; counts None: partition's blocks of ``count``."""
    sizes = [pycollective.partition(count, n, n - 1 - q)[1] for q in range(n)]
    gaps = [0] * n
    at = 1
    for q in reversed(range(n)):  # blocks in reverse rank order, one element apart
        gaps[q] = at
        at += sizes[q] + 1
    return [("partition", None, None), ("reversed with gaps", sizes, gaps)]


def check(comm, algorithm, dtype, count, counts, displs, in_place, failures, where):
    n, r = comm.Get_size(), comm.Get_rank()
    sizes = counts or [pycollective.partition(count, n, q)[1] for q in range(n)]
    starts = displs or [sum(sizes[:q]) for q in range(n)]
    total = max([s + c for s, c in zip(starts, sizes)] + [0]) + (1 if displs else 0)
    mine = block(r, sizes[r], dtype)
    expected = np.full(total, 3, dtype)
    comm.Allgatherv(mine, [expected, (sizes, starts)])
    out = np.full(total, 3, dtype)
    if in_place:
        out[starts[r]:starts[r] + sizes[r]] = mine
        send = MPI.IN_PLACE
    else:
        send = mine.copy()
    if counts is None:
        pycollective.allgather(send, out, comm=comm, algorithm=algorithm)
    else:
        pycollective.allgatherv(send, out, counts, displs, comm=comm, algorithm=algorithm)
    if not bitwise_equal(out, expected):
        failures.append(f"{where}: {int(np.count_nonzero(out != expected))} wrong")
    if not in_place and not bitwise_equal(send, mine):
        failures.append(f"{where}: sendbuf modified")
    if not replicas_identical(comm, out):
        failures.append(f"{where}: ranks hold different results")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm, dtype", CASES)
def test_matrix(layouts, algorithm, dtype):
    """Counts 0,1,N-1,N,N+1,13,1000,10007 x layouts x in place x sizes 1..W."""
    failures = []
    for label, comm in layouts:
        n = comm.Get_size()
        for count in counts_for(n):
            for name, counts, displs in layouts_of(count, n):
                for in_place in (False, True):
                    check(comm, algorithm, dtype, count, counts, displs, in_place, failures,
                          f"{label} N={n} count={count} {name} in_place={in_place}")
    assert not failures, f"{len(failures)} failures, first: " + "; ".join(failures[:5])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_large_and_segmented(algorithm):
    """Above the shared-memory algorithms' 1 MiB switch, and many pipeline segments."""
    comm = MPI.COMM_WORLD
    failures = []
    old = _settings.set_segment_bytes(64 << 10)
    try:
        count = 300_007 * comm.Get_size()
        for name, counts, displs in layouts_of(count, comm.Get_size()):
            check(comm, algorithm, "float64", count, counts, displs, False, failures, name)
    finally:
        _settings.set_segment_bytes(old)
    assert not failures, "; ".join(failures[:5])


@pytest.mark.mpi(min_size=2)
def test_bad_layouts_raise_on_every_rank():
    comm = MPI.COMM_WORLD
    n, r = comm.Get_size(), comm.Get_rank()
    out = np.zeros(4 * n)
    with pytest.raises(ValueError, match="overlap"):
        pycollective.allgatherv(np.zeros(4), out, [4] * n, [0] * n, comm=comm)
    with pytest.raises(ValueError, match="block"):
        pycollective.allgatherv(np.zeros(4), out, [4] * n, [4 * n] * n, comm=comm)
    counts = [4] * n if r else [5] + [4] * (n - 1)  # rank 0 disagrees
    with pytest.raises(ValueError, match="ranks disagree on count"):
        pycollective.allgatherv(np.zeros(counts[r]), np.zeros(5 * n), counts, comm=comm)
    with pytest.raises(TypeError, match="dtype"):
        pycollective.allgather(np.zeros(4, np.float32), out, comm=comm)
    pycollective.allgather(np.full(4, float(r)), out, comm=comm)  # still usable
    assert np.array_equal(out, np.repeat(np.arange(n, dtype=float), 4))
