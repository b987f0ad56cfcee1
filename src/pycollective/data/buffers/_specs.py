"""mpi4py's buffer specifications (``[buf, count, displ, datatype]``, vector specs), its errors."""

import operator
from typing import NamedTuple, Optional

import numpy as np
from mpi4py import MPI

from ..kernels import is_bfloat16
from ._common import RAW, Invalid
from ._datatypes import bfloat16_datatype
from ._dlpack import dlpack_device
from ._memory import memory

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
    if isinstance(msg, Invalid):  # an unreadable buffer: its error is raised when it is read
        return True
    return dlpack_device(msg) is not None or hasattr(msg, "__cuda_array_interface__")


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
    if is_bfloat16(mem.dtype):
        return bfloat16_datatype()
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
