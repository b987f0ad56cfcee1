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

from . import _auto, _fastpath, _registry, _settings, _watch
from . import algorithms as _algorithms  # noqa: F401  (importing it registers every algorithm)
from ._agree import Facts, agree, agree_max, verdict
from ._context import Context, comm_settings, get_context, set_comm_setting
from ._errors import CollectiveTimeout, ConfigurationError
from ._kernels import SUPPORTED_DTYPES, get_kernel
from ._ops import OPS, resolve_op
from ._partition import chunk_bounds, partition
from .algorithms.ring import allgather_phase, reduce_scatter_phase

__all__ = ["allreduce", "reduce_scatter", "allgather", "algorithms", "set_check",
           "set_timeout", "usable_algorithms", "unusable_algorithms"]

_AUTO = "auto"
DEFAULT = _settings.UNSET  # "not given": the communicator's or the process's setting

check_enabled = _settings.check_enabled


def set_check(enabled: bool) -> bool:
    """Turn the cross-rank agreement step on or off; returns the previous setting.

    The step costs one small MAX reduction per call (a shared-memory
    exchange on one node, else an ``MPI_Allreduce``).  It turns a bad
    argument on one rank, or ranks that disagree on count, dtype, op or
    algorithm, into the same exception on every rank before any data move.
    Without it, ranks that disagree still raise everywhere -- from the
    shared-memory headers, the message sizes and tags, or the side channel
    once a wait runs long -- but after data started to move, and the
    communicator is then unusable.  The setting must be the same on every
    rank (a rank that differs makes the call raise).  The environment
    variable ``PYCOLLECTIVE_CHECK=0`` sets the default off.
    """
    return _settings.set_check(enabled)


def set_timeout(seconds, comm=None):
    """Set the longest wait without progress before a collective raises ``CollectiveTimeout``.

    Args:
        seconds: positive seconds; ``None`` or 0 for no limit.
        comm: set it for this communicator only (a local setting, not a
            collective call); None: for the whole process (the default is
            ``PYCOLLECTIVE_TIMEOUT_S``, 300 s).  A call's own ``timeout=``
            argument overrides both.  It must be the same on every rank.

    Returns:
        The previous setting (for ``comm``: None if it had none).
    """
    if comm is None:
        return _settings.set_timeout(seconds)
    previous = set_comm_setting(_resolve_comm(comm), "timeout", _settings.parse_timeout(seconds))
    _settings.set_segment_bytes(_settings.segment_bytes())  # bump the epoch: plans re-resolve
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
    """Flat view of a contiguous numpy array, in memory order (subclasses as plain arrays)."""
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(buf).__name__}")
    if type(buf) is not np.ndarray:
        if isinstance(buf, np.ma.MaskedArray):
            raise TypeError(f"{name} is a masked array: reduce its data explicitly "
                            "(e.g. arr.filled(0)) or its mask separately")
        # np.matrix, np.memmap, ...: the same memory as a plain array, so that
        # shapes and sizes mean what they mean for numpy arrays.
        buf = buf.view(np.ndarray)
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


def _dtype_code(dtype):
    return SUPPORTED_DTYPES.index(dtype) if dtype in SUPPORTED_DTYPES else -1


# --- one call: settings, agreement, bounded waits, failures -----------------------

def _settings_facts(settings: _settings.Settings) -> Facts:
    timeout_ms = -1 if settings.timeout is None else int(settings.timeout * 1000)
    return (("segment size (set_segment_bytes / PYCOLLECTIVE_SEGMENT_BYTES)",
             settings.segment_bytes),
            ("timeout in ms (set_timeout / PYCOLLECTIVE_TIMEOUT_S)", timeout_ms))


def _enter(ctx: Context, what: str, fp: tuple, settings: _settings.Settings,
           words=None, tag_offset=None) -> _watch.Call:
    """Take the communicator (bounded) and start a numbered call on it."""
    if ctx.broken is not None:
        raise _watch.broken_error(ctx, what)
    limit = settings.timeout
    if not ctx.lock.acquire(timeout=-1 if limit is None else limit):
        raise CollectiveTimeout(
            f"{what} on {ctx.label}: another thread's collective on this communicator did "
            f"not finish within {limit:g} s (calls on one communicator are serialised)",
            collective=what, comm=ctx.label)
    if tag_offset is None:
        tag_offset = _watch.tag_offset(fp, _tag_ub(ctx)) if fp else 0
    return _watch.begin(ctx, what, fp, settings, tag_offset, words)


