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
  nonblocking forms (``Iallreduce``, ``Ireduce_scatter_block``, ...), and
  ``Barrier`` (``Ibarrier`` stays the library's); the
  constructors of new communicators (``Dup``, ``Split``, ``Create``, ...)
  return wrapped communicators with the same algorithms.
* Device buffers (CUDA, ROCm; ``__dlpack_device__`` or
  ``__cuda_array_interface__``) are found first: unless the MPI library takes
  device pointers, the call runs on pinned host mirrors of them
  (:mod:`pycollective.device`; ``Allreduce`` of bare buffers in overlapping
  chunks) and the results are copied back before it returns (nonblocking:
  before the request completes).
* Each replaced call's arguments are read, before any message, into a plan
  (:mod:`pycollective.comm.arguments`): pycollective's call on numpy views of the
  buffers, the wrapped communicator's own call (a fallback, logged once per
  reason), or the error of an unreadable argument, raised on every rank.
* ``algorithm``: one name for every collective that has an algorithm of that
  name ("ring" exists for all but bcast), "auto" elsewhere; or a mapping
  ``{"allreduce": "shm", "bcast": "chain", ...}``.

Nonblocking collectives
-----------------------
``Iallreduce`` and the other nonblocking forms return a
:class:`pycollective.Request`, completed by one helper thread per
communicator (:mod:`pycollective.comm.nonblocking` says how they overlap).

As with MPI, the send buffer must not be modified and the receive buffer is
undefined until the request completes; pycollective itself never writes to
the send buffer.
"""

import functools

from mpi4py import MPI

from .. import compression as _compression
from ..data.buffers import is_in_place, log_fallback
from . import device as _device
from ..collectives.options import COLLECTIVES, algorithms
from ..runtime.context import comm_settings
from .nonblocking import Job, Request, engine_for
from .nonblocking import thread_multiple as _thread_multiple  # tests replace it here
from .arguments import (_allgather_plan, _allreduce_plan, _bcast_plan, _gather_counts,
                        _invalid_allgather, _invalid_allreduce, _invalid_bcast, _invalid_reduce,
                        _plan, _reduce_plan, _reduce_scatter_plan, plain_allreduce,
                        reduce_scatter)
from . import arguments as _arguments
from ..collectives import plans as _plans
from ..collectives.barrier import barrier as _barrier
from ..collectives.call import DEFAULT

__all__ = ["Comm", "Request"]


def _log_once(reason):
    log_fallback(reason, "pycollective.Comm")


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


# --- the replaced collectives ----------------------------------------------------------------
# Each is described once, as ``describe(comm, *mpi4py's arguments) -> (plan,
# the native call's arguments)``; _pair makes the blocking method and its
# nonblocking twin from it, with its signature and docstring.

def _pair(collective, blocking, describe):
    """``(Blocking, Iblocking)``: the two methods of one replaced collective."""
    nbuffers = 1 if blocking == "Bcast" else 2
    def method(name, run):
        native = getattr(MPI.Intracomm, name)

        @functools.wraps(describe)
        def call(self, *args, **kwargs):
            # Device buffers are staged through host memory unless MPI takes them (comm/device.py).
            staged = _device.dropin(self, name, blocking, nbuffers, args, kwargs)
            if staged is not _device.NOT_STAGED:
                return staged
            plan, native_args = describe(self, *args, **kwargs)
            return getattr(self, run)(collective, plan, lambda: native(self, *native_args))
        call.__name__, call.__qualname__ = name, f"Comm.{name}"
        return call

    start = method("I" + blocking[0].lower() + blocking[1:], "_start")
    start.__doc__ = (f"Nonblocking :meth:`{blocking}`: a :class:`Request`, whose ``Wait`` "
                     "raises the call's error, if any.")
    return method(blocking, "_do"), start


def _allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
    """Reduce to all, through :func:`pycollective.allreduce` where it can (as mpi4py's)."""
    return (_plan(_allreduce_plan, _invalid_allreduce, sendbuf, recvbuf, op),
            (_native_send(sendbuf, recvbuf), recvbuf, op))


def _reduce(self, sendbuf, recvbuf, op=MPI.SUM, root=0):
    """Reduce to ``root``, through :func:`pycollective.reduce` where it can."""
    return (_plan(_reduce_plan, _invalid_reduce, sendbuf, recvbuf, op, root, self.Get_rank()),
            (_native_send(sendbuf, recvbuf), recvbuf, op, root))


def _reduce_scatter_of(self, sendbuf, recvbuf, counts, op):
    gather = counts is None and not (is_in_place(sendbuf) or sendbuf is recvbuf)

    def enter_invalid(bad, comm, kw):
        if gather:  # the others gather the counts first
            _gather_counts(comm, -1)
        reduce_scatter(bad, bad, comm=comm, **kw)
    return _plan(_reduce_scatter_plan, enter_invalid, sendbuf, recvbuf, counts, op,
                 self.Get_size(), self.Get_rank())


def _reduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM):
    """Reduce-scatter with equal blocks, through :func:`pycollective.reduce_scatter`."""
    return (_reduce_scatter_of(self, sendbuf, recvbuf, "block", op),
            (_native_send(sendbuf, recvbuf), recvbuf, op))


