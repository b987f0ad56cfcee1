"""Every registered algorithm against exact answers and native MPI_Allreduce.

Failures are collected per test and asserted at the end so that all ranks
keep issuing the same collectives; a failing assertion then aborts the job
(see conftest.py).
"""

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from _data import (MPI_OPS, Replicas, bitwise_equal, counts_for, exact_reduce, exact_values,
                   random_values, replicas_identical, rounding_bound)

ALGORITHMS = pycollective.algorithms()
OPS = ["sum", "prod", "max", "min"]


def _failures_message(failures):
    return f"{len(failures)} failures, first: " + "; ".join(failures[:5])


def _run(algorithm, comm, send, op, in_place, op_form):
    op_arg = MPI_OPS[op] if op_form == "mpi" else op
    if in_place:
        out = send.copy()
        result = pycollective.allreduce(MPI.IN_PLACE, out, op_arg, comm=comm, algorithm=algorithm)
    else:
        out = np.full_like(send, 99)
        result = pycollective.allreduce(send, out, op_arg, comm=comm, algorithm=algorithm)
    assert result is out
    return out


_natives = {}


def _native(label, comm, send, op):
    """MPI_Allreduce's result for exact data, made once per launch for every algorithm's test
    (the data and so the result are the same for each): one collective in three of the
    matrix's steps."""
    key = (label, comm.Get_size(), send.dtype.str, send.size, op)
    if key not in _natives:
        _natives[key] = np.empty_like(send)
        comm.Allreduce(send, _natives[key], op=MPI_OPS[op])
    return _natives[key]


# Where chunks and segments fall depends on the item size, not on the type: at 8
# ranks (four per core in CI) the matrix takes one type of each size, a fifth of
# that launch's time with all five; the launches at 2, 3 and 4 ranks take all.
EXACT_DTYPES = ["float32", "float64", "int32", "int64", "float16"]
if MPI.COMM_WORLD.Get_size() >= 8:
    EXACT_DTYPES = ["float16", "int32", "float64"]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", EXACT_DTYPES)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_exact_matrix(layouts, algorithm, dtype):
    """All ops x in/out of place x counts 0,1,N-1,N,N+1,13,1000,10007 x sizes 1..W."""
    failures = []
    for label, comm in layouts:
        n, r = comm.Get_size(), comm.Get_rank()
        replicas = Replicas()
        for op in OPS:
            for count in counts_for(n):
                everyone = [exact_values(q, count, dtype, op) for q in range(n)]
                expected = exact_reduce(everyone, op, dtype)
                send = everyone[r]
                original = send.copy()
                native = _native(label, comm, send, op)
                for in_place, op_form in ((False, "mpi"), (True, "str")):
                    out = _run(algorithm, comm, send, op, in_place, op_form)
                    where = f"{label} N={n} {op} count={count} in_place={in_place}"
                    if not bitwise_equal(out, expected):
                        bad = np.flatnonzero(out != expected)
                        failures.append(f"{where}: {bad.size} wrong, first at {bad[:3]}")
                    if not bitwise_equal(out, native):
                        failures.append(f"{where}: differs from native MPI_Allreduce")
                    if not bitwise_equal(send, original):
                        failures.append(f"{where}: sendbuf modified")
                    replicas.add(where, out)
        failures += [f"{where}: ranks hold different results" for where in replicas.differ(comm)]
    assert not failures, _failures_message(failures)


@pytest.mark.mpi(min_size=2)
def test_the_loops_replica_check_names_each_call_whose_replicas_differ():
    """The matrices check replicas with one gather per loop (``_data.Replicas``): it must
    name exactly the calls where one rank's bytes differ, NaN payloads and -0.0 included."""
    comm = MPI.COMM_WORLD
    r = comm.Get_rank()
    replicas = Replicas()
    same = np.array([1.0, np.nan, -0.0])
    replicas.add("same", same)
    payload = same.copy()
    payload.view(np.uint64)[1] |= r == 1  # another NaN on rank 1
    replicas.add("nan payload", payload)
    replicas.add("same again", same)
    zero = same.copy()
    zero[2] = 0.0 if r == comm.Get_size() - 1 else -0.0
    replicas.add("signed zero", zero)
    assert replicas.differ(comm) == ["nan payload", "signed zero"]
    assert replicas.differ(comm) == []  # emptied by the check


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_rounding_within_bound(layouts, algorithm, dtype):
    """Random floats: within (N-1)·eps·Σ|x| of the exact sum (and of native within twice that)."""
    failures = []
    for label, comm in layouts:
        n, r = comm.Get_size(), comm.Get_rank()
        replicas = Replicas()
        for op in ("sum", "prod"):
            for count in (n + 1, 1000, 10007):
                everyone = [random_values(q, count, dtype, op) for q in range(n)]
                exact, bound = rounding_bound(everyone, op, dtype)
                send = everyone[r]
                native = np.empty_like(send)
                comm.Allreduce(send, native, op=MPI_OPS[op])
                for in_place in (False, True):
                    out = _run(algorithm, comm, send, op, in_place, "mpi")
                    where = f"{label} N={n} {op} count={count} in_place={in_place}"
                    err = np.abs(out.astype(np.float64) - exact)
                    if not np.all(err <= bound):
                        i = int(np.argmax(err - bound))
                        failures.append(f"{where}: error {err[i]:.3g} > bound {bound[i]:.3g} at {i}")
                    gap = np.abs(out.astype(np.float64) - native.astype(np.float64))
                    if not np.all(gap <= 2 * bound):
                        failures.append(f"{where}: farther than 2*bound from native")
                    replicas.add(where, out)
        failures += [f"{where}: ranks hold different results" for where in replicas.differ(comm)]
    assert not failures, _failures_message(failures)


