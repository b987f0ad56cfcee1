"""Test data that catch misplaced chunks, and the reductions they should give.

Every element depends on both the rank and the index (a multiplicative hash
of both, see :mod:`pycollective.bench._exact`), so a chunk delivered to the wrong
place or taken from the wrong rank changes the result.  "Exact" data are
integers small enough that every partial reduction is exact in the dtype
(integer overflow wraps, identically in any order), so the right answer is
known bit for bit.  "Random" data exercise
rounding and are checked against an error bound instead.
"""

import functools
import os
import zlib
from contextlib import contextmanager

import numpy as np
from mpi4py import MPI

import pycollective

from pycollective.bench import _exact
from pycollective.data.ops import MPI_OPS  # noqa: F401  (re-exported for the tests)

MAX_RANKS = 8  # data ranges are chosen so reductions over this many ranks stay exact


def exact_values(rank, count, dtype, op):
    """Integer-valued data for ``rank`` whose reduction is exact in ``dtype`` (N <= MAX_RANKS).

    The library's own generator (:mod:`pycollective.bench._exact`, also the
    benchmark's), sized for :data:`MAX_RANKS` ranks so that the same data
    serve every communicator of a launch.
    """
    return _exact.exact_values(0, count, rank, MAX_RANKS, dtype, op)


exact_reduce = _exact.exact_reduce


@functools.lru_cache(maxsize=16)
def exact_expected(nranks, count, dtype, op):
    """The exact reduction of ranks 0..nranks-1's :func:`exact_values` (read-only; in any
    order of the ranks, as the values are exact).  Kept for the next call of the same
    case: making every rank's data for one result was most of a large case's time (the
    checks at the one-step limit's 4 MiB, ``test_rsag.py`` and ``test_shm_mid.py``)."""
    expected = exact_reduce([exact_values(q, count, dtype, op) for q in range(nranks)],
                            op, dtype)
    expected.flags.writeable = False
    return expected


def random_values(rank, count, dtype, op, seed=0):
    """Floating data with rounding in every reduction step."""
    rng = np.random.default_rng([seed, rank, count])
    if op == "prod":
        x = rng.uniform(0.5, 2.0, count) * rng.choice([-1.0, 1.0], count)
    else:
        x = rng.standard_normal(count) * (10.0 if np.dtype(dtype) != np.float16 else 1.0)
    return x.astype(dtype)


def rounding_bound(arrays, op, dtype):
    """Per-element bound on |computed - exact| for any reduction order.

    A sum of N terms in any order is within (N-1)·u·Σ|x_i|·(1 + O(u)) of the
    exact sum (u = eps/2), and a product within (N-1)·u·|Π x_i|·(1 + O(u));
    (N-1)·eps covers both with room to spare.  Returns (exact, bound).
    """
    stack = np.array([a.astype(np.float64) for a in arrays]).reshape(len(arrays), -1)
    eps = float(np.finfo(dtype).eps)
    n = len(arrays)
    if op == "sum":
        exact, scale = stack.sum(axis=0), np.abs(stack).sum(axis=0)
    else:
        exact = stack.prod(axis=0)
        scale = np.abs(exact)
    return exact, (n - 1) * eps * scale + float(np.finfo(dtype).smallest_subnormal)


def replicas_identical(comm, array):
    """True on every rank iff all ranks hold the same bytes."""
    crcs = comm.allgather(zlib.crc32(np.ascontiguousarray(array).view(np.uint8)))
    return len(set(crcs)) == 1


class Replicas:
    """The replica check of a whole loop of calls in one collective.

    ``add(where, out)`` records a checksum of one call's result on this rank;
    ``differ(comm)`` gathers them all at once and returns the ``where`` of every
    call whose result is not the same bytes on every rank (the same list on every
    rank).  One allgather per loop instead of one per call: at 8 ranks on 2 cores
    each collective costs milliseconds, and the per-call checks were two of the
    five collectives of every step of the exact matrix.
    """

    def __init__(self):
        self.where, self.crcs = [], []

    def add(self, where, array):
        self.where.append(where)
        self.crcs.append(zlib.crc32(np.ascontiguousarray(array).view(np.uint8)))

    def differ(self, comm):
        every = comm.allgather(self.crcs)
        if len({len(c) for c in every}) != 1:
            return [f"ranks made different numbers of calls: {[len(c) for c in every]}"]
        bad = [w for i, w in enumerate(self.where) if len({c[i] for c in every}) != 1]
        self.where, self.crcs = [], []
        return bad


def bitwise_equal(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(
        a.view(np.uint8), b.view(np.uint8))


def counts_for(nranks):
    """0, 1, N-1, N, N+1, a prime, 1000 and the prime 10007."""
    return sorted({0, 1, max(nranks - 1, 0), nranks, nranks + 1, 13, 1000, 10007})


def check_allreduce(comm, algorithm, dtype, op, count, failures, where, shift=0):
    """Exact data through ``algorithm``, both ways; append what is wrong to ``failures``.

    ``shift``: rank q sends rank (q + shift) % N's data, so that calls in a row
    differ (a call that read a slot left from an earlier one gives a wrong sum)."""
    n, r = comm.Get_size(), comm.Get_rank()
    expected = exact_expected(n, count, np.dtype(dtype), op)
    send = exact_values((r + shift) % n, count, dtype, op)
    original = send.copy()
    out = np.full_like(send, 99)
    pycollective.allreduce(send, out, op, comm=comm, algorithm=algorithm)
    inplace = send.copy()
    pycollective.allreduce(MPI.IN_PLACE, inplace, op, comm=comm, algorithm=algorithm)
    label = f"{where} {dtype} {op} count={count}"
    if not bitwise_equal(out, expected):
        failures.append(f"{label}: {int(np.count_nonzero(out != expected))} wrong")
    if not bitwise_equal(inplace, expected):
        failures.append(f"{label} in place: {int(np.count_nonzero(inplace != expected))} wrong")
    if not bitwise_equal(send, original):
        failures.append(f"{label}: sendbuf modified")
    # No separate replica check: both results are compared bit for bit with
    # ``expected``, the same on every rank, so ranks can only differ where a
    # comparison above already failed (and a gather per call was a third of the
    # collectives here).  Checks of rounded results keep theirs (``Replicas``).


@contextmanager
def env(name, value):
    """Set (or with None: unset) an environment variable for the block."""
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def shared_tmp(comm, tmp_path_factory, name):
    """A path chosen on rank 0 and used by all ranks (same file system here)."""
    path = str(tmp_path_factory.mktemp("shared") / name) if comm.Get_rank() == 0 else None
    return comm.bcast(path, root=0)
