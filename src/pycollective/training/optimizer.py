"""Data-parallel training on numpy: one start for every rank, replicas checked, gradients averaged.

Three pieces a training script needs besides an allreduce:

* :func:`broadcast_parameters` gives every rank the root's parameters, so
  replicas start identical whatever each rank initialised (no reliance on
  equal seeds).
* :func:`check_replicas` tells, on demand, whether the replicas are still
  bitwise identical, and if not which ranks and which arrays differ.
* :class:`DistributedOptimizer` wraps a numpy optimizer: gradients are
  averaged over the ranks through :class:`~pycollective.GradientBuckets`
  (overlapping the backward pass when the caller reports each gradient
  ready), and may be accumulated locally over micro-batches first.

Arrays.  ``arrays``/``params`` is a list (arrays named by index) or a dict
(named by key, taken in the dict's order).  Every rank must pass the same
names, shapes and dtypes in the same order.  That is checked before any
data moves, by one small gather of a per-rank summary (:func:`_exchange`:
status, count, bytes, a 64-bit hash of the layout, a 64-bit hash of the
contents), so a rank with a different parameter list gets a ``ValueError``
on every rank naming that rank instead of a hang or garbage, and a rank
whose own arguments are bad (not a buffer, read-only) has its message
raised everywhere.  The gather is pycollective's ``allgather``: bounded
waits, so a rank that never arrives gives ``CollectiveTimeout``.

Broadcast buckets.  :func:`broadcast_parameters` packs the arrays' bytes,
in order, into buckets of at most ``cap_bytes`` (the rule of
:func:`pycollective.training.bucketing.bucket_layout`; an array larger than the cap
has a bucket of its own) and broadcasts each with :func:`pycollective.bcast`,
which pipelines large buffers (algorithms ``chain``, ``scatter_allgather``).
A bucket is raw bytes, not one dtype: a broadcast copies bytes and computes
nothing, so grouping by dtype would only add calls.  Arrays start at
multiples of :data:`ALIGN` bytes inside a bucket so every typed view of a
bucket is aligned.  A bucket that is one contiguous array is broadcast in
place, without packing.

Replica checksums.  Each array's checksum is the 8-byte BLAKE2b of its
dtype, shape and bytes (so a NaN compares by its bits, and any flipped bit
changes it).  :func:`check_replicas` gathers one combined checksum per rank;
only when they differ does it gather the per-array checksums to say which
arrays differ on which ranks (ranks that differ from the most common value;
on a tie, from the lowest rank's).
"""

import hashlib
import operator
from collections import Counter
from collections.abc import Mapping
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from ..data import buffers as _buffers
from ..collectives.api import allgather, bcast
from ..comm import device as _device
from .._errors import ReplicaMismatch
from .bucketing import DEFAULT_CAP_BYTES, GradientBuckets, bucket_layout
from ..comm.dropin import Comm

__all__ = ["ALIGN", "DistributedOptimizer", "ReplicaMismatch", "broadcast_parameters",
           "broadcast_plan", "check_replicas", "checksum"]

#: Offset granularity of arrays inside a broadcast bucket (every dtype's alignment divides it).
ALIGN = 64
_MESSAGE_BYTES = 2048   # room for one rank's error message on the error path
_ROW = 5                # failed, count, bytes, layout hash, contents hash


# --- arrays and their summaries ---------------------------------------------------------------

def _entries(arrays, what):
    """``[(name, array)]`` of a list (names: indices) or a dict (its keys, in its order)."""
    if isinstance(arrays, Mapping):
        return list(arrays.items())
    if isinstance(arrays, (np.ndarray, str, bytes)) or not hasattr(arrays, "__iter__"):
        raise TypeError(f"{what}: pass a list or a dict of arrays, got {type(arrays).__name__}")
    return list(enumerate(arrays))


def _view(obj, name, writable):
    """A numpy view (no copy) of one array: numpy arrays as they are, other buffers flat."""
    if isinstance(obj, np.ndarray):
        if writable and not obj.flags.writeable:
            raise ValueError(f"array {name!r} is read-only")
        return obj.view(np.ndarray)
    try:
        return _buffers.flat(obj, f"array {name!r}", writable)
    except _buffers.DeviceMemory as exc:
        raise TypeError(f"{exc.reason}: pycollective.training handles host memory only") from None




