import numpy as np
import pytest
from mpi4py import MPI

from pycollective.data.kernels import BFLOAT16, SUPPORTED_DTYPES, get_kernel, is_float
from pycollective.data.ops import OPS, resolve_op

NUMPY = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def _operands(dtype, n=1001, seed=0):
    rng = np.random.default_rng(seed)
    if is_float(dtype):
        a = rng.standard_normal(n) * 50
        b = rng.standard_normal(n) * 50
    else:
        info = np.iinfo(dtype)
        a = rng.integers(info.min, info.max, n, endpoint=True, dtype=dtype)
        b = rng.integers(info.min, info.max, n, endpoint=True, dtype=dtype)
    return a.astype(dtype), b.astype(dtype)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
def test_matches_numpy_bitwise(op, dtype):
    a, b = _operands(dtype)
    out = np.empty_like(a)
    get_kernel(op, dtype)(a, b, out)
    with np.errstate(all="ignore"):
        expected = NUMPY[op](a, b)  # integers wrap like C
    assert np.array_equal(out.view(np.uint8), expected.view(np.uint8))


@pytest.mark.parametrize("op", OPS)
def test_output_may_alias_an_input(op):
    a, b = _operands(np.dtype(np.float64), seed=1)
    expected = NUMPY[op](a, b)
    x = a.copy()
    get_kernel(op, np.float64)(x, b, x)
    assert np.array_equal(x, expected)
    y = b.copy()
    get_kernel(op, np.float64)(a, y, y)
    assert np.array_equal(y, expected)


def _specials(dtype, n):
    """Operands with every pairing of NaNs of two payloads, signed zeros, infinities and
    plain values (floats), or random integers, ``n`` elements each."""
    a, b = _operands(dtype, n=n, seed=2)
    if is_float(dtype):
        bits = np.dtype(f"u{dtype.itemsize}")
        one = np.array([1.0], dtype).view(bits)[0]
        sign = bits.type(1) << bits.type(8 * dtype.itemsize - 1)
        nan_a = np.array([np.nan], dtype).view(bits)[0] | bits.type(1)  # payloads differ
        nan_b = np.array([np.nan], dtype).view(bits)[0] | bits.type(2)
        vals = np.array([0, sign, nan_a, nan_b, one, one | sign,
                         np.array([np.inf], dtype).view(bits)[0]], bits)
        k = vals.size
        a.view(bits)[:k * k] = np.repeat(vals, k)
        b.view(bits)[:k * k] = np.tile(vals, k)
    return a, b


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
def test_in_place_is_bitwise_the_out_of_place_result(op, dtype):
    """The in-place forms (``out`` is ``a``, ``out`` is ``b``: every reduction's passes
    after the first) compute exactly what the out-of-place form does, NaN payloads and
    signed zeros included, at lengths around the vector width."""
    kernel = get_kernel(op, dtype)
    for n in (49, 64, 1001, 4099):
        a, b = _specials(dtype, n)
        expected = np.empty_like(a)
        with np.errstate(all="ignore"):
            kernel(a, b, expected)
            x = a.copy()
            kernel(x, b, x)
            y = b.copy()
            kernel(a, y, y)
        assert x.tobytes() == expected.tobytes(), (op, dtype, n, "out is a")
        assert y.tobytes() == expected.tobytes(), (op, dtype, n, "out is b")


@pytest.mark.parametrize("op", OPS)
def test_float16_every_pattern_against_numpy(op):
    """All 65536 half patterns against random partners; numpy rounds each op correctly."""
    a = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    rng = np.random.default_rng(2)
    for _ in range(3):
        b = rng.integers(0, 65536, a.size, dtype=np.uint32).astype(np.uint16).view(np.float16)
        out = np.empty_like(a)
        get_kernel(op, np.float16)(a, b, out)
        with np.errstate(all="ignore"):
            expected = NUMPY[op](a, b)
        nan = np.isnan(expected)
        assert np.array_equal(np.isnan(out), nan)
        assert np.array_equal(out[~nan].view(np.uint16), expected[~nan].view(np.uint16))


def _patterns(n=65536, seed=None, dtype=np.float16):
    """Every 16-bit pattern (seed None) or ``n`` random ones, as ``dtype``."""
    if seed is None:
        bits = np.arange(65536, dtype=np.uint32)
    else:
        bits = np.random.default_rng(seed).integers(0, 65536, n, dtype=np.uint32)
    return bits.astype(np.uint16).view(dtype)


_TOP = {np.dtype(np.float16): 2.0 ** 16, BFLOAT16: 2.0 ** 128}


