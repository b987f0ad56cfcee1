"""Drop-in communicator for mpi4py training scripts.

A script that averages gradients with ``comm.Allreduce(MPI.IN_PLACE, grad,
op=MPI.SUM)`` switches to pycollective by changing one line::

    comm = pycollective.Comm(MPI.COMM_WORLD)          # was: MPI.COMM_WORLD

How it is built
---------------
* :class:`Comm` subclasses ``MPI.Intracomm`` and shares the wrapped
  communicator's MPI handle (the way ``mpi4py.util.pkl5`` wraps one), so
  ``isinstance`` checks, ``Get_rank``, lowercase ``allreduce``,
  point-to-point calls and everything else run mpi4py's own code on the same
  communicator.  Replaced are the buffer collectives of data-parallel
  training -- ``Allreduce``, ``Reduce_scatter_block``, ``Reduce_scatter``,
  ``Allgather``, ``Allgatherv``, ``Reduce``, ``Bcast`` -- and their
  nonblocking forms (``Iallreduce``, ``Ireduce_scatter_block``, ...); the
  constructors of new communicators (``Dup``, ``Split``, ``Create``, ...)
  return wrapped communicators with the same algorithms.
* Each replaced call reads its buffer arguments the way mpi4py does
  (:mod:`pycollective._buffers`: any buffer, CPU DLPack tensors, ``[buf,
  datatype]``, ``[buf, count, datatype]``, ``[buf, (count, displ),
  datatype]``, ``[buf, count, displ, datatype]``, vector specs with counts
  and displacements, datatypes as ``MPI.FLOAT`` or typecodes like ``"f"``;
  ``MPI.IN_PLACE`` or ``None`` as sendbuf; the same object as both buffers
  means in place), views the described memory as numpy arrays (no copy) and
  calls the public function (:func:`pycollective.allreduce`,
  :func:`~pycollective.reduce_scatter`, ...).  Their argument checks and
  cross-rank agreement therefore apply unchanged: a count mismatch on one
  rank raises ValueError naming both counts on every rank, before any data
  moves.  Collectives that only move data (Allgather(v), Bcast) move bytes,
  so they take any datatype without holes, derived ones included.
* Fallback.  Whether pycollective can run a call depends only on the op,
  the datatype and the kind of memory, which MPI requires to be the same on
  every rank, so all ranks take the same path.  User-defined ops, ops other
  than SUM, PROD, MAX and MIN, datatypes without a pycollective kernel
  (complex, bool, long double, ``MPI.BYTE``, derived ones) for the
  reductions, datatypes with holes for the data movers, and device memory
  (``__cuda_array_interface__``, a non-CPU DLPack device) go to the wrapped
  communicator's own call (identical results, by construction), and the
  reason is logged once per reason (INFO on the ``"pycollective"`` logger).
* A buffer argument that cannot be read on one rank (not a buffer, count
  larger than the buffer, unknown typecode, a strided tensor) still takes
  part in the collective: the rank enters the same pycollective call with an
  :class:`~pycollective._buffers.Invalid` argument, so the agreement step
  makes every rank raise ("invalid arguments on rank r: ...") instead of
  waiting, and the rank itself raises the precise error, mpi4py's type
  included (``BufferError`` for a strided or read-only tensor).
* ``algorithm``: one name for every collective that has an algorithm of that
  name ("ring" exists for all but bcast), "auto" elsewhere; or a mapping
  ``{"allreduce": "shm", "bcast": "chain", ...}``.

Nonblocking collectives and how they overlap
--------------------------------------------
``Iallreduce`` and the other nonblocking forms return a :class:`Request`.
With ``MPI_THREAD_MULTIPLE`` (mpi4py's default) each communicator gets, on
its first nonblocking call, one helper thread with its OWN private duplicate
of the communicator (not the one :func:`pycollective._context.get_context`
caches for blocking calls, so messages of the two threads can never match
each other and the two never share scratch buffers).  Requests are queued
and run one after the other in submission order, which is the same on every
rank because the calls are collective.  The helper runs the same public
functions; while it waits in MPI or reduces in the numba kernels (compiled
``nogil``) it does not hold the GIL, so the caller's Python and numpy work
(numpy releases the GIL in large operations) proceeds in parallel: that is
the overlap.  Each request is an MPI generalized request completed by the
helper, so ``MPI.Request.Waitall`` (and ``Testall``/``Waitany``) accept them
next to native requests; :meth:`Request.Wait`/:meth:`Request.Test`
additionally re-raise the helper's exception on the caller's thread, and
block on a sleeping event rather than in MPI's busy-polling wait, which
would steal the core the helper needs.  Without ``MPI_THREAD_MULTIPLE`` (and
for the fallbacks) the nonblocking calls are the wrapped communicator's
native ones.  ``Ireduce_scatter`` without counts first gathers every rank's
receive count, blocking, as mpi4py does.

As with MPI, the send buffer must not be modified and the receive buffer is
undefined until the request completes; pycollective itself never writes to
the send buffer.
"""