def _leave(call: _watch.Call) -> None:
    _watch.end(call)
    call.ctx.lock.release()


_TAG_UB = None


def _tag_ub(ctx):
    global _TAG_UB
    if _TAG_UB is None:
        _TAG_UB = int(ctx.comm.Get_attr(MPI.TAG_UB) or 32767)
    return _TAG_UB


def _prepare(what: str, comm, local: Callable[[], NamedTuple], timeout):
    """Local checks, then (on several ranks) the call's start and agreement.

    Returns ``(ctx, checked, call)``; ``call`` is None on one rank.  The
    caller must end a call with :func:`_leave`.  ``local`` returns a named
    tuple with ``facts`` and ``fingerprint`` (settings -> tuple) or raises
    TypeError/ValueError; on one rank only, that error reaches every rank:
    through the agreement step when it is on, else through the side channel
    (and the communicator is then unusable: the others may be mid-algorithm).
    """
    comm = _resolve_comm(comm)
    checked, error = None, None
    try:
        checked = local()
    except (TypeError, ValueError) as exc:
        error = exc
    settings = _settings.resolve(timeout, comm_settings(comm).get("timeout", DEFAULT))
    if comm.Get_size() == 1:
        if error is not None:
            raise error
        return None, checked, None
    ctx = get_context(comm)
    fp = checked.fingerprint(settings) if checked is not None else ()
    call = _enter(ctx, what, fp, settings)
    try:
        if settings.check:
            facts = None if checked is None else tuple(checked.facts) + _settings_facts(settings)
            agree(ctx, what, error, facts)
        elif error is not None:
            # Without the agreement this rank alone knows; ranks that did not
            # make the same mistake are already in the algorithm, waiting:
            # the side channel tells them (they raise PeerFailed).
            _watch.notify(call, error)
            raise error
    except BaseException:
        _leave(call)
        raise
    return ctx, checked, call


def _run(call: _watch.Call, algo, ctx, *args) -> None:
    """Run an algorithm; any failure breaks the communicator and reaches every rank."""
    try:
        algo(ctx, *args)
    except ConfigurationError:
        raise  # found by every rank together: nothing is half done
    except BaseException as exc:
        err = _watch.fail(call, exc)
        if err is exc:
            raise
        raise err from exc


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
        return _watch.fingerprint("allreduce", self.dst.size, _dtype_code(self.dst.dtype),
                                  OPS.index(self.opname), algo, settings)


def _resolve_algorithm(ctx: Context, checked: _Allreduce) -> _registry.Algorithm:
    """The algorithm to run, the same on every rank; raises where it cannot run."""
    if checked.algo is None:  # the decision, or one of auto's timed trials (see _auto)
        return _auto.auto_for(ctx).resolve(checked.dst.size, checked.dst.dtype, checked.opname)
    reason = checked.algo.usable(ctx)
    if reason:
        raise ValueError(reason)
    return checked.algo


