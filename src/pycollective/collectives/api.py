"""Public collectives: argument checks, cross-rank agreement, dispatch.

Every call follows the same order, so that a bad argument can never leave
some ranks waiting for messages that will not come:

1. Local checks (buffers, dtype, op, algorithm) and kernel selection, before
   any message.  Kernel compilation happens here, outside anything timed.
2. Agreement (on by default, see :func:`~pycollective.collectives.options.set_check` and :mod:`~pycollective.collectives.agree`): one
   small MAX reduction carries each rank's error flag and its (count, dtype,
   op, algorithm).  If any rank failed its local checks, or the ranks
   disagree, every rank raises the same error.  With agreement off, errors
   that depend only on facts shared by all ranks (algorithm, op, dtype,
   sizes under the same-on-all-ranks contract) still raise everywhere, but a
   rank-local mistake can leave the others waiting.
3. Trivial cases (count 0, one rank) return without messages, identically
   on every rank.
4. The algorithm is resolved: ``auto`` asks :mod:`~pycollective.collectives.auto` (:mod:`~pycollective.collectives.choose`
   for the collectives other than allreduce; collective on a communicator's
   first automatic call, which is safe now that every rank agreed it is an
   automatic call); a named algorithm that cannot run on this communicator
   raises its ``usable`` reason on every rank.
5. The algorithm runs on flat views of the buffers.

Step 1 is each function's own (its ``local()``); steps 2 to 5 are the same
for every collective and live in :mod:`~pycollective.collectives.call`.  Repeated calls of one shape
take :mod:`~pycollective.collectives.plans` instead of steps 1-4 (allreduce only).  Buffers are read by :mod:`~pycollective.data.buffers`: any buffer mpi4py
accepts.  Device memory (CUDA, ROCm) is staged through pinned host memory into
these same functions, or goes to the communicator's own MPI call only where the
MPI library takes device pointers (:mod:`~pycollective.collectives.device`).
"""

import operator
import zlib
from typing import Callable, NamedTuple, Optional

import numpy as np
from mpi4py import MPI

from . import auto as _auto, plans as _plans, probe as _probe
from . import device as _device
from ..data import buffers as _buffers
from ..runtime import registry as _registry, watch as _watch
from .. import compression as _compression
from .. import algorithms as _algorithms  # noqa: F401  (importing it registers every algorithm)
from .agree import Facts
from .call import (AUTO, DEFAULT, FAMILY, Checked, call_collective, comm_shape, resolve_comm,
                   run_collective, settings_facts)
from ..runtime.context import Context
from ..data.kernels import DTYPE_NAMES, dtype_code, get_kernel
from ..data.ops import OPS, resolve_op
from ..data.partition import chunk_bounds
from .. import timeline as _timeline

__all__ = ["allreduce", "reduce_scatter", "allgather", "allgatherv", "reduce", "bcast",
           "broadcast"]


# --- local checks -------------------------------------------------------------

def _flat(buf, name, writable):
    """Flat view (no copy) of any buffer: numpy arrays, the buffer protocol, CPU DLPack."""
    return _buffers.flat(buf, name, writable)


def _reducible(array, name):
    """``array``, unless its elements are raw bytes of a type numpy has no name for."""
    if array.dtype == _buffers.RAW:
        raise TypeError(f"unsupported dtype: {name} holds elements numpy has no name for "
                        "(a DLPack type such as bfloat16); pycollective reduces "
                        + ", ".join(DTYPE_NAMES))
    return array


def _pair(sendbuf, recvbuf):
    """Return (src, dst) flat views of a reduction; src is dst for in-place calls."""
    dst = _reducible(_flat(recvbuf, "recvbuf", writable=True), "recvbuf")
    if sendbuf is MPI.IN_PLACE:
        return dst, dst
    src = _flat(sendbuf, "sendbuf", writable=False)
    if src.dtype != dst.dtype:
        raise TypeError(f"recvbuf dtype {dst.dtype} differs from sendbuf dtype {src.dtype}")
    return src, dst


