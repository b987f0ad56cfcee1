"""Public collectives: argument checks, cross-rank agreement, dispatch.

Every call follows the same order, so that a bad argument can never leave
some ranks waiting for messages that will not come:

1. Local checks (buffers, dtype, op, algorithm) and kernel selection, before
   any message.  Kernel compilation happens here, outside anything timed.
2. Agreement (on by default, see :func:`set_check` and :mod:`._agree`): one
   small MAX reduction carries each rank's error flag and its (count, dtype,
   op, algorithm).  If any rank failed its local checks, or the ranks
   disagree, every rank raises the same error.  With agreement off, errors
   that depend only on facts shared by all ranks (algorithm, op, dtype,
   sizes under the same-on-all-ranks contract) still raise everywhere, but a
   rank-local mistake can leave the others waiting.
3. Trivial cases (count 0, one rank) return without messages, identically
   on every rank.
4. The algorithm is resolved: ``auto`` asks :mod:`._auto` (collective on a
   communicator's first automatic call, which is safe now that every rank
   agreed it is an automatic call); a named algorithm that cannot run on
   this communicator raises its ``usable`` reason on every rank.
5. The algorithm runs on flat views of the buffers.

Repeated calls of one shape take :mod:`._fastpath` instead of steps 1-4.
"""

from typing import Callable, List, NamedTuple, Optional

import numpy as np
from mpi4py import MPI

from . import _auto, _env, _fastpath, _registry
from . import algorithms as _algorithms  # noqa: F401  (importing it registers every algorithm)
from ._agree import Facts, agree, agree_max, verdict
from ._context import Context, get_context
from ._kernels import get_kernel
from ._ops import OPS, resolve_op
from ._partition import chunk_bounds, partition
from .algorithms.ring import allgather_phase, reduce_scatter_phase

__all__ = ["allreduce", "reduce_scatter", "allgather", "algorithms", "set_check",
           "usable_algorithms"]

_AUTO = "auto"
_AUTO_INDEX = -1  # the agreed "algorithm" fact of an automatic call
_check_override: Optional[bool] = None


def check_enabled() -> bool:
    """Whether calls run the agreement step: :func:`set_check`, else ``PYCOLLECTIVE_CHECK``."""
    if _check_override is not None:
        return _check_override
    return _env.CHECK.get()


def set_check(enabled: bool) -> bool:
    """Turn the cross-rank agreement step on or off; returns the previous setting.

    The step costs one small MAX reduction per call (a shared-memory
    exchange on one node, else an ``MPI_Allreduce``).  It turns a bad
    argument on one rank, or ranks that disagree on count, dtype, op or
    algorithm, into the same exception on every rank instead of a hang.
    The environment variable ``PYCOLLECTIVE_CHECK=0`` sets the default off.
    """
    global _check_override
    previous, _check_override = check_enabled(), bool(enabled)
    return previous


def algorithms() -> List[str]:
    """Return the names of the registered allreduce algorithms."""
    return _registry.names()


def usable_algorithms(comm=None) -> List[str]:
    """The registered algorithms that can run on ``comm`` (collective on first use).

    See :func:`unusable_algorithms` for the others and why.
    """
    reasons = unusable_algorithms(comm)
    return [n for n in _registry.names() if n not in reasons]


def unusable_algorithms(comm=None) -> dict:
    """``{name: reason}`` for each registered algorithm that cannot run on ``comm``."""
    return _auto.unusable_reasons(get_context(_resolve_comm(comm)))


# --- local checks -------------------------------------------------------------

def _resolve_comm(comm):
    if comm is None:
        return MPI.COMM_WORLD
    if not isinstance(comm, MPI.Intracomm) or isinstance(comm, MPI.Intercomm):
        raise TypeError(f"comm must be an mpi4py intracommunicator, got {type(comm).__name__}")
    if comm == MPI.COMM_NULL:
        raise ValueError("comm is MPI.COMM_NULL")
    return comm


def _flat(buf, name, writable):
    """Flat view of a contiguous numpy array, in memory order."""
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(buf).__name__}")
    if not (buf.flags.c_contiguous or buf.flags.f_contiguous):
        raise ValueError(f"{name} is not contiguous (strides {buf.strides}); "
                         "pass a contiguous array, e.g. np.ascontiguousarray(...)")
    if writable and not buf.flags.writeable:
        raise ValueError(f"{name} is read-only")
    return buf.reshape(-1, order="A")


