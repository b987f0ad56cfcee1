"""Device buffers in the drop-in's methods and in training's arrays (see :mod:`pycollective.collectives.device`).

A drop-in call with a device buffer runs on pinned host mirrors: the same
method of the same communicator, called with the mirrors in place of the
device buffers (so mpi4py's buffer specifications, the plans, their
fallbacks and errors apply unchanged), between the copies in and out;
``Allreduce`` of bare buffers with an op pycollective reduces goes through
the chunked pipeline instead.  Nonblocking forms do all of it on the
drop-in's helper thread: the request completes after the copy back.
"""

import operator

import numpy as np
from mpi4py import MPI

from ..data.buffers import Invalid, is_in_place
from .nonblocking import Job, engine_for, thread_multiple
from ..device._aware import gpu_aware, setting
from ..device._backends import wrap
from ..data.buffers._device_error import DeviceMemoryError
from ..collectives.device import _bind_all, _device_kind
from ..device import _pipeline

NOT_STAGED = object()


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
    if not kwargs and len(args) >= buffer_count and all(
            type(a) is np.ndarray or a is MPI.IN_PLACE for a in args[:buffer_count]):
        return NOT_STAGED  # the common case, decided without a look inside
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
    from ..data.buffers import op_reason
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
    if not thread_multiple() or comm.Get_size() == 1:
        run(comm)  # nothing to overlap with (or no helper): done now
        return MPI.Request()
    engine = engine_for(comm)

    def on_helper(helper):
        run(comm._adopt(MPI.Intracomm(helper)))  # a drop-in of the same settings
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
