"""What a buffer argument is: the one place that reads the objects collectives are given.

pycollective's public functions and its drop-in :class:`~pycollective.Comm`
accept what mpi4py accepts, read by the same rules, in the same order:

1. The buffer protocol (numpy arrays, ``array.array``, ``bytearray``,
   ``memoryview``, ...).  The memory must be contiguous (C or Fortran order)
   and, for a receive buffer, writable.
2. DLPack (``__dlpack__`` and ``__dlpack_device__``: torch and JAX CPU
   tensors, numpy, mpi4py's own test wrappers), for objects without the
   buffer protocol, and for those whose buffer is not contiguous (as mpi4py
   does, so a strided numpy array gets DLPack's "not contiguous" error).
   On the CPU the tensor is viewed in place, never copied.  As mpi4py does,
   the producer is asked for a versioned capsule
   (``__dlpack__(max_version=(1, 0), copy=False)``) and, if it does not
   take those arguments, for a legacy one; the capsule is read without being
   consumed and stays alive as long as the view (through the array's
   ``base``), so the producer frees the tensor when the view goes.  Why not
   ``np.from_dlpack``: it consumes the capsule and calls the producer's
   deleter when the array dies, which crashes with producers whose capsule
   frees the tensor itself (mpi4py's test wrappers do); reading it the
   way mpi4py does is safe with both kinds.  Strides are checked (C or F
   contiguous, as mpi4py's ``dlpack_is_contig``); a read-only tensor (flag
   of a versioned capsule) cannot be a receive buffer.
3. Device memory -- ``__cuda_array_interface__``, or a DLPack device other
   than the CPU -- cannot be read by the CPU: :class:`DeviceMemory` is
   raised with a one-line reason, and the caller falls back to the MPI
   library's own call (a CUDA-aware MPI handles it; pycollective never
   touches it).

mpi4py's buffer *specifications* (``[buf, datatype]``, ``[buf, count,
datatype]``, ``[buf, (count, displ), datatype]``, ``[buf, count, displ,
datatype]``, and for vector collectives ``[buf, counts, displs, datatype]``)
are parsed here too (:func:`parse`, :func:`vector_layout`), with mpi4py's
errors; so is the decision whether pycollective can serve an (op, datatype)
or must fall back (:func:`op_reason`, :func:`reduction_dtype`,
:func:`movable`), which depends only on arguments MPI requires to match on
every rank.

Errors: ``TypeError`` for what is not a buffer, :class:`BufferSpecError`
(both a ``BufferError``, as mpi4py raises, and a ``ValueError``, as the
agreement step carries) for memory that cannot be used as asked.  An
:class:`Invalid` wrapping an error stands for an argument that could not be
read at all: passed to a collective in its place, it raises that error in the
collective's local checks, so the agreement step reports it on every rank.

Layer 0: no communicator and no MPI call beyond datatype queries.
"""

import ctypes
import logging
import operator
import threading
from typing import NamedTuple, Optional

import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib

from ._kernels import SUPPORTED_DTYPES
from ._ops import predefined_name, resolve_op

__all__ = ["BufferSpecError", "Fallback", "DeviceMemory", "Invalid", "memory", "flat", "device_reason",
           "Spec", "parse", "spec_datatype", "spec_memory", "spec_array",
           "vector_layout", "op_reason",
           "reduction_dtype", "movable", "log_fallback", "is_in_place"]

logger = logging.getLogger("pycollective")


class BufferSpecError(BufferError, ValueError):
    """Memory that cannot be used as asked: not contiguous, or read-only for a receive buffer.

    A ``BufferError`` like mpi4py's, and a ``ValueError`` like pycollective's
    other argument errors (the agreement step carries those to every rank).
    """


class Fallback(Exception):
    """Not an error: this call goes to the MPI library's own collective; ``reason`` says why."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


class DeviceMemory(Fallback):
    """The buffer is device memory; ``reason`` says which kind."""


class Invalid:
    """Stands for a buffer argument that could not be read; using it raises ``error``."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


def is_in_place(obj) -> bool:
    """``MPI.IN_PLACE`` or ``None``, as mpi4py reads a send buffer."""
    return obj is None or obj is MPI.IN_PLACE