def _same_or_disjoint(src, dst):
    """``dst`` if both views are the same memory, ``src`` if disjoint; else error."""
    if src is dst or not np.may_share_memory(src, dst):
        return src
    if (src.__array_interface__["data"][0] == dst.__array_interface__["data"][0]
            and src.nbytes == dst.nbytes):
        return dst  # the same memory passed twice: an in-place call
    raise ValueError("sendbuf and recvbuf partially overlap")


# --- allreduce ----------------------------------------------------------------

class _Allreduce(NamedTuple):
    algo: Optional[_registry.Algorithm]  # None: algorithm="auto", chosen after agreement
    src: np.ndarray
    dst: np.ndarray
    opname: str
    kernel: Callable
    facts: Facts

    def fingerprint(self, settings):
        algo = len(_registry.names()) if self.algo is None else _registry.index(self.algo.name)
        return _watch.fingerprint("allreduce", self.dst.size, dtype_code(self.dst.dtype),
                                  OPS.index(self.opname), algo, settings)

    # What run_collective reads of a checked call (Checked's fields).
    own = ()  # copied on one rank only (_one_rank): the algorithms read src

    @property
    def count(self):
        return self.dst.size

    @property
    def args(self):
        return self.src, self.dst, self.kernel


def _one_rank(checked: _Allreduce) -> None:
    if checked.src is not checked.dst and checked.dst.size:
        checked.dst[...] = checked.src


def _resolve_algorithm(ctx: Context, checked: _Allreduce) -> _registry.Algorithm:
    """The algorithm to run, the same on every rank; raises where it cannot run."""
    if checked.algo is None:  # the decision, or one of auto's timed trials (see _auto)
        return _auto.auto_for(ctx).resolve(checked.dst.size, checked.dst.dtype, checked.opname)
    reason = checked.algo.usable(ctx)
    if reason:
        raise ValueError(reason)
    return checked.algo


def allreduce(sendbuf, recvbuf, op=MPI.SUM, *, comm=None, algorithm: str = "auto",
              timeout=DEFAULT, compress=None):
    """Reduce ``sendbuf`` element-wise over all ranks into ``recvbuf`` on every rank.

    Args:
        sendbuf: contiguous numpy array (any shape, treated as flat; may be
            read-only and is never modified), or ``MPI.IN_PLACE`` to reduce
            ``recvbuf`` in place.
        recvbuf: writable contiguous numpy array of the same dtype and size.
        op: ``MPI.SUM``, ``MPI.PROD``, ``MPI.MAX``, ``MPI.MIN`` or their
            names "sum", "prod", "max", "min".
        comm: an mpi4py intracommunicator; ``None`` means ``MPI.COMM_WORLD``.
        algorithm: one of :func:`algorithms`, or "auto" (the default): the
            one :func:`pycollective.model.choose` predicts fastest for this
            (N, M, dtype, op), from rank 0's calibration, so every rank runs
            the same algorithm.
        timeout: longest wait without progress, in seconds (None or 0: no
            limit); default: :func:`set_timeout`'s for the communicator or
            the process, else ``PYCOLLECTIVE_TIMEOUT_S`` (300 s).
        compress: None (the default), "fp16", "bf16" or a compressor object:
            a floating sum travels as two-byte floats and accumulates in
            float64 at every step (:mod:`pycollective.compression`).

    Returns:
        ``recvbuf``, holding bitwise the same result on every rank.

    Raises:
        TypeError: objects that are not buffers, different dtypes,
            unsupported dtype, a comm that is not an intracommunicator.
        ValueError: sizes differ, non-contiguous or read-only recvbuf,
            partially overlapping buffers, unknown op or algorithm, an
            algorithm that cannot run on this communicator, or (with
            agreement on) arguments that differ across ranks.
        CollectiveError: after data started to move: a peer stalled or died
            (``CollectiveTimeout``), ranks called different things
            (``CollectiveMismatch``), a peer failed (``PeerFailed``), or the
            communicator is unusable since an earlier failure
            (``CommunicatorBroken``).  The communicator is then unusable.
    """
    if _timeline.ACTIVE is None:  # timeline hook (the fast path's one test of it)
        # A repeated call first (plans take only numpy arrays: no device check); a bound
        # one with no frame between here and fast_way (a small call's 0.1 us each)
        if compress is None:
            bound = _plans.find_bound(sendbuf, recvbuf, op, comm, algorithm, timeout)
            if (bound is not None
                    and _plans.fast_way(bound.ctx, bound.plan, sendbuf, recvbuf, None, bound)
                    or _plans.run_found(sendbuf, recvbuf, op, comm, algorithm, timeout)):
                return recvbuf
    elif _timeline.ACTIVE.outside():  # timeline hook: the call
        return _timeline.ACTIVE.traced(allreduce, "allreduce", (sendbuf, recvbuf, op), dict(
            comm=comm, algorithm=algorithm, timeout=timeout, compress=compress))
    elif compress is None and _plans.run_found(sendbuf, recvbuf, op, comm, algorithm,
                                               timeout):
        return recvbuf
    return _allreduce(sendbuf, recvbuf, op, comm, algorithm, timeout, compress)