def _hash64(*parts) -> int:
    """8-byte BLAKE2b of the parts (bytes or buffers), as a signed 64-bit integer."""
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        h.update(part)
    return int.from_bytes(h.digest(), "little", signed=True)


def _layout_hash(views, settings=""):
    text = repr([(name, a.dtype.str, a.shape) for name, a in views]) + settings
    return _hash64(text.encode())


def checksum(array: np.ndarray) -> int:
    """64-bit checksum of one array: its dtype, shape and bytes (NaNs by their bits)."""
    data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    return _hash64(f"{array.dtype.str}{array.shape}".encode(), data)


class _Summary(NamedTuple):
    views: list          # [(name, numpy view)]
    layout: int          # hash of names, dtypes, shapes (and settings that must agree)
    sums: list[int]      # per-array checksums (empty unless asked for)


def _summarise(entries, writable, contents, settings=""):
    views = [(name, _view(obj, name, writable)) for name, obj in entries]
    sums = [checksum(a) for _, a in views] if contents else []
    return _Summary(views, _layout_hash(views, settings), sums)


# --- one small exchange: everyone's summary, or everyone's error -------------------------------

def _plain(comm):
    """The communicator pycollective's functions take (a drop-in's own calls would recurse)."""
    comm = MPI.COMM_WORLD if comm is None else comm
    return MPI.Intracomm(comm) if isinstance(comm, Comm) else comm


def _reference(values, prefer=None):
    """(the reference value, ranks whose value differs): ``prefer``'s value, else the most
    common one (on a tie, the lowest such rank's)."""
    if prefer is None:
        counts = Counter(values)
        best = max(counts.values())
        prefer = next(r for r, v in enumerate(values) if counts[v] == best)
    ref = values[prefer]
    return ref, [r for r, v in enumerate(values) if v != ref]


def _names(names):
    return "[" + ", ".join(repr(n) for n in names) + "]"


def _exchange(comm, what, summarise, reference=None):
    """Run ``summarise()`` here and gather every rank's summary row; raise on every rank if
    a rank's ``summarise`` failed or the layouts differ.

    Returns ``(summary, table)``: this rank's :class:`_Summary` and the
    ``(N, 5)`` int64 table of rows ``[failed, count, bytes, layout, contents]``.
    """
    summary, error = None, None
    try:
        summary = summarise()
    except (TypeError, ValueError) as exc:
        error = exc
    row = np.zeros(_ROW, np.int64)
    if error is not None:
        row[0] = 1
    else:
        row[1] = len(summary.views)
        row[2] = sum(a.nbytes for _, a in summary.views)
        row[3] = summary.layout
        row[4] = _hash64(np.asarray(summary.sums, np.int64)) if summary.sums else 0
    nranks = comm.Get_size()
    table = np.empty((nranks, _ROW), np.int64)
    allgather(row, table, comm=comm)
    failed = [r for r in range(nranks) if table[r, 0]]
    if failed:
        # Every rank saw who failed: the first one's message goes to all.
        message = np.zeros(_MESSAGE_BYTES, np.uint8)
        if comm.Get_rank() == failed[0]:
            text = f"{type(error).__name__}: {error}".encode()[:_MESSAGE_BYTES]
            message[:len(text)] = np.frombuffer(text, np.uint8)
        bcast(message, root=failed[0], comm=comm)
        if error is not None:
            raise error
        text = message.tobytes().rstrip(b"\0").decode(errors="replace")
        raise ValueError(f"{what}: invalid arguments on rank {failed[0]}"
                         + (f" (and ranks {failed[1:]})" if len(failed) > 1 else "")
                         + f": {text}")
    ref, odd = _reference([tuple(table[r, 1:4]) for r in range(nranks)], reference)
    if odd:
        ref_rank = next(r for r in range(nranks) if tuple(table[r, 1:4]) == ref)
        described = "; ".join(f"rank {r} has {table[r, 1]} arrays of {table[r, 2]} bytes"
                              for r in odd)
        raise ValueError(
            f"{what}: the ranks pass different arrays or settings: {described}, where rank "
            f"{ref_rank} has {ref[0]} arrays of {ref[1]} bytes (or the same counts with other "
            "names, shapes, dtypes or order); every rank must pass the same list or dict")
    return summary, table