import atexit
import logging
import operator
import queue
import sys
import threading
import time
from typing import Callable, NamedTuple, Optional

import numpy as np
from mpi4py import MPI

from . import _settings
from . import compression as _compression
from ._buffers import (Fallback, Invalid, is_in_place, log_fallback, movable, op_reason, parse,
                       reduction_dtype, spec_array, spec_datatype, spec_memory, vector_layout)
from ._collectives import (COLLECTIVES, algorithms, allgather, allgatherv, allreduce, bcast,
                           reduce, reduce_scatter)  # looked up at each call (tests spy on them)
from ._context import Key, comm_settings, duplicate, get_context, live_contexts
from ._kernels import BFLOAT16, get_kernel

__all__ = ["Comm", "Request"]

logger = logging.getLogger("pycollective")


def _log_once(reason):
    log_fallback(reason, "pycollective.Comm")


# --- reading a call's arguments: pycollective, native, or an error ----------------------------

class _Plan(NamedTuple):
    """What one drop-in call resolves to, before any message."""

    run: Optional[Callable]          # run(comm, algorithm kwargs): the pycollective call
    reason: Optional[str] = None     # set: the native call, for this reason
    error: Optional[BaseException] = None  # set: raise it (after run has told the others)


def _plan(resolve, enter_invalid, *args) -> _Plan:
    """``resolve(*args)`` -> run; a fallback -> native; an error -> an invalid entry.

    ``enter_invalid(bad)`` makes the same public call with the unreadable
    argument ``bad``, so the other ranks raise from the agreement instead of
    waiting for this one.
    """
    try:
        return _Plan(resolve(*args))
    except Fallback as why:
        return _Plan(None, reason=why.reason)
    except (TypeError, ValueError) as exc:
        bad = Invalid(exc)
        return _Plan(lambda comm, kw: enter_invalid(bad, comm, kw), error=exc)


def _read(msg, name, writable, vector=False):
    """``(spec, memory, datatype)`` of one buffer argument (mpi4py's errors)."""
    spec = parse(msg, vector)
    mem = spec_memory(spec, name, writable)
    return spec, mem, spec_datatype(spec, mem)


def _op(op):
    opname, reason = op_reason(op)
    if reason is not None:
        raise Fallback(reason)
    return opname


def _reduction_type(datatype):
    dtype, reason = reduction_dtype(datatype)
    if reason is not None:
        raise Fallback(reason)
    return dtype


def _byte_type(datatype):
    itemsize, reason = movable(datatype)
    if reason is not None:
        raise Fallback(reason)
    return np.dtype((np.void, itemsize))


def _send_array(sendbuf, rtype, dtype, blocks=1):
    """The send buffer of a reduction, as ``dtype``; mpi4py's datatype check."""
    sspec, smem, stype = _read(sendbuf, "sendbuf", writable=False)
    sdtype, _ = reduction_dtype(stype)
    # Same element type under two names (MPI.LONG and "q") is fine.
    if sdtype is None or (stype != rtype and sdtype != dtype):
        raise ValueError("mismatch in send and receive MPI datatypes")
    return spec_array(sspec, smem, sdtype, "sendbuf", blocks)


def _same_count(src, dst):
    if src.size != dst.size:  # as mpi4py says it, before any message
        raise ValueError(f"mismatch in send count {src.size} and receive count {dst.size}")


def _bytes(array):
    return array.view(np.uint8)


# Public calls with an unreadable argument (see _plan).
def _invalid_allreduce(bad, comm, kw):
    allreduce(bad, bad, comm=comm, **{k: v for k, v in kw.items() if k != "compress"})


def _invalid_allgather(bad, comm, kw):
    allgatherv(bad, bad, (), comm=comm, **kw)


def _invalid_reduce(bad, comm, kw):
    reduce(bad, bad, comm=comm, **kw)