# --- DLPack, read as mpi4py reads it ------------------------------------------------------

_KDL_CPU = 1
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
RAW = np.dtype("V1")  # bytes of an element type numpy cannot name (bfloat16, vectors): MPI.BYTE


def _dlpack_device(obj) -> Optional[int]:
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


def _from_dlpack(obj, name, writable) -> np.ndarray:
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


# --- any buffer -----------------------------------------------------------------------------

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
        if _dlpack_device(obj) is None:
            raise BufferSpecError(f"{name} is not contiguous (buffer strides {view.strides})")
    device = _dlpack_device(obj)
    if device is not None:
        if device != _KDL_CPU:
            raise DeviceMemory(f"{name} is device memory (DLPack device type {device})")
        return _from_dlpack(obj, name, writable)
    if hasattr(obj, "__cuda_array_interface__"):
        raise DeviceMemory(f"{name} is device memory (__cuda_array_interface__)")
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
        device = _dlpack_device(obj)
        if device is not None and device != _KDL_CPU:
            return f"device memory (DLPack device type {device})"
        if device is None and hasattr(obj, "__cuda_array_interface__"):
            return "device memory (__cuda_array_interface__)"
    return None


# --- mpi4py buffer specifications -----------------------------------------------------------

class Spec(NamedTuple):
    """One buffer argument, split the way mpi4py splits it."""

    buf: object
    count: object = None       # int, or for vector specs a sequence (or int) of counts
    displ: object = None       # int, or for vector specs a sequence (or int) of displacements
    datatype: object = None


def _is_buffer(obj) -> bool:
    if isinstance(obj, np.ndarray):
        return True
    try:
        memoryview(obj)
    except TypeError:
        return False
    return True


def _is_datatype(obj) -> bool:
    return isinstance(obj, (MPI.Datatype, str))


def _bare(msg) -> bool:
    """A buffer object on its own (not a list/tuple spec), as mpi4py decides."""
    if _is_buffer(msg):
        return True
    if isinstance(msg, (list, tuple)):
        return False
    return _dlpack_device(msg) is not None or hasattr(msg, "__cuda_array_interface__")


def parse(msg, vector=False) -> Spec:
    """Split a buffer argument as mpi4py's ``message_simple`` (``vector``: ``message_vector``).

    ``[buf, x]`` is ``[buf, datatype]`` if x is one, else ``[buf, (count,
    displ)]`` if x is a pair, else ``[buf, count]``; a vector spec's pair
    must be a tuple (a list there is the counts).  Raises mpi4py's errors.
    """
    if _bare(msg):
        return Spec(msg)
    if not isinstance(msg, (list, tuple)):
        raise TypeError(f"message: expecting buffer or list/tuple, got {type(msg).__name__}")
    pair = tuple if vector else (list, tuple)
    if len(msg) == 2:
        buf, second = msg
        if _is_datatype(second):
            return Spec(buf, datatype=second)
        if isinstance(second, pair):
            count, displ = second
            return Spec(buf, count, displ)
        return Spec(buf, second)
    if len(msg) == 3:
        buf, count, datatype = msg
        if isinstance(count, pair):
            count, displ = count
            return Spec(buf, count, displ, datatype)
        return Spec(buf, count, None, datatype)
    if len(msg) == 4:
        return Spec(*msg)
    raise ValueError("message: expecting 2 to 4 items")


_by_code = {}  # numpy type code -> MPI datatype (predefined: never changes)


def _datatype_of(mem: np.ndarray) -> MPI.Datatype:
    if mem.dtype == RAW:
        return MPI.BYTE
    code = mem.dtype.char
    datatype = _by_code.get(code)
    if datatype is None:
        try:
            datatype = _by_code[code] = MPI.Datatype.fromcode(code)
        except (ValueError, KeyError):
            raise ValueError(f"cannot map {code!r} to MPI datatype") from None
    return datatype


def spec_datatype(spec: Spec, mem: Optional[np.ndarray]) -> MPI.Datatype:
    """The spec's datatype: explicit (an ``MPI.Datatype`` or a typecode), else the buffer's."""
    if spec.datatype is not None:
        if isinstance(spec.datatype, MPI.Datatype):
            return spec.datatype
        try:
            return MPI.Datatype.fromcode(spec.datatype)
        except (ValueError, KeyError):
            raise ValueError(f"cannot map {spec.datatype!r} to MPI datatype") from None
    if mem is None:
        raise ValueError("message: a None or MPI.BOTTOM buffer needs an explicit datatype")
    return _datatype_of(mem)


