import numpy as np
import pytest
from mpi4py import MPI

from pycollective._kernels import SUPPORTED_DTYPES, get_kernel
from pycollective._ops import OPS, resolve_op

NUMPY = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def _operands(dtype, n=1001, seed=0):
    rng = np.random.default_rng(seed)
    if dtype.kind == "f":
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


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=str)
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