def _invalid_bcast(bad, comm, kw):
    bcast(bad, comm=comm, **kw)


def _unnamed(buf):
    """A numpy array of a dtype pycollective reduces but MPI cannot name (bfloat16)."""
    return isinstance(buf, np.ndarray) and buf.dtype == BFLOAT16


def _allreduce_plan(sendbuf, recvbuf, op):
    opname = _op(op)
    in_place = is_in_place(sendbuf) or sendbuf is recvbuf
    if _unnamed(recvbuf) and (in_place or _unnamed(sendbuf)):
        # A dtype MPI has no datatype for (bfloat16): pycollective moves its
        # bytes and reduces it itself.
        src = MPI.IN_PLACE if in_place else sendbuf
        get_kernel(opname, recvbuf.dtype)

        def run_unnamed(comm, kw):
            allreduce(src, recvbuf, opname, comm=comm, **_compress_kw(kw, recvbuf.dtype, opname))
        return run_unnamed
    rspec, rmem, rtype = _read(recvbuf, "recvbuf", writable=True)
    dtype = _reduction_type(rtype)
    dst = spec_array(rspec, rmem, dtype, "recvbuf")
    if is_in_place(sendbuf) or sendbuf is recvbuf:
        src = MPI.IN_PLACE
    else:
        src = _send_array(sendbuf, rtype, dtype)
        _same_count(src, dst)
    get_kernel(opname, dtype)  # compiled on the caller's thread, not a helper's

    def run(comm, kw):
        allreduce(src, dst, opname, comm=comm, **_compress_kw(kw, dtype, opname))
    return run


def _compress_kw(kw, dtype, opname):
    """``kw`` without the compressor unless this call is a floating sum it applies to."""
    if "compress" in kw and not _compression.applies(dtype, opname):
        kw = {k: v for k, v in kw.items() if k != "compress"}
    return kw


def _reduce_plan(sendbuf, recvbuf, op, root, rank):
    opname = _op(op)
    if rank == root:
        rspec, rmem, rtype = _read(recvbuf, "recvbuf", writable=True)
        dtype = _reduction_type(rtype)
        dst = spec_array(rspec, rmem, dtype, "recvbuf")
        src = MPI.IN_PLACE if is_in_place(sendbuf) or sendbuf is recvbuf else \
            _send_array(sendbuf, rtype, dtype)
        if src is not MPI.IN_PLACE:
            _same_count(src, dst)
    else:
        # The receive buffer means nothing here (mpi4py does not read it).
        sspec, smem, stype = _read(sendbuf, "sendbuf", writable=False)
        dtype = _reduction_type(stype)
        src, dst = spec_array(sspec, smem, dtype, "sendbuf"), None
    get_kernel(opname, dtype)

    def run(comm, kw):
        reduce(src, dst, opname, root=root, comm=comm, **kw)
    return run


def _gather_counts(comm, count):
    """Every rank's receive count (-1 from a rank whose arguments could not be read)."""
    counts = np.empty(comm.Get_size(), np.int64)
    allgather(np.array([count], np.int64), counts, comm=comm)
    return counts.tolist()


def _reduce_scatter_plan(sendbuf, recvbuf, counts, op, nranks, rank):
    """Reduce_scatter (``counts`` a list, or None: gathered when the call runs)
    and Reduce_scatter_block (``counts="block"``)."""
    opname = _op(op)
    rspec, rmem, rtype = _read(recvbuf, "recvbuf", writable=True)
    dtype = _reduction_type(rtype)
    block = isinstance(counts, str)
    if not block and counts is not None:
        counts = [operator.index(c) for c in counts]
        if len(counts) != nranks:
            raise ValueError(f"expecting {nranks} recvcounts, got {len(counts)}")
    if is_in_place(sendbuf) or sendbuf is recvbuf:
        # MPI: the input is the whole receive buffer, the result goes to its start.
        src = spec_array(rspec, rmem, dtype, "recvbuf", nranks if block else 1)
        if counts is None:
            raise ValueError("Reduce_scatter in place needs recvcounts")
        dst = None
    else:
        dst = spec_array(rspec, rmem, dtype, "recvbuf")
        src = _send_array(sendbuf, rtype, dtype, nranks if block else 1)
        if block and src.size // nranks != dst.size:
            raise ValueError(f"mismatch in send count {src.size // nranks} "
                             f"and receive count {dst.size}")
    get_kernel(opname, dtype)

    def run(comm, kw):
        if block:  # equal blocks: partition's
            agreed, mine = None, src.size // nranks
        else:
            agreed = counts if counts is not None else _gather_counts(comm, dst.size)
            unread = [str(q) for q, c in enumerate(agreed) if c < 0]
            if unread:  # -1: that rank's own call raises why; this one names it
                bad = Invalid(ValueError(f"rank {', '.join(unread)} could not read its "
                                         "Reduce_scatter arguments"))
                reduce_scatter(bad, bad, comm=comm, **kw)
            mine = agreed[rank]
        out = dst if dst is not None else np.empty(min(mine, src.size), dtype)
        reduce_scatter(src, out, opname, counts=agreed, comm=comm, **kw)
        if dst is None:
            src[:out.size] = out
    return run


