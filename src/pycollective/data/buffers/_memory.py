"""Any buffer as a flat numpy view: the buffer protocol, then DLPack; device memory refused."""

from typing import Optional

import numpy as np
from mpi4py import MPI

from ._common import RAW, BufferSpecError, DeviceMemory, Invalid
from ._dlpack import dlpack_device, from_dlpack
from ._classify import HOST_DEVICES, classify, device_name
from ._cai import cai_host_view

def as_they_are(sendbuf, recvbuf) -> bool:
    """Whether two arguments are numpy arrays a reduction can take as they are, with no
    view or check of its own beside: ``recvbuf`` an ``np.ndarray`` (not a subclass),
    C-contiguous and writable; ``sendbuf`` ``MPI.IN_PLACE``, ``recvbuf`` itself, or an
    ``np.ndarray`` of its dtype and size, C-contiguous, that cannot overlap it."""
    if type(recvbuf) is not np.ndarray:
        return False
    flags = recvbuf.flags
    if not (flags.c_contiguous and flags.writeable):
        return False
    if sendbuf is MPI.IN_PLACE or sendbuf is recvbuf:
        return True
    if type(sendbuf) is not np.ndarray:
        return False
    sflags = sendbuf.flags
    # Two arrays that each own their memory are two allocations: they cannot overlap,
    # and saying so costs far less than np.may_share_memory.
    return (sflags.c_contiguous and sendbuf.dtype == recvbuf.dtype
            and sendbuf.size == recvbuf.size
            and (sflags.owndata and flags.owndata or not np.may_share_memory(sendbuf, recvbuf)))


def _not_a_buffer(obj, name):
    return TypeError(f"{name} must be a numpy array or a buffer (buffer protocol or DLPack), "
                     f"got {type(obj).__name__}")


def _numpy(buf, name, writable) -> np.ndarray:
    """Flat view of a contiguous numpy array, in memory order (subclasses as plain arrays)."""
    if type(buf) is not np.ndarray:
        if isinstance(buf, np.ma.MaskedArray):
            raise TypeError(f"{name} is a masked array: reduce its data explicitly "
                            "(e.g. arr.filled(0)) or its mask separately")
        # np.matrix, np.memmap, ...: the same memory as a plain array, so that
        # shapes and sizes mean what they mean for numpy arrays.
        buf = buf.view(np.ndarray)
    if not (buf.flags.c_contiguous or buf.flags.f_contiguous):
        raise BufferSpecError(f"{name} is not contiguous (strides {buf.strides}); "
                              "pass a contiguous array, e.g. np.ascontiguousarray(...)")
    if writable and not buf.flags.writeable:
        raise BufferSpecError(f"{name} is read-only")
    return buf.reshape(-1, order="A")


def memory(obj, name, writable) -> np.ndarray:
    """A flat numpy view (no copy) of any buffer mpi4py accepts.

    Args:
        obj: the buffer object (or an :class:`Invalid`).
        name: "sendbuf", "recvbuf", ... for messages.
        writable: it will be written to.

    Returns:
        A 1-d array over the object's memory, typed by its format (dtype
        :data:`RAW`, one byte per element, when numpy has no name for it).

    Raises:
        TypeError: not a buffer.
        BufferSpecError: not contiguous, or read-only when ``writable``.
        DeviceMemory: device memory (not an error: the caller falls back).
    """
    if isinstance(obj, np.ndarray):
        return _numpy(obj, name, writable)
    if isinstance(obj, Invalid):
        raise obj.error
    try:
        view = memoryview(obj)
    except TypeError:
        view = None
    except BufferError as exc:  # an exporter that refuses (as a ValueError too)
        raise BufferSpecError(f"{name}: {exc}") from None
    if view is not None:
        if view.c_contiguous or view.f_contiguous:
            if writable and view.readonly:
                raise BufferSpecError(f"{name} is read-only")
            try:
                return np.asarray(view).reshape(-1, order="A")
            except (TypeError, ValueError):  # a format numpy cannot read: raw bytes
                return np.frombuffer(view.cast("B"), RAW)
        if dlpack_device(obj) is None:
            raise BufferSpecError(f"{name} is not contiguous (buffer strides {view.strides})")
    device = dlpack_device(obj)
    if device is not None:
        if device not in HOST_DEVICES:  # pinned and managed memory: read in place
            raise DeviceMemory(f"{name} is device memory (DLPack device type {device}, "
                               f"{device_name(device)})")
        return from_dlpack(obj, name, writable)
    kind = classify(obj)
    if kind is not None:
        if not kind.host:
            raise DeviceMemory(f"{name} is device memory (__cuda_array_interface__)")
        return cai_host_view(obj, name, writable)
    raise _not_a_buffer(obj, name)


def flat(obj, name, writable) -> np.ndarray:
    """:func:`memory` for the public functions: numpy arrays first, other buffers by the same rules."""
    if type(obj) is np.ndarray or isinstance(obj, np.ndarray):
        return _numpy(obj, name, writable)
    return memory(obj, name, writable)


def device_reason(*objs) -> Optional[str]:
    """Why one of ``objs`` is device memory, or None (numpy arrays and host buffers: None).

    Cheap for the common case: numpy arrays and ``MPI.IN_PLACE`` are not looked into.
    """
    for obj in objs:
        if obj is None or type(obj) is np.ndarray or obj is MPI.IN_PLACE:
            continue
        if isinstance(obj, (list, tuple)) and obj:
            obj = obj[0]
        try:
            memoryview(obj)
            continue
        except TypeError:
            pass
        kind = classify(obj)
        if kind is not None and not kind.host:
            return f"device memory ({kind.describe()})"
    return None
