"""shm's reduce-scatter-allgather step (algorithms/_rsag.py) without MPI: its compiled
hot loops vectorise, its slices lie on 64-byte lines, its call word tells calls apart."""

import platform
import re

import numba
import numpy as np
import pytest
from numba import types

from pycollective.algorithms.shm import rsag as _rsag

X86 = platform.machine().lower() in ("x86_64", "amd64")
# Packed (SIMD) adds, by element type: a loop compiled to scalar code has none of these.
PACKED_ADD = {types.float32: r"\bv?addps\b", types.float64: r"\bv?addpd\b",
              types.int32: r"\bv?paddd\b", types.int64: r"\bv?paddq\b", types.uint8: r"\bv?paddb\b"}


def _asm(function, element):
    """The assembly of ``function`` for ``element`` arrays, freshly compiled (numba gives
    none for code loaded from its cache)."""
    fresh = numba.njit(nogil=True)(function.py_func)
    arr = types.Array(element, 1, "C")
    sig = (types.Array(types.int64, 1, "C"), arr, arr, types.int64, types.int64,
           types.int64, types.int64)
    fresh.compile(sig)
    return fresh.inspect_asm(sig)


@pytest.mark.skipif(not X86, reason="reads x86 assembly")
@pytest.mark.parametrize("element", list(PACKED_ADD))
def test_the_step_folds_sum_with_packed_adds(element):
    """The step's fold of SUM (and the copies beside it) compile to SIMD code for the
    signatures a call uses; the older steps' strided rows compiled to scalar adds."""
    asm = _asm(_rsag._body, element)
    assert re.search(PACKED_ADD[element], asm), f"no packed add for {element}: scalar fold"
    assert re.search(r"\bv?movup[sd]\b|\bv?movdq[au]\b", asm), "no packed moves: scalar copies"


@pytest.mark.skipif(not X86, reason="reads x86 assembly")
def test_copies_are_packed():
    """The copy-in and copy-out loop, on the 1-D views the step takes."""
    fresh = numba.njit(nogil=True)(_rsag._copy.py_func)
    arr = types.Array(types.float32, 1, "C")
    fresh.compile((arr, arr))
    asm = fresh.inspect_asm((arr, arr))
    assert re.search(r"\bv?movups\b", asm), "the copy compiled to scalar moves"


@pytest.mark.skipif(not X86, reason="reads x86 assembly")
def test_waits_pause_between_passes():
    assert re.search(r"\bpause\b", _asm(_rsag._body, types.float32))


@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
@pytest.mark.parametrize("count", [0, 1, 15, 16, 17, 63, 64, 65, 1000, 4097, 262144])
@pytest.mark.parametrize("size", [2, 3, 4, 7, 16])
def test_slices_lie_on_lines_and_share_the_work(itemsize, count, size):
    bounds = _rsag.line_bounds(count, size, itemsize)
    per_line = 64 // itemsize
    assert bounds.dtype == np.int64 and bounds.size == size + 1
    assert bounds[0] == 0 and bounds[-1] == count
    assert np.all(np.diff(bounds) >= 0)
    assert all(b % per_line == 0 for b in bounds[:-1])  # every slice starts on a line
    lines = [-(-(int(hi) - int(lo)) // per_line) for lo, hi in zip(bounds, bounds[1:])]
    assert max(lines) - min(lines) <= 1  # whole lines each, within one of the others


def test_the_call_word_tells_calls_apart():
    values = np.arange(23, dtype=np.int64)
    fingerprint = np.arange(9, dtype=np.int64) * 3
    word = _rsag.call_word(5, values, fingerprint)
    assert word == _rsag.call_word(5, values.copy(), fingerprint.copy())
    assert word != _rsag.call_word(6, values, fingerprint)
    for array in (values, fingerprint):
        for j in range(2 if array is values else 0, array.size):
            changed = array.copy()
            changed[j] += 1
            args = (changed, fingerprint) if array is values else (values, changed)
            assert word != _rsag.call_word(5, *args), j
    # the number words of the row are the call number's, mixed in apart
    moved = values.copy()
    moved[:2] = 99, -99
    assert word == _rsag.call_word(5, moved, fingerprint)