def _round_reference(x, dtype):
    """Bits of float64 ``x`` rounded to ``dtype`` by nearest-neighbour search, ties to even.

    Independent of the kernels' integer rounding: the non-negative finite
    values in pattern order are increasing, so the two candidates come from a
    sorted search; the pattern after the largest finite value (infinity)
    stands for the next power of two, which makes overflow follow the same
    rule.  Differences are exact (Sterbenz).
    """
    dtype = np.dtype(dtype)
    inf_bits = int(np.array(np.inf, np.float64).astype(np.float32).astype(dtype).view(np.uint16))
    values = np.arange(inf_bits + 1, dtype=np.uint16).view(dtype).astype(np.float64)
    values[inf_bits] = _TOP[dtype]
    mag = np.abs(x)
    lo = np.searchsorted(values, mag, side="right") - 1
    lo = np.minimum(lo, inf_bits)
    hi = np.minimum(lo + 1, inf_bits)
    d_lo, d_hi = mag - values[lo], values[hi] - mag
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (lo % 2 == 1))
    bits = np.where(pick_hi, hi, lo).astype(np.uint16)
    bits[mag >= _TOP[dtype]] = inf_bits
    bits |= np.where(np.signbit(x), np.uint16(0x8000), np.uint16(0))
    return bits, np.isnan(x)


@pytest.mark.parametrize("op", ["sum", "prod"])
@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BFLOAT16], ids=str)
def test_two_byte_floats_round_once_from_float64(op, dtype):
    """Every pattern against random partners: float64 result rounded once, ties to even."""
    a = _patterns(dtype=dtype)
    for seed in (3, 4, 5):
        b = _patterns(a.size, seed, dtype)
        out = np.empty_like(a)
        get_kernel(op, dtype)(a, b, out)
        with np.errstate(all="ignore"):
            wide = NUMPY[op](a.astype(np.float64), b.astype(np.float64))
        want, nan = _round_reference(wide, dtype)
        got = out.view(np.uint16)
        assert np.array_equal(np.isnan(out.astype(np.float32)), nan)
        assert np.array_equal(got[~nan], want[~nan]), op


def test_bfloat16_sum_agrees_with_ml_dtypes_where_it_rounds_once():
    """ml_dtypes adds in float32 (24 >= 2*8+1 bits: one correct rounding); we must agree."""
    a = _patterns(dtype=BFLOAT16)
    b = _patterns(a.size, 6, BFLOAT16)
    out = np.empty_like(a)
    get_kernel("sum", BFLOAT16)(a, b, out)
    with np.errstate(all="ignore"):
        want = a + b
    nan = np.isnan(want.astype(np.float32))
    assert np.array_equal(np.isnan(out.astype(np.float32)), nan)
    assert np.array_equal(out.view(np.uint16)[~nan], want.view(np.uint16)[~nan])


def test_bfloat16_ties_subnormals_and_overflow():
    k = get_kernel("sum", BFLOAT16)
    out = np.empty(1, BFLOAT16)

    def add(x, y):
        k(np.array([x], BFLOAT16), np.array([y], BFLOAT16), out)
        return float(out[0])

    assert add(1.0, 2.0 ** -8) == 1.0                 # half an ulp of 1: tie to even
    assert add(1.0 + 2.0 ** -7, 2.0 ** -8) == 1.0 + 2.0 ** -6   # tie to even, upwards
    assert add(2.0 ** -133, 2.0 ** -133) == 2.0 ** -132          # subnormals add exactly
    big = float(np.array(3.3895313892515355e38, BFLOAT16))      # largest finite bfloat16
    assert np.isinf(add(big, big))
    assert add(big, 2.0 ** 118) == big    # below half an ulp of the largest: stays finite
    assert np.isinf(add(big, 2.0 ** 119))  # the tie goes to the even neighbour, infinity


@pytest.mark.parametrize("dtype", [np.float16, BFLOAT16, np.float32, np.float64], ids=str)
def test_max_min_are_symmetric_in_nan_and_signed_zero(dtype):
    """Partners combining (a, b) and (b, a) must get the same bits."""
    vals = np.array([0.0, -0.0, np.nan, 1.0, -1.0, np.inf, -np.inf], dtype)
    a = np.repeat(vals, vals.size)
    b = np.tile(vals, vals.size)
    for op in ("max", "min", "sum", "prod"):
        k = get_kernel(op, dtype)
        ab, ba = np.empty_like(a), np.empty_like(a)
        with np.errstate(all="ignore"):
            k(a, b, ab)
            k(b, a, ba)
        assert np.array_equal(np.isnan(ab), np.isnan(ba))
        ok = ~np.isnan(ab)
        assert np.array_equal(ab[ok].view(np.uint8), ba[ok].view(np.uint8)), op
    out = np.empty(2, dtype)
    get_kernel("max", dtype)(np.array([0.0, -0.0], dtype), np.array([-0.0, 0.0], dtype), out)
    assert not np.signbit(out).any()
    get_kernel("min", dtype)(np.array([0.0, -0.0], dtype), np.array([-0.0, 0.0], dtype), out)
    assert np.signbit(out).all()
    get_kernel("max", dtype)(np.array([np.nan, 1.0], dtype), np.array([1.0, np.nan], dtype), out)
    assert np.isnan(out).all()


