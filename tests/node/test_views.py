"""Arrays at raw addresses in compiled code (``pycollective.node.views``)."""

import numba
import numpy as np
import pytest

from pycollective.node.views import address, as_writable, strided, view, writable_view


@numba.njit
def _add_through_view(at, n, dtype, value):
    a = view(at, n, dtype)
    for i in range(n):
        a[i] += value


@numba.njit
def _rows_sum(at, rows, count, stride, dtype):
    a = strided(at, rows, count, stride, dtype)
    return a.shape[0], a.shape[1], a.sum()


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint16])
def test_a_view_writes_the_array_at_the_address(dtype):
    x = np.arange(10, dtype=dtype)
    _add_through_view(address(x[3:]), 5, x.dtype, 1)
    expected = np.arange(10, dtype=dtype)
    expected[3:8] += 1
    assert np.array_equal(x, expected)


def test_address_is_that_of_the_first_element():
    x = np.zeros(16, np.float64)
    assert address(x) == x.ctypes.data
    assert address(x[5:]) == x.ctypes.data + 5 * 8


@pytest.mark.parametrize("rows, count, stride", [(3, 4, 10), (1, 7, 7), (4, 1, 5), (0, 3, 8)])
def test_strided_rows_cover_exactly_their_elements(rows, count, stride):
    # the gaps between rows and the words after the last one hold 1000s: a row that
    # started or ended in the wrong place would count them
    extent = max(0, (rows - 1) * stride + count)
    flat = np.full(extent + 8, 1000, np.int64)
    for q in range(rows):
        flat[q * stride:q * stride + count] = np.arange(q * stride, q * stride + count)
    got = _rows_sum(address(flat), rows, count, stride, flat.dtype)
    expected = sum(int(flat[q * stride + i]) for q in range(rows) for i in range(count))
    assert got == (rows, count, expected)


@pytest.mark.parametrize("dtype", ["float16", "float32", "int8", "uint64"])
@pytest.mark.parametrize("count", [0, 1, 7, 1000])
def test_as_writable_aliases_a_read_only_array_and_leaves_a_writable_one(dtype, count):
    """A read-only send buffer reaches the compiled steps as a writable alias of the same
    memory (numba would compile them again for its type); a writable one as itself."""
    data = np.arange(count).astype(dtype)
    assert as_writable(data) is data
    data.flags.writeable = False
    alias = as_writable(data)
    assert alias.flags.writeable and alias.dtype == data.dtype and alias.shape == data.shape
    assert np.array_equal(alias.view(np.uint8), data.view(np.uint8))
    if count:
        assert address(alias) == address(data)
        assert numba.typeof(alias) == numba.typeof(np.empty(count, dtype))


def test_as_writable_leaves_a_strided_read_only_array_as_it_is():
    """Only a C-contiguous array has an alias over its own bytes; a strided one is passed
    on unchanged (numba compiles for its type), never aliased over the wrong elements."""
    data = np.arange(20, dtype=np.float32)[::2]
    data.flags.writeable = False
    assert as_writable(data) is data
    grid = np.arange(12, dtype=np.int32).reshape(3, 4)
    grid.flags.writeable = False
    alias = as_writable(grid)
    assert alias.shape == (3, 4) and alias.flags.writeable and np.array_equal(alias, grid)


@numba.njit
def _view_of(array, dtype):
    v = writable_view(array, dtype)
    return v.ctypes.data, v.shape[0], v.sum()


def test_writable_view_is_the_read_only_arrays_memory():
    """In compiled code, a read-only array viewed by address (what shm's typed entries pass
    their callees): the same memory and values, typed writable."""
    data = np.arange(9, dtype=np.int32)
    data.flags.writeable = False
    assert numba.typeof(data).mutable is False
    at, n, total = _view_of(data, data.dtype)
    assert (at, n, total) == (address(data), 9, 36)