_large = {}


def _large_case(n, r, count, dtype, op):
    """This rank's input and the exact answer of the large-count test, made once per launch
    (every algorithm's test reduces the same data; at 8 ranks on 2 cores making all eight
    inputs on every rank took more of the test than the collectives)."""
    key = (n, r, count, dtype, op)
    if key not in _large:
        everyone = [exact_values(q, count, dtype, op) for q in range(n)]
        _large[key] = everyone[r], exact_reduce(everyone, op, dtype)
    return _large[key]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_large_count(algorithm):
    """A prime count above 1e6 on the whole world, float32 sum and int64 max."""
    comm = MPI.COMM_WORLD
    n, r = comm.Get_size(), comm.Get_rank()
    count = 1_000_003
    for dtype, op in (("float32", "sum"), ("int64", "max")):
        mine, expected = _large_case(n, r, count, dtype, op)
        for in_place in (False, True):
            send = mine.copy()  # the kept input stays as made, whatever a call does
            out = _run(algorithm, comm, send, op, in_place, "mpi")
            if not in_place:
                assert np.array_equal(send, mine), f"{dtype} {op}: sendbuf modified"
            wrong = int(np.count_nonzero(out != expected))
            assert wrong == 0, f"{dtype} {op} in_place={in_place}: {wrong} wrong elements"
            assert replicas_identical(comm, out)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_other_integer_dtypes(algorithm):
    comm = MPI.COMM_WORLD
    n, r = comm.Get_size(), comm.Get_rank()
    failures = []
    for dtype in ("int8", "int16", "uint8", "uint16", "uint32", "uint64"):
        for op in OPS:
            for count in (0, n + 1, 1000):
                everyone = [exact_values(q, count, dtype, op) for q in range(n)]
                expected = exact_reduce(everyone, op, dtype)
                out = _run(algorithm, comm, everyone[r], op, False, "mpi")
                if not bitwise_equal(out, expected):
                    failures.append(f"{dtype} {op} count={count}")
    assert not failures, _failures_message(failures)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_buffer_shapes_and_aliasing(algorithm):
    """Multi-dimensional, Fortran-ordered, 0-d, read-only and aliased buffers."""
    comm = MPI.COMM_WORLD
    n, r = comm.Get_size(), comm.Get_rank()
    everyone = [exact_values(q, 60, "float64", "sum") for q in range(n)]
    expected = exact_reduce(everyone, "sum", "float64")

    c2d = everyone[r].reshape(6, 10)
    out = np.empty((6, 10))
    pycollective.allreduce(c2d, out, comm=comm, algorithm=algorithm)
    assert np.array_equal(out.reshape(-1), expected)

    # Fortran order: element-wise in memory order, like MPI.
    f2d = np.asfortranarray(c2d)
    fout = np.empty((6, 10), order="F")
    pycollective.allreduce(f2d, fout, comm=comm, algorithm=algorithm)
    assert np.array_equal(fout, np.asfortranarray(expected.reshape(6, 10)))

    ro = everyone[r].copy()
    ro.flags.writeable = False
    out = np.empty(60)
    pycollective.allreduce(ro, out, comm=comm, algorithm=algorithm)
    assert np.array_equal(out, expected)

    same = everyone[r].copy()  # the same array as both buffers means in place
    pycollective.allreduce(same, same, comm=comm, algorithm=algorithm)
    assert np.array_equal(same, expected)

    zero_d = np.array(float(r + 1))
    out0 = np.empty(())
    pycollective.allreduce(zero_d, out0, comm=comm, algorithm=algorithm)
    assert out0 == n * (n + 1) / 2


@pytest.mark.mpi(min_size=2)
def test_library_messages_never_match_user_messages():
    """A user's wildcard receive on the same communicator stays unmatched by library traffic."""
    comm = MPI.COMM_WORLD
    n, r = comm.Get_size(), comm.Get_rank()
    user = np.full(4, -1.0)
    req = comm.Irecv(user, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
    for algorithm in ALGORITHMS:
        x = exact_values(r, 1000, "float32", "sum")
        out = np.empty_like(x)
        pycollective.allreduce(x, out, comm=comm, algorithm=algorithm)
    comm.Barrier()  # nobody sends the user message before everyone has looked
    matched = req.Test()
    comm.Barrier()
    assert not matched, "a library message matched the user's receive"
    comm.Send(np.full(4, float(r)), dest=(r + 1) % n, tag=7)
    req.Wait()
    assert np.array_equal(user, np.full(4, float((r - 1) % n)))


@pytest.mark.mpi(min_size=2)
def test_interleaved_algorithms_and_sizes(layouts):
    """Back-to-back calls with different algorithms, sizes and ops on the same comms."""
    rng = np.random.default_rng(1234)  # same sequence on every rank
    plan = [(str(rng.choice(ALGORITHMS)), int(rng.integers(0, 3000)), str(rng.choice(OPS)))
            for _ in range(40)]
    for label, comm in layouts:
        n, r = comm.Get_size(), comm.Get_rank()
        outs = []
        for algorithm, count, op in plan:
            x = exact_values(r, count, "int64", op)
            outs.append((pycollective.allreduce(x, np.empty_like(x), op, comm=comm,
                                                algorithm=algorithm), count, op))
        for out, count, op in outs:
            everyone = [exact_values(q, count, "int64", op) for q in range(n)]
            assert np.array_equal(out, exact_reduce(everyone, op, "int64")), (label, count, op)
