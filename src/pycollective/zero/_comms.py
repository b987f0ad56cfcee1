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

from .. import _collectives
from .. import compression as _compression
from .._partition import partition
from ..model.ledger import ring_sent

__all__ = ["Comms", "Traffic"]


@dataclass
class Traffic:
    """What this rank sent and how long its collectives took, since the last reset."""

    elements: int = 0
    bytes: int = 0
    calls: int = 0
    seconds: float = 0.0
    by_collective: dict = field(default_factory=dict)

    def add(self, collective, elements, nbytes, seconds):
        self.elements += elements
        self.bytes += nbytes
        self.calls += 1
        self.seconds += seconds
        self.by_collective[collective] = self.by_collective.get(collective, 0) + elements


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

    # --- counted collectives ---------------------------------------------------

    def _count(self, collective, buf, t0, counted):
        if counted:
            sent = ring_sent(collective, buf.size, self.nranks, self.rank)
            self.traffic.add(collective, sent, sent * buf.dtype.itemsize,
                             time.perf_counter() - t0)

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
