"""Every collective the sharded optimizer makes, in one place, counted and timed.

ZeRO is made of three collectives: allreduce (baseline), reduce-scatter of
gradients and allgather of parameters.  They are called here and nowhere
else, so that switching to another implementation (the ``counts=``/v-variants
being added to the library) is a change to this file only.

Traffic.  For every call, :class:`Traffic` adds the elements (and bytes)
this rank sends, from the schedule of the library's ring reduce-scatter and
allgather chunk by chunk (:func:`pycollective.model.ledger.ring_sent`,
which uses :func:`pycollective.partition` exactly as the ring does), and the
time the call took.  The count therefore follows every call the optimizer
really made -- an extra gather would show -- with each call's elements from
the ring's schedule rather than from a counter inside MPI.  Allreduce runs
with ``algorithm="ring"``: the schedule the lecture's 2M refers to, and the
same chunks as the reduce-scatter, so baseline and sharded stages reduce
every element in the same order (float32 results are then bitwise equal).

Overlap.  :meth:`Comms.start_reduce_scatter` starts a layer's gradient
reduce-scatter without waiting for it (stages 2 and 3 call it as soon as a
layer's backward is done): through the drop-in's ``Ireduce_scatter``, which
runs the same public ``reduce_scatter`` (ring, the same blocks as
:func:`pycollective.partition`, so the same reduction order) on a helper
thread with a communicator of its own, one request after the other in the
order they were started -- the same on every rank, since every rank starts
them in layer order.  The helper needs ``MPI_THREAD_MULTIPLE`` and a dtype
the drop-in reduces itself; otherwise (a lower thread level, or a dtype the
drop-in would hand to MPI's own reduction, in another order) the
reduce-scatter runs blocking at once and the returned handle is already
complete.  The elements are counted when a call starts; its time is what
the caller spent starting and waiting for it (the part not hidden).

Compression.  Gradients can travel compressed (:mod:`pycollective.compression`):
:meth:`Comms.to_wire` compresses (dividing by N first if the compressor
asks), the reduction runs on the wire buffer, and :meth:`Comms.from_wire`
decompresses a reduced slice into float32 (multiplying by N again) and
divides by the loss scale.  Compressors must be element-wise (decompressing
a slice of the buffer gives that slice of the result), as casts are.
"""

import time
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from ..collectives import api as _collectives
from .. import compression as _compression
from ..data.kernels import bfloat16
from ..data.partition import partition
from ..comm.dropin import Comm
from ..model.ledger import ring_sent

__all__ = ["Comms", "Traffic", "Pending"]

# The dtypes the drop-in reduces through pycollective (mpi4py maps float16 to
# MPI's C_FLOAT16 where the library has it; bfloat16 gets a datatype of
# pycollective's own).
_NAMEABLE = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64, bfloat16()))


@dataclass
class Traffic:
    """What this rank sent and how long its collectives took, since the last reset."""

    elements: int = 0
    bytes: int = 0
    calls: int = 0
    seconds: float = 0.0
    by_collective: dict = field(default_factory=dict)
    log: list = field(default_factory=list)   # (collective, count, dtype name) of each call

    def add(self, collective, count, dtype, elements):
        """One call of ``collective`` on ``count`` elements; this rank sends ``elements``."""
        self.elements += elements
        self.bytes += elements * dtype.itemsize
        self.calls += 1
        self.by_collective[collective] = self.by_collective.get(collective, 0) + elements
        self.log.append((collective, count, dtype.name))


class Pending:
    """A started gradient reduce-scatter: :meth:`Comms.wait` completes it."""

    __slots__ = ("request", "buf", "out")

    def __init__(self, request, buf, out):
        self.request, self.buf, self.out = request, buf, out   # buffers live until done