# --- replicas -------------------------------------------------------------------------------

def check_replicas(arrays, comm=None) -> int:
    """Raise on every rank unless every rank holds bitwise the same ``arrays``.

    One gather of a 40-byte summary per rank (a second one, of one checksum
    per array, only when they differ).  NaNs compare by their bits.

    Args:
        arrays: a list or dict of arrays (numpy arrays or any host buffer
            pycollective takes), the same names, shapes and dtypes on every rank.
        comm: an mpi4py intracommunicator or ``pycollective.Comm``; ``None``:
            ``MPI.COMM_WORLD``.

    Returns:
        The replicas' common 64-bit checksum.

    Raises:
        ReplicaMismatch: the contents differ; ``.ranks`` are the ranks that
            differ from the most common replica (on a tie, from the lowest
            rank's), ``.arrays`` maps each to the names (dict) or indices
            (list) of its differing arrays.
        ValueError, TypeError: a rank passes other names, shapes or dtypes,
            or something that is not an array (on every rank, naming it).
        CollectiveError: a rank never arrives (timeout) or fails.
    """
    staged = _device.host_arrays(arrays)
    if staged is not None:  # device arrays: compared through host copies
        return staged.run(lambda host: check_replicas(host, comm), copy_back=False)
    comm = _plain(comm)
    summary, table = _exchange(comm, "check_replicas",
                               lambda: _summarise(_entries(arrays, "check_replicas"), False, True))
    combined = [int(table[r, 4]) for r in range(comm.Get_size())]
    ref, odd = _reference(combined)
    if not odd:
        return ref
    # Every rank knows the replicas differ: gather the per-array checksums to say where.
    sums = np.asarray(summary.sums, np.int64)
    all_sums = np.empty((comm.Get_size(), sums.size), np.int64)
    allgather(sums, all_sums, comm=comm)
    names = [name for name, _ in summary.views]
    differing = {}
    for j, name in enumerate(names):
        _, bad = _reference([int(v) for v in all_sums[:, j]])
        for r in bad:
            differing.setdefault(r, []).append(name)
    ranks = sorted(differing)
    described = "; ".join(f"rank {r}: arrays {_names(differing[r])}" for r in ranks)
    raise ReplicaMismatch(
        f"check_replicas: the replicas differ on {len(ranks)} of {comm.Get_size()} ranks "
        f"(compared with the most common replica): {described}", ranks=ranks, arrays=differing)


# --- broadcast --------------------------------------------------------------------------------

class _Bucket(NamedTuple):
    members: list[int]   # array indices, in order
    offsets: list[int]   # byte offset of each in the bucket
    nbytes: int          # the bucket's length (no padding after its last array)