def _allreduce(sendbuf, recvbuf, op, comm, algorithm, timeout, compress):
    """:func:`allreduce` past its fast path, apart: its closures make each argument a cell,
    made on every call (0.2-0.3 us of a repeated 1e3 call's 3.5 as allreduce's own)."""
    if _buffers.device_reason(sendbuf, recvbuf) is not None:
        return _device.allreduce(
            allreduce, sendbuf, recvbuf, op, comm, algorithm, timeout, compress,
            lambda: _device.native_allreduce(sendbuf, recvbuf, op, resolve_comm(comm)))
    if compress is not None:
        return _compression.allreduce(allreduce, sendbuf, recvbuf, op, compress, comm=comm,
                                      algorithm=algorithm, timeout=timeout)
    def local():
        algo = None if algorithm == AUTO else _registry.get(algorithm)
        opname = resolve_op(op)
        src, dst = _pair(sendbuf, recvbuf)
        if src.size != dst.size:
            raise ValueError(f"recvbuf has {dst.size} elements but sendbuf has {src.size}")
        src = _same_or_disjoint(src, dst)
        kernel = get_kernel(opname, dst.dtype)
        index = -1 if algo is None else _registry.index(algo.name)
        facts = (("count", dst.size), ("dtype", dst.dtype.num), ("op", OPS.index(opname)),
                 ("algorithm (-1: auto)", index))
        return _Allreduce(algo, src, dst, opname, kernel, facts)

    def remember(ctx, call, algo, checked):
        _plans.remember(ctx, algorithm, op, timeout, algo, checked.kernel, checked.dst,
                        tuple(checked.facts) + settings_facts(call.settings), call)

    run_collective("allreduce", comm, local, timeout, _one_rank, _resolve_algorithm, remember)
    return recvbuf


# --- the other collectives: shared steps -------------------------------------------------------

def _named(algorithm, what):
    """The registered algorithm called ``algorithm`` (None: auto); ValueError if unknown."""
    return None if algorithm == AUTO else _registry.get(algorithm, FAMILY[what])


def _algorithm_fact(what, algo):
    return ("algorithm (-1: auto)", -1 if algo is None else
            _registry.index(algo.name, FAMILY[what]))


def _counts_fact(counts):
    """One integer that differs when the counts do (CRC-32 of the int64 vector)."""
    return ("counts (CRC-32)", zlib.crc32(np.asarray(counts, np.int64).tobytes()))


