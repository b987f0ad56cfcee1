"""Where device buffers enter: the public collectives, the drop-in's methods, training.

Each entry classifies the buffers first (no MPI call), then: the MPI
library takes device pointers (:mod:`._aware`): the caller's native path;
else the buffers are bound to their library's backend and staged
(:mod:`._pipeline`); a buffer that cannot be staged makes this rank enter
the same collective with an :class:`~pycollective._buffers.Invalid` in its
place, so the agreement step raises on every rank, and this rank raises its
:class:`DeviceMemoryError` -- before any data moves.
"""

import operator

import numpy as np
from mpi4py import MPI

from .._buffers import Invalid, flat, is_in_place
from ._aware import gpu_aware, setting
from ._backends import DeviceBuffer, wrap
from ._classify import classify
from ._errors import DeviceMemoryError
from . import _pipeline

NOT_STAGED = object()


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
    from .._call import resolve_comm
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
        from .._kernels import get_kernel
        from .._ops import resolve_op
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
    from .._call import resolve_comm
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


# --- the drop-in ------------------------------------------------------------------------------

def _spec_buffer(arg):
    return arg[0] if isinstance(arg, (list, tuple)) and arg else arg


def _replace(arg, new):
    if isinstance(arg, (list, tuple)) and arg:
        return type(arg)([new, *arg[1:]])
    return new


def dropin(comm, name, blocking, buffer_count, args, kwargs):
    """A drop-in method's call with device buffers, staged; NOT_STAGED when it has none.

    ``name``: the method ("Allreduce", "Iallreduce", ...); ``blocking``: the
    name of its blocking form; ``buffer_count``: how many leading arguments
    are buffers (the keyword forms are read too).
    """
    names = ["sendbuf", "recvbuf"] if buffer_count == 2 else ["buf"]
    args = list(args)
    slots = []  # ("a", index) or ("k", keyword) of each buffer argument, in order
    for i, key in enumerate(names):
        if i < len(args):
            slots.append(("a", i))
        elif key in kwargs:
            slots.append(("k", key))
    values = [args[i] if kind == "a" else kwargs[i] for kind, i in slots]
    bare = [_spec_buffer(v) for v in values]
    if all(_device_kind(b) is None for b in bare):
        return NOT_STAGED
    if gpu_aware(comm):
        return NOT_STAGED  # the native call takes them (plans: a DeviceMemory fallback)

    def substitute(mapping):
        new_args, new_kwargs = list(args), dict(kwargs)
        for (kind, i), v, b in zip(slots, values, bare):
            if id(b) in mapping:
                if kind == "a":
                    new_args[i] = _replace(v, mapping[id(b)])
                else:
                    new_kwargs[i] = _replace(v, mapping[id(b)])
        return new_args, new_kwargs

    try:
        bound = _bind_all(bare, names[:len(bare)])
    except DeviceMemoryError as err:
        bad = Invalid(err)
        bad_args, bad_kwargs = substitute({id(b): bad for b in bare
                                           if _device_kind(b) is not None})
        getattr(comm, name)(*bad_args, **bad_kwargs)  # raises (here and everywhere)
        raise err
    nonblocking = name != blocking
    written = _written(blocking, comm, args, kwargs, bare)
    chunked = _chunked_allreduce(comm, blocking, values, bare, bound, args, kwargs)
    if chunked is not None:
        run, orders = chunked
        return _launch(comm, nonblocking, lambda c: run(c, orders), (args, kwargs))
    mirrors = _pipeline.Mirrors(list(bound.values()))
    views = dict(zip(bound, mirrors.views))
    host_args, host_kwargs = substitute(views)
    keys = list(bound)
    out = sorted({keys.index(id(b)) for i, b in enumerate(bare) if i in written and id(b) in bound})

    def run(c):
        try:
            mirrors.copy_in()
            getattr(c, blocking)(*host_args, **host_kwargs)
            mirrors.copy_out(out)
        finally:
            mirrors.release()
    return _launch(comm, nonblocking, run, (args, kwargs))


def _written(blocking, comm, args, kwargs, bare):
    """Indices (among the buffer arguments) the call writes on this rank."""
    rank = comm.Get_rank()
    if blocking == "Bcast":
        root = args[1] if len(args) > 1 else kwargs.get("root", 0)
        return {0} if rank != operator.index(root) else set()
    if blocking == "Reduce":
        root = args[3] if len(args) > 3 else kwargs.get("root", 0)
        return {1} if rank == operator.index(root) else set()
    return {1}


