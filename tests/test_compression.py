"""Compressed transport (pycollective.compression) on one rank: names, checks, rounding, the bound."""

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective import compression
from pycollective.data.kernels import BFLOAT16

SELF = MPI.COMM_SELF


@pytest.mark.parametrize("name, wire", [("fp16", np.float16), ("FP16", np.float16),
                                        ("float16", np.float16), ("bf16", BFLOAT16),
                                        ("bfloat16", BFLOAT16)])
def test_names(name, wire):
    assert compression.resolve(name).wire == np.dtype(wire)
    assert compression.resolve(None) is None and compression.resolve("none") is None


def test_objects_and_bad_names():
    class Identity:
        def compress(self, a):
            return a.copy(), None

        def decompress(self, buf, ctx):
            return buf

    ident = Identity()
    assert compression.resolve(ident) is ident
    with pytest.raises(ValueError, match="unknown compression 'int8'"):
        compression.resolve("int8")
    with pytest.raises(ValueError, match="no compress"):
        compression.resolve(object())
    x = np.arange(7, dtype=np.float32)
    out = np.empty_like(x)
    pycollective.allreduce(x, out, comm=SELF, compress=ident)
    assert np.array_equal(out, x)


def test_applies_to_floating_sums_only():
    assert compression.applies(np.float32, MPI.SUM) and compression.applies(BFLOAT16, "sum")
    assert not compression.applies(np.int32, MPI.SUM)
    assert not compression.applies(np.float32, MPI.MAX)


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_one_rank_rounds_once(name):
    """On one rank the result is the input rounded to the wire dtype and back (no division)."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(1000) * 100).astype(np.float32)
    out = np.empty_like(x)
    pycollective.allreduce(x, out, comm=SELF, compress=name)
    wire = compression.resolve(name).wire
    assert np.array_equal(out, x.astype(wire).astype(np.float32))
    inplace = x.copy()
    pycollective.allreduce(MPI.IN_PLACE, inplace, comm=SELF, compress=name)
    assert np.array_equal(inplace, out)
    bound = compression.resolve(name).error_bound(np.abs(x.astype(np.float64)), 1)
    assert np.all(np.abs(out.astype(np.float64) - x) <= bound)


def test_bound_grows_with_n_and_is_tight_for_one_rank():
    fp16, bf16 = compression.FP16, compression.BF16
    assert fp16.error_bound(1.0, 1) == pytest.approx(2.0 ** -11, rel=1e-3)
    assert bf16.error_bound(1.0, 1) == pytest.approx(2.0 ** -8, rel=1e-3)
    assert fp16.error_bound(1.0, 8) > 7 * 2.0 ** -11
    assert bf16.error_bound(1.0, 8) < 9 * 2.0 ** -8


@pytest.mark.parametrize("args, error, match", [
    ((np.ones(3, np.float32), np.ones(3, np.float32), MPI.MAX), ValueError, "sums only"),
    ((np.ones(3, np.int32), np.ones(3, np.int32), MPI.SUM), TypeError, "floating dtype"),
    ((np.ones(3, np.float32), np.ones(4, np.float32), MPI.SUM), ValueError, "4 elements"),
    ((np.ones(3, np.float32), np.ones(3, np.float64), MPI.SUM), TypeError, "differs"),
])
def test_bad_arguments(args, error, match):
    with pytest.raises(error, match=match):
        pycollective.allreduce(*args, comm=SELF, compress="fp16")


def test_uncompressed_ops_pass_through():
    x = np.array([3, 1, 2], np.int32)
    out = np.empty_like(x)
    pycollective.allreduce(x, out, MPI.MAX, comm=SELF, compress="none")
    assert np.array_equal(out, x)
