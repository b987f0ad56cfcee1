"""Where device buffers enter the public collectives (the drop-in and training: :mod:`pycollective.comm.device`).

Each entry classifies the buffers first (no MPI call), then: the MPI
library takes device pointers (:mod:`pycollective.device._aware`): the caller's native path;
else the buffers are bound to their library's backend and staged
(:mod:`pycollective.device._pipeline`); a buffer that cannot be staged makes this rank enter
the same collective with an :class:`~pycollective.data.buffers.Invalid` in its
place, so the agreement step raises on every rank, and this rank raises its
:class:`DeviceMemoryError` -- before any data moves.
"""

import numpy as np
from mpi4py import MPI

from ..data.buffers import Invalid, flat, is_in_place
from ..device._aware import gpu_aware, setting
from ..device._backends import DeviceBuffer, wrap
from ..data.buffers._classify import classify
from ..data.buffers._device_error import DeviceMemoryError
from ..device import _pipeline
from ..data.buffers import device_reason, log_fallback
from ..data.ops import MPI_OPS, resolve_op
from .. import timeline as _timeline

__all__ = ["allreduce", "staged", "mpi_op", "native", "native_allreduce"]


# --- device memory to the MPI library's own call ------------------------------------------

def mpi_op(op):
    """The MPI op for a native fallback (names as pycollective reads them)."""
    return op if isinstance(op, MPI.Op) else MPI_OPS[resolve_op(op)]


def native(what, reason):
    """Say that the public ``what`` hands device memory to the MPI library (log, timeline)."""
    log_fallback(reason, f"pycollective.{what}")
    if _timeline.ACTIVE is not None:  # timeline hook: device memory goes to MPI's own call
        _timeline.ACTIVE.about(algorithm="native MPI (device memory)")


def native_allreduce(sendbuf, recvbuf, op, comm):
    """Device memory, to an MPI library that takes device pointers."""
    native("allreduce", device_reason(sendbuf, recvbuf))
    comm.Allreduce(sendbuf, recvbuf, mpi_op(op))
    return recvbuf

def _device_kind(obj):
    """The :class:`Kind` of a device buffer (not host-readable), else None."""
    if obj is None or type(obj) is np.ndarray or obj is MPI.IN_PLACE or isinstance(obj, Invalid):
        return None
    try:
        memoryview(obj)
        return None
    except TypeError:
        pass
    kind = classify(obj)
    return kind if kind is not None and not kind.host else None


def _bind_all(objs, names):
    """``{id(obj): DeviceBuffer}`` of the device buffers among ``objs`` (each once)."""
    bound = {}
    for obj, name in zip(objs, names):
        if id(obj) in bound:
            continue
        kind = _device_kind(obj)
        if kind is not None:
            bound[id(obj)] = wrap(obj, kind, name, setting())
    return bound


def _fail_everywhere(err, enter_invalid):
    """Enter the collective with invalid arguments (the others raise), then raise ``err``."""
    try:
        enter_invalid(Invalid(err))
    except (TypeError, ValueError):
        pass  # the agreement's error about this rank; this rank raises its own
    raise err


# --- the public functions ---------------------------------------------------------------------

def allreduce(public, sendbuf, recvbuf, op, comm, algorithm, timeout, compress, native):
    """:func:`pycollective.allreduce` with a device buffer: native, staged in chunks, or an error."""
    from .call import resolve_comm
    if gpu_aware(resolve_comm(comm)):
        return native()
    kw = {"comm": comm, "algorithm": algorithm, "timeout": timeout}
    in_place = is_in_place(sendbuf) or sendbuf is recvbuf
    try:
        bound = _bind_all([recvbuf, sendbuf], ["recvbuf", "sendbuf"])
        dst = bound.get(id(recvbuf)) or flat(recvbuf, "recvbuf", True)
        src = MPI.IN_PLACE if in_place else (bound.get(id(sendbuf))
                                             or flat(sendbuf, "sendbuf", False))
        _check_pair(src, dst)
        from ..data.kernels import get_kernel
        from ..data.ops import resolve_op
        get_kernel(resolve_op(op), dst.dtype)
    except (TypeError, ValueError) as err:
        _fail_everywhere(err, lambda bad: public(bad, bad, op, **kw))

    def host_call(s, d):
        public(s, d, op, compress=compress, **kw)

    def agree(values):
        out = np.empty_like(values)
        public(values, out, "max", comm=comm, timeout=timeout)
        return out
    _run_allreduce(src, dst, host_call, agree)
    return recvbuf


def _check_pair(src, dst):
    dtype = dst.dtype
    if src is MPI.IN_PLACE:
        return
    if src.dtype != dtype:
        raise TypeError(f"sendbuf has dtype {src.dtype} but recvbuf has {dtype}")
    count = lambda b: b.count if isinstance(b, DeviceBuffer) else b.size  # noqa: E731
    if count(src) != count(dst):
        raise ValueError(f"recvbuf has {count(dst)} elements but sendbuf has {count(src)}")


def _run_allreduce(src, dst, host_call, agree, orders=None):
    devices = [b for b in (src, dst) if isinstance(b, DeviceBuffer)]
    if len({b.backend for b in devices}) > 1:
        # Two libraries' buffers (e.g. a torch tensor into a CuPy array): whole mirrors,
        # each copied by its own library.
        mirrors = _pipeline.Mirrors(devices)
        try:
            mirrors.copy_in()
            host_call(mirrors.views[0], mirrors.views[1])
            mirrors.copy_out([1])
        finally:
            mirrors.release()
        return
    _pipeline.allreduce(src, dst, host_call, agree, orders)


def staged(public, bufs, names, written, call, native, comm):
    """A public collective other than allreduce with device buffers, staged whole.

    ``bufs``: its buffer arguments; ``call(*bufs)`` runs it; ``written``:
    the indices of the buffers it writes on this rank; ``native()`` the MPI
    library's own call.
    """
    from .call import resolve_comm
    if gpu_aware(resolve_comm(comm)):
        return native()
    try:
        bound = _bind_all(bufs, names)
    except DeviceMemoryError as err:
        _fail_everywhere(err, lambda bad: call(*[bad if _device_kind(b) is not None else b
                                                 for b in bufs]))
    order = list(bound.values())
    mirrors = _pipeline.Mirrors(order)
    try:
        mirrors.copy_in()
        views = {key: view for key, view in zip(bound, mirrors.views)}
        call(*[views.get(id(b), b) for b in bufs])
        keys = list(bound)
        out = sorted({keys.index(id(bufs[i])) for i in written if id(bufs[i]) in bound})
        mirrors.copy_out(out)
    finally:
        mirrors.release()