def _check_counts(counts, nranks, what):
    """``counts`` as a list of N non-negative ints; ValueError otherwise."""
    try:
        counts = [operator.index(c) for c in counts]
    except TypeError:
        raise TypeError(f"{what} must be a sequence of integers, got {counts!r}") from None
    if len(counts) != nranks:
        raise ValueError(f"{what} has {len(counts)} entries for {nranks} ranks")
    if any(c < 0 for c in counts):
        raise ValueError(f"{what} has a negative entry: {counts}")
    return counts


def _bounds_of(counts):
    bounds = [0]
    for c in counts:
        bounds.append(bounds[-1] + c)
    return bounds


# --- reduce-scatter ----------------------------------------------------------------------------

def reduce_scatter(sendbuf, recvbuf, op=MPI.SUM, *, counts=None, comm=None,
                   algorithm: str = "auto", timeout=DEFAULT):
    """Reduce element-wise over all ranks; rank r receives block r of the result.

    The M elements of ``sendbuf`` are split into N blocks: by ``counts``
    (block r has ``counts[r]`` elements, blocks end to end), or if ``counts``
    is None as :func:`partition` says (block r is ``partition(M, N, r)``).

    Args:
        sendbuf: M elements, any buffer :func:`allreduce` takes (same M on
            every rank), never modified; or ``MPI.IN_PLACE``, in which case
            ``recvbuf`` holds the M input elements and the result is written
            over this rank's own block of it (the other blocks are left
            unchanged).
        recvbuf: writable buffer of this rank's block length (M in place).
        op: as for :func:`allreduce`.
        counts: N block lengths summing to M, the same on every rank; None:
            :func:`partition`'s.
        comm, timeout: as for :func:`allreduce`.
        algorithm: one of ``algorithms("reduce_scatter")`` or "auto" (the
            smallest registered cost, see ``docs/usage.md``).

    Returns:
        ``recvbuf``.

    Raises:
        TypeError, ValueError, CollectiveError: as for :func:`allreduce`;
        ValueError when ``recvbuf`` does not have this rank's block length or
        ``counts`` do not add up to M.
    """
    reason = _buffers.device_reason(sendbuf, recvbuf)
    if reason is not None:
        def native():
            if sendbuf is MPI.IN_PLACE:
                raise ValueError("reduce_scatter in place on device memory: MPI places the "
                                 "result differently; pass a separate recvbuf")
            _device.native("reduce_scatter", reason)
            # counts None: mpi4py gathers the receive counts, which are partition's here.
            resolve_comm(comm).Reduce_scatter(
                sendbuf, recvbuf, None if counts is None else list(counts), _device.mpi_op(op))
        _device.staged(reduce_scatter, [sendbuf, recvbuf], ["sendbuf", "recvbuf"], [1],
                       lambda s, r: reduce_scatter(s, r, op, counts=counts, comm=comm,
                                                   algorithm=algorithm, timeout=timeout),
                       native, comm)
        return recvbuf
    what = "reduce_scatter" if counts is None else "reduce_scatterv"

    def local():
        algo = _named(algorithm, what)
        opname = resolve_op(op)
        src, dst = _pair(sendbuf, recvbuf)
        nranks, rank = comm_shape(comm)
        if counts is None:
            bounds = chunk_bounds(src.size, nranks)
        else:
            blocks = _check_counts(counts, nranks, "counts")
            if sum(blocks) != src.size:
                raise ValueError(f"counts add up to {sum(blocks)} but the input has "
                                 f"{src.size} elements")
            bounds = _bounds_of(blocks)
        offset, length = bounds[rank], bounds[rank + 1] - bounds[rank]
        if sendbuf is MPI.IN_PLACE:
            out = dst[offset:offset + length]
        else:
            if dst.size != length:
                raise ValueError(
                    f"recvbuf has {dst.size} elements but this rank's chunk of "
                    f"{src.size} over {nranks} ranks has {length}")
            if np.may_share_memory(src, dst):
                raise ValueError("sendbuf and recvbuf overlap; use MPI.IN_PLACE")
            out = dst
        kernel = get_kernel(opname, dst.dtype)
        facts = (("count", src.size), ("dtype", dst.dtype.num), ("op", OPS.index(opname)),
                 _algorithm_fact(what, algo))
        if counts is not None:
            facts += (_counts_fact(bounds),)
        return Checked(what, algo, src.size, dst.dtype, dtype_code(dst.dtype),
                        OPS.index(opname), facts, (src, out, kernel, bounds))

    def one_rank(checked):
        src, out = checked.args[:2]
        if src.size and not np.may_share_memory(src, out):
            out[...] = src

    call_collective(what, comm, local, timeout, one_rank)
    return recvbuf


