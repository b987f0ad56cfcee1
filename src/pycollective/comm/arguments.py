"""How the drop-in reads one call's arguments: pycollective's call, the native one, or an error.

:class:`pycollective.Comm` (``comm.py``) builds one plan per replaced call,
before any message, and runs it, blocking or on the helper thread
(``comm/nonblocking.py``).

* Each replaced call reads its buffer arguments the way mpi4py does
  (:mod:`pycollective.data.buffers`: any buffer, CPU DLPack tensors, ``[buf,
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
  reductions, and datatypes with holes for the data movers go to the wrapped
  communicator's own call (identical results, by construction), and the
  reason is logged once per reason (INFO on the ``"pycollective"`` logger).
  Device memory reaches a plan only when the MPI library takes device
  pointers (``comm/dropin.py`` stages it otherwise, :mod:`pycollective.device`):
  it goes to the wrapped communicator's call too.
* A buffer argument that cannot be read on one rank (not a buffer, count
  larger than the buffer, unknown typecode, a strided tensor) still takes
  part in the collective: the rank enters the same pycollective call with an
  :class:`~pycollective.data.buffers.Invalid` argument, so the agreement step
  makes every rank raise ("invalid arguments on rank r: ...") instead of
  waiting, and the rank itself raises the precise error, mpi4py's type
  included (``BufferError`` for a strided or read-only tensor).
"""

import operator
from typing import Callable, NamedTuple, Optional

import numpy as np
from mpi4py import MPI

from .. import compression as _compression
from ..data.buffers import (Fallback, Invalid, as_they_are, is_in_place, movable, op_reason, parse,
                            reduction_dtype, spec_array, spec_datatype, spec_memory, vector_layout)
# The public calls are looked up at each call (tests spy on them here).
from ..collectives.api import allgather, allgatherv, allreduce, bcast, reduce, reduce_scatter
from ..data.kernels import DTYPE_NAMES, get_kernel, is_bfloat16


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
    return isinstance(buf, np.ndarray) and is_bfloat16(buf.dtype)


# The predefined ops pycollective reduces, and the plain numpy dtypes it reduces (native
# byte order; bfloat16 and the rest go the way of _allreduce_plan).
_PLAIN_OPS = (MPI.SUM, MPI.MAX, MPI.MIN, MPI.PROD)
_PLAIN_DTYPES = frozenset(np.dtype(name) for name in DTYPE_NAMES if name != "bfloat16")


def plain_allreduce(sendbuf, recvbuf, op) -> bool:
    """Whether an Allreduce needs no reading of MPI buffer specs: numpy arrays as they are
    (:func:`~pycollective.data.buffers.as_they_are`) of a plain dtype and a predefined op.
    Such a call is :func:`allreduce` on the arrays, the call ``_allreduce_plan`` would
    make on views of them, and nothing it could raise on this rank alone is left (the
    plan raises those on every rank)."""
    if type(recvbuf) is not np.ndarray or recvbuf.dtype not in _PLAIN_DTYPES:
        return False
    if not (op is MPI.SUM or op in _PLAIN_OPS):  # "in": identity first, then equality
        return False
    return as_they_are(sendbuf, recvbuf)


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