def _allgather_plan(sendbuf, recvbuf, nranks, rank, vector):
    """Allgather(v) as bytes: the receive layout in elements of the receive datatype."""
    rspec, rmem, rtype = _read(recvbuf, "recvbuf", writable=True, vector=vector)
    element = _byte_type(rtype)
    item = element.itemsize
    if vector:
        counts, displs = vector_layout(rspec, rmem, item, nranks, "recvbuf")
        base = _bytes(rmem) if rmem is not None else np.empty(0, np.uint8)
        starts = [d * item for d in displs]
    else:
        base = _bytes(spec_array(rspec, rmem, element, "recvbuf", nranks))
        counts, starts = [base.size // item // nranks] * nranks, None
    nbytes = [c * item for c in counts]
    if is_in_place(sendbuf):
        src = MPI.IN_PLACE
    else:
        sspec, smem, stype = _read(sendbuf, "sendbuf", writable=False)
        src = _bytes(spec_array(sspec, smem, _byte_type(stype), "sendbuf"))
        if src.size != nbytes[rank]:
            raise ValueError(f"mismatch in send size {src.size} bytes and this rank's "
                             f"receive block of {nbytes[rank]} bytes")

    def run(comm, kw):
        allgatherv(src, base, nbytes, starts, comm=comm, **kw)
    return run


def _bcast_plan(buf, root, rank):
    spec, mem, datatype = _read(buf, "buf", writable=rank != root)
    data = _bytes(spec_array(spec, mem, _byte_type(datatype), "buf"))

    def run(comm, kw):
        bcast(data, root=root, comm=comm, **kw)
    return run


# --- the communicator ------------------------------------------------------------------------

def _thread_multiple():
    return MPI.Query_thread() >= MPI.THREAD_MULTIPLE


def _algorithm_map(algorithm):
    """``{collective: name}`` of a ``Comm``'s ``algorithm`` argument; ValueError if unknown."""
    if algorithm is None or algorithm == "auto":
        return {}
    if isinstance(algorithm, str):
        found = {c: algorithm for c in COLLECTIVES if algorithm in algorithms(c)}
        if not found:
            raise ValueError(f"unknown algorithm {algorithm!r}; registered: "
                             + "; ".join(f"{c}: {', '.join(algorithms(c))}" for c in COLLECTIVES))
        return found
    chosen = {}
    for collective, name in dict(algorithm).items():
        if collective not in COLLECTIVES:
            raise ValueError(f"unknown collective {collective!r}; one of {', '.join(COLLECTIVES)}")
        if name != "auto":
            if name not in algorithms(collective):
                raise ValueError(f"unknown algorithm {name!r} for {collective}; registered: "
                                 + ", ".join(algorithms(collective)))
            chosen[collective] = name
    return chosen


def _native_send(sendbuf, recvbuf):
    # MPI forbids the same buffer twice; mpi4py users mean in place.
    return MPI.IN_PLACE if sendbuf is recvbuf and sendbuf is not None else sendbuf


class Comm(MPI.Intracomm):
    """An mpi4py intracommunicator whose buffer collectives run pycollective.

    Args:
        comm: the ``MPI.Intracomm`` to wrap (the handle is shared, not
            duplicated); ``None`` gives a null communicator, as
            ``MPI.Intracomm()`` does.
        algorithm: ``None`` or "auto" for pycollective's automatic choice; a
            name, used by every collective that has an algorithm of that
            name (:func:`pycollective.algorithms`); or a mapping from
            collective ("allreduce", "reduce_scatter", "allgather", "bcast",
            "reduce") to a name.
        compress: None, "fp16", "bf16" or a compressor object
            (:mod:`pycollective.compression`): ``Allreduce``/``Iallreduce``
            sums of floating buffers travel compressed; other calls do not.

    Raises:
        TypeError: ``comm`` is not an intracommunicator.
        ValueError: unknown algorithm, collective name or compression.
    """

    def __new__(cls, comm=None, algorithm=None, compress=None):
        if comm is not None and (not isinstance(comm, MPI.Intracomm)
                                 or isinstance(comm, MPI.Intercomm)):
            raise TypeError(f"comm must be an mpi4py intracommunicator, got {type(comm).__name__}")
        chosen = _algorithm_map(algorithm)
        self = MPI.Intracomm.__new__(cls, comm)
        self._algorithm, self._chosen = algorithm, chosen
        self._compress = _compression.resolve(compress)
        return self

    def _plain(self):
        # pycollective's own calls get a plain Intracomm on the same handle:
        # the library duplicates the communicator it is given, and our Dup
        # returns a Comm whose collectives would call back into the library.
        return MPI.Intracomm(self)

    @property
    def algorithm(self):
        """The ``algorithm`` given at construction (``None``: pycollective's default)."""
        return self._algorithm

    def __repr__(self):
        algo = self._algorithm or "default"
        return f"<pycollective.Comm algorithm={algo} handle={MPI._handleof(self):#x}>"

    @property
    def compress(self):
        """The compressor given at construction (``None``: uncompressed)."""
        return self._compress

    def _kw(self, collective):
        name = self._chosen.get(collective)
        kw = {} if name is None else {"algorithm": name}
        if collective == "allreduce" and self._compress is not None:
            kw["compress"] = self._compress
        return kw

    def _do(self, collective, plan, native):
        """Run a blocking call as ``plan`` says; ``native()`` is the wrapped communicator's."""
        if plan.reason is not None:
            _log_once(plan.reason)
            return native()
        if plan.error is not None:
            try:
                plan.run(self._plain(), self._kw(collective))
            except (TypeError, ValueError):
                pass  # the other ranks raise from this rank's error; this rank raises its own
            raise plan.error
        plan.run(self._plain(), self._kw(collective))
        return None

    def _start(self, collective, plan, native):
        """Start a nonblocking call; a :class:`Request` (or the native request)."""
        if plan.reason is not None or not _thread_multiple():
            _log_once(plan.reason or "nonblocking collectives are native: MPI thread level is "
                      "below MPI_THREAD_MULTIPLE")
            return native()
        engine = _engine_for(self)
        kw = self._kw(collective)
        own = comm_settings(self)
        if "timeout" in own:
            # The helper runs on a communicator of its own, which does not
            # carry this one's set_timeout(comm=...): the call takes it along.
            kw["timeout"] = own["timeout"]
        job = _Job(lambda comm: plan.run(comm, kw), plan)
        if plan.error is not None:
            engine.submit(job).Free()  # freed now, released by MPI once the helper completes it
            raise plan.error
        if self.Get_size() == 1:
            engine.run(job)  # nothing to wait for: a copy at most, done now
            return engine.request(job)
        return engine.submit(job)

    # --- the replaced collectives -----------------------------------------------------------

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        """Reduce to all, through :func:`pycollective.allreduce` where it can (as mpi4py's)."""
        plan = _plan(_allreduce_plan, _invalid_allreduce, sendbuf, recvbuf, op)
        return self._do("allreduce", plan, lambda: MPI.Intracomm.Allreduce(
            self, _native_send(sendbuf, recvbuf), recvbuf, op))

    def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        """Nonblocking :meth:`Allreduce`; a :class:`Request` (errors raised by its ``Wait``)."""
        plan = _plan(_allreduce_plan, _invalid_allreduce, sendbuf, recvbuf, op)
        return self._start("allreduce", plan, lambda: MPI.Intracomm.Iallreduce(
            self, _native_send(sendbuf, recvbuf), recvbuf, op))

    def Reduce(self, sendbuf, recvbuf, op=MPI.SUM, root=0):
        """Reduce to ``root``, through :func:`pycollective.reduce` where it can."""
        plan = _plan(_reduce_plan, _invalid_reduce, sendbuf, recvbuf, op, root, self.Get_rank())
        return self._do("reduce", plan, lambda: MPI.Intracomm.Reduce(
            self, _native_send(sendbuf, recvbuf), recvbuf, op, root))

    def Ireduce(self, sendbuf, recvbuf, op=MPI.SUM, root=0):
        """Nonblocking :meth:`Reduce`."""
        plan = _plan(_reduce_plan, _invalid_reduce, sendbuf, recvbuf, op, root, self.Get_rank())
        return self._start("reduce", plan, lambda: MPI.Intracomm.Ireduce(
            self, _native_send(sendbuf, recvbuf), recvbuf, op, root))

    def _reduce_scatter(self, sendbuf, recvbuf, counts, op):
        gather = counts is None and not (is_in_place(sendbuf) or sendbuf is recvbuf)

        def enter_invalid(bad, comm, kw):
            if gather:  # the others gather the counts first
                _gather_counts(comm, -1)
            reduce_scatter(bad, bad, comm=comm, **kw)
        return _plan(_reduce_scatter_plan, enter_invalid, sendbuf, recvbuf, counts, op,
                     self.Get_size(), self.Get_rank())

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM):
        """Reduce-scatter with equal blocks, through :func:`pycollective.reduce_scatter`."""
        plan = self._reduce_scatter(sendbuf, recvbuf, "block", op)
        return self._do("reduce_scatter", plan, lambda: MPI.Intracomm.Reduce_scatter_block(
            self, _native_send(sendbuf, recvbuf), recvbuf, op))

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM):
        """Nonblocking :meth:`Reduce_scatter_block`."""
        plan = self._reduce_scatter(sendbuf, recvbuf, "block", op)
        return self._start("reduce_scatter", plan, lambda: MPI.Intracomm.Ireduce_scatter_block(
            self, _native_send(sendbuf, recvbuf), recvbuf, op))

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM):
        """Reduce-scatter with any block lengths (``recvcounts``; None: every rank's recvbuf)."""
        plan = self._reduce_scatter(sendbuf, recvbuf, recvcounts, op)
        return self._do("reduce_scatter", plan, lambda: MPI.Intracomm.Reduce_scatter(
            self, _native_send(sendbuf, recvbuf), recvbuf, recvcounts, op))

    def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM):
        """Nonblocking :meth:`Reduce_scatter` (without counts, they are gathered first)."""
        plan = self._reduce_scatter(sendbuf, recvbuf, recvcounts, op)
        return self._start("reduce_scatter", plan, lambda: MPI.Intracomm.Ireduce_scatter(
            self, _native_send(sendbuf, recvbuf), recvbuf, recvcounts, op))

    def _allgather(self, sendbuf, recvbuf, vector):
        return _plan(_allgather_plan, _invalid_allgather, sendbuf, recvbuf, self.Get_size(),
                     self.Get_rank(), vector)

    def Allgather(self, sendbuf, recvbuf):
        """Gather to all, through :func:`pycollective.allgatherv` (bytes) where it can."""
        plan = self._allgather(sendbuf, recvbuf, False)
        return self._do("allgather", plan, lambda: MPI.Intracomm.Allgather(
            self, _native_send(sendbuf, recvbuf), recvbuf))

    def Iallgather(self, sendbuf, recvbuf):
        """Nonblocking :meth:`Allgather`."""
        plan = self._allgather(sendbuf, recvbuf, False)
        return self._start("allgather", plan, lambda: MPI.Intracomm.Iallgather(
            self, _native_send(sendbuf, recvbuf), recvbuf))

    def Allgatherv(self, sendbuf, recvbuf):
        """Gather to all with counts and displacements, through :func:`pycollective.allgatherv`."""
        plan = self._allgather(sendbuf, recvbuf, True)
        return self._do("allgather", plan, lambda: MPI.Intracomm.Allgatherv(
            self, _native_send(sendbuf, recvbuf), recvbuf))

    def Iallgatherv(self, sendbuf, recvbuf):
        """Nonblocking :meth:`Allgatherv`."""
        plan = self._allgather(sendbuf, recvbuf, True)
        return self._start("allgather", plan, lambda: MPI.Intracomm.Iallgatherv(
            self, _native_send(sendbuf, recvbuf), recvbuf))

    def Bcast(self, buf, root=0):
        """Broadcast from ``root``, through :func:`pycollective.bcast` where it can."""
        plan = _plan(_bcast_plan, _invalid_bcast, buf, root, self.Get_rank())
        return self._do("bcast", plan, lambda: MPI.Intracomm.Bcast(self, buf, root))

    def Ibcast(self, buf, root=0):
        """Nonblocking :meth:`Bcast`."""
        plan = _plan(_bcast_plan, _invalid_bcast, buf, root, self.Get_rank())
        return self._start("bcast", plan, lambda: MPI.Intracomm.Ibcast(self, buf, root))

    # --- constructors return wrapped communicators ------------------------------

    def _adopt(self, new):
        if isinstance(new, Comm):
            new._algorithm, new._chosen = self._algorithm, self._chosen
            new._compress = self._compress
            return new
        if new == MPI.COMM_NULL or not isinstance(new, MPI.Intracomm) \
                or isinstance(new, (MPI.Intercomm, MPI.Topocomm)):
            return new
        return type(self)(new, algorithm=self._algorithm, compress=self._compress)

    def Dup(self, info=None):
        """As ``MPI.Intracomm.Dup``; returns a :class:`Comm` with the same algorithm."""
        return self._adopt(MPI.Intracomm.Dup(self, info))

    def Dup_with_info(self, info):
        """As ``MPI.Intracomm.Dup_with_info``; returns a :class:`Comm`."""
        return self._adopt(MPI.Intracomm.Dup_with_info(self, info))

    def Idup(self, info=None):
        """As ``MPI.Intracomm.Idup``; the new communicator is a :class:`Comm`."""
        result = MPI.Intracomm.Idup(self, info)
        if isinstance(result, tuple):
            return (self._adopt(result[0]),) + tuple(result[1:])
        return result

    def Clone(self):
        """As ``MPI.Intracomm.Clone``; returns a :class:`Comm`."""
        return self._adopt(MPI.Intracomm.Clone(self))

    def Split(self, color=0, key=0):
        """As ``MPI.Intracomm.Split``; returns a :class:`Comm` (or the null communicator)."""
        return self._adopt(MPI.Intracomm.Split(self, color, key))

    def Split_type(self, split_type, key=0, info=MPI.INFO_NULL):
        """As ``MPI.Intracomm.Split_type``; returns a :class:`Comm`."""
        return self._adopt(MPI.Intracomm.Split_type(self, split_type, key, info))

    def Create(self, group):
        """As ``MPI.Intracomm.Create``; returns a :class:`Comm`."""
        return self._adopt(MPI.Intracomm.Create(self, group))

    def Create_group(self, group, tag=0):
        """As ``MPI.Intracomm.Create_group``; returns a :class:`Comm`."""
        return self._adopt(MPI.Intracomm.Create_group(self, group, tag))