# --- allgather ---------------------------------------------------------------------------------

def _allgather(what, sendbuf, recvbuf, counts, displs, comm, algorithm, timeout):
    """allgather (``counts`` None: :func:`partition`'s blocks) and allgatherv."""
    def local():
        algo = _named(algorithm, what)
        dst = _flat(recvbuf, "recvbuf", writable=True)
        nranks, rank = comm_shape(comm)
        if counts is None:
            bounds = chunk_bounds(dst.size, nranks)
            blocks = list(zip(bounds, bounds[1:]))
            sizes = [hi - lo for lo, hi in blocks]
        else:
            sizes = _check_counts(counts, nranks, "counts")
            starts = _bounds_of(sizes)[:-1] if displs is None else \
                _check_counts(displs, nranks, "displs")
            blocks = [(d, d + c) for d, c in zip(starts, sizes)]
            for q, (lo, hi) in enumerate(blocks):
                if hi > dst.size:
                    raise ValueError(f"recvbuf has {dst.size} elements but rank {q}'s block "
                                     f"is [{lo}, {hi})")
            placed = sorted(b for b in blocks if b[1] > b[0])
            if any(a[1] > b[0] for a, b in zip(placed, placed[1:])):
                raise ValueError(f"the blocks overlap in recvbuf: {blocks}")
        lo, hi = blocks[rank]
        src = None
        if sendbuf is not MPI.IN_PLACE:
            src = _flat(sendbuf, "sendbuf", writable=False)
            if src.dtype != dst.dtype:
                raise TypeError(f"recvbuf dtype {dst.dtype} differs from sendbuf dtype {src.dtype}")
            if src.size != hi - lo:
                raise ValueError(
                    f"sendbuf has {src.size} elements but this rank's chunk of "
                    f"{sum(sizes)} over {nranks} ranks has {hi - lo}")
            if np.may_share_memory(src, dst) and not np.shares_memory(src, dst[lo:hi]):
                raise ValueError("sendbuf overlaps recvbuf outside this rank's block")
        item = dst.dtype.itemsize
        facts = (("count", sum(sizes)), ("itemsize", item), _algorithm_fact(what, algo))
        if counts is not None:
            facts += (_counts_fact(sizes),)
        byte_blocks = [(a * item, b * item) for a, b in blocks]
        return Checked(what, algo, sum(sizes) * item, np.dtype(np.uint8), item, -1, facts,
                        (dst.view(np.uint8), byte_blocks), () if src is None else (src, dst[lo:hi]))

    call_collective(what, comm, local, timeout, lambda checked: None)
    return recvbuf


