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
* the two-byte floats -- float16 and bfloat16 (``ml_dtypes.bfloat16``, the
  dtype numpy users have for it) -- have no arithmetic in numba, so their
  kernels work on the bit patterns, and every step is correctly rounded:
  never summed in two-byte arithmetic.  A sum is formed in float32 and
  rounded once more to the two-byte format, which gives the correctly
  rounded sum because 24 bits are at least 2p + 1 (p = 11 or 8 significant
  bits; see the fast paths below).  A product is formed in float64, where
  it is exact, and rounded once in integer arithmetic; MAX and MIN compare
  the exact float64 values and pick one operand's bits.  Every reduction
  step thus accumulates wider and rounds to the two-byte format, like an
  MPI library reducing float16 buffers.  (``ml_dtypes``' own float64 ->
  bfloat16 cast goes through float32 and can round twice, so it is not
  used here.)
"""

import math
import sys

import numba
import numpy as np

from .ops import OPS

__all__ = ["get_kernel", "DTYPE_NAMES", "SUPPORTED_DTYPES", "BFLOAT16", "FLOAT_DTYPES",
           "bfloat16", "is_bfloat16", "dtype_code", "as_dtype", "is_float", "float_info",
           "to_two_bytes", "from_two_bytes"]

#: The dtypes pycollective reduces, by name.  Append only: a dtype's index is its code in
#: fingerprints and message tags (:func:`dtype_code`).
DTYPE_NAMES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64",
               "uint8", "uint16", "uint32", "uint64", "bfloat16")
_CODES = {np.dtype(name): code for code, name in enumerate(DTYPE_NAMES[:-1])}
_BF16_CODE = len(DTYPE_NAMES) - 1
_FLOATS = frozenset(np.dtype(name) for name in ("float16", "float32", "float64"))
_bf16 = None


def bfloat16() -> np.dtype:
    """``ml_dtypes.bfloat16`` as a numpy dtype (8 exponent bits like float32, 8 significant
    bits), importing ml_dtypes on the first call.

    Not at import: ml_dtypes 0.7's own import takes longer than the rest of pycollective's
    (docs/results/startup.md), every rank of every job would pay it, and no bfloat16 array
    can exist in a process before something imported ml_dtypes (:func:`is_bfloat16`)."""
    global _bf16
    if _bf16 is None:
        import ml_dtypes
        _bf16 = np.dtype(ml_dtypes.bfloat16)
    return _bf16


def is_bfloat16(dtype) -> bool:
    """Whether the numpy dtype ``dtype`` is bfloat16; never imports ml_dtypes itself."""
    if _bf16 is None and "ml_dtypes" not in sys.modules:
        return False  # the dtype is ml_dtypes': without it there is none
    return dtype == bfloat16()


def dtype_code(dtype) -> int:
    """The numpy dtype's index in :data:`DTYPE_NAMES`, -1 if pycollective does not reduce it
    (a byte-swapped dtype included)."""
    code = _CODES.get(dtype, -1)
    return _BF16_CODE if code < 0 and is_bfloat16(dtype) else code


def as_dtype(value) -> np.dtype:
    """``np.dtype(value)``, where the name "bfloat16" works whether or not ml_dtypes (which
    gives numpy that name) is imported yet."""
    if isinstance(value, str) and value == "bfloat16":
        return bfloat16()
    return np.dtype(value)


def __getattr__(name):
    """``BFLOAT16``, ``SUPPORTED_DTYPES`` and ``FLOAT_DTYPES``, which hold ml_dtypes' bfloat16,
    made when first asked for (:func:`bfloat16` says why not at import)."""
    if name == "BFLOAT16":
        return bfloat16()
    if name == "SUPPORTED_DTYPES":  # in code order
        return tuple(_CODES) + (bfloat16(),)
    if name == "FLOAT_DTYPES":
        return (np.dtype("float16"), bfloat16(), np.dtype("float32"), np.dtype("float64"))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_float(dtype) -> bool:
    """True for the floating dtypes pycollective reduces, bfloat16 included."""
    dtype = as_dtype(dtype)
    return dtype in _FLOATS or is_bfloat16(dtype)


def float_info(dtype):
    """``np.finfo`` of a floating dtype, bfloat16 included (through ``ml_dtypes.finfo``)."""
    dtype = as_dtype(dtype)
    if is_bfloat16(dtype):
        import ml_dtypes
        return ml_dtypes.finfo(dtype)
    return np.finfo(dtype)


_jit = numba.njit(cache=True, nogil=True)


# --- native dtypes -----------------------------------------------------------
# Each loop comes in three forms: ``out`` is ``a``, ``out`` is ``b``, or
# neither.  LLVM vectorises a loop only behind a runtime check that ``out``
# does not overlap an input, and the in-place calls every reduction makes
# (``kernel(acc, x, acc)``, N - 2 of every N - 1 passes) fail that check and
# ran the scalar loop: 2.2x the time of the out-of-place call on 64K float32
# in L2, against 0.7x for the same loop written on two arrays.  The
# operations and their operand order are the same in all three forms.

@_jit
def _same(x, y):
    return x.ctypes.data == y.ctypes.data


@_jit
def _sum(a, b, out):
    if _same(out, a):
        for i in range(out.shape[0]):
            out[i] = out[i] + b[i]
    elif _same(out, b):
        for i in range(out.shape[0]):
            out[i] = a[i] + out[i]
    else:
        for i in range(out.shape[0]):
            out[i] = a[i] + b[i]


@_jit
def _prod(a, b, out):
    if _same(out, a):
        for i in range(out.shape[0]):
            out[i] = out[i] * b[i]
    elif _same(out, b):
        for i in range(out.shape[0]):
            out[i] = a[i] * out[i]
    else:
        for i in range(out.shape[0]):
            out[i] = a[i] * b[i]


@_jit
def _max_of(x, y):
    """MAX of two values: NaN wins on either side, +0.0 over -0.0."""
    if y > x or y != y:
        return y
    if y == x and x == 0 and math.copysign(1.0, y) > 0:
        return y
    return x


@_jit
def _min_of(x, y):
    """MIN of two values: NaN wins on either side, -0.0 over +0.0."""
    if y < x or y != y:
        return y
    if y == x and x == 0 and math.copysign(1.0, y) < 0:
        return y
    return x


@_jit
def _max(a, b, out):
    if _same(out, a):
        for i in range(out.shape[0]):
            out[i] = _max_of(out[i], b[i])
    elif _same(out, b):
        for i in range(out.shape[0]):
            out[i] = _max_of(a[i], out[i])
    else:
        for i in range(out.shape[0]):
            out[i] = _max_of(a[i], b[i])


@_jit
def _min(a, b, out):
    if _same(out, a):
        for i in range(out.shape[0]):
            out[i] = _min_of(out[i], b[i])
    elif _same(out, b):
        for i in range(out.shape[0]):
            out[i] = _min_of(a[i], out[i])
    else:
        for i in range(out.shape[0]):
            out[i] = _min_of(a[i], b[i])


# --- two-byte floats (float16, bfloat16) on their bit patterns -------------------

@_jit
def _shift_even(x, s):
    """``x / 2**s`` rounded to the nearest integer, ties to even (x >= 0, s >= 1)."""
    q = x >> s
    rem = x - (q << s)
    half = np.int64(1) << (s - 1)
    if rem > half or (rem == half and q & 1):
        q += 1
    return q


@_jit
def _narrow(bits, ebits, pbits):
    """Bit pattern of the float64 with bit pattern ``bits``, rounded to a small float.

    The small format has ``ebits`` exponent and ``pbits`` fraction bits
    (float16: 5, 10; bfloat16: 8, 7); rounding to nearest, ties to even, with
    its subnormals, overflow to infinity and one quiet NaN.  Integer
    arithmetic only, so that it is exact and fast.
    """
    sign = np.int64((bits >> 63) & 1) << (ebits + pbits)
    ex = np.int64((bits >> 52) & 0x7FF)
    frac = np.int64(bits & 0xFFFFFFFFFFFFF)
    inf = ((np.int64(1) << ebits) - 1) << pbits
    if ex == 0x7FF:
        if frac:
            return inf | (np.int64(1) << (pbits - 1))  # quiet NaN, sign dropped
        return sign | inf
    if ex == 0:
        return sign  # float64 subnormals are far below half the smallest small subnormal
    bias = (np.int64(1) << (ebits - 1)) - 1
    e = ex - 1023
    sig = frac | (np.int64(1) << 52)
    if e < 1 - bias:  # below the smallest normal: quantum 2**(1 - bias - pbits)
        shift = 52 + (1 - bias - pbits) - e
        if shift > 53:
            return sign  # below half the smallest subnormal
        # q == 2**pbits lands on the smallest normal: its bits are right as they are
        return sign | _shift_even(sig, shift)
    q = _shift_even(sig, 52 - pbits)
    if q == np.int64(1) << (pbits + 1):
        q >>= 1
        e += 1
    if e > bias:
        return sign | inf
    return sign | ((e + bias) << pbits) | (q - (np.int64(1) << pbits))


@_jit
def _prod_small(a, b, out, wide, ebits, pbits):
    x = np.empty(1, np.float64)
    xbits = x.view(np.uint64)
    for i in range(out.shape[0]):
        x[0] = wide[a[i]] * wide[b[i]]
        out[i] = _narrow(xbits[0], ebits, pbits)


@_jit
def _max_small(a, b, out, wide, ebits, pbits):
    for i in range(out.shape[0]):
        x = wide[a[i]]
        y = wide[b[i]]
        pick_b = y > x or y != y or (y == x and x == 0 and math.copysign(1.0, y) > 0)
        out[i] = b[i] if pick_b else a[i]


@_jit
def _min_small(a, b, out, wide, ebits, pbits):
    for i in range(out.shape[0]):
        x = wide[a[i]]
        y = wide[b[i]]
        pick_b = y < x or y != y or (y == x and x == 0 and math.copysign(1.0, y) < 0)
        out[i] = b[i] if pick_b else a[i]


# The fast paths: through float32.  The sum of two float16 (11 significant
# bits) or bfloat16 (8) values rounded to float32 (24 bits) and then to the
# two-byte format is the correctly rounded sum: double rounding of a sum is
# harmless when the wider format has at least 2p + 1 bits, and float32's
# exponent range holds every float16 sum exactly-rounded and overflows
# exactly where bfloat16 would.  The same holds for a quotient x / N of a
# float32 x (2p + 2 bits suffice for a division).  Float32 values are
# rounded to the two-byte formats on their bit patterns, in blocks.

_BLOCK = 2048


@_jit
def _f32_to_f16(b):
    """float16 bits of the float32 with bits ``b`` (nearest, ties to even)."""
    sign = (b >> 16) & 0x8000
    a = b & 0x7FFFFFFF
    if a >= 0x7F800000:
        return 0x7E00 if a > 0x7F800000 else sign | 0x7C00  # quiet NaN, sign dropped
    if a >= 0x477FF000:  # >= 65520: rounds to infinity
        return sign | 0x7C00
    if a >= 0x38800000:  # a normal half: rebias the exponent, round 23 -> 10 bits
        a -= 0x38000000
        return sign | ((a + 0xFFF + ((a >> 13) & 1)) >> 13)
    if a <= 0x33000000:  # at most 2^-25, half the smallest subnormal (a tie: to 0)
        return sign
    e = a >> 23  # a subnormal half: m * 2^(e - 150) in units of 2^-24
    return sign | _shift_even((a & 0x7FFFFF) | 0x800000, 126 - e)


@_jit
def _f32_to_bf16(b):
    """bfloat16 bits of the float32 with bits ``b`` (nearest, ties to even)."""
    if (b & 0x7FFFFFFF) > 0x7F800000:
        return 0x7FC0  # quiet NaN, sign dropped
    return (b + 0x7FFF + ((b >> 16) & 1)) >> 16


@_jit
def _narrow_block(tbits, out, start, n, bf16):
    if bf16:
        for j in range(n):
            out[start + j] = _f32_to_bf16(np.int64(tbits[j]))
    else:
        for j in range(n):
            out[start + j] = _f32_to_f16(np.int64(tbits[j]))


@_jit
def _sum_small32(a, b, out, wide32, bf16):
    tmp = np.empty(_BLOCK, np.float32)
    tbits = tmp.view(np.uint32)
    for start in range(0, out.shape[0], _BLOCK):
        n = min(_BLOCK, out.shape[0] - start)
        for j in range(n):
            tmp[j] = wide32[a[start + j]] + wide32[b[start + j]]
        _narrow_block(tbits, out, start, n, bf16)


@_jit
def _narrow32(src, out, divide, bf16):
    tmp = np.empty(_BLOCK, np.float32)
    tbits = tmp.view(np.uint32)
    m, _ = math.frexp(divide)
    inverse = np.float32(1.0 / divide)
    d = np.float32(divide)
    for start in range(0, out.shape[0], _BLOCK):
        n = min(_BLOCK, out.shape[0] - start)
        if divide == 1.0:
            for j in range(n):
                tmp[j] = src[start + j]
        elif m == 0.5:  # a power of two: its inverse is exact
            for j in range(n):
                tmp[j] = src[start + j] * inverse
        else:
            for j in range(n):
                tmp[j] = src[start + j] / d
        _narrow_block(tbits, out, start, n, bf16)


@_jit
def _narrow_all(src, out, divide, ebits, pbits):
    x = np.empty(1, np.float64)
    xbits = x.view(np.uint64)
    m, e = math.frexp(divide)
    if m == 0.5:  # a power of two: multiplying by its inverse is exact (and faster)
        inverse = 1.0 / divide
        for i in range(out.shape[0]):
            x[0] = np.float64(src[i]) * inverse
            out[i] = _narrow(xbits[0], ebits, pbits)
    else:
        for i in range(out.shape[0]):
            x[0] = np.float64(src[i]) / divide
            out[i] = _narrow(xbits[0], ebits, pbits)


@_jit
def _widen_all(src, out, multiply, wide):
    for i in range(out.shape[0]):
        out[i] = wide[src[i]] * multiply


_NATIVE = {"sum": _sum, "prod": _prod, "max": _max, "min": _min}
_SMALL = {"prod": _prod_small, "max": _max_small, "min": _min_small}
_U16 = np.dtype(np.uint16)


def _widened(patterns_as):
    """float64 value of each of the 65536 bit patterns (NaN patterns stay NaN)."""
    with np.errstate(invalid="ignore"):
        return patterns_as(np.arange(1 << 16, dtype=np.uint32)).astype(np.float64)


# dtype -> (exponent bits, fraction bits, float64 value of every bit pattern); bfloat16's
# entry is made by _small_format on first use, with ml_dtypes.
_SMALL_FORMATS = {
    np.dtype(np.float16): (5, 10, _widened(lambda p: p.astype(np.uint16).view(np.float16))),
}


def _float32_table(wide):
    with np.errstate(invalid="ignore"):  # NaN patterns stay NaN
        return wide.astype(np.float32)


_WIDE32 = {dtype: _float32_table(wide) for dtype, (_, _, wide) in _SMALL_FORMATS.items()}


def _small_format(dtype):
    """``_SMALL_FORMATS[dtype]`` for float16 and bfloat16 (KeyError for other dtypes)."""
    found = _SMALL_FORMATS.get(dtype)
    if found is None and is_bfloat16(dtype):
        found = (8, 7, _widened(lambda p: (p << 16).view(np.float32)))
        _WIDE32[dtype] = _float32_table(found[2])
        _SMALL_FORMATS[dtype] = found
    if found is None:
        raise KeyError(dtype)
    return found


# float16 kernels on uint16 arrays, callable from other compiled code (the
# shm small path, algorithms/_small.py); get_kernel's float16 kernels are
# these, so both paths give bitwise the same results.
_F16_WIDE = _SMALL_FORMATS[np.dtype(np.float16)][2]
_F16_WIDE32 = _WIDE32[np.dtype(np.float16)]


@_jit
def _sum_f16(a, b, out):
    _sum_small32(a, b, out, _F16_WIDE32, False)


@_jit
def _prod_f16(a, b, out):
    _prod_small(a, b, out, _F16_WIDE, 5, 10)


@_jit
def _max_f16(a, b, out):
    _max_small(a, b, out, _F16_WIDE, 5, 10)


@_jit
def _min_f16(a, b, out):
    _min_small(a, b, out, _F16_WIDE, 5, 10)


_HALF = {"sum": _sum_f16, "prod": _prod_f16, "max": _max_f16, "min": _min_f16}


def _half_kernel(fn):
    def kernel(a, b, out):
        fn(a.view(_U16), b.view(_U16), out.view(_U16))
    return kernel


def _small_sum(dtype):
    _small_format(dtype)
    wide32, bf16 = _WIDE32[dtype], is_bfloat16(dtype)

    def kernel(a, b, out):
        _sum_small32(a.view(_U16), b.view(_U16), out.view(_U16), wide32, bf16)
    return kernel


def _small_kernel(fn, dtype):
    ebits, pbits, wide = _small_format(dtype)

    def kernel(a, b, out):
        fn(a.view(_U16), b.view(_U16), out.view(_U16), wide, ebits, pbits)
    return kernel


def to_two_bytes(src, dtype, divide=1.0):
    """``src / divide`` rounded once to float16 or bfloat16 (a new array).

    The quotient is formed in float64 (correctly rounded; 53 bits make the
    second rounding harmless), so dividing first costs no extra rounding.
    numpy's own float32 -> float16 cast is 5-10x slower on subnormals.
    """
    dtype = as_dtype(dtype)
    ebits, pbits, _ = _small_format(dtype)
    out = np.empty(src.shape, dtype)
    if src.dtype == np.float32:
        _narrow32(src.reshape(-1), out.reshape(-1).view(_U16), float(divide), is_bfloat16(dtype))
    else:
        _narrow_all(src.reshape(-1), out.reshape(-1).view(_U16), float(divide), ebits, pbits)
    return out


def from_two_bytes(buf, dtype, multiply=1.0, out=None):
    """The float16/bfloat16 ``buf`` times ``multiply``, rounded once to ``dtype`` (float32/64)."""
    _, _, wide = _small_format(buf.dtype)
    if out is None:
        out = np.empty(buf.shape, dtype)
    _widen_all(buf.reshape(-1).view(_U16), out.reshape(-1), float(multiply), wide)
    return out


def _build(op, dtype):
    if dtype == np.float16:
        kernel = _half_kernel(_HALF[op])
    elif is_bfloat16(dtype):
        kernel = _small_sum(dtype) if op == "sum" else _small_kernel(_SMALL[op], dtype)
    else:
        kernel = _NATIVE[op]
    empty = np.empty(0, dtype)
    kernel(empty, empty, empty)  # compile (or load from cache) now
    return kernel


_cache = {}


def get_kernel(op, dtype):
    """Return the warmed kernel for canonical op name ``op`` (one of ``OPS``) and ``dtype``.

    Raises:
        TypeError: if ``dtype`` is not one of :data:`DTYPE_NAMES`.
        ValueError: for an op name that is not one of ``OPS``.
    """
    dtype = as_dtype(dtype)
    key = (op, dtype)
    kernel = _cache.get(key)
    if kernel is None:
        if op not in OPS:
            raise ValueError(f"unknown op name {op!r}; expected one of {', '.join(OPS)}")
        if dtype_code(dtype) < 0:
            raise TypeError(f"unsupported dtype {dtype}: pycollective reduces "
                            + ", ".join(DTYPE_NAMES))
        kernel = _cache[key] = _build(op, dtype)
    return kernel