def spec_memory(spec: Spec, name, writable) -> Optional[np.ndarray]:
    """The spec's buffer as a flat array (None for a ``None`` buffer)."""
    if spec.buf is None:
        return None
    if spec.buf is MPI.BOTTOM:
        raise ValueError("message: MPI.BOTTOM buffers are not supported")
    try:
        return memory(spec.buf, name, writable)
    except TypeError:
        if isinstance(spec.buf, (list, tuple)) or not _bare(spec.buf):
            raise TypeError(f"a bytes-like object is required, not "
                            f"{type(spec.buf).__name__!r}") from None
        raise


def _raw(mem: Optional[np.ndarray]) -> np.ndarray:
    if mem is None:
        return np.empty(0, np.uint8)
    return mem.view(np.uint8) if mem.dtype.itemsize != 1 or mem.dtype != np.uint8 else mem


def spec_array(spec: Spec, mem: Optional[np.ndarray], dtype: np.dtype, name,
               blocks=1) -> np.ndarray:
    """View (no copy) of the elements a simple spec describes, as ``dtype``.

    With ``blocks`` > 1 (a receive buffer holding one block per rank, as
    mpi4py's ``message_simple`` reads it) an explicit count is per block and
    an inferred one must divide into ``blocks``; the view holds all blocks.
    """
    plain = spec.count is None and spec.displ is None
    if mem is not None and plain and mem.dtype == dtype and mem.size % blocks == 0:
        return mem
    if mem is None:
        count = 0 if spec.count is None else operator.index(spec.count)
        if count:
            raise ValueError(f"message: buffer is None but count is {count}")
        return np.empty(0, dtype)
    raw = _raw(mem)
    extent = dtype.itemsize
    offset = 0
    if spec.displ is not None:
        displ = operator.index(spec.displ)
        if displ < 0:
            raise ValueError(f"message: negative displacement {displ}")
        offset = displ * extent
        if offset > raw.size:
            raise ValueError(f"message: displacement {displ} out of bounds, "
                             f"number of datatype entries {raw.size // extent}")
    length = raw.size - offset
    if spec.count is None:
        if length % extent:
            raise ValueError(f"message: cannot infer count, buffer length {length} "
                             f"is not a multiple of datatype extent {extent}")
        count = length // extent
        if blocks > 1 and count % blocks:
            raise ValueError(f"message: cannot infer count, number of entries {count} is not "
                             f"a multiple of required number of blocks {blocks}")
    else:
        count = operator.index(spec.count)
        if count < 0:
            raise ValueError(f"message: negative count {count}")
        count *= blocks
        if count * extent > length:
            raise ValueError(f"{name}: count {count} needs {count * extent} bytes "
                             f"but the buffer has {length}")
    return raw[offset:offset + count * extent].view(dtype)