def _buffers(sendbuf, recvbuf):
    """Return (src, dst) flat views; src is dst for in-place calls."""
    dst = _flat(recvbuf, "recvbuf", writable=True)
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


def _prepare(what: str, comm, local: Callable[[], NamedTuple]):
    """Run ``local()`` (the local checks), then agreement; return ``(ctx, checked)``.

    ``local`` returns a named tuple with a ``facts`` field or raises
    TypeError/ValueError; on one rank only, that error reaches every rank.
    """
    comm = _resolve_comm(comm)
    checked, error = None, None
    try:
        checked = local()
    except (TypeError, ValueError) as exc:
        error = exc
    if comm.Get_size() == 1 or not check_enabled():
        if error is not None:
            raise error
        return get_context(comm), checked
    ctx = get_context(comm)
    agree(ctx, what, error, None if checked is None else checked.facts)
    return ctx, checked


# --- allreduce ----------------------------------------------------------------

class _Allreduce(NamedTuple):
    algo: Optional[_registry.Algorithm]  # None: algorithm="auto", chosen after agreement
    src: np.ndarray
    dst: np.ndarray
    opname: str
    kernel: Callable
    facts: Facts


def _resolve_algorithm(ctx: Context, checked: _Allreduce) -> _registry.Algorithm:
    """The algorithm to run, the same on every rank; raises where it cannot run."""
    if checked.algo is None:
        state = _auto.auto_for(ctx)
        return _registry.get(state.choose(checked.dst.size, checked.dst.dtype, checked.opname))
    reason = checked.algo.usable(ctx)
    if reason:
        raise ValueError(reason)
    return checked.algo


