"""Gradient bucketing: one allreduce for many tensors, started as soon as they are ready.

Why.  Every allreduce pays a start-up cost (α per message, 2(N-1)α for a
ring) whatever its size, and a model has many small tensors (biases, norms).
Packing the gradients of several tensors into one flat buffer turns many
latency-bound calls into one bandwidth-bound call.  PyTorch DDP does this
with buckets of 25 MB by default; so do we.

Layout.  Tensors are assigned to buckets in the order their gradients become
ready (backward runs from the last layer to the first, so the default order
is the reverse of the parameter order).  A bucket collects tensors until the
next one would take it over ``cap_bytes``; a tensor larger than the cap gets
a bucket of its own, and ``cap_bytes=0`` gives one bucket per tensor (the
unbucketed baseline).  Each bucket is one contiguous array; the gradient of
tensor i is ``grads[i]``, a view into its bucket, so code that writes its
gradients into those views (``np.matmul(a.T, d, out=buckets.grads[i])``)
never copies anything: packing and unpacking are free.

Overlap.  With ``overlap=True``, :meth:`GradientBuckets.ready` marks a
tensor's gradient as written, and as soon as every tensor of a bucket is
ready the bucket's ``Iallreduce`` starts, while the backward pass goes on
computing the earlier layers.  Buckets are started strictly in bucket order
(a complete bucket waits for the ones before it, as in DDP), so every rank
issues the same sequence of collectives even if its tensors become ready in
a different order.  :meth:`GradientBuckets.wait` starts whatever is left,
waits for all requests and, with ``average=True``, divides by the number of
ranks.  With ``overlap=False`` nothing starts before :meth:`wait`, which
then runs one blocking ``Allreduce`` per bucket.

The communicator is any mpi4py intracommunicator: ``pycollective.Comm``
(whose ``Iallreduce`` progresses on a helper thread) or a plain
``MPI.COMM_WORLD`` (native requests; :meth:`ready` calls ``Test`` on the
requests in flight to give MPI a chance to progress them).

Compression.  ``compress="fp16"`` or ``"bf16"`` (or a compressor object, see
:mod:`pycollective.compression`) makes the buckets travel as two-byte floats
with every reduction step accumulated in float64: the buckets are then
reduced through a ``pycollective.Comm`` on the same communicator (and the
same algorithm, if it is one) that compresses its floating sums.

Memory.  With a ``pycollective.Comm`` (and no compression) the buckets are
slices of one ``pycollective.shared_empty`` array: where the ranks share a node, ``shm``
reads a peer's bucket where it lies instead of copying it (above 1 MiB;
0.5-0.9 of the time, docs/usage.md#shared-buffers).  Constructing the
buckets is then collective, and :meth:`GradientBuckets.close` (collective
too) hands the memory back; it also goes when the communicator is freed.
"""

import numpy as np
from mpi4py import MPI

from .. import compression as _compression
from ..data.kernels import as_dtype, is_float
from ..collectives.allocate import release, shared_empty
from ..comm.dropin import Comm

__all__ = ["GradientBuckets"]

DEFAULT_CAP_BYTES = 25 * 1024 * 1024


def bucket_layout(nbytes, cap_bytes, order):
    """Group tensors into buckets.

    Args:
        nbytes: bytes of each tensor's gradient, by tensor index.
        cap_bytes: largest bucket (a larger tensor gets its own bucket).
        order: tensor indices in the order their gradients become ready.

    Returns:
        A list of buckets, each a list of tensor indices in layout order.
    """
    buckets, current, size = [], [], 0
    for i in order:
        if current and size + nbytes[i] > cap_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += nbytes[i]
    if current:
        buckets.append(current)
    return buckets