def test_float16_rounds_ties_to_even_and_overflows_to_inf():
    one = np.float16(1.0)
    half_ulp = np.float16(2.0 ** -11)  # exactly half an ulp of 1.0
    out = np.empty(1, np.float16)
    get_kernel("sum", np.float16)(np.array([one]), np.array([half_ulp]), out)
    assert out[0] == one  # tie goes to the even neighbour 1.0
    get_kernel("sum", np.float16)(np.array([np.float16(65504)]), np.array([np.float16(16)]), out)
    assert np.isinf(out[0])


@pytest.mark.parametrize("spelling, name", [
    (MPI.SUM, "sum"), (MPI.PROD, "prod"), (MPI.MAX, "max"), (MPI.MIN, "min"),
    ("sum", "sum"), ("PROD", "prod"), ("Max", "max"), ("min", "min"),
])
def test_resolve_op(spelling, name):
    assert resolve_op(spelling) == name


@pytest.mark.parametrize("op", [MPI.LAND, MPI.BOR, MPI.MAXLOC, "avg", None, 3])
def test_resolve_op_rejects(op):
    with pytest.raises(ValueError, match="unsupported op"):
        resolve_op(op)


@pytest.mark.parametrize("dtype", [np.complex64, np.bool_, np.object_, np.dtype(">f4")], ids=str)
def test_unsupported_dtypes(dtype):
    with pytest.raises(TypeError, match="unsupported dtype"):
        get_kernel("sum", dtype)


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BFLOAT16], ids=str)
@pytest.mark.parametrize("src", [np.float32, np.float64], ids=str)
def test_conversions_round_once(dtype, src):
    """to_two_bytes matches a single correct rounding; from_two_bytes widens exactly."""
    from pycollective.data.kernels import from_two_bytes, to_two_bytes
    rng = np.random.default_rng(8)
    x = (rng.standard_normal(20000) * np.exp2(rng.uniform(-30, 20, 20000))).astype(src)
    x[:4] = [np.inf, -np.inf, np.nan, -0.0]
    with np.errstate(all="ignore"):
        for divide in (1, 3, 8):
            want, nan = _round_reference(x.astype(np.float64) / divide, dtype)
            got = to_two_bytes(x, dtype, divide)
            assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
            assert np.array_equal(got.view(np.uint16)[~nan], want[~nan]), divide
        wide = from_two_bytes(got, np.float64, 8)
        assert np.array_equal(wide[~nan], got[~nan].astype(np.float64) * 8)
        if dtype == BFLOAT16 and src == np.float32:  # ml_dtypes rounds float32 once, correctly
            assert np.array_equal(to_two_bytes(x, dtype).view(np.uint16)[4:],
                                  x.astype(dtype).view(np.uint16)[4:])


def test_dtype_codes_follow_the_names_and_refuse_other_byte_orders():
    from pycollective.data.kernels import DTYPE_NAMES, dtype_code
    assert [dtype_code(d) for d in SUPPORTED_DTYPES] == list(range(len(DTYPE_NAMES)))
    assert [str(d) for d in SUPPORTED_DTYPES] == list(DTYPE_NAMES)
    for other in (np.dtype(">f4"), np.dtype(np.bool_), np.dtype(np.complex64), np.dtype("V2")):
        assert dtype_code(other) == -1, other


# In a fresh interpreter: importing pycollective and reducing other dtypes leaves ml_dtypes
# unimported (its import costs more than the rest of pycollective's:
# docs/results/startup.md); bfloat16 by name, as a compression and as a model's dtype
# then works, importing it.
_LAZY_BFLOAT16 = """
import sys
import numpy as np
import pycollective
from pycollective.data import kernels
from pycollective.model import choose
out = pycollective.allreduce(np.arange(5, dtype=np.float32), np.empty(5, np.float32))
assert out.tolist() == [0, 1, 2, 3, 4], out
assert not kernels.is_bfloat16(np.dtype(np.uint16)) and kernels.is_float("float16")
assert "ml_dtypes" not in sys.modules, "imported before any bfloat16"
x = np.linspace(-3, 3, 7, dtype=np.float32)
got = pycollective.allreduce(x, np.empty_like(x), compress="bf16")
assert np.array_equal(got, x.astype(kernels.BFLOAT16).astype(np.float32)), got
assert "ml_dtypes" in sys.modules
assert kernels.as_dtype("bfloat16") == kernels.BFLOAT16 and kernels.is_float("bfloat16")
assert kernels.dtype_code(kernels.BFLOAT16) == kernels.DTYPE_NAMES.index("bfloat16")
assert choose(4, 1000, "bfloat16")
print("ok")
"""


def test_bfloat16_costs_nothing_until_a_bfloat16_is_used():
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", _LAZY_BFLOAT16], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