def _aligned(n):
    return -(-n // ALIGN) * ALIGN


def broadcast_plan(nbytes, cap_bytes=DEFAULT_CAP_BYTES) -> list[_Bucket]:
    """The buckets that broadcast arrays of ``nbytes`` bytes, in order, at most ``cap_bytes``
    each (counting each array's alignment padding); a larger array gets a bucket of its own."""
    if cap_bytes < 0:
        raise ValueError(f"cap_bytes must be >= 0, got {cap_bytes}")
    padded = [_aligned(n) for n in nbytes]
    plan = []
    for members in bucket_layout(padded, cap_bytes, range(len(nbytes))):
        offsets = [0]
        for i in members[:-1]:
            offsets.append(offsets[-1] + padded[i])
        plan.append(_Bucket(members, offsets, offsets[-1] + nbytes[members[-1]]))
    return plan


def _bytes_of(array):
    """The array's bytes in C order: a view when contiguous, else a copy."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def broadcast_parameters(arrays, root=0, comm=None, *, cap_bytes=DEFAULT_CAP_BYTES,
                         algorithm="auto", check=True):
    """Copy the root's arrays into every rank's arrays, bucketed, then verify.

    Args:
        arrays: a list or dict (name -> array) of numpy arrays or any host
            buffer pycollective takes; each is overwritten in place on the
            ranks other than ``root``.  Same names, shapes and dtypes, in the
            same order, on every rank (checked first, see the module docstring).
        root: the rank whose values everyone gets.
        comm: an mpi4py intracommunicator or ``pycollective.Comm``; ``None``:
            ``MPI.COMM_WORLD``.
        cap_bytes: largest bucket in bytes (default 25 MiB); 0 broadcasts each
            array on its own.
        algorithm: passed to :func:`pycollective.bcast` ("auto" or one of
            ``pycollective.algorithms("bcast")``).
        check: afterwards run :func:`check_replicas` (one more small gather).

    Returns:
        The replicas' common 64-bit checksum (None with ``check=False``).

    Raises:
        ValueError: ranks pass different arrays (naming them), a read-only
            array off the root, a bad root or cap (on every rank).
        TypeError: something that is not an array (on every rank).
        ReplicaMismatch: the check found a rank with other bytes afterwards.
        CollectiveError: a rank never arrives (timeout) or fails.
    """
    staged = _device.host_arrays(arrays)
    if staged is not None:  # device arrays: broadcast through host copies, copied back
        return staged.run(lambda host: broadcast_parameters(
            host, root, comm, cap_bytes=cap_bytes, algorithm=algorithm, check=check), True)
    comm = _plain(comm)
    rank = comm.Get_rank()
    valid_root = isinstance(root, (int, np.integer)) and 0 <= root < comm.Get_size()

    def summarise():
        if not valid_root:
            raise ValueError(f"root must be a rank of the communicator, got {root!r}")
        return _summarise(_entries(arrays, "broadcast_parameters"), rank != root, False,
                          f"cap {cap_bytes}, algorithm {algorithm}")

    summary, _ = _exchange(comm, "broadcast_parameters", summarise,
                           int(root) if valid_root else None)
    views = [a for _, a in summary.views]
    for bucket in broadcast_plan([a.nbytes for a in views], cap_bytes):
        if bucket.nbytes == 0:
            continue
        if len(bucket.members) == 1 and views[bucket.members[0]].flags.c_contiguous:
            bcast(views[bucket.members[0]].reshape(-1), root=root, comm=comm, algorithm=algorithm)
            continue
        buf = np.zeros(bucket.nbytes, np.uint8)
        pairs = [(views[i], off) for i, off in zip(bucket.members, bucket.offsets)]
        if rank == root:
            for a, off in pairs:
                buf[off:off + a.nbytes] = _bytes_of(a)
        bcast(buf, root=root, comm=comm, algorithm=algorithm)
        if rank != root:
            for a, off in pairs:
                a[...] = buf[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    return check_replicas(arrays, comm) if check else None


# --- the optimizer wrapper -------------------------------------------------------------------

class DistributedOptimizer:
    """Average gradients over the ranks, then apply a numpy optimizer's step.

    The numpy counterpart of Horovod's ``DistributedOptimizer`` and of DDP's
    gradient averaging.  The backward pass writes each gradient into
    :attr:`grads` (views into the reduction buckets, so nothing is copied)
    and may report each one with :meth:`ready`, which starts a bucket's
    allreduce as soon as the bucket is complete, while the backward pass
    goes on.  :meth:`step` ends the backward pass: it reduces what was not
    started, waits, and calls ``optimizer.step(params, grads)`` with the
    averaged gradients::

        opt = DistributedOptimizer(SGD(params, lr=0.1), params, comm)
        for x, y in batches:
            backward(params, x, y, out=opt.grads, ready=opt.ready)  # writes opt.grads[i]
            opt.step()

    numpy has no autograd to tell the wrapper that a backward pass ended, so
    every pass ends with :meth:`step`; a pass that only accumulates (inside
    :meth:`no_sync`, or before ``backward_passes_per_step`` passes are
    collected) adds its gradients to a local sum and leaves the parameters
    alone; the next synchronising pass adds that sum to its own gradients,
    reduces the total once and applies it.  Accumulated gradients are summed
    over the passes, not averaged (as DDP's ``no_sync`` and Horovod's
    ``backward_passes_per_step`` do): scale the loss if you want the mean.

    Args:
        optimizer: any object whose ``step(params, grads)`` updates the
            parameter arrays in place (``examples/train_mlp.py``'s SGD,
            :class:`pycollective.zero.Adam`).  It gets two lists in the order
            of ``params`` (a dict's values in the dict's order).
        params: list or dict (name -> array) of the parameter arrays: numpy,
            one floating dtype, the same names, shapes and order on every
            rank (checked once, here, by one small gather).
        comm: ``pycollective.Comm`` or any mpi4py intracommunicator (a plain
            one reduces with its MPI library's own ``Iallreduce``); ``None``:
            ``pycollective.Comm(MPI.COMM_WORLD)``.
        average: divide the summed gradients by the number of ranks (DDP's
            convention); ``False`` leaves the sum (e.g. each rank already
            divided its loss by the global batch size).
        compress: None, "fp16", "bf16" or a compressor
            (:mod:`pycollective.compression`): gradients travel as two-byte
            floats, summed in float64 at every step.
        backward_passes_per_step: k: the gradients of k passes are summed
            locally and reduced once; only every k-th :meth:`step` applies.
        cap_bytes, order, overlap: the buckets' cap (25 MiB), the order the
            backward pass produces gradients in (default: last parameter
            first) and whether buckets start from :meth:`ready`; see
            :class:`~pycollective.GradientBuckets`.

    Raises:
        TypeError: ``optimizer`` has no ``step``; ``params`` is not a list or dict.
        ValueError: mixed or integer dtypes (with ``average``), a bad
            argument, or ranks that pass different parameters or settings
            (on every rank, naming the ranks).
    """

    def __init__(self, optimizer, params, comm=None, *, average=True, compress=None,
                 backward_passes_per_step=1, cap_bytes=DEFAULT_CAP_BYTES, order=None,
                 overlap=True):
        if not callable(getattr(optimizer, "step", None)):
            raise TypeError(f"optimizer must have a step(params, grads) method, "
                            f"got {type(optimizer).__name__}")
        if int(backward_passes_per_step) < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, "
                             f"got {backward_passes_per_step}")
        self.optimizer = optimizer
        self.comm = Comm(MPI.COMM_WORLD) if comm is None else comm
        self.backward_passes_per_step = int(backward_passes_per_step)
        # What must agree besides the arrays (a compressor by its name: an
        # object's repr may hold its address, which differs across ranks).
        label = compress if compress is None or isinstance(compress, str) else \
            getattr(compress, "name", type(compress).__qualname__)
        settings = (f"average {bool(average)}, compress {str(label).lower()}, passes "
                    f"{self.backward_passes_per_step}, cap {cap_bytes}, order {order}, "
                    f"overlap {bool(overlap)}")

        def summarise():
            entries = _entries(params, "DistributedOptimizer")
            if any(not isinstance(a, np.ndarray) for _, a in entries):
                raise TypeError("DistributedOptimizer: params must be numpy arrays")
            summary = _summarise(entries, True, False, settings)
            dtypes = {a.dtype for _, a in summary.views}
            if len(dtypes) > 1:
                raise ValueError(f"DistributedOptimizer: params of several dtypes "
                                 f"{sorted(map(str, dtypes))}; one dtype per optimizer (mixed "
                                 "precision: pycollective.zero)")
            return summary

        summary, _ = _exchange(_plain(self.comm), "DistributedOptimizer", summarise)
        self._names = [name for name, _ in summary.views]
        self._params = [a for _, a in summary.views]
        self._index = {name: i for i, name in enumerate(self._names)}
        dtype = self._params[0].dtype if self._params else np.float32
        self._buckets = GradientBuckets([p.shape for p in self._params], self.comm, dtype=dtype,
                                        cap_bytes=cap_bytes, order=order, overlap=overlap,
                                        average=average, compress=compress)
        views = self._buckets.grads
        self.grads = dict(zip(self._names, views)) if isinstance(params, Mapping) else views
        self._acc = None            # the sum of the passes accumulated so far, per gradient
        self._passes = 0            # how many passes that sum holds
        self._no_sync = False
        self._syncing = None        # the current pass: None (not begun), True or False
        self._marked = [False] * len(self._params)
        self._reduced = False       # synchronize() done, step() to apply

    @property
    def nbuckets(self):
        """How many allreduces one synchronising pass makes."""
        return self._buckets.nbuckets

    def close(self):
        """Hand back the gradient buckets' shared memory (collective; see
        :meth:`GradientBuckets.close`).  ``grads`` stay valid; ``with`` closes too."""
        self._buckets.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:  # a raising block may be on this rank only (see GradientBuckets)
            self.close()

    @property
    def params(self):
        """The parameter arrays, as a list in the order the optimizer sees them."""
        return list(self._params)

    @contextmanager
    def no_sync(self):
        """Passes begun inside only accumulate their gradients locally (no communication).

        As DDP's ``no_sync``: the first pass begun after the block reduces
        the sum of every accumulated pass and its own, and its :meth:`step`
        applies it.  A pass's kind is fixed when it begins (its first
        :meth:`ready`, or :meth:`step`).
        """
        before, self._no_sync = self._no_sync, True
        try:
            yield self
        finally:
            self._no_sync = before

    def _key(self, key):
        """The position of parameter ``key`` (a name for a dict, an index for a list)."""
        if isinstance(self.grads, dict):
            index = self._index.get(key)
        else:
            try:
                index = operator.index(key)
            except TypeError:
                index = None
            if index is not None and not 0 <= index < len(self._params):
                index = None
        if index is None:
            raise KeyError(f"no parameter {key!r}")
        return index

    def _begin(self):
        if self._syncing is None:
            self._syncing = (not self._no_sync
                             and self._passes + 1 >= self.backward_passes_per_step)

    def ready(self, key):
        """Gradient ``key`` (index, or name for a dict) of this pass is written to ``grads``.

        In a synchronising pass, its bucket's allreduce starts once every
        gradient of the bucket is ready (buckets start in order, the same on
        every rank).  Optional: :meth:`step` marks whatever is left.

        Raises:
            KeyError: no such parameter.
            ValueError: the gradient was already marked in this pass.
        """
        self._mark(self._key(key))

    def _mark(self, index):
        self._begin()
        if self._marked[index]:
            raise ValueError(f"gradient {self._names[index]!r} marked ready twice in one pass")
        self._marked[index] = True
        grad = self._buckets.grads[index]
        if self._syncing:
            if self._passes:
                grad += self._acc[index]  # the earlier passes' sum joins this one's
            self._buckets.ready(index)
        elif self._passes == 0:
            if self._acc is None:
                self._acc = [np.empty_like(g) for g in self._buckets.grads]
            self._acc[index][...] = grad
        else:
            self._acc[index] += grad

    def _end_pass(self):
        """Mark what is left; True if this pass reduced (the gradients are final)."""
        self._begin()
        for index, marked in enumerate(self._marked):
            if not marked:
                self._mark(index)
        syncing = self._syncing
        if syncing:
            self._buckets.wait()
            self._passes = 0
        else:
            self._passes += 1
        self._syncing = None
        self._marked = [False] * len(self._marked)
        return syncing

    def synchronize(self):
        """End a synchronising pass now: reduce and wait, without stepping.

        For reading or changing the averaged gradients (clipping, say)
        before :meth:`step`, which then applies them without reducing again.

        Returns:
            ``grads``, averaged over the ranks (bitwise the same on each).

        Raises:
            RuntimeError: this pass only accumulates (inside :meth:`no_sync`
                or before ``backward_passes_per_step`` passes).
        """
        self._begin()
        if not self._syncing:
            raise RuntimeError("synchronize() in a pass that only accumulates (no_sync, or "
                               "fewer than backward_passes_per_step passes)")
        self._end_pass()
        self._reduced = True
        return self.grads

    def step(self):
        """End this backward pass; in a synchronising pass, reduce and apply the optimizer.

        Returns:
            True when the parameters were updated; False when the pass only
            accumulated its gradients.
        """
        if not self._reduced and not self._end_pass():
            return False
        self._reduced = False
        self.optimizer.step(self._params, self._buckets.grads)
        return True

    def zero_grad(self):
        """Set :attr:`grads` to zero (for a backward pass that adds into them)."""
        self._buckets.zero()