class GradientBuckets:
    """Flat gradient buckets reduced with one allreduce each.

    Args:
        shapes: the shape of each tensor's gradient, by tensor index.
        comm: an mpi4py intracommunicator (``pycollective.Comm`` or native).
        dtype: gradient dtype (one for all tensors).
        cap_bytes: bucket size cap (default 25 MiB, as PyTorch DDP); 0 gives
            one bucket per tensor.
        order: tensor indices in the order their gradients become ready;
            default: reverse index order (backward of a layer stack).
        overlap: start each bucket's ``Iallreduce`` from :meth:`ready` as
            soon as the bucket is complete; otherwise reduce in :meth:`wait`.
        average: divide the sums by the number of ranks (DDP's convention).
        op: the reduction (``MPI.SUM`` for gradients).
        compress: None, "fp16", "bf16" or a compressor: floating sums travel
            compressed (see the module docstring).
        shared: allocate the buckets with ``pycollective.shared_empty``
            (collective); default: where ``comm`` is a ``pycollective.Comm``
            and nothing is compressed.

    Raises:
        ValueError: ``order`` is not a permutation of the tensor indices,
            ``cap_bytes`` is negative, ``average`` with an integer dtype, or
            an unknown compression.
    """

    def __init__(self, shapes, comm, *, dtype=np.float32, cap_bytes=DEFAULT_CAP_BYTES,
                 order=None, overlap=True, average=True, op=MPI.SUM, compress=None,
                 shared=None):
        self.comm = comm
        compressor = _compression.resolve(compress)
        # What the buckets are reduced with: the communicator itself, or a
        # compressing drop-in on the same handle.
        self._reducer = comm if compressor is None else Comm(
            comm, algorithm=getattr(comm, "algorithm", None), compress=compressor)
        self.dtype = as_dtype(dtype)
        self.shapes = [tuple(int(d) for d in np.atleast_1d(s)) for s in shapes]
        ntensors = len(self.shapes)
        order = list(reversed(range(ntensors))) if order is None else [int(i) for i in order]
        if sorted(order) != list(range(ntensors)):
            raise ValueError(f"order must be a permutation of 0..{ntensors - 1}, got {order}")
        if cap_bytes < 0:
            raise ValueError(f"cap_bytes must be >= 0, got {cap_bytes}")
        if average and not is_float(self.dtype):
            raise ValueError(f"average=True needs a floating dtype, got {self.dtype}")
        sizes = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
        self.layout = bucket_layout([n * self.dtype.itemsize for n in sizes], cap_bytes, order)
        self.buffers = []
        self.grads = [None] * ntensors
        self._bucket_of = [0] * ntensors
        if shared is None:
            shared = isinstance(comm, Comm) and compressor is None
        self._shared = MPI.Intracomm(comm) if shared else None
        counts = [sum(sizes[i] for i in members) for members in self.layout]
        # Shared: one allocation (one collective, one segment) holding every
        # bucket, each starting on a 64-byte line.
        align = max(1, 64 // self.dtype.itemsize)
        starts = np.cumsum([0] + [-(-c // align) * align for c in counts]).tolist()
        self._memory = None
        if self._shared is not None:
            self._memory = shared_empty(starts[-1], self.dtype, comm=self._shared)
            self._memory[...] = 0
        for b, members in enumerate(self.layout):
            if self._memory is None:
                buf = np.zeros(counts[b], self.dtype)
            else:
                buf = self._memory[starts[b]:starts[b] + counts[b]]
            offset = 0
            for i in members:
                self.grads[i] = buf[offset:offset + sizes[i]].reshape(self.shapes[i])
                self._bucket_of[i] = b
                offset += sizes[i]
            self.buffers.append(buf)
        self.overlap, self.average, self.op = bool(overlap), bool(average), op
        self._missing = [len(m) for m in self.layout]
        self._ready = [False] * ntensors
        self._next = 0          # first bucket not started yet
        self._requests = []

    def close(self):
        """Hand back the buckets' shared memory (collective where they are shared; the
        arrays, and ``grads``, stay valid as ordinary memory).  Nothing to do otherwise.
        ``with GradientBuckets(...) as buckets:`` closes them at the end of the block
        (not when the block raises: the other ranks may not be closing, and the memory
        then goes with the communicator)."""
        if self._shared is not None:
            release(self._memory, comm=self._shared)
            self._shared = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()

    @property
    def nbuckets(self):
        """Number of buckets."""
        return len(self.layout)

    def zero(self):
        """Set every gradient to zero (for code that accumulates with ``+=``)."""
        for buf in self.buffers:
            buf[...] = 0

    def ready(self, index, value=None):
        """Mark tensor ``index``'s gradient as final; may start bucket allreduces.

        Args:
            index: tensor index.
            value: if given, copied into ``grads[index]`` first (otherwise the
                gradient is assumed to have been written into that view).

        Raises:
            ValueError: the tensor was already marked ready in this step.
        """
        if self._ready[index]:
            raise ValueError(f"gradient {index} marked ready twice in one step")
        if value is not None:
            self.grads[index][...] = value
        self._ready[index] = True
        self._missing[self._bucket_of[index]] -= 1
        if self.overlap:
            self._start_complete()
            for request in self._requests:
                request.Test()  # lets MPI progress native requests; cheap otherwise

    def _start_complete(self):
        while self._next < len(self.layout) and self._missing[self._next] == 0:
            buf = self.buffers[self._next]
            self._requests.append(self._reducer.Iallreduce(MPI.IN_PLACE, buf, self.op))
            self._next += 1

    def wait(self):
        """Finish the step: reduce every bucket not yet started, wait for all.

        Returns:
            ``grads``, holding the reduced (and, with ``average``, averaged)
            gradients, bitwise identical on every rank.
        """
        if self.overlap:
            self._missing = [0] * len(self.layout)
            self._start_complete()
            for request in self._requests:
                request.Wait()
        else:
            for buf in self.buffers:
                self._reducer.Allreduce(MPI.IN_PLACE, buf, self.op)
        if self.average:
            size = self.comm.Get_size()
            for buf in self.buffers:
                buf /= size  # the same operation on the same sums: identical on all ranks
        self._requests = []
        self._next = 0
        self._missing = [len(m) for m in self.layout]
        self._ready = [False] * len(self._ready)
        return self.grads