def allreduce(sendbuf, recvbuf, op=MPI.SUM, *, comm=None, algorithm: str = "auto"):
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

    Returns:
        ``recvbuf``, holding bitwise the same result on every rank.

    Raises:
        TypeError: non-numpy buffers, different dtypes, unsupported dtype,
            a comm that is not an intracommunicator.
        ValueError: sizes differ, non-contiguous or read-only recvbuf,
            partially overlapping buffers, unknown op or algorithm, an
            algorithm that cannot run on this communicator, or (with
            agreement on) arguments that differ across ranks.
    """
    hit = _fastpath.lookup(sendbuf, recvbuf, op, comm, algorithm)
    if hit is not None:
        plan = hit.plan
        if check_enabled():
            values = plan.template.copy()
            agree_max(hit.ctx, values)
            if values.tobytes() != plan.agreed:
                verdict(hit.ctx, "allreduce", None, plan.facts, values)
        plan.algo.run(hit.ctx, hit.src, hit.dst, plan.kernel)
        return recvbuf

    def local():
        algo = None if algorithm == _AUTO else _registry.get(algorithm)
        opname = resolve_op(op)
        src, dst = _buffers(sendbuf, recvbuf)
        if src.size != dst.size:
            raise ValueError(f"recvbuf has {dst.size} elements but sendbuf has {src.size}")
        src = _same_or_disjoint(src, dst)
        kernel = get_kernel(opname, dst.dtype)
        index = _AUTO_INDEX if algo is None else _registry.index(algo.name)
        facts = (("count", dst.size), ("dtype", dst.dtype.num), ("op", OPS.index(opname)),
                 ("algorithm", index))
        return _Allreduce(algo, src, dst, opname, kernel, facts)

    ctx, checked = _prepare("allreduce", comm, local)
    src, dst = checked.src, checked.dst
    if dst.size == 0:
        return recvbuf
    if ctx.size == 1:
        if src is not dst:
            dst[...] = src
        return recvbuf
    algo = _resolve_algorithm(ctx, checked)
    _fastpath.remember(ctx, algorithm, op, algo, checked.kernel, dst, checked.facts)
    algo.run(ctx, src, dst, checked.kernel)
    return recvbuf


# --- reduce-scatter and allgather -------------------------------------------

class _ReduceScatter(NamedTuple):
    src: np.ndarray
    out: np.ndarray
    kernel: Callable
    facts: Facts


class _Allgather(NamedTuple):
    src: Optional[np.ndarray]
    dst: np.ndarray
    offset: int
    facts: Facts


def reduce_scatter(sendbuf, recvbuf, op=MPI.SUM, *, comm=None):
    """Ring reduce-scatter: rank r receives the reduction of chunk r.

    The M elements of ``sendbuf`` are split as :func:`partition` says; rank r
    gets elements ``[offset, offset + length)`` of the element-wise
    reduction, where ``(offset, length) = partition(M, N, r)``.

    Args:
        sendbuf: contiguous numpy array of M elements (same M on every rank),
            never modified; or ``MPI.IN_PLACE``, in which case ``recvbuf``
            holds the M input elements and the result is written over its
            own chunk ``recvbuf[offset:offset + length]`` (the other chunks
            are left unchanged).
        recvbuf: writable contiguous array of ``length`` elements (M in place).
        op: as for :func:`allreduce`.
        comm: as for :func:`allreduce`.

    Returns:
        ``recvbuf``.

    Raises:
        TypeError, ValueError: as for :func:`allreduce`; ValueError when
        ``recvbuf`` does not have this rank's chunk length.
    """
    def local():
        opname = resolve_op(op)
        in_place = sendbuf is MPI.IN_PLACE
        src, dst = _buffers(sendbuf, recvbuf)
        resolved = _resolve_comm(comm)
        nranks, rank = resolved.Get_size(), resolved.Get_rank()
        offset, length = partition(src.size, nranks, rank)
        if in_place:
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
        facts = (("count", src.size), ("dtype", dst.dtype.num), ("op", OPS.index(opname)))
        return _ReduceScatter(src, out, kernel, facts)

    ctx, checked = _prepare("reduce_scatter", comm, local)
    src, out = checked.src, checked.out
    if src.size == 0:
        return recvbuf
    if ctx.size == 1:
        if not np.may_share_memory(src, out):
            out[...] = src
        return recvbuf
    reduce_scatter_phase(ctx, src, out, checked.kernel, chunk_bounds(src.size, ctx.size))
    return recvbuf


def allgather(sendbuf, recvbuf, *, comm=None):
    """Ring allgather: every rank receives all ranks' chunks, placed by :func:`partition`.

    Args:
        sendbuf: contiguous numpy array with this rank's chunk of M elements
            (``partition(M, N, rank)[1]`` elements), or ``MPI.IN_PLACE`` when
            ``recvbuf`` already holds it at its offset.
        recvbuf: writable contiguous array of M elements (same M on every rank).
        comm: as for :func:`allreduce`.

    Returns:
        ``recvbuf``.

    Raises:
        TypeError, ValueError: as for :func:`allreduce`; ValueError when
        ``sendbuf`` does not have this rank's chunk length.
    """
    def local():
        dst = _flat(recvbuf, "recvbuf", writable=True)
        resolved = _resolve_comm(comm)
        nranks, rank = resolved.Get_size(), resolved.Get_rank()
        offset, length = partition(dst.size, nranks, rank)
        src = None
        if sendbuf is not MPI.IN_PLACE:
            src = _flat(sendbuf, "sendbuf", writable=False)
            if src.dtype != dst.dtype:
                raise TypeError(f"recvbuf dtype {dst.dtype} differs from sendbuf dtype {src.dtype}")
            if src.size != length:
                raise ValueError(
                    f"sendbuf has {src.size} elements but this rank's chunk of "
                    f"{dst.size} over {nranks} ranks has {length}")
            if np.may_share_memory(src, dst) and not np.shares_memory(
                    src, dst[offset:offset + length]):
                raise ValueError("sendbuf overlaps recvbuf outside this rank's chunk")
        facts = (("count", dst.size), ("itemsize", dst.dtype.itemsize))
        return _Allgather(src, dst, offset, facts)

    ctx, checked = _prepare("allgather", comm, local)
    src, dst, offset = checked.src, checked.dst, checked.offset
    if src is not None and src.size:
        mine = dst[offset:offset + src.size]
        if not (src.__array_interface__["data"][0] == mine.__array_interface__["data"][0]):
            mine[...] = src
    if dst.size == 0 or ctx.size == 1:
        return recvbuf
    allgather_phase(ctx, dst, chunk_bounds(dst.size, ctx.size))
    return recvbuf