def vector_layout(spec: Spec, mem: Optional[np.ndarray], itemsize: int, blocks: int, name):
    """``(counts, displs)`` in elements of a vector spec over ``blocks`` ranks, checked.

    As mpi4py's ``message_vector``: no counts split the buffer's elements as
    evenly as possible (the first ranks one more); one integer count is
    every rank's; no displacements lay the blocks end to end; one integer
    displacement is a stride.  Every block must lie inside the buffer.
    """
    nbytes = 0 if mem is None else _raw(mem).size
    if spec.count is None:
        if nbytes % itemsize:
            raise ValueError(f"message: cannot infer count, buffer length {nbytes} "
                             f"is not a multiple of datatype extent {itemsize}")
        total = nbytes // itemsize
        counts = [total // blocks + (1 if i < total % blocks else 0) for i in range(blocks)]
    elif isinstance(spec.count, (int, np.integer)):
        counts = [operator.index(spec.count)] * blocks
    else:
        counts = [operator.index(c) for c in spec.count]
    if spec.displ is None:
        displs, at = [], 0
        for c in counts:
            displs.append(at)
            at += c
    elif isinstance(spec.displ, (int, np.integer)):
        displs = [operator.index(spec.displ) * i for i in range(blocks)]
    else:
        displs = [operator.index(d) for d in spec.displ]
    if len(counts) != blocks or len(displs) != blocks:
        raise ValueError(f"message: expecting {blocks} counts and displacements, got "
                         f"{len(counts)} and {len(displs)}")
    for q, (c, d) in enumerate(zip(counts, displs)):
        if c < 0 or d < 0:
            raise ValueError(f"message: negative count or displacement for rank {q}")
        if c and (d + c) * itemsize > nbytes:
            raise ValueError(f"{name}: block of rank {q} ({c} elements at {d}) lies outside "
                             f"the buffer of {nbytes // itemsize} elements")
    return counts, displs


# --- which ops and datatypes pycollective serves ------------------------------------------

def op_reason(op):
    """``(canonical op name, None)`` or ``(None, why pycollective cannot do op)``."""
    try:
        return resolve_op(op), None
    except ValueError:
        pass
    if isinstance(op, MPI.Op):
        name = predefined_name(op)
        if name is not None:
            return None, f"op MPI.{name} is not implemented by pycollective"
        return None, "user-defined op"
    return None, f"op {op!r} is not implemented by pycollective"


_lock = threading.Lock()
_reduction_cache = {}
_movable_cache = {}
_NOT_ARITHMETIC = ("MPI.BYTE", MPI.BYTE), ("MPI.PACKED", MPI.PACKED)


def _name(datatype) -> str:
    try:
        return datatype.Get_name() or repr(datatype)
    except MPI.Exception:
        return repr(datatype)


def reduction_dtype(datatype):
    """``(numpy dtype, None)`` or ``(None, why pycollective cannot reduce datatype)``."""
    handle = MPI._handleof(datatype)
    cached = _reduction_cache.get(handle)
    if cached is not None:
        return cached
    if datatype == MPI.DATATYPE_NULL:
        return None, "datatype MPI.DATATYPE_NULL"
    if not datatype.is_predefined:
        return None, "derived datatype"
    name = _name(datatype)
    result = None, f"datatype {name} has no pycollective kernel"
    if not any(datatype == t for _, t in _NOT_ARITHMETIC):
        try:
            dtype = dtlib.to_numpy_dtype(datatype)
        except Exception:  # noqa: BLE001  (any datatype numpy cannot describe)
            dtype = None
        if dtype is not None and dtype in SUPPORTED_DTYPES and dtype.isnative:
            result = dtype, None
        elif dtype is not None:
            result = None, f"datatype {name} ({dtype}) has no pycollective kernel"
    with _lock:
        _reduction_cache[handle] = result  # predefined handles never change
    return result


def movable(datatype):
    """``(element bytes, None)`` or ``(None, why)``: can a collective move it as plain bytes?

    True for any datatype, predefined or derived, whose elements are
    contiguous bytes without holes (lower bound 0, extent = size); gaps or
    a shifted lower bound are left to MPI.
    """
    if datatype == MPI.DATATYPE_NULL:
        return None, "datatype MPI.DATATYPE_NULL"
    predefined = datatype.is_predefined
    handle = MPI._handleof(datatype)
    if predefined:
        cached = _movable_cache.get(handle)
        if cached is not None:
            return cached
    size = datatype.Get_size()
    lb, extent = datatype.Get_extent()
    tlb, textent = datatype.Get_true_extent()
    if size > 0 and lb == 0 and tlb == 0 and extent == size == textent:
        result = size, None
    else:
        result = None, f"datatype {_name(datatype)} has holes (size {size}, extent {extent})"
    if predefined:
        with _lock:
            _movable_cache[handle] = result
    return result


# --- logging of fallbacks --------------------------------------------------------------------

_logged = set()


def log_fallback(reason, what="pycollective") -> None:
    """Log, once per reason, that a call goes to the MPI library's own collective."""
    with _lock:
        if reason in _logged:
            return
        _logged.add(reason)
    logger.info("%s: using the MPI library's own call: %s", what, reason)


def forget_logged(reason) -> None:
    """Let ``reason`` be logged again (for tests)."""
    with _lock:
        _logged.discard(reason)