def _reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM):
    """Reduce-scatter with any block lengths (``recvcounts``; None: every rank's recvbuf,
    gathered first, blocking, also by the nonblocking form, as mpi4py does)."""
    return (_reduce_scatter_of(self, sendbuf, recvbuf, recvcounts, op),
            (_native_send(sendbuf, recvbuf), recvbuf, recvcounts, op))


def _allgather(self, sendbuf, recvbuf):
    """Gather to all, through :func:`pycollective.allgatherv` (bytes) where it can."""
    return (_plan(_allgather_plan, _invalid_allgather, sendbuf, recvbuf, self.Get_size(),
                  self.Get_rank(), False), (_native_send(sendbuf, recvbuf), recvbuf))


def _allgatherv(self, sendbuf, recvbuf):
    """Gather to all with counts and displacements, through :func:`pycollective.allgatherv`."""
    return (_plan(_allgather_plan, _invalid_allgather, sendbuf, recvbuf, self.Get_size(),
                  self.Get_rank(), True), (_native_send(sendbuf, recvbuf), recvbuf))


def _bcast(self, buf, root=0):
    """Broadcast from ``root``, through :func:`pycollective.bcast` where it can."""
    return _plan(_bcast_plan, _invalid_bcast, buf, root, self.Get_rank()), (buf, root)


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
        self._plain_comm = None
        return self

    def _plain(self):
        # pycollective's own calls get a plain Intracomm on the same handle:
        # the library duplicates the communicator it is given, and our Dup
        # returns a Comm whose collectives would call back into the library.
        # Kept while the handle is the same (a repeated call is recognised by
        # its communicator object); a freed Comm's null handle makes a new one.
        plain = self._plain_comm
        if plain is None or plain != self:
            plain = self._plain_comm = MPI.Intracomm(self)
        return plain

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
        engine = engine_for(self)
        kw = self._kw(collective)
        own = comm_settings(self)
        if "timeout" in own:
            # The helper runs on a communicator of its own, which does not
            # carry this one's set_timeout(comm=...): the call takes it along.
            kw["timeout"] = own["timeout"]
        job = Job(lambda comm: plan.run(comm, kw), plan)
        if plan.error is not None:
            engine.submit(job).Free()  # freed now, released by MPI once the helper completes it
            raise plan.error
        if self.Get_size() == 1:
            engine.run(job)  # nothing to wait for: a copy at most, done now
            return engine.request(job)
        return engine.submit(job)

    # --- the replaced collectives: each pair from one description (_pair) ----------------------

    _read_allreduce, Iallreduce = _pair("allreduce", "Allreduce", _allreduce)

    @functools.wraps(_read_allreduce)
    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        # A training loop's call on the same arrays is pycollective's repeated call on
        # them (checked when it was first made), and plain numpy arrays skip the reading
        # of MPI buffer specs; anything else is read as mpi4py reads it
        # (docs/results/dropin.md).
        if self._compress is None:
            plain = self._plain()
            algorithm = self._chosen.get("allreduce", "auto")
            if _plans.repeat(sendbuf, recvbuf, op, plain, algorithm, DEFAULT):
                return None
            if plain_allreduce(sendbuf, recvbuf, op):
                _arguments.allreduce(sendbuf, recvbuf, op, comm=plain, algorithm=algorithm)
                return None
        return self._read_allreduce(sendbuf, recvbuf, op)
    Reduce, Ireduce = _pair("reduce", "Reduce", _reduce)
    Reduce_scatter_block, Ireduce_scatter_block = _pair("reduce_scatter", "Reduce_scatter_block",
                                                        _reduce_scatter_block)
    Reduce_scatter, Ireduce_scatter = _pair("reduce_scatter", "Reduce_scatter", _reduce_scatter)
    Allgather, Iallgather = _pair("allgather", "Allgather", _allgather)
    Allgatherv, Iallgatherv = _pair("allgather", "Allgatherv", _allgatherv)
    Bcast, Ibcast = _pair("bcast", "Bcast", _bcast)

    def Barrier(self):
        """Wait until every rank has called it: :func:`pycollective.barrier` (bounded; on one
        node the ranks leave together, which a call timed after it does not pay for)."""
        _barrier(self._plain())

    def barrier(self):
        """:meth:`Barrier` (mpi4py's lowercase form, which returns None)."""
        _barrier(self._plain())

    # --- constructors return wrapped communicators ------------------------------

    def _adopt(self, new):
        if isinstance(new, Comm):
            new._algorithm, new._chosen = self._algorithm, self._chosen
            new._compress, new._plain_comm = self._compress, None
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
