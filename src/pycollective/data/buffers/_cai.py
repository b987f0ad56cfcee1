"""Pinned or managed memory seen through ``__cuda_array_interface__``, viewed in place.

The CPU reads such memory directly (:mod:`pycollective.data.buffers._classify`
says which CAI pointers are host-readable); it takes the host path as a
flat numpy view, as CPU DLPack tensors do.
"""

import numpy as np

from ._classify import read_cai
from ._common import BufferSpecError
from ._dlpack import _contiguous


def cai_host_view(obj, name, writable) -> np.ndarray:
    """A flat numpy view of CAI memory the CPU can read (pinned or managed)."""
    cai = read_cai(obj)
    ptr, readonly = cai["data"]
    dtype = np.dtype(cai["typestr"])
    shape = tuple(int(s) for s in cai["shape"])
    strides = cai.get("strides")
    if strides is not None:
        strides = [int(s) // dtype.itemsize for s in strides]
    if not _contiguous(shape, strides):
        raise BufferSpecError(f"{name} is not contiguous (__cuda_array_interface__ strides "
                              f"{cai.get('strides')})")
    if writable and readonly:
        raise BufferSpecError(f"{name} is read-only (__cuda_array_interface__)")
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        return np.empty(0, dtype)

    class _View:
        __slots__ = ("__array_interface__", "owner")

    view = _View()
    view.owner = obj
    view.__array_interface__ = {"version": 3, "shape": (count,), "typestr": dtype.str,
                                "data": (int(ptr), bool(readonly))}
    return np.asarray(view)
