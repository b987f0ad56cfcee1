"""Reduction kernels: ``kernel(a, b, out)`` sets ``out[i] = a[i] (op) b[i]``.

All reductions of received data in the library go through this module.  The
arguments are flat arrays of one dtype and one length; ``out`` may be ``a`` or
``b`` (the element-wise loops read both inputs before writing).

Each (op, dtype) kernel is a numba-compiled loop, selected once per call by
:func:`get_kernel` before any message is sent; :func:`get_kernel` also runs it
on empty arrays so that compilation never lands in a timed region.  numba's
on-disk cache keeps the machine code between runs.

Semantics chosen so that every algorithm gives bitwise-identical results on
all ranks even when partners combine operands in opposite orders:
* integer arithmetic wraps around, as in C and in MPI implementations;
* MAX/MIN propagate NaN whichever side it is on, and treat +0.0/-0.0
  symmetrically (MAX prefers +0.0, MIN prefers -0.0);
* float16 has no arithmetic in numba, so float16 kernels work on the bit
  patterns: both operands are widened to float64, where the sum or product of
  two halves is exact, and the result is rounded once to the nearest half
  (ties to even).  Every reduction step therefore rounds to float16, like an
  MPI library reducing float16 buffers, and each step is correctly rounded.
"""

import math

import numba
import numpy as np

from ._ops import OPS

__all__ = ["get_kernel", "SUPPORTED_DTYPES"]

SUPPORTED_DTYPES = tuple(np.dtype(t) for t in (
    "float16", "float32", "float64",
    "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64",
))

_jit = numba.njit(cache=True, nogil=True)


# --- native dtypes -----------------------------------------------------------

@_jit
def _sum(a, b, out):
    for i in range(out.shape[0]):
        out[i] = a[i] + b[i]


@_jit
def _prod(a, b, out):
    for i in range(out.shape[0]):
        out[i] = a[i] * b[i]


@_jit
def _max(a, b, out):
    for i in range(out.shape[0]):
        x = a[i]
        y = b[i]
        if y > x or y != y:
            x = y
        elif y == x and x == 0 and math.copysign(1.0, y) > 0:
            x = y
        out[i] = x


@_jit
def _min(a, b, out):
    for i in range(out.shape[0]):
        x = a[i]
        y = b[i]
        if y < x or y != y:
            x = y
        elif y == x and x == 0 and math.copysign(1.0, y) < 0:
            x = y
        out[i] = x


# --- float16 on its bit patterns ---------------------------------------------

@_jit
def _h2d(h):
    """Exact float64 value of the half with bit pattern ``h``."""
    h = np.int64(h)
    exp = (h >> 10) & 0x1F
    man = h & 0x3FF
    if exp == 0:
        v = math.ldexp(float(man), -24)
    elif exp == 31:
        v = math.inf if man == 0 else math.nan
    else:
        v = math.ldexp(float(man + 1024), exp - 25)
    return -v if h & 0x8000 else v


@_jit
def _round_half_even(q):
    f = math.floor(q)
    d = q - f
    if d > 0.5 or (d == 0.5 and f % 2.0 == 1.0):
        f += 1.0
    return np.int64(f)


@_jit
def _d2h(x):
    """Bit pattern of ``x`` rounded to the nearest half, ties to even."""
    if x != x:
        return np.uint16(0x7E00)
    sign = np.int64(0x8000) if math.copysign(1.0, x) < 0 else np.int64(0)
    a = abs(x)
    if a >= 65520.0:  # halfway between 65504 (max half) and 2**16 rounds up
        return np.uint16(sign | 0x7C00)
    if a < 6.103515625e-05:  # below 2**-14: subnormal, quantum 2**-24
        return np.uint16(sign | _round_half_even(math.ldexp(a, 24)))
    m, e = math.frexp(a)  # a = m * 2**e, 0.5 <= m < 1
    q = _round_half_even(math.ldexp(m, 11))  # 11 significant bits
    if q == 2048:
        q = 1024
        e += 1
    biased = e - 1 + 15
    if biased >= 31:
        return np.uint16(sign | 0x7C00)
    return np.uint16(sign | (biased << 10) | (q - 1024))


@_jit
def _sum_f16(a, b, out):
    for i in range(out.shape[0]):
        out[i] = _d2h(_h2d(a[i]) + _h2d(b[i]))


@_jit
def _prod_f16(a, b, out):
    for i in range(out.shape[0]):
        out[i] = _d2h(_h2d(a[i]) * _h2d(b[i]))


@_jit
def _max_f16(a, b, out):
    for i in range(out.shape[0]):
        x = _h2d(a[i])
        y = _h2d(b[i])
        pick_b = y > x or y != y or (y == x and x == 0 and math.copysign(1.0, y) > 0)
        out[i] = b[i] if pick_b else a[i]


@_jit
def _min_f16(a, b, out):
    for i in range(out.shape[0]):
        x = _h2d(a[i])
        y = _h2d(b[i])
        pick_b = y < x or y != y or (y == x and x == 0 and math.copysign(1.0, y) < 0)
        out[i] = b[i] if pick_b else a[i]


_NATIVE = {"sum": _sum, "prod": _prod, "max": _max, "min": _min}
_HALF = {"sum": _sum_f16, "prod": _prod_f16, "max": _max_f16, "min": _min_f16}
_U16 = np.dtype(np.uint16)
_F16 = np.dtype(np.float16)


def _half_kernel(fn):
    def kernel(a, b, out):
        fn(a.view(_U16), b.view(_U16), out.view(_U16))
    return kernel


def _build(op, dtype):
    if dtype == _F16:
        kernel = _half_kernel(_HALF[op])
    else:
        kernel = _NATIVE[op]
    empty = np.empty(0, dtype)
    kernel(empty, empty, empty)  # compile (or load from cache) now
    return kernel


_cache = {}


def get_kernel(op, dtype):
    """Return the warmed kernel for canonical op name ``op`` (one of ``OPS``) and ``dtype``.

    Raises:
        TypeError: if ``dtype`` is not one of :data:`SUPPORTED_DTYPES`.
        ValueError: for an op name that is not one of ``OPS``.
    """
    dtype = np.dtype(dtype)
    key = (op, dtype)
    kernel = _cache.get(key)
    if kernel is None:
        if op not in OPS:
            raise ValueError(f"unknown op name {op!r}; expected one of {', '.join(OPS)}")
        if dtype not in SUPPORTED_DTYPES or not dtype.isnative:
            raise TypeError(
                f"unsupported dtype {dtype}: pycollective reduces "
                + ", ".join(str(d) for d in SUPPORTED_DTYPES))
        kernel = _cache[key] = _build(op, dtype)
    return kernel
