"""The ops and datatypes pycollective serves (else: the MPI library's own call); fallbacks' log."""

import logging
import threading

from mpi4py import MPI
from mpi4py.util import dtlib

from ..kernels import bfloat16, dtype_code
from ..ops import predefined_name, resolve_op

logger = logging.getLogger("pycollective")

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


_bfloat16 = []  # [the datatype], made at first use (MPI must be initialised)


def bfloat16_datatype() -> MPI.Datatype:
    """The MPI datatype that stands for bfloat16 arrays, which MPI has no name for.

    Two bytes without holes (a named duplicate of ``MPI.UINT16_T``): the MPI
    library can move it, and pycollective, which knows what it is, reduces
    it with its own kernels.  One per process, never freed (it lives as long
    as MPI does).
    """
    with _lock:
        if not _bfloat16:
            datatype = MPI.UINT16_T.Dup()
            datatype.Set_name("bfloat16 (pycollective)")
            _bfloat16.append(datatype)
        return _bfloat16[0]


def reduction_dtype(datatype):
    """``(numpy dtype, None)`` or ``(None, why pycollective cannot reduce datatype)``."""
    handle = MPI._handleof(datatype)
    cached = _reduction_cache.get(handle)
    if cached is not None:
        return cached
    if datatype == MPI.DATATYPE_NULL:
        return None, "datatype MPI.DATATYPE_NULL"
    if _bfloat16 and datatype == _bfloat16[0]:
        return bfloat16(), None
    if not datatype.is_predefined:
        return None, "derived datatype"
    name = _name(datatype)
    result = None, f"datatype {name} has no pycollective kernel"
    if not any(datatype == t for _, t in _NOT_ARITHMETIC):
        try:
            dtype = dtlib.to_numpy_dtype(datatype)
        except Exception:  # noqa: BLE001  (any datatype numpy cannot describe)
            dtype = None
        if dtype is not None and dtype_code(dtype) >= 0:
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
