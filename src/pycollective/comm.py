"""Drop-in communicator for mpi4py training scripts.

A script that averages gradients with ``comm.Allreduce(MPI.IN_PLACE, grad,
op=MPI.SUM)`` switches to pycollective by changing one line::

    comm = pycollective.Comm(MPI.COMM_WORLD)          # was: MPI.COMM_WORLD

How it is built
---------------
* :class:`Comm` subclasses ``MPI.Intracomm`` and shares the wrapped
  communicator's MPI handle (the way ``mpi4py.util.pkl5`` wraps one), so
  ``isinstance`` checks, ``Get_rank``, ``Bcast``, lowercase ``allreduce``,
  point-to-point calls and everything else run mpi4py's own code on the same
  communicator.  Only ``Allreduce`` and ``Iallreduce`` are replaced, and the
  constructors of new communicators (``Dup``, ``Split``, ``Create``, ...)
  return wrapped communicators with the same algorithm.
* ``Allreduce`` reads its buffer arguments the way mpi4py does (a buffer,
  ``[buf, datatype]``, ``[buf, count, datatype]``, ``[buf, (count, displ),
  datatype]``, ``[buf, count, displ, datatype]``, datatypes as ``MPI.FLOAT``
  or typecodes like ``"f"``; ``MPI.IN_PLACE`` or ``None`` as sendbuf; the
  same object as both buffers means in place), views the memory as a numpy
  array with ``np.frombuffer`` (no copy) and calls
  :func:`pycollective.allreduce`.  Its argument checks and cross-rank
  agreement therefore apply unchanged: a count mismatch on one rank raises
  ValueError naming both counts on every rank, before any data moves.
* Fallback.  Whether pycollective can run a call depends only on the op
  and the datatype, which MPI requires to be the same on every rank, so all
  ranks take the same path.  User-defined ops, ops other than SUM, PROD,
  MAX and MIN, derived datatypes and types without a pycollective kernel
  (complex, bool, long double, ``MPI.PACKED``, ...) go to the wrapped
  communicator's own ``Allreduce`` (identical results, by construction), and
  the reason is logged once per reason on the ``"pycollective"`` logger.
* A buffer argument that cannot be read at all on one rank (not a buffer,
  count larger than the buffer, unknown typecode) still takes part in the
  collective: the rank joins :func:`pycollective.allreduce` with an empty
  array, so the agreement step makes every other rank raise ("ranks disagree
  on count") instead of waiting, and the rank itself raises the precise error.

Nonblocking allreduce and how it overlaps
-----------------------------------------
``Iallreduce`` returns a :class:`Request`.  With ``MPI_THREAD_MULTIPLE``
(mpi4py's default) each communicator gets, on its first ``Iallreduce``, one
helper thread with its OWN private duplicate of the communicator (not the
one :func:`pycollective._context.get_context` caches for blocking calls, so
messages of the two threads can never match each other and the two never
share scratch buffers).  Requests are queued and run one after the other in
submission order, which is the same on every rank because ``Iallreduce`` is
collective.  The helper runs the same :func:`pycollective.allreduce`; while
it waits in MPI or reduces in the numba kernels (compiled ``nogil``) it does
not hold the GIL, so the caller's Python and numpy work (numpy releases the
GIL in large operations) proceeds in parallel: that is the overlap.
Each request is an MPI generalized request completed by the helper, so
``MPI.Request.Waitall`` (and ``Testall``/``Waitany``) accept them next to
native requests; :meth:`Request.Wait`/:meth:`Request.Test` additionally
re-raise the helper's exception on the caller's thread, and block on a
sleeping event rather than in MPI's busy-polling wait, which would steal
the core the helper needs.  Without ``MPI_THREAD_MULTIPLE`` (and for the
fallback ops and datatypes) ``Iallreduce`` is the wrapped communicator's
native ``Iallreduce``.

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

import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib

from ._collectives import algorithms, allreduce
from . import _settings
from . import compression as _compression
from ._context import Key, duplicate, get_context, live_contexts
from ._kernels import BFLOAT16, SUPPORTED_DTYPES, get_kernel
from ._ops import predefined_name, resolve_op

__all__ = ["Comm", "Request"]

logger = logging.getLogger("pycollective")

# --- logging of fallbacks -------------------------------------------------------

_logged = set()
_logged_lock = threading.Lock()


def _log_once(reason):
    with _logged_lock:
        if reason in _logged:
            return
        _logged.add(reason)
    logger.info("pycollective.Comm: using the wrapped communicator's own call: %s", reason)


# --- op and datatype: the decision every rank takes alike ----------------------

def _op_reason(op):
    """(canonical op name, None) or (None, why pycollective cannot do ``op``)."""
    try:
        return resolve_op(op), None
    except ValueError:
        pass
    if isinstance(op, MPI.Op):
        name = predefined_name(op)
        if name is not None:
            return None, f"op MPI.{name} is not implemented by pycollective"
        return None, "user-defined op"
    return None, f"op {op!r} is not implemented by pycollective"


_dtype_cache = {}


def _dtype_reason(datatype):
    """(numpy dtype, None) or (None, why pycollective cannot reduce ``datatype``)."""
    handle = MPI._handleof(datatype)
    cached = _dtype_cache.get(handle)
    if cached is not None:
        return cached
    if datatype == MPI.DATATYPE_NULL:
        return None, "datatype MPI.DATATYPE_NULL"
    if not datatype.is_predefined:
        return None, "derived datatype"
    name = datatype.Get_name() or repr(datatype)
    result = None, f"datatype {name} has no pycollective kernel"
    if datatype != MPI.PACKED:
        try:
            dtype = dtlib.to_numpy_dtype(datatype)
        except Exception:  # noqa: BLE001  (any datatype numpy cannot describe)
            dtype = None
        if dtype is not None and dtype in SUPPORTED_DTYPES and dtype.isnative:
            result = dtype, None
        elif dtype is not None:
            result = None, f"datatype {name} ({dtype}) has no pycollective kernel"
    _dtype_cache[handle] = result  # predefined handles never change
    return result


# --- reading mpi4py buffer specifications --------------------------------------

class _Spec:
    """One buffer argument, split the way mpi4py splits it."""

    __slots__ = ("buf", "count", "displ", "type")

    def __init__(self, buf, count=None, displ=None, datatype=None):
        self.buf, self.count, self.displ, self.type = buf, count, displ, datatype


def _is_buffer(obj):
    if isinstance(obj, np.ndarray):
        return True
    try:
        memoryview(obj)
    except TypeError:
        return False
    return True


def _is_datatype(obj):
    return isinstance(obj, (MPI.Datatype, str))


def _parse(msg):
    """Split a buffer argument; raises TypeError/ValueError as mpi4py does."""
    if _is_buffer(msg):
        return _Spec(msg)
    if isinstance(msg, (list, tuple)):
        if len(msg) == 2:
            buf, second = msg
            if _is_datatype(second):
                return _Spec(buf, datatype=second)
            if isinstance(second, (list, tuple)):
                count, displ = second
                return _Spec(buf, count, displ)
            return _Spec(buf, second)
        if len(msg) == 3:
            buf, count, datatype = msg
            if isinstance(count, (list, tuple)):
                count, displ = count
                return _Spec(buf, count, displ, datatype)
            return _Spec(buf, count, None, datatype)
        if len(msg) == 4:
            return _Spec(*msg)
        raise ValueError("message: expecting 2 to 4 items")
    raise TypeError(f"message: expecting buffer or list/tuple, got {type(msg).__name__}")


_NATIVE_ORDER = "<" if sys.byteorder == "little" else ">"


def _datatype(spec):
    """The MPI datatype of a parsed spec (explicit, or from the buffer's format)."""
    if spec.buf is not None and spec.buf is not MPI.BOTTOM and not _is_buffer(spec.buf):
        raise TypeError(f"a bytes-like object is required, not {type(spec.buf).__name__!r}")
    if spec.type is not None:
        if isinstance(spec.type, MPI.Datatype):
            return spec.type
        try:
            return MPI.Datatype.fromcode(spec.type)
        except (ValueError, KeyError):
            raise ValueError(f"cannot map {spec.type!r} to MPI datatype") from None
    if spec.buf is None or spec.buf is MPI.BOTTOM:
        raise ValueError("message: a None or MPI.BOTTOM buffer needs an explicit datatype")
    fmt = memoryview(spec.buf).format
    if fmt[:1] in ("@", "=", _NATIVE_ORDER):
        fmt = fmt[1:]
    elif fmt[:1] in ("<", ">", "!"):
        raise ValueError(f"format string {fmt!r} with non-native byte order")
    try:
        return MPI.Datatype.fromcode(fmt)
    except (ValueError, KeyError):
        raise ValueError(f"cannot map {fmt!r} to MPI datatype") from None


def _as_array(spec, dtype, name):
    """numpy view (no copy) of the elements a parsed spec describes."""
    buf = spec.buf
    plain = spec.count is None and spec.displ is None
    if isinstance(buf, np.ndarray) and plain and buf.dtype == dtype:
        # A numpy array of the datatype itself goes to pycollective as it is,
        # so its checks (contiguity, read-only) run with cross-rank agreement.
        return buf
    if buf is None:
        count = 0 if spec.count is None else operator.index(spec.count)
        if count:
            raise ValueError(f"message: buffer is None but count is {count}")
        return np.empty(0, dtype)
    if buf is MPI.BOTTOM:
        raise ValueError("message: MPI.BOTTOM buffers are not supported")
    if isinstance(buf, np.ndarray):
        if not (buf.flags.c_contiguous or buf.flags.f_contiguous):
            raise ValueError(f"{name}: buffer is not contiguous")
        raw = buf.reshape(-1, order="A").view(np.uint8)
    else:
        try:
            raw = np.frombuffer(buf, np.uint8)
        except (ValueError, TypeError, BufferError) as exc:
            raise ValueError(f"{name}: {exc}") from None
    extent = dtype.itemsize
    offset = 0
    if spec.displ is not None:
        displ = operator.index(spec.displ)
        if displ < 0:
            raise ValueError(f"message: negative displacement {displ}")
        offset = displ * extent
        if offset > raw.size:
            raise ValueError(f"message: displacement {displ} out of bounds, "
                             f"number of datatype entries {raw.size // extent}")
    length = raw.size - offset
    if spec.count is None:
        if length % extent:
            raise ValueError(f"message: cannot infer count, buffer length {length} "
                             f"is not a multiple of datatype extent {extent}")
        count = length // extent
    else:
        count = operator.index(spec.count)
        if count < 0:
            raise ValueError(f"message: negative count {count}")
        if count * extent > length:
            raise ValueError(f"{name}: count {count} needs {count * extent} bytes "
                             f"but the buffer has {length}")
    return raw[offset:offset + count * extent].view(dtype)


class _Call:
    """What one Allreduce/Iallreduce call resolves to, before any message."""

    __slots__ = ("native", "reason", "src", "dst", "opname", "error")

    def __init__(self):
        self.native, self.reason = False, None
        self.src = self.dst = self.opname = self.error = None


def _resolve(sendbuf, recvbuf, op):
    """Decide native vs pycollective from (op, datatype) and build the arrays.

    Local problems with the buffers are returned in ``call.error`` rather than
    raised, so that the caller can still take part in the collective.
    """
    call = _Call()
    call.opname, reason = _op_reason(op)
    if reason is not None:
        call.native, call.reason = True, reason
        return call
    in_place = sendbuf is None or sendbuf is MPI.IN_PLACE or sendbuf is recvbuf
    if _unnamed(recvbuf) and (in_place or _unnamed(sendbuf)):
        # A dtype MPI has no datatype for (bfloat16): pycollective moves its
        # bytes and reduces it itself.
        call.dst, call.src = recvbuf, MPI.IN_PLACE if in_place else sendbuf
        return call
    try:
        rspec = _parse(recvbuf)
        rtype = _datatype(rspec)
    except (TypeError, ValueError) as exc:
        call.error = exc
        return call
    dtype, reason = _dtype_reason(rtype)
    if reason is not None:
        call.native, call.reason = True, reason
        return call
    try:
        call.dst = _as_array(rspec, dtype, "recvbuf")
        if in_place:
            call.src = MPI.IN_PLACE
        else:
            sspec = _parse(sendbuf)
            stype = _datatype(sspec)
            sdtype, _ = _dtype_reason(stype)
            if sdtype is None or (stype != rtype and sdtype != dtype):
                raise ValueError("mismatch in send and receive MPI datatypes")
            # Same element type, different type names (MPI.LONG vs "q"): fine.
            call.src = _as_array(sspec, sdtype, "sendbuf")
    except (TypeError, ValueError) as exc:
        call.error = exc
    return call


def _unnamed(buf):
    """A numpy array of a dtype pycollective reduces but MPI cannot name (bfloat16)."""
    return isinstance(buf, np.ndarray) and buf.dtype == BFLOAT16


def _sentinel_src():
    return np.empty(0, np.float64)


# --- the communicator ------------------------------------------------------------

def _thread_multiple():
    return MPI.Query_thread() >= MPI.THREAD_MULTIPLE


class Comm(MPI.Intracomm):
    """An mpi4py intracommunicator whose ``Allreduce``/``Iallreduce`` run pycollective.

    Args:
        comm: the ``MPI.Intracomm`` to wrap (the handle is shared, not
            duplicated); ``None`` gives a null communicator, as
            ``MPI.Intracomm()`` does.
        algorithm: a name from :func:`pycollective.algorithms`, or ``None``
            for pycollective's default (whatever ``pycollective.allreduce``
            uses when no algorithm is given).
        compress: None, "fp16", "bf16" or a compressor object
            (:mod:`pycollective.compression`): ``Allreduce``/``Iallreduce``
            sums of floating buffers travel compressed; other calls do not.

    Raises:
        TypeError: ``comm`` is not an intracommunicator.
        ValueError: unknown algorithm name or compression.
    """

    def __new__(cls, comm=None, algorithm=None, compress=None):
        if comm is not None and (not isinstance(comm, MPI.Intracomm)
                                 or isinstance(comm, MPI.Intercomm)):
            raise TypeError(f"comm must be an mpi4py intracommunicator, got {type(comm).__name__}")
        if algorithm is not None and algorithm not in algorithms() and algorithm != "auto":
            raise ValueError(f"unknown algorithm {algorithm!r}; registered: "
                             + ", ".join(algorithms()))
        self = MPI.Intracomm.__new__(cls, comm)
        self._algorithm = algorithm
        self._compress = _compression.resolve(compress)
        return self

    def _plain(self):
        # pycollective's own calls get a plain Intracomm on the same handle:
        # the library duplicates the communicator it is given, and our Dup
        # returns a Comm whose Allreduce would call back into the library.
        return MPI.Intracomm(self)

    @property
    def algorithm(self):
        """The algorithm name given at construction (``None``: pycollective's default)."""
        return self._algorithm

    def __repr__(self):
        algo = self._algorithm or "default"
        return f"<pycollective.Comm algorithm={algo} handle={MPI._handleof(self):#x}>"

    def _algo_kw(self):
        return {} if self._algorithm is None else {"algorithm": self._algorithm}

    @property
    def compress(self):
        """The compressor given at construction (``None``: uncompressed)."""
        return self._compress

    def _call_kw(self, call):
        """``_algo_kw()``, and the compressor when this call is a floating sum."""
        kw = self._algo_kw()
        if (self._compress is not None and call.dst is not None
                and _compression.applies(call.dst.dtype, call.opname)):
            kw["compress"] = self._compress
        return kw

    # --- Allreduce ---------------------------------------------------------------

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        """Reduce to all, through :func:`pycollective.allreduce` where it can.

        Args:
            sendbuf: buffer spec as for mpi4py, ``MPI.IN_PLACE`` or ``None``
                (in place); the same object as ``recvbuf`` also means in place.
            recvbuf: buffer spec as for mpi4py.
            op: an ``MPI.Op`` (or "sum"/"prod"/"max"/"min").

        Raises:
            ValueError, TypeError: as :func:`pycollective.allreduce` (on every
                rank), or as mpi4py for malformed buffer arguments.
        """
        call = _resolve(sendbuf, recvbuf, op)
        if call.native:
            _log_once(call.reason)
            if sendbuf is recvbuf:
                sendbuf = MPI.IN_PLACE
            return MPI.Intracomm.Allreduce(self, sendbuf, recvbuf, op)
        if call.error is not None:
            try:
                allreduce(_sentinel_src(), _sentinel_src(), call.opname, comm=self._plain(),
                          **self._algo_kw())
            except (TypeError, ValueError):
                pass  # the other ranks raise from this disagreement; we raise ours
            raise call.error
        allreduce(call.src, call.dst, call.opname, comm=self._plain(), **self._call_kw(call))
        return None

    def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        """Nonblocking reduce to all; returns a :class:`Request` (or a native one).

        Args:
            sendbuf, recvbuf, op: as for :meth:`Allreduce`.

        Returns:
            A request whose ``Wait``/``Test`` complete the reduction; errors
            found by the agreement step are raised by ``Wait``/``Test``.

        Raises:
            ValueError, TypeError: malformed buffer arguments on this rank
                (the other ranks then get an error from their ``Wait``).
        """
        call = _resolve(sendbuf, recvbuf, op)
        if call.native or not _thread_multiple():
            _log_once(call.reason if call.native else
                      "Iallreduce is the native one: MPI thread level is below "
                      "MPI_THREAD_MULTIPLE")
            if sendbuf is recvbuf:
                sendbuf = MPI.IN_PLACE
            return MPI.Intracomm.Iallreduce(self, sendbuf, recvbuf, op)
        engine = _engine_for(self)
        job = _Job(call.src, call.dst, call.opname, self._call_kw(call), (sendbuf, recvbuf))
        if call.error is None and call.src is not MPI.IN_PLACE and call.src.size != call.dst.size:
            # mpi4py raises this at the call; the job still runs so that its
            # agreement step raises the same mismatch on the other ranks' Wait.
            call.error = ValueError(f"mismatch in send count {call.src.size} "
                                    f"and receive count {call.dst.size}")
        elif call.error is not None:
            job = _Job(_sentinel_src(), _sentinel_src(), call.opname, self._algo_kw(), None)
        if call.error is not None:
            engine.submit(job).Free()  # freed now, released by MPI once the helper completes it
            raise call.error
        get_kernel(call.opname, call.dst.dtype)  # compile on this thread, not the helper
        if self.Get_size() == 1:
            engine.run(job)  # nothing to wait for: a copy at most, done now
            return engine.request(job)
        return engine.submit(job)

    # --- constructors return wrapped communicators ------------------------------

    def _adopt(self, new):
        if isinstance(new, Comm):
            new._algorithm, new._compress = self._algorithm, self._compress
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
    """One queued allreduce and its completion state."""

    __slots__ = ("src", "dst", "opname", "algo_kw", "keep", "event", "error",
                 "reported", "greq")

    def __init__(self, src, dst, opname, algo_kw, keep):
        self.src, self.dst, self.opname, self.algo_kw = src, dst, opname, algo_kw
        self.keep = keep  # the caller's buffer objects stay alive until completion
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
        logger.error("pycollective Iallreduce failed: %s: %s",
                     type(job.error).__name__, job.error)
        raise MPI.Exception(MPI.ERR_OTHER)


def _free(job):
    job.keep = None


def _cancel(completed, job):
    pass  # a started collective cannot be cancelled; MPI then completes it normally


class _Engine:
    """Helper thread running queued allreduces on a private communicator, in order."""

    def __init__(self, comm):
        # Collective (all ranks reach their first Iallreduce on comm in the same
        # order); done on the caller's thread so no MPI object is created racily.
        # ``comm`` is the context's private communicator; the helper gets its
        # own duplicate of it, so its messages never meet blocking calls'.
        self.comm = duplicate(comm, "the helper of Iallreduce",
                              "every rank's first Iallreduce on this communicator")
        get_context(self.comm)
        self.queue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="pycollective-iallreduce",
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
            allreduce(job.src, job.dst, job.opname, comm=self.comm, **job.algo_kw)
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
        """Let the queued reductions finish, then stop the thread; True if it stopped."""
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
            sys.stderr.write(f"pycollective: rank {MPI.COMM_WORLD.Get_rank()}: an Iallreduce on "
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
    """Request of a pycollective ``Iallreduce`` (an MPI generalized request).

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
        """Block until the reduction is done; raises its error, if any.

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
        """Return True (and complete the request) if the reduction is done."""
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