def allgather(sendbuf, recvbuf, *, comm=None, algorithm: str = "auto", timeout=DEFAULT):
    """Every rank receives all ranks' blocks, placed by :func:`partition`.

    Args:
        sendbuf: this rank's block of M elements (``partition(M, N, rank)[1]``
            elements), any buffer :func:`allreduce` takes and of any dtype
            (nothing is computed), or ``MPI.IN_PLACE`` when ``recvbuf``
            already holds it at its offset.
        recvbuf: writable buffer of M elements (same M on every rank).
        comm, timeout: as for :func:`allreduce`.
        algorithm: one of ``algorithms("allgather")`` or "auto".

    Returns:
        ``recvbuf``.

    Raises:
        TypeError, ValueError, CollectiveError: as for :func:`allreduce`;
        ValueError when ``sendbuf`` does not have this rank's block length.
    """
    reason = _buffers.device_reason(sendbuf, recvbuf)
    if reason is not None:
        def native():
            _device.native("allgather", reason)
            # A bare recvbuf: mpi4py splits it as partition does (the first ranks one more).
            resolve_comm(comm).Allgatherv(sendbuf, recvbuf)
        _device.staged(allgather, [sendbuf, recvbuf], ["sendbuf", "recvbuf"], [1],
                       lambda s, r: allgather(s, r, comm=comm, algorithm=algorithm,
                                              timeout=timeout), native, comm)
        return recvbuf
    return _allgather("allgather", sendbuf, recvbuf, None, None, comm, algorithm, timeout)


def allgatherv(sendbuf, recvbuf, counts, displs=None, *, comm=None, algorithm: str = "auto",
               timeout=DEFAULT):
    """Every rank receives all ranks' blocks of any lengths, at any displacements.

    Args:
        sendbuf: this rank's block, ``counts[rank]`` elements (any buffer
            :func:`allreduce` takes, any dtype), or ``MPI.IN_PLACE`` when
            ``recvbuf`` already holds it at ``displs[rank]``.
        recvbuf: writable buffer holding every block.
        counts: N block lengths, the same on every rank.
        displs: N element offsets of the blocks in ``recvbuf`` (this rank's
            layout; blocks may not overlap); None: end to end.
        comm, timeout: as for :func:`allreduce`.
        algorithm: one of ``algorithms("allgather")`` or "auto".

    Returns:
        ``recvbuf``; elements outside the blocks are left unchanged.

    Raises:
        TypeError, ValueError, CollectiveError: as for :func:`allgather`;
        ValueError for counts or displacements that do not fit ``recvbuf``.
    """
    reason = _buffers.device_reason(sendbuf, recvbuf)
    if reason is not None:
        def native():
            _device.native("allgatherv", reason)
            layout = (list(counts), None if displs is None else list(displs))
            resolve_comm(comm).Allgatherv(sendbuf, [recvbuf, layout])
        _device.staged(allgatherv, [sendbuf, recvbuf], ["sendbuf", "recvbuf"], [1],
                       lambda s, r: allgatherv(s, r, counts, displs, comm=comm,
                                               algorithm=algorithm, timeout=timeout),
                       native, comm)
        return recvbuf
    return _allgather("allgatherv", sendbuf, recvbuf, counts, displs, comm, algorithm, timeout)


# --- reduce and bcast ----------------------------------------------------------------------------

def _check_root(root, nranks):
    try:
        root = operator.index(root)
    except TypeError:
        raise TypeError(f"root must be an integer, got {root!r}") from None
    if not 0 <= root < nranks:
        raise ValueError(f"root {root} outside [0, {nranks})")
    return root


