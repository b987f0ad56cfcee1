"""The path every public collective call takes: settings, agreement, bounded waits, failures.

:mod:`~pycollective.collectives.api` checks a call's own arguments (``local()``); what
follows is the same for every collective and lives here:

* :func:`prepare`: the local checks, then, on several ranks, the call's start
  on its communicator (its lock, taken with the timeout, and its number) and
  the agreement step, which raises the same error on every rank if any rank
  failed its checks or the ranks disagree.  Returns ``(ctx, checked, call)``.
* :func:`run_algorithm`: the algorithm on the checked arguments; a failure
  after data started to move breaks the communicator and reaches every rank.
* :func:`leave`: the end of the call (in a ``finally``).
* :func:`run_collective`: those three for every collective.  The collectives
  other than allreduce enter it by :func:`call_collective`, their checked
  arguments a :class:`Checked`, with ``auto`` resolved by
  :mod:`~pycollective.collectives.choose`; allreduce enters it after its own
  entry checks (device memory, compression, its remembered shapes), with its
  own resolution and its plan remembered before the algorithm runs.
  Allreduce's repeated shapes run from their plans
  (:mod:`~pycollective.collectives.plans`), on :func:`enter`,
  :func:`run_algorithm` and :func:`leave` too.
"""

from typing import Callable, NamedTuple, Optional

import numpy as np
from mpi4py import MPI

from . import choose as _choose
from ..runtime import registry as _registry, settings as _settings, watch as _watch
from .agree import Facts, agree, needs_agreement
from ..runtime.context import Context, comm_settings, get_context
from .._errors import CollectiveTimeout, ConfigurationError
from .. import timeline as _timeline
from ..runtime import threads as _threads

AUTO = "auto"
DEFAULT = _settings.UNSET  # "not given": the communicator's or the process's setting

# The registry family serving each collective of a call (_watch.COLLECTIVES names).
FAMILY = {"reduce_scatter": "reduce_scatter", "reduce_scatterv": "reduce_scatter",
          "allgather": "allgather", "allgatherv": "allgather", "bcast": "bcast",
          "reduce": "reduce"}


def resolve_comm(comm):
    if comm is None:
        return MPI.COMM_WORLD
    if not isinstance(comm, MPI.Intracomm) or isinstance(comm, MPI.Intercomm):
        raise TypeError(f"comm must be an mpi4py intracommunicator, got {type(comm).__name__}")
    if comm == MPI.COMM_NULL:
        raise ValueError("comm is MPI.COMM_NULL")
    return comm


def settings_facts(settings: _settings.Settings) -> Facts:
    timeout_ms = -1 if settings.timeout is None else int(settings.timeout * 1000)
    return (("segment size (set_segment_bytes / PYCOLLECTIVE_SEGMENT_BYTES)",
             settings.segment_bytes),
            ("timeout in ms (set_timeout / PYCOLLECTIVE_TIMEOUT_S)", timeout_ms),
            ("the agreement setting (set_check / PYCOLLECTIVE_CHECK)", int(settings.check)),
            (_threads.LABEL, _threads.code()))


def hold(ctx: Context, what: str, limit) -> None:
    """Take the communicator's lock, waiting at most ``limit`` seconds (None: no limit);
    raise if the communicator is broken or another thread keeps it longer."""
    if ctx.broken is not None:
        raise _watch.broken_error(ctx, what)
    # Uncontended (the usual case) without the timed acquire's 0.2 us.
    if not ctx.lock.acquire(False) and not ctx.lock.acquire(
            timeout=-1 if limit is None else limit):
        raise CollectiveTimeout(
            f"{what} on {ctx.label}: another thread's collective on this communicator did "
            f"not finish within {limit:g} s (calls on one communicator are serialised)",
            collective=what, comm=ctx.label)


def enter(ctx: Context, what: str, fp: tuple, settings: _settings.Settings,
          words=None, tag_offset=None) -> _watch.Call:
    """Take the communicator (bounded) and start a numbered call on it."""
    hold(ctx, what, settings.timeout)
    if tag_offset is None:
        tag_offset = _watch.tag_offset(fp, tag_ub(ctx)) if fp else 0
    return _watch.begin(ctx, what, fp, settings, tag_offset, words)


def leave(call: _watch.Call) -> None:
    _watch.end(call)
    call.ctx.lock.release()


_TAG_UB = None


def tag_ub(ctx):
    """The communicator's largest tag (MPI.TAG_UB), read once."""
    global _TAG_UB
    if _TAG_UB is None:
        _TAG_UB = int(ctx.comm.Get_attr(MPI.TAG_UB) or 32767)
    return _TAG_UB