class Comms:
    """The optimizer's collectives on ``comm``, with optional compression of gradients.

    Args:
        comm: an mpi4py intracommunicator (the same on every rank).
        compress: None, "fp16", "bf16" or an element-wise compressor.
    """

    def __init__(self, comm, compress=None):
        self.comm = comm
        self.nranks, self.rank = comm.Get_size(), comm.Get_rank()
        self.compressor = _compression.resolve(compress)
        self.traffic = Traffic()
        self._dropin = None
        self._helper = MPI.Query_thread() >= MPI.THREAD_MULTIPLE

    # --- counted collectives ---------------------------------------------------

    def _count(self, collective, buf, t0, counted):
        if counted:
            sent = ring_sent(collective, buf.size, self.nranks, self.rank)
            self.traffic.add(collective, buf.size, buf.dtype, sent)
            self.traffic.seconds += time.perf_counter() - t0

    def allreduce(self, buf, counted=True):
        """Sum ``buf`` over the ranks, in place (ring)."""
        t0 = time.perf_counter()
        _collectives.allreduce(MPI.IN_PLACE, buf, MPI.SUM, comm=self.comm, algorithm="ring")
        self._count("allreduce", buf, t0, counted)
        return buf

    def reduce_scatter(self, buf, counted=True):
        """Sum ``buf`` over the ranks, in place; returns this rank's chunk of it (a view)."""
        t0 = time.perf_counter()
        _collectives.reduce_scatter(MPI.IN_PLACE, buf, MPI.SUM, comm=self.comm, algorithm="ring")
        self._count("reduce_scatter", buf, t0, counted)
        offset, length = partition(buf.size, self.nranks, self.rank)
        return buf[offset:offset + length]

    def overlaps(self, dtype):
        """Whether :meth:`start_reduce_scatter` of ``dtype`` returns before the data moved."""
        return self._helper and self.nranks > 1 and np.dtype(dtype) in _NAMEABLE

    def start_reduce_scatter(self, buf, out):
        """Start summing ``buf`` over the ranks into ``out`` (its chunk here); a :class:`Pending`.

        ``buf`` must stay unchanged and ``out`` unread until :meth:`wait`.
        """
        t0 = time.perf_counter()
        if not self.overlaps(buf.dtype):
            out[...] = self.reduce_scatter(buf, counted=False)
            self._count("reduce_scatter", buf, t0, True)
            return Pending(None, None, None)
        if self._dropin is None:
            self._dropin = Comm(self.comm, algorithm="ring")
        counts = [partition(buf.size, self.nranks, r)[1] for r in range(self.nranks)]
        request = self._dropin.Ireduce_scatter(buf, out, counts, MPI.SUM)
        self._count("reduce_scatter", buf, t0, True)
        return Pending(request, buf, out)

    def wait(self, pending):
        """Complete a started reduce-scatter (its errors are raised here)."""
        if pending.request is not None:
            t0 = time.perf_counter()
            pending.request.Wait()
            self.traffic.seconds += time.perf_counter() - t0
            pending.request = pending.buf = pending.out = None

    def allgather(self, buf, counted=True):
        """Fill every rank's chunk of ``buf`` from its owner (this rank's is in place)."""
        t0 = time.perf_counter()
        _collectives.allgather(MPI.IN_PLACE, buf, comm=self.comm, algorithm="ring")
        self._count("allgather", buf, t0, counted)
        return buf

    def any_rank(self, flag, counted=True):
        """True on every rank if ``flag`` is true on any rank (one-element MAX)."""
        value = np.array([1 if flag else 0], np.int32)
        t0 = time.perf_counter()
        _collectives.allreduce(MPI.IN_PLACE, value, MPI.MAX, comm=self.comm, algorithm="ring")
        self._count("allreduce", value, t0, counted)
        return bool(value[0])

    # --- compression ---------------------------------------------------------------

    def wire_dtype(self, dtype):
        """The dtype gradients of ``dtype`` travel as."""
        if self.compressor is None:
            return np.dtype(dtype)
        return self.compressor.compress(np.zeros(0, dtype))[0].dtype

    def to_wire(self, grads):
        """``(buffer to reduce, context)``: ``grads`` itself when uncompressed."""
        if self.compressor is None:
            return grads, None
        return _compression.compress_for(self.compressor, grads, self.nranks)

    def from_wire(self, reduced, ctx, out, scale):
        """``out`` (float32) = the reduced gradient slice ``reduced``, decompressed, / scale."""
        out[...] = reduced if self.compressor is None else self.compressor.decompress(reduced, ctx)
        if scale != 1:
            out *= np.float32(1 / scale)
        return out