# --- nonblocking engine ------------------------------------------------------------

class _Job:
    """One queued collective (``fn(comm)``) and its completion state."""

    __slots__ = ("fn", "keep", "event", "error", "reported", "greq")

    def __init__(self, fn, keep):
        self.fn = fn
        self.keep = keep  # the caller's buffers (and DLPack capsules) stay alive until completion
        self.event = threading.Event()
        self.error = None
        self.reported = False
        self.greq = None


def _query(status, job):
    # Called by MPI when a Wait/Test completes the generalized request.
    status.Set_source(MPI.ANY_SOURCE)
    status.Set_tag(MPI.ANY_TAG)
    status.Set_cancelled(False)
    status.Set_elements(MPI.BYTE, 0)
    if job.error is not None and not job.reported:
        # Completed by MPI's own Waitall/Testall: report through MPI's error.
        job.reported = True
        logger.error("pycollective nonblocking collective failed: %s: %s",
                     type(job.error).__name__, job.error)
        raise MPI.Exception(MPI.ERR_OTHER)


def _free(job):
    job.keep = None


def _cancel(completed, job):
    pass  # a started collective cannot be cancelled; MPI then completes it normally


class _Engine:
    """Helper thread running queued collectives on a private communicator, in order."""

    def __init__(self, comm):
        # Collective (all ranks reach their first nonblocking call on comm in the
        # same order); done on the caller's thread so no MPI object is created racily.
        # ``comm`` is the context's private communicator; the helper gets its
        # own duplicate of it, so its messages never meet blocking calls'.
        self.comm = duplicate(comm, "the helper of nonblocking collectives",
                              "every rank's first nonblocking collective on this communicator")
        get_context(self.comm)
        self.queue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="pycollective-nonblocking",
                                       daemon=True)
        self.thread.start()

    def request(self, job):
        if job.greq is None:
            job.greq = MPI.Grequest.Start(_query, _free, _cancel, args=(job,))
        request = Request(job.greq)
        request._job = job
        return request

    def submit(self, job):
        request = self.request(job)
        self.queue.put(job)
        return request

    def run(self, job):
        """Run ``job`` on the calling thread and complete it."""
        if job.greq is None:
            job.greq = MPI.Grequest.Start(_query, _free, _cancel, args=(job,))
        try:
            job.fn(self.comm)
        except BaseException as exc:  # noqa: BLE001  (re-raised by Wait)
            job.error = exc
        job.greq.Complete()
        job.event.set()

    def _run(self):
        while True:
            job = self.queue.get()
            if job is None:
                return
            self.run(job)

    def stop(self, limit=None):
        """Let the queued collectives finish, then stop the thread; True if it stopped."""
        if self.thread.is_alive():
            self.queue.put(None)
            self.thread.join(limit)
        return not self.thread.is_alive()

    def free(self):
        self.stop()
        if self.comm != MPI.COMM_NULL:
            self.comm.Free()
            self.comm = MPI.COMM_NULL