def prepare(what: str, comm, local: Callable[[], NamedTuple], timeout, algorithm_of=None):
    """Local checks, then (on several ranks) the call's start and agreement.

    Returns ``(ctx, checked, call)``; ``call`` is None on one rank.  The
    caller must end a call with :func:`leave`.  ``local`` returns a named
    tuple with ``facts`` and ``fingerprint`` (settings -> tuple) or raises
    TypeError/ValueError; on one rank only, that error reaches every rank
    through the agreement step.  The step runs unless the agreement is off
    and ``algorithm_of(ctx, checked)`` names an algorithm that verifies the
    arguments itself (:func:`needs_agreement`).  A rank with a bad argument
    always runs it, so ranks that do hear what is wrong, and ranks that skip
    it (shared memory) find a header that does not match theirs.
    """
    comm = resolve_comm(comm)
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
    call = enter(ctx, what, fp, settings)
    try:
        agreement = settings.check or error is not None or algorithm_of is None
        if not agreement:
            agreement = needs_agreement(settings, algorithm_of(ctx, checked))
        if agreement:
            facts = None if checked is None else tuple(checked.facts) + settings_facts(settings)
            agree(ctx, what, error, facts)
    except BaseException:
        leave(call)
        raise
    return ctx, checked, call


def run_algorithm(call: _watch.Call, algo, ctx, *args) -> None:
    """Run an algorithm; any failure breaks the communicator and reaches every rank."""
    if _timeline.ACTIVE is not None:  # timeline hook: the kernel's calls are "reduce" phases
        args = _timeline.ACTIVE.kernels(args)
    try:
        return algo(ctx, *args)
    except ConfigurationError:
        raise  # found by every rank together: nothing is half done
    except BaseException as exc:
        err = _watch.fail(call, exc)
        if err is exc:
            raise
        raise err from exc


class Checked(NamedTuple):
    """A checked call of a collective other than allreduce: what the algorithm runs on."""

    what: str                            # its name in _watch.COLLECTIVES
    algo: Optional[_registry.Algorithm]  # None: algorithm="auto", chosen after agreement
    count: int                           # elements (bytes for bcast) of the whole vector
    dtype: np.dtype                      # the element type the algorithm sees
    dtype_code: int                      # for the fingerprint (the itemsize for allgather)
    op_code: int
    facts: Facts
    args: tuple                          # run(ctx, *args)
    own: tuple = ()                      # (src, dst): this rank's block to put in place first

    def fingerprint(self, settings):
        names = _registry.names(FAMILY[self.what])
        algo = len(names) if self.algo is None else names.index(self.algo.name)
        return _watch.fingerprint(self.what, self.count, self.dtype_code, self.op_code, algo,
                                  settings)


def call_collective(what, comm, local, timeout, one_rank):
    """Check, agree, then run the algorithm; ``one_rank(checked)`` on a single rank."""
    if _timeline.ACTIVE is not None and _timeline.ACTIVE.outside():  # timeline hook: the call
        return _timeline.ACTIVE.traced(call_collective, what, (what, comm, local, timeout,
                                                               one_rank))
    run_collective(what, comm, local, timeout, one_rank)


def run_collective(what, comm, local, timeout, one_rank, algorithm_of=None, started=None):
    """:func:`prepare`, the algorithm (:func:`run_algorithm`), :func:`leave`.

    ``local()`` returns the checked call: ``facts``, ``fingerprint``, ``own``,
    ``count`` and ``args`` as :class:`Checked` has them.  ``one_rank(checked)``
    runs on a single rank.  ``algorithm_of(ctx, checked)``: the algorithm to
    run, and what lets :func:`prepare` skip the agreement for an algorithm
    that verifies the arguments itself (allreduce's); None: ``checked.algo``,
    or :func:`~pycollective.collectives.choose.choose`'s for auto, always
    agreed.  ``started(ctx, call, algo, checked)``: told the algorithm just
    before it runs (allreduce remembers its plan there).
    """
    ctx, checked, call = prepare(what, comm, local, timeout, algorithm_of)
    if checked.own:
        src, dst = checked.own
        if src.size and src.__array_interface__["data"][0] != dst.__array_interface__["data"][0]:
            dst[...] = src
    if call is None:
        one_rank(checked)
        return
    try:
        if checked.count == 0:
            return
        algo = (algorithm_of or _chosen)(ctx, checked)
        if _timeline.ACTIVE is not None:  # timeline hook: what the call runs
            _timeline.ACTIVE.about(algorithm=algo.name)
        if started is not None:
            started(ctx, call, algo, checked)
        run_algorithm(call, algo.run, ctx, *checked.args)
    finally:
        leave(call)


def _chosen(ctx: Context, checked: Checked) -> _registry.Algorithm:
    """A :class:`Checked` call's algorithm: the one named (if it can run here) or choose's."""
    algo = checked.algo
    if algo is None:
        return _choose.choose(ctx, FAMILY[checked.what], checked.count, checked.dtype)
    reason = algo.usable(ctx)
    if reason:
        raise ValueError(reason)
    return algo


def comm_shape(comm):
    resolved = resolve_comm(comm)
    return resolved.Get_size(), resolved.Get_rank()
