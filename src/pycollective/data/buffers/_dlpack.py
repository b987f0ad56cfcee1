"""DLPack, read as mpi4py reads it: a CPU tensor viewed in place, its capsule kept alive.

See the package docstring (:mod:`pycollective.data.buffers`) for why it is not
``np.from_dlpack``.
"""

import ctypes
from typing import Optional

import numpy as np

from ._common import RAW, BufferSpecError

KDL_CPU = 1
_READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManaged(ctypes.Structure):  # DLPack < 1.0, capsule "dltensor"
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class _DLManagedVersioned(ctypes.Structure):  # DLPack >= 1.0, capsule "dltensor_versioned"
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype, _capsule_valid.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

# DLPack (type code, bits) -> numpy dtype, for single-lane types numpy has (long
# double and its complex by their C size, as mpi4py maps them).
_DL_DTYPES = {(code, 8 * np.dtype(t).itemsize): np.dtype(t) for code, kinds in (
    (0, ("int8", "int16", "int32", "int64")), (1, ("uint8", "uint16", "uint32", "uint64")),
    (2, ("float16", "float32", "float64", "longdouble")),
    (5, ("complex64", "complex128", "clongdouble")), (6, ("bool",)))
    for t in kinds}


def dlpack_device(obj) -> Optional[int]:
    """The DLPack device type of ``obj``, or None if it does not speak DLPack."""
    try:
        dlpack, device = obj.__dlpack__, obj.__dlpack_device__
    except AttributeError:
        return None
    del dlpack
    return int(device()[0])


def _contiguous(shape, strides) -> bool:
    """C or Fortran contiguous, strides in elements; size-1 dimensions do not count."""
    if strides is None:
        return True
    for dims in (range(len(shape) - 1, -1, -1), range(len(shape))):
        expected, ok = 1, True
        for i in dims:
            if shape[i] > 1 and strides[i] != expected:
                ok = False
                break
            expected *= shape[i]
        if ok:
            return True
    return False


class _Exported:
    """Exposes a DLPack tensor's memory to numpy and keeps its capsule alive."""

    __slots__ = ("__array_interface__", "capsule")

    def __init__(self, capsule, address, count, dtype, readonly):
        self.capsule = capsule
        self.__array_interface__ = {"version": 3, "shape": (count,), "typestr": dtype.str,
                                    "data": (address, readonly)}


def from_dlpack(obj, name, writable) -> np.ndarray:
    """Flat view of a CPU DLPack tensor (see the module docstring)."""
    try:
        try:
            capsule = obj.__dlpack__(max_version=(1, 0), copy=False)
        except TypeError:  # a producer of DLPack < 1.0
            capsule = obj.__dlpack__()
    except BufferError as exc:  # the producer cannot export it (as a ValueError too)
        raise BufferSpecError(f"{name}: {exc}") from None
    if _capsule_valid(capsule, b"dltensor_versioned"):
        managed = _DLManagedVersioned.from_address(
            _capsule_pointer(capsule, b"dltensor_versioned"))
        if managed.major < 1:
            raise BufferSpecError(f"{name}: dlpack: unexpected version {managed.major}")
        readonly = bool(managed.flags & _READ_ONLY)
    elif _capsule_valid(capsule, b"dltensor"):
        managed = _DLManaged.from_address(_capsule_pointer(capsule, b"dltensor"))
        readonly = False
    else:
        raise BufferSpecError(f"{name}: dlpack: invalid capsule object")
    t = managed.dl_tensor
    if t.ndim < 0 or (t.ndim > 0 and not t.shape):
        raise BufferSpecError(f"{name}: dlpack: invalid shape")
    shape = [int(t.shape[i]) for i in range(t.ndim)]
    strides = [int(t.strides[i]) for i in range(t.ndim)] if t.strides else None
    if any(s < 0 for s in shape) or (strides and any(s < 0 for s in strides)):
        raise BufferSpecError(f"{name}: dlpack: negative shape or strides")
    if not _contiguous(shape, strides):
        raise BufferSpecError(f"{name} is not contiguous (dlpack: buffer is not contiguous; "
                              f"shape {tuple(shape)}, strides {tuple(strides)} in elements)")
    if writable and readonly:
        raise BufferSpecError(f"{name} is read-only (dlpack: buffer is not writable)")
    count = int(np.prod(shape, dtype=np.int64))
    code, bits, lanes = t.dtype.code, t.dtype.bits, t.dtype.lanes
    if code == 2 and lanes == 2:  # a complex number as two float lanes (mpi4py reads it so)
        code, bits, lanes = 5, 2 * bits, 1
    dtype = _DL_DTYPES.get((code, bits)) if lanes == 1 else None
    if dtype is None:
        count *= (bits * lanes + 7) // 8
        dtype = RAW
    if count == 0:
        return np.empty(0, dtype)
    array = np.asarray(_Exported(capsule, t.data + t.byte_offset, count, dtype, readonly))
    return array