def _chunked_allreduce(comm, blocking, values, bare, bound, args, kwargs):
    """``(run(comm), orders)`` for an Allreduce of bare buffers whose op pycollective serves."""
    if blocking != "Allreduce" or len(values) != 2 or any(v is not b for v, b in zip(values, bare)):
        return None
    sendbuf, recvbuf = bare
    op = args[2] if len(args) > 2 else kwargs.get("op", MPI.SUM)
    from .._buffers import op_reason
    if op_reason(op)[1] is not None:
        return None  # not an op of pycollective's: whole mirrors, the native call on them
    dst = bound.get(id(recvbuf))
    if dst is None:
        return None  # device send, host receive: whole mirrors (the receive spec rules apply)
    in_place = is_in_place(sendbuf) or sendbuf is recvbuf
    src = MPI.IN_PLACE if in_place else bound.get(id(sendbuf))
    if src is None or (src is not MPI.IN_PLACE and (src.backend is not dst.backend
                                                    or src.dtype != dst.dtype
                                                    or src.count != dst.count)):
        return None  # the drop-in's own checks say what is wrong, on whole mirrors
    orders = (_pipeline.start_order(dst if in_place else src),
              None if in_place else _pipeline.start_order(dst))

    def run(c, orders):
        def host_call(s, d):
            c.Allreduce(s, d, op)

        def agree(values):
            out = np.empty_like(values)
            c.Allreduce(values, out, MPI.MAX)
            return out
        _pipeline.allreduce(src, dst, host_call, agree, orders)
    return run, orders


def _launch(comm, nonblocking, run, keep):
    """Run ``run(drop-in comm)`` now, or (nonblocking) on the drop-in's helper thread."""
    if not nonblocking:
        run(comm)
        return None
    from .._nonblocking import Job, engine_for
    from ..comm import Comm, _thread_multiple
    if not _thread_multiple() or comm.Get_size() == 1:
        run(comm)  # nothing to overlap with (or no helper): done now
        return MPI.Request()
    engine = engine_for(comm)

    def on_helper(helper):
        run(Comm(helper, algorithm=comm._algorithm, compress=comm._compress))
    return engine.submit(Job(on_helper, keep))


# --- training's arrays -------------------------------------------------------------------------

class HostArrays:
    """Host mirrors of a list or dict of arrays whose device ones are staged."""

    def __init__(self, arrays):
        from collections.abc import Mapping
        items = list(arrays.items()) if isinstance(arrays, Mapping) else list(enumerate(arrays))
        self.mirrors, self.errors = None, None
        bufs, where = [], []
        for key, obj in items:
            kind = _device_kind(obj)
            if kind is not None:
                try:
                    bufs.append(wrap(obj, kind, f"array {key!r}", setting()))
                    where.append(key)
                except DeviceMemoryError as err:
                    self.errors = err
        host = dict(items)
        if self.errors is not None:
            for key, obj in items:
                if _device_kind(obj) is not None:
                    host[key] = Invalid(self.errors)
        else:
            self.mirrors = _pipeline.Mirrors(bufs)
            for key, b, view in zip(where, bufs, self.mirrors.views):
                host[key] = view.reshape(tuple(getattr(b.obj, "shape", (view.size,))))
        self.host = host if isinstance(arrays, Mapping) else [host[k] for k, _ in items]
        self.count = len(bufs)

    def copy_in(self):
        if self.mirrors is not None:
            self.mirrors.copy_in()

    def copy_out(self):
        if self.mirrors is not None:
            self.mirrors.copy_out(range(self.count))

    def release(self):
        if self.mirrors is not None:
            self.mirrors.release()

    def run(self, fn, copy_back):
        """``fn(host arrays)`` between the copies in and (``copy_back``) out."""
        try:
            self.copy_in()
            result = fn(self.host)
            if copy_back:
                self.copy_out()
            return result
        finally:
            self.release()


def host_arrays(arrays):
    """:class:`HostArrays` of ``arrays`` when one is a device array, else None."""
    try:
        from collections.abc import Mapping
        values = arrays.values() if isinstance(arrays, Mapping) else list(arrays)
    except TypeError:
        return None
    if isinstance(arrays, (np.ndarray, str, bytes)):
        return None
    if all(_device_kind(v) is None for v in values):
        return None
    return HostArrays(arrays)
