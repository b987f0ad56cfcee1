"""Exact test data: inputs whose reduction is known bit for bit, and the checks that use them.

Every value depends on the element index and the rank, so a misplaced or
misrouted chunk changes the result; values are small integers chosen so
that the reduction over N ranks is exact in the dtype whatever the order of
operations.  Any difference from the reference is therefore an error, and
checks use tolerance 0.  Used by the benchmark harness and the test suite
(one generator for both).
"""

import numpy as np

from ..data.kernels import float_info, is_float

__all__ = ["exact_values", "exact_reduce", "exact_case", "fill_exact", "compare", "BLOCK"]

BLOCK = 1 << 20  # elements per block when generating or checking data


def _exact_limit(dtype):
    """Largest L such that every integer in [-L, L] (or [0, L]) is exact in ``dtype``."""
    if is_float(dtype):
        return 2 ** (float_info(dtype).nmant + 1)
    return int(np.iinfo(dtype).max)


def _sum_halfwidth(dtype, nranks):
    """K such that N values in [-K, K] (or [0, K]) sum exactly, in any order."""
    return max(0, min(_exact_limit(dtype) // nranks, 1 << 20))


def _float_pow2_cap(dtype):
    """Largest k with 2**k finite (and so exact) in the floating ``dtype``."""
    return int(float_info(dtype).maxexp) - 1


_PROD_SIGNED = np.array([1, 2, -1, 1, -2], np.int64)
_PROD_UNSIGNED = np.array([1, 2, 3, 1, 2], np.int64)
_PROD_UNIT = np.array([1, -1, 1, -1, -1], np.int64)


def _check_exact(dtype, nranks, op):
    if op == "sum" and _sum_halfwidth(dtype, nranks) < 1:
        raise ValueError(f"{dtype} cannot hold an exact sum over {nranks} ranks "
                         f"(integers are exact only up to {_exact_limit(dtype)})")


def exact_values(start, stop, rank, nranks, dtype, op):
    """Input values of ``rank`` for element indices ``[start, stop)``.

    Every value depends on the index and the rank through a multiplicative
    hash ``u = (i * 0x9E3779B1 + (r + 1) * 0x85EBCA77) mod 2**32``, so a
    misplaced or misrouted chunk changes the result, and the pattern has no
    short period a chunk shift could hide in.  Values are small integers
    chosen so that the reduction over ``nranks`` ranks is exact in ``dtype``
    whatever the order of operations -- any difference from native MPI is an
    error, and the check uses tolerance 0:

    * sum, max, min: ``u % (2K+1) - K`` (unsigned: ``u % (K+1)``) with
      ``N*K`` within the dtype's exact-integer range (2**11 for float16,
      2**24 for float32, 2**53 for float64, the maximum for integers), so
      every partial sum is exact;
    * prod: values from {1, 2, -1, 1, -2} (unsigned {1, 2, 3, 1, 2}); for a
      float dtype, ranks beyond the largest finite power of two (float16:
      15) use {1, -1} only, so every partial product is a power of two and
      exact.  Integer overflow wraps around identically in native MPI and
      here (fixed-width integer arithmetic is associative and commutative
      modulo 2**bits), so integer products are exact at any N.

    Args:
        start, stop: index range.
        rank, nranks: this rank and the communicator size N.
        dtype: a numpy dtype.
        op: "sum", "prod", "max" or "min".

    Returns:
        An array of ``stop - start`` elements of ``dtype``.

    Raises:
        ValueError: if no exact data exist (a float sum over more ranks than
            the dtype has exact integers, e.g. float16 beyond 2048 ranks).
    """
    dtype = np.dtype(dtype)
    _check_exact(dtype, nranks, op)
    i = np.arange(start, stop, dtype=np.uint64)
    u = (i * np.uint64(0x9E3779B1) + np.uint64(((rank + 1) * 0x85EBCA77) & 0xFFFFFFFF))
    u &= np.uint64(0xFFFFFFFF)
    u >>= np.uint64(7)  # the low bits of i*odd depend on the low bits of i only
    if op == "prod":
        if dtype.kind == "u":
            table = _PROD_UNSIGNED
        elif is_float(dtype) and rank >= _float_pow2_cap(dtype):
            table = _PROD_UNIT
        else:
            table = _PROD_SIGNED
        v = table[(u % np.uint64(5)).astype(np.intp)]
    else:
        k = max(1, _sum_halfwidth(dtype, nranks))
        if dtype.kind == "u":
            v = (u % np.uint64(k + 1)).astype(np.int64)
        else:
            v = (u % np.uint64(2 * k + 1)).astype(np.int64) - k
    return v.astype(dtype)


def fill_exact(buf, rank, nranks, op):
    """Fill the flat array ``buf`` with :func:`exact_values` ``(0, buf.size, ...)``, in blocks."""
    for s in range(0, buf.size, BLOCK):
        e = min(s + BLOCK, buf.size)
        buf[s:e] = exact_values(s, e, rank, nranks, buf.dtype, op)


def _bits(a):
    return a.view(f"u{a.dtype.itemsize}") if is_float(a.dtype) else a


def compare(got, want):
    """Return (#elements not bitwise equal, largest |got - want|) of two flat arrays."""
    wrong, err = 0, 0.0
    for s in range(0, got.size, BLOCK):
        g, w = got[s:s + BLOCK], want[s:s + BLOCK]
        bad = _bits(g) != _bits(w)
        n = int(np.count_nonzero(bad))
        if n:
            wrong += n
            with np.errstate(invalid="ignore", over="ignore"):
                diff = np.abs(g[bad].astype(np.float64) - w[bad].astype(np.float64))
            diff[np.isnan(diff)] = np.inf  # NaN where a number was due: infinitely wrong
            err = max(err, float(diff.max()))
    return wrong, err




def exact_reduce(arrays, op, dtype):
    """The exact reduction of integer-valued arrays, as ``dtype`` (integers wrap as in C).

    Args:
        arrays: one array per rank, all of the same length.
        op: "sum", "prod", "max" or "min".
        dtype: the result dtype.
    """
    dtype = np.dtype(dtype)
    stack = np.array([np.asarray(a).astype(np.int64) for a in arrays],
                     np.int64).reshape(len(arrays), -1)
    with np.errstate(over="ignore"):
        reducer = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[op]
        result = reducer(stack, axis=0)
    if dtype.kind in "iu":
        return result.astype(dtype)  # int64 -> narrower integer wraps modulo 2**bits
    return result.astype(np.float64).astype(dtype)


def exact_case(count, rank, nranks, dtype="float32", op="sum"):
    """``(mine, expected)``: this rank's :func:`exact_values` for ``count`` elements and
    the exact reduction of every rank's (the benchmarks' scripts time a collective on
    these and check its result against ``expected`` with tolerance 0)."""
    mine = exact_values(0, count, rank, nranks, dtype, op)
    everyone = [exact_values(0, count, q, nranks, dtype, op) for q in range(nranks)]
    return mine, exact_reduce(everyone, op, dtype)