def reduce(sendbuf, recvbuf, op=MPI.SUM, *, root=0, comm=None, algorithm: str = "auto",
           timeout=DEFAULT):
    """Reduce element-wise over all ranks into ``recvbuf`` on ``root``.

    Args:
        sendbuf: M elements, any buffer :func:`allreduce` takes, never
            modified; ``MPI.IN_PLACE`` on the root only (its ``recvbuf``
            holds its input).
        recvbuf: on the root a writable buffer of M elements of the same
            dtype; ignored elsewhere (may be None).
        op, comm, timeout: as for :func:`allreduce`.
        root: the rank that receives the result (the same on every rank).
        algorithm: one of ``algorithms("reduce")`` or "auto".

    Returns:
        ``recvbuf``.

    Raises:
        TypeError, ValueError, CollectiveError: as for :func:`allreduce`.
    """
    reason = _buffers.device_reason(sendbuf, recvbuf)
    if reason is not None:
        def native():
            _device.native("reduce", reason)
            resolve_comm(comm).Reduce(sendbuf, recvbuf, _device.mpi_op(op), root)
        at_root = isinstance(root, (int, np.integer)) and resolve_comm(comm).Get_rank() == root
        _device.staged(reduce, [sendbuf, recvbuf], ["sendbuf", "recvbuf"], [1] if at_root else [],
                       lambda s, r: reduce(s, r, op, root=root, comm=comm, algorithm=algorithm,
                                           timeout=timeout), native, comm)
        return recvbuf

    def local():
        algo = _named(algorithm, "reduce")
        opname = resolve_op(op)
        nranks, rank = comm_shape(comm)
        where = _check_root(root, nranks)
        if rank == where:
            src, dst = _pair(sendbuf, recvbuf)
            if src.size != dst.size:
                raise ValueError(f"recvbuf has {dst.size} elements but sendbuf has {src.size}")
            src = _same_or_disjoint(src, dst)
        else:
            if sendbuf is MPI.IN_PLACE:
                raise ValueError(f"MPI.IN_PLACE as sendbuf on rank {rank}, which is not the "
                                 f"root ({where})")
            src, dst = _reducible(_flat(sendbuf, "sendbuf", writable=False), "sendbuf"), None
        kernel = get_kernel(opname, src.dtype)
        facts = (("count", src.size), ("dtype", src.dtype.num), ("op", OPS.index(opname)),
                 _algorithm_fact("reduce", algo), ("root", where))
        return Checked("reduce", algo, src.size, src.dtype, dtype_code(src.dtype),
                        OPS.index(opname), facts, (src, dst, kernel, where))

    def one_rank(checked):
        src, dst = checked.args[:2]
        if src is not dst and src.size:
            dst[...] = src

    call_collective("reduce", comm, local, timeout, one_rank)
    return recvbuf


def bcast(buf, *, root=0, comm=None, algorithm: str = "auto", timeout=DEFAULT):
    """Copy ``buf`` of ``root`` into ``buf`` of every other rank.

    Args:
        buf: any buffer :func:`allreduce` takes, of any dtype (bytes are
            copied); the same size in bytes on every rank; writable except
            on the root.
        root: the rank whose buffer is sent (the same on every rank).
        comm, timeout: as for :func:`allreduce`.
        algorithm: one of ``algorithms("bcast")`` or "auto".

    Returns:
        ``buf``.

    Raises:
        TypeError, ValueError, CollectiveError: as for :func:`allreduce`.
    """
    reason = _buffers.device_reason(buf)
    if reason is not None:
        def native():
            _device.native("bcast", reason)
            resolve_comm(comm).Bcast(buf, root)
        off_root = not (isinstance(root, (int, np.integer))
                        and resolve_comm(comm).Get_rank() == root)
        _device.staged(bcast, [buf], ["buf"], [0] if off_root else [],
                       lambda b: bcast(b, root=root, comm=comm, algorithm=algorithm,
                                       timeout=timeout), native, comm)
        return buf

    def local():
        algo = _named(algorithm, "bcast")
        nranks, rank = comm_shape(comm)
        where = _check_root(root, nranks)
        data = _flat(buf, "buf", writable=rank != where).view(np.uint8)
        facts = (("bytes", data.size), _algorithm_fact("bcast", algo), ("root", where))
        return Checked("bcast", algo, data.size, np.dtype(np.uint8), -1, -1, facts,
                        (data, where))

    call_collective("bcast", comm, local, timeout, lambda checked: None)
    return buf


broadcast = bcast

# The first-use measurement times the library's own allreduce (collectives/probe.py); it
# runs inside auto, which this module imports, so it is handed the function here.
_probe.allreduce = allreduce