def allreduce(sendbuf, recvbuf, op=MPI.SUM, *, comm=None, algorithm: str = "auto",
              timeout=DEFAULT):
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

    Returns:
        ``recvbuf``, holding bitwise the same result on every rank.

    Raises:
        TypeError: non-numpy buffers, different dtypes, unsupported dtype,
            a comm that is not an intracommunicator.
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
    hit = _fastpath.lookup(sendbuf, recvbuf, op, comm, algorithm, timeout)
    if hit is not None:
        plan, ctx = hit.plan, hit.ctx
        call = _enter(ctx, "allreduce", plan.fingerprint, plan.settings, plan.words,
                      plan.tag_offset)
        try:
            if plan.settings.check:
                values = plan.template.copy()
                values[0], values[1] = call.number, -call.number
                agreed = values.tobytes()
                agree_max(ctx, values)
                if values.tobytes() != agreed:
                    verdict(ctx, "allreduce", None, plan.facts, values)
            _run(call, plan.algo.run, ctx, hit.src, hit.dst, plan.kernel)
        finally:
            _leave(call)
        return recvbuf

    def local():
        algo = None if algorithm == _AUTO else _registry.get(algorithm)
        opname = resolve_op(op)
        src, dst = _buffers(sendbuf, recvbuf)
        if src.size != dst.size:
            raise ValueError(f"recvbuf has {dst.size} elements but sendbuf has {src.size}")
        src = _same_or_disjoint(src, dst)
        kernel = get_kernel(opname, dst.dtype)
        index = -1 if algo is None else _registry.index(algo.name)
        facts = (("count", dst.size), ("dtype", dst.dtype.num), ("op", OPS.index(opname)),
                 ("algorithm (-1: auto)", index))
        return _Allreduce(algo, src, dst, opname, kernel, facts)

    ctx, checked, call = _prepare("allreduce", comm, local, timeout)
    src, dst = checked.src, checked.dst
    if call is None:  # one rank
        if src is not dst and dst.size:
            dst[...] = src
        return recvbuf
    try:
        if dst.size == 0:
            return recvbuf
        algo = _resolve_algorithm(ctx, checked)
        _fastpath.remember(ctx, algorithm, op, timeout, algo, checked.kernel, dst,
                           tuple(checked.facts) + _settings_facts(call.settings), call)
        _run(call, algo.run, ctx, src, dst, checked.kernel)
    finally:
        _leave(call)
    return recvbuf


# --- reduce-scatter and allgather -------------------------------------------

class _ReduceScatter(NamedTuple):
    src: np.ndarray
    out: np.ndarray
    opname: str
    kernel: Callable
    facts: Facts

    def fingerprint(self, settings):
        return _watch.fingerprint("reduce_scatter", self.src.size, _dtype_code(self.src.dtype),
                                  OPS.index(self.opname), 0, settings)


class _Allgather(NamedTuple):
    src: Optional[np.ndarray]
    dst: np.ndarray
    offset: int
    facts: Facts

    def fingerprint(self, settings):
        # Allgather only moves bytes: the element size is what must agree.
        return _watch.fingerprint("allgather", self.dst.size, self.dst.dtype.itemsize, -1, 0,
                                  settings)


def reduce_scatter(sendbuf, recvbuf, op=MPI.SUM, *, comm=None, timeout=DEFAULT):
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
        op, comm, timeout: as for :func:`allreduce`.

    Returns:
        ``recvbuf``.

    Raises:
        TypeError, ValueError, CollectiveError: as for :func:`allreduce`;
        ValueError when ``recvbuf`` does not have this rank's chunk length.
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
        return _ReduceScatter(src, out, opname, kernel, facts)

    ctx, checked, call = _prepare("reduce_scatter", comm, local, timeout)
    src, out = checked.src, checked.out
    if call is None:  # one rank
        if src.size and not np.may_share_memory(src, out):
            out[...] = src
        return recvbuf
    try:
        if src.size:
            _run(call, reduce_scatter_phase, ctx, src, out, checked.kernel,
                 chunk_bounds(src.size, ctx.size))
    finally:
        _leave(call)
    return recvbuf


def allgather(sendbuf, recvbuf, *, comm=None, timeout=DEFAULT):
    """Ring allgather: every rank receives all ranks' chunks, placed by :func:`partition`.

    Args:
        sendbuf: contiguous numpy array with this rank's chunk of M elements
            (``partition(M, N, rank)[1]`` elements), or ``MPI.IN_PLACE`` when
            ``recvbuf`` already holds it at its offset.
        recvbuf: writable contiguous array of M elements (same M on every rank).
        comm, timeout: as for :func:`allreduce`.

    Returns:
        ``recvbuf``.

    Raises:
        TypeError, ValueError, CollectiveError: as for :func:`allreduce`;
        ValueError when ``sendbuf`` does not have this rank's chunk length.
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

    ctx, checked, call = _prepare("allgather", comm, local, timeout)
    src, dst, offset = checked.src, checked.dst, checked.offset
    if src is not None and src.size:
        mine = dst[offset:offset + src.size]
        if not (src.__array_interface__["data"][0] == mine.__array_interface__["data"][0]):
            mine[...] = src
    if call is None:
        return recvbuf
    try:
        if dst.size:
            _run(call, allgather_phase, ctx, dst, chunk_bounds(dst.size, ctx.size))
    finally:
        _leave(call)
    return recvbuf
