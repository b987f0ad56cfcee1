"""Arrays at raw addresses, inside compiled code.

A compiled function called from Python pays for every argument before it
runs: numba types each one, about 0.15 µs an array and 13 ns a scalar
(docs/results/entry.md).  A prepared call that passes the
same arrays call after call can pass their addresses instead, as int64
words of one array, and take the views again inside: :func:`view`,
:func:`strided`.  Whoever stores an address keeps its array alive, and
its memory mapped, for as long as the address is used.
"""

import array as _array
import ctypes

import numba
import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["address", "view", "strided", "as_writable", "writable_view"]


def address(array) -> int:
    """The address of ``array``'s first element (as :func:`view` takes it): a numpy array,
    or an ``array.array`` (the bookkeeping words compiled entries share with Python)."""
    if type(array) is _array.array:
        return array.buffer_info()[0]
    return array.__array_interface__["data"][0]


def as_writable(array):
    """A writable alias of a read-only C-contiguous ``array``'s memory (same shape and
    dtype), for a compiled call that only reads it: numba types a read-only array apart
    from a writable one and compiles the whole callee again for it.  Any other array is
    returned as it is.  The alias lives no longer than the call; ``array`` must outlive it."""
    if array.flags.writeable or not array.flags.c_contiguous:
        return array
    memory = (ctypes.c_char * array.nbytes).from_address(address(array))
    return np.frombuffer(memory, array.dtype, array.size).reshape(array.shape)


@intrinsic
def _pointer(typingctx, at):
    """The int64 ``at`` as a ``void *``."""
    sig = types.voidptr(types.int64)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)
    return sig, codegen


@numba.njit(cache=True, nogil=True)
def view(at, shape, dtype):
    """A C-contiguous array of ``shape`` and ``dtype`` over the memory at address ``at``."""
    return numba.carray(_pointer(at), shape, dtype)


@numba.njit(cache=True, nogil=True)
def writable_view(array, dtype):
    """The 1-D C-contiguous ``array``'s memory as a writable array of ``dtype`` (same
    count), for a compiled entry that only reads it: a read-only array is typed apart from
    a writable one, and whatever the entry calls with it would compile again for that
    type; the entry's callees see only the writable view.  The Python side's twin is
    :func:`as_writable`."""
    return view(array.ctypes.data, array.shape[0], dtype)


@numba.njit(cache=True, nogil=True)
def strided(at, rows, count, stride, dtype):
    """``rows`` rows of ``count`` elements each, ``stride`` elements apart, from address ``at``
    (a 2-D view covering exactly the rows' elements, not the gaps after the last one)."""
    flat = view(at, (rows - 1) * stride + count if rows > 0 else 0, dtype)
    itemsize = flat.itemsize
    return np.lib.stride_tricks.as_strided(flat, (rows, count), (stride * itemsize, itemsize))