_ENGINE = Key("comm.engine")
_engine_lock = threading.Lock()


@atexit.register
def _drain_at_exit():
    # Registered after the contexts' exit hook, so it runs before it: the
    # helpers finish what was queued (the other ranks are exiting too and run
    # the same reductions) and stop before any communicator is freed.  A
    # helper still inside MPI when MPI_Finalize runs would crash the process.
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return
    limit = _settings.timeout()
    for ctx in live_contexts():
        engine = ctx.peek(_ENGINE)
        if engine is not None and not engine.stop(limit):
            sys.stderr.write(f"pycollective: rank {MPI.COMM_WORLD.Get_rank()}: a nonblocking "
                             f"collective on "
                             f"{ctx.label} did not finish within {limit} s at exit; "
                             "aborting the job\n")
            sys.stderr.flush()
            MPI.COMM_WORLD.Abort(1)


def _engine_for(comm):
    """The helper of ``comm``'s context; collective on its first use (it Dups)."""
    ctx = get_context(MPI.Intracomm(comm))
    with _engine_lock:
        return ctx.cached(_ENGINE, lambda ctx: _Engine(ctx.comm))


class Request(MPI.Request):
    """Request of a pycollective nonblocking collective (an MPI generalized request).

    Works with ``MPI.Request.Waitall``/``Testall`` like any request (a failed
    reduction then raises ``MPI.Exception``); its own :meth:`Wait` and
    :meth:`Test`, and :meth:`Request.Waitall`, re-raise the original Python
    exception and sleep instead of polling while the helper thread works.
    """

    def __new__(cls, request=None):
        self = MPI.Request.__new__(cls, request)
        self._job = None
        return self

    def _finish(self, status):
        job, self._job = self._job, None
        job.reported = True
        MPI.Request.Wait(self, status)  # already complete: frees the request
        if job.error is not None:
            raise job.error

    def Wait(self, status=None):
        """Block until the collective is done; raises its error, if any.

        Returns:
            True, as ``MPI.Request.Wait``.
        """
        job = self._job
        if job is None:
            return MPI.Request.Wait(self, status)
        job.event.wait()
        self._finish(status)
        return True

    def Test(self, status=None):
        """Return True (and complete the request) if the collective is done."""
        job = self._job
        if job is None:
            return MPI.Request.Test(self, status)
        if not job.event.is_set():
            # Hand the GIL to the helper thread: a caller polling Test() in a
            # tight Python loop would otherwise hold it for whole switch
            # intervals (5 ms) while the helper waits to run its next step.
            time.sleep(0)
            return False
        self._finish(status)
        return True

    def wait(self, status=None):
        """As :meth:`Wait`; returns None (no message object), like mpi4py's ``wait``."""
        self.Wait(status)

    def test(self, status=None):
        """As :meth:`Test`; returns ``(flag, None)`` like mpi4py's ``test``."""
        return self.Test(status), None

    @classmethod
    def Waitall(cls, requests, statuses=None):
        """Wait for every request in ``requests`` (pycollective or native), in order.

        Raises:
            The first error of a pycollective request, after all have completed.
        """
        first = None
        for i, request in enumerate(requests):
            status = statuses[i] if statuses is not None else None
            try:
                if isinstance(request, Request):
                    request.Wait(status)
                else:
                    MPI.Request.Wait(request, status)
            except Exception as exc:  # noqa: BLE001  (finish the others first)
                if first is None:
                    first = exc
        if first is not None:
            raise first
        return True
