"""``algorithm="auto"``: the per-communicator state that picks, tunes and remembers.

The model (:mod:`pycollective.model`) ranks the algorithms for a call; the
first calls of each (size class, dtype, op) on a communicator then time the
few it ranks best and keep the fastest (:mod:`pycollective.model.tuning` has
the rules and the bounds).  What this module adds is what makes that right
and the same on every rank:

* The parameters are rank 0's: on a communicator's first automatic call,
  rank 0 alone reads the calibration file, the ``PYCOLLECTIVE_AUTO`` setting
  and any decisions file, and broadcasts them, so ranks with different files
  (or none) still agree.  A calibration that cannot be read gives the
  built-in defaults, with a warning on rank 0: a broken file must not break
  every allreduce.
* Where the ranks run (:class:`~pycollective.model.topology.Layout`) is found
  once, collectively: ``Split_type(COMM_TYPE_SHARED)`` for the nodes, the
  cores each node's ranks may use (the union of their affinity masks) and
  rank 0's core cache.  The model prices links inside and between nodes from
  it and scales its defaults by the ranks per core.
* Algorithms that cannot run on the communicator (their ``usable(ctx)``
  gives a reason, e.g. "shm" across nodes) are left out, asked once, on
  every rank at the same point.
* A trial is the user's own call: :meth:`AutoState.resolve` returns the
  candidate as a :class:`Trial`, which runs the real algorithm on the real
  buffers (so its result is as right as any call's), times it on this rank
  and, at the end of each round, agrees on the round's times with one MAX
  reduction over the ranks (the slowest rank's time).  Decisions are taken
  from agreed times only, so every rank runs the same candidate in the same
  call and settles on the same winner.  The fast path never keeps a trial
  (``collectives.plans.remember`` skips a :class:`Trial`), so nothing freezes a
  choice before its class is tuned.
* Every decision is logged at DEBUG level on the ``"pycollective"`` logger
  and kept per class in the context (and, with ``PYCOLLECTIVE_AUTO=FILE``,
  in that file, which later runs read back and follow).
"""

import dataclasses
import functools
import logging
import os
import time
import warnings
from typing import Callable, Dict, Optional, Sequence

import numpy as np
from mpi4py import MPI

from ..runtime import env as _env, machine as _machine, registry as _registry, watch as _watch
from . import probe as _probe
from .agree import agree_max, fact_values, needs_agreement, prepared, verdict
from ..runtime.context import Context, Key
from .._errors import CollectiveMismatch
from ..data.kernels import as_dtype
from ..data.ops import OPS
from ..runtime.root import bcast_from_root
from ..node.group import node_comm
from ..model.choice import learned, ranked
from ..model.params import builtin_params, load_params, params_for
from ..model.topology import Layout
from ..model.tuning import (Decision, Tuner, candidates, class_bounds, load_decisions,
                            save_decision, size_class)
from .. import timeline as _timeline

__all__ = ["AutoState", "Trial", "auto_for", "unusable_reasons", "layout_of", "KEY"]

logger = logging.getLogger("pycollective")

KEY = Key("auto")
_USABLE = Key("usable")
_LAYOUT = Key("layout")


def unusable_reasons(ctx: Context) -> Dict[str, str]:
    """``{name: reason}`` of the registered algorithms that cannot run on ``ctx``.

    Collective on a context's first use (an algorithm's ``usable`` may build
    state, e.g. shm's node window), the same answer on every rank.
    """
    def ask(ctx):
        reasons = {}
        for name in _registry.names():
            why = _registry.get(name).usable(ctx) if ctx.size > 1 else None
            if why:
                reasons[name] = why
        return reasons
    return ctx.cached(_USABLE, ask)


# --- where the ranks run -------------------------------------------------------------------

_MASK_WORDS = 16  # affinity masks of up to 1024 CPUs


def _affinity_mask() -> np.ndarray:
    mask = np.zeros(_MASK_WORDS, np.uint64)
    try:
        cpus = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        cpus = range(os.cpu_count() or 1)
    for cpu in cpus:
        if cpu < 64 * _MASK_WORDS:
            mask[cpu // 64] |= np.uint64(1 << (cpu % 64))
    return mask


def _find_layout(ctx: Context) -> Layout:
    comm = ctx.comm
    _watch.arrive(comm, "its first automatic choice")
    node, _ = node_comm(comm)
    try:
        mask = _affinity_mask()
        node.Allreduce(MPI.IN_PLACE, mask, op=MPI.BOR)
        cores = min(sum(bin(int(w)).count("1") for w in mask), os.cpu_count() or 1)
        leader = node.bcast(ctx.rank, root=0)  # the node's lowest rank (key = rank)
    finally:
        node.Free()
    facts = comm.allgather((leader, cores, _machine.cache_bytes(2) if ctx.rank == 0 else 0))
    leaders = sorted({f[0] for f in facts})
    members = {lead: [r for r, f in enumerate(facts) if f[0] == lead] for lead in leaders}
    blocks = all(m[-1] - m[0] + 1 == len(m) for m in members.values())
    return Layout(tuple(len(members[lead]) for lead in leaders), blocks,
                  tuple(facts[lead][1] for lead in leaders), facts[0][2])


def layout_of(ctx: Context) -> Layout:
    """Where the ranks of ``ctx`` run (collective on first use; the same on every rank)."""
    if ctx.size == 1:
        return Layout((1,))
    return ctx.cached(_LAYOUT, _find_layout)


# --- trials --------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Trial(_registry.Algorithm):
    """A registered algorithm serving a call of a shape auto has not decided yet.

    Most are timed trials of the tuning.  ``tuning``, on a timed trial:
    ``tuning(kernel, dst, settings, forget)`` -> a plan's ``run`` for the later
    calls of the shape (:meth:`AutoState.tuning_run`), which the plan cache
    keeps until the shape is decided (``forget()`` then drops it); the
    untimed ones (another count of a class being tuned) are not kept.
    """

    tuning: Optional[Callable] = None


def _trial(algo: _registry.Algorithm, run=None, tuning=None) -> Trial:
    return Trial(algo.name, run or algo.run, algo.summary, algo.cost, algo.usable, algo.tags,
                 algo.collective, tuning=tuning)


class AutoState:
    """Rank 0's parameters for this communicator, where its ranks run, and auto's decisions."""

    _LIMIT = 4096  # bound the decisions kept for programs that sweep many sizes

    def __init__(self, params: dict, size: int, exclude=(), layout: Optional[Layout] = None,
                 mode: str = "tune", path: Optional[str] = None, kept: Optional[dict] = None):
        self.params = params
        self.size = size
        self.layout = layout if layout is not None else Layout((size,))
        self.flat = params_for(params, size, self.layout)
        self.exclude = tuple(exclude)
        self.mode = mode          # "tune" or "model"
        self.path = path          # decisions file (rank 0 writes it), or None
        self.decisions: Dict[tuple, Decision] = {}
        self.tuners: Dict[tuple, Tuner] = {}
        self._times: Dict[tuple, list] = {}  # this rank's times of the round under way
        self._prepared: Dict[tuple, dict] = {}  # key -> {(name, agreement): prepared run}
        self._saving = path is not None
        for entry in (kept or {}).values():
            if entry["nranks"] == size and tuple(entry["nodes"]) == self.layout.nodes:
                self._adopt(entry)

    # -- what the model says --

    def ranking(self, count: int, dtype: np.dtype):
        """``[(name, predicted seconds)]`` of the algorithms that can run here, fastest first."""
        return ranked(self.size, count, dtype, self.flat, self.exclude)

    # -- decisions --

    def key(self, count: int, dtype: np.dtype, opname: str) -> tuple:
        """Decisions hold for a size class; the model alone decides each count."""
        key = (size_class(count * dtype.itemsize), dtype.num, opname)
        return key + (count,) if self.mode == "model" else key

    def decision(self, count: int, dtype: np.dtype, opname: str) -> Optional[Decision]:
        """The decision for calls of this shape, or None while it is not taken."""
        return self.decisions.get(self.key(count, as_dtype(dtype), opname))

    def choose(self, count: int, dtype: np.dtype, opname: str) -> str:
        """What auto runs for this shape outside a trial: the decision, else the model's first."""
        dtype = as_dtype(dtype)
        found = self.decision(count, dtype, opname)
        return found.algorithm if found is not None else self.ranking(count, dtype)[0][0]

    def resolve(self, count: int, dtype: np.dtype, opname: str) -> _registry.Algorithm:
        """The algorithm this call runs: the decision, a :class:`Trial`, or the model's first.

        Called once per automatic call, on every rank, in the same order;
        only agreed facts decide, so every rank gets the same answer.
        """
        key = self.key(count, dtype, opname)
        found = self.decisions.get(key)
        if found is not None:
            return _registry.get(found.algorithm)
        tuner = self.tuners.get(key)
        if tuner is None:
            ranking = self.ranking(count, dtype)
            if self.mode == "model":
                return _registry.get(self._decide(key, dtype, Decision(
                    ranking[0][0], "model", count, {}, dict(ranking[:1]))).algorithm)
            trusted = _probe.trusted(ranking, self.params)
            nbytes = count * as_dtype(dtype).itemsize
            tuner = Tuner(trusted, count, always=_layout_aware(self.layout),
                          settle={n: _registry.get(n).settling_calls(self.layout, nbytes)
                                  for n, _ in trusted})
            if tuner.decision is not None:  # one candidate: nothing to time
                return _registry.get(self._decide(key, dtype, tuner.decision).algorithm)
            if len(self.tuners) >= self._LIMIT:
                self.tuners.clear()
                self._prepared.clear()
            self.tuners[key] = tuner
        if count != tuner.count:
            # Another count of the class: the model's first, untimed (only equal
            # calls are compared), and not kept either: the class is undecided.
            return _trial(_registry.get(next(iter(tuner.predicted))))
        algo = _registry.get(tuner.next())
        if _timeline.ACTIVE is not None:  # timeline hook: one of auto's timed trials
            _timeline.ACTIVE.instant("auto trial", algorithm=algo.name, count=count)
        return _trial(algo, self._timed(key, dtype, tuner, algo),
                      functools.partial(self.tuning_run, key, dtype, tuner))

    def _prepared_run(self, key, ctx, algo, kernel, dst, agreement):
        """The plan cache's prepared run of ``algo`` for the shape (agree.prepared: shm's
        repeated compiled step, the others' run_checked), kept for the algorithm's later
        trials of the shape (the first resolves what it needs, as a decided shape's first
        repeated call does).  The key fixes dtype and op, the tuner the count; the
        agreement may change with ``set_check``."""
        runs = self._prepared.setdefault(key, {})
        run = runs.get((algo.name, agreement))
        if run is None:
            run = runs[algo.name, agreement] = prepared(ctx, algo, kernel, dst, agreement)
        return run

    def _timed(self, key, dtype, tuner: Tuner, algo: _registry.Algorithm):
        def trial(ctx, src, dst, kernel):
            # The shape's first trial call, on the full path (later ones run from the plan
            # cache: tuning_run).  Time what the decided call will run, with the agreement
            # folded into its first sync where the algorithm can, else one MAX before it.
            # The call agreed already: this second agreement on the call number is
            # redundant, and costs this one trial only.
            call = _watch.current()
            agreement = needs_agreement(call.settings, algo)
            values = fact_values(ctx.rank, None, (), call.number) if agreement else None
            run = self._prepared_run(key, ctx, algo, kernel, dst, agreement)
            start = time.perf_counter()
            if not run(ctx, call, values, src, dst):
                verdict(ctx, "allreduce", None, (), values)
                raise CollectiveMismatch(
                    f"{call.title()}: the ranks disagree in auto's timed trial of "
                    f"{algo.name}, after agreeing on the call", collective=call.what,
                    call=call.number, comm=ctx.label)
            self._took(key, dtype, tuner, ctx, time.perf_counter() - start)
        return trial

    def _took(self, key, dtype, tuner: Tuner, ctx, seconds):
        """One trial call's time on this rank; at a round's end the round's times, the
        slowest rank's (one small MAX over the ranks), go to the tuner, which may decide."""
        mine = self._times.setdefault(key, [])
        mine.append(seconds)
        if tuner.ran():
            values = np.array([int(t * 1e9) for t in mine], np.int64)
            del self._times[key]
            agree_max(ctx, values)
            decision = tuner.feed(values / 1e9)
            if decision is not None:
                self.tuners.pop(key, None)
                self._prepared.pop(key, None)
                self._decide(key, dtype, decision, ctx)

    def tuning_run(self, key, dtype, tuner: Tuner, kernel, dst, settings, forget):
        """``run(ctx, call, values, src, dst)`` -> agreed, for a plan of a shape being tuned
        (``collectives.plans`` keeps it after the shape's first trial call).

        A trial call then costs what a decided call of the shape costs on the plan
        cache's way: no check of the arguments beyond the buffers, one agreement on
        the call's facts (``values``, the plan's), folded into the candidate's first
        sync where it can, and the candidate's prepared run, timed as on the full
        path.  Where the ranks disagree nothing ran and the tuner has not moved (every
        rank's tuner stays where the others' are), and the caller raises the verdict.
        When the shape is decided the plan is dropped (``forget``), so the next call
        goes the full way and keeps the decided plan.
        """
        def run(ctx, call, values, src, dst):
            if self.tuners.get(key) is not tuner:  # decided by another thread's call, or
                forget()                           # the tuners were cleared: the decision,
                algo = _registry.get(self.choose(dst.size, dst.dtype, key[2]))  # untimed
                agreement = needs_agreement(settings, algo)
                return prepared(ctx, algo, kernel, dst, agreement)(
                    ctx, call, values if agreement else None, src, dst)
            algo = _registry.get(tuner.next())
            if _timeline.ACTIVE is not None:  # timeline hook: one of auto's timed trials
                _timeline.ACTIVE.instant("auto trial", algorithm=algo.name, count=dst.size)
            agreement = needs_agreement(settings, algo)
            prun = self._prepared_run(key, ctx, algo, kernel, dst, agreement)
            start = time.perf_counter()
            if not prun(ctx, call, values if agreement else None, src, dst):
                return False
            self._took(key, dtype, tuner, ctx, time.perf_counter() - start)
            if key not in self.tuners:
                forget()
            return True
        return run

    def _decide(self, key, dtype: np.dtype, decision: Decision,
                ctx: Optional[Context] = None) -> Decision:
        if len(self.decisions) >= self._LIMIT:
            self.decisions.clear()
        self.decisions[key] = decision
        if decision.how == "tuned":  # the trials' agreed times refine the model's ratios
            self.flat = learned(self.flat, self.size, decision.count, dtype, decision.times)
        if _timeline.ACTIVE is not None:  # timeline hook: auto's decision
            _timeline.ACTIVE.instant("auto decided", algorithm=decision.algorithm,
                                     how=decision.how, shape=str(key))
        klass, _, opname = key[:3]
        lo, hi = class_bounds(klass)
        if logger.isEnabledFor(logging.DEBUG):
            shape = f"M={key[3]}" if len(key) > 3 else f"{lo}-{hi} B per rank"
            logger.debug("auto: N=%d (%s), %s, %s %s -> %s", self.size, self.layout.describe(),
                         shape, dtype.name, opname, decision.describe())
        if self._saving and decision.how == "tuned" and ctx is not None and ctx.rank == 0:
            try:
                save_decision(self.path, self.size, self.layout.nodes, klass, dtype.name, opname,
                              decision)
            except (OSError, ValueError) as exc:
                self._saving = False
                warnings.warn(f"pycollective: cannot keep auto's decisions in {self.path}: {exc}")
        return decision

    def _adopt(self, entry: dict) -> None:
        """Follow a decision read from the decisions file, if it fits this communicator."""
        name = entry["algorithm"]
        if (name not in _registry.names() or name in self.exclude
                or entry["op"] not in OPS):
            return
        try:
            dtype = np.dtype(entry["dtype"])
        except TypeError:
            return
        self.decisions[(entry["class"], dtype.num, entry["op"])] = Decision(
            name, "file", int(entry.get("count", 0)))

    # -- reporting --

    def explain(self, count: int, dtype: np.dtype, opname: str) -> Sequence[str]:
        """Lines: the model's ranking, the candidates, and the decision (or the tuning so far)."""
        dtype = as_dtype(dtype)
        key = self.key(count, dtype, opname)
        lo, hi = class_bounds(key[0])
        lines = [f"layout: {self.layout.describe()}; auto mode: {self.mode}"
                 + (f", decisions kept in {self.path}" if self.path else "")]
        found = self.decisions.get(key)
        tuner = self.tuners.get(key)
        if found is not None:
            lines.append(f"decision for {lo}-{hi} B per rank, {dtype.name} {opname}: "
                         f"{found.describe()}")
        elif tuner is not None:
            lines.append(f"tuning {lo}-{hi} B per rank: {tuner.calls} trial calls so far, "
                         f"candidates {list(tuner.alive)}")
        else:
            first = candidates(self.ranking(count, dtype), always=_layout_aware(self.layout))
            lines.append(f"no call of {lo}-{hi} B per rank yet: the first calls will try "
                         f"{[n for n, _ in first]}" if self.mode == "tune"
                         else "the model decides")
        return lines


def _load_everything():
    """On rank 0: the calibration, the auto mode and the kept decisions."""
    try:
        params = load_params()
    except ValueError as exc:
        warnings.warn(f"pycollective: ignoring the calibration: {exc}")
        params = builtin_params(f"defaults ({exc})")
    setting = _env.AUTO.get()
    mode, path, kept = ("model", None, {}) if setting == "model" else ("tune", None, {})
    if setting not in ("model", "tune"):
        path = setting
        try:
            kept = load_decisions(path)
        except ValueError as exc:
            warnings.warn(f"pycollective: ignoring auto's decisions file: {exc}")
    return params, mode, path, kept


def _layout_aware(layout: Layout):
    """The allreduce algorithms auto always times on ``layout`` where they can run (see
    ``runtime.registry``'s ``layout_aware``)."""
    return [n for n in _registry.names() if _registry.get(n).times_always(layout)]


def auto_for(ctx: Context, params: Optional[dict] = None,
             mode: Optional[str] = None) -> AutoState:
    """The :class:`AutoState` of ``ctx``; collective on its first use.

    Args:
        ctx: the communicator's context.
        params: use these parameters instead of rank 0's file (they must be
            the same on every rank); replaces any existing state.
        mode: with ``params``: "tune" or "model" instead of rank 0's setting.
    """
    state = ctx.peek(KEY)
    if state is None or params is not None:
        if ctx.size > 1:
            _watch.arrive(ctx.comm, "its first automatic choice")
        loaded, setting, path, kept = bcast_from_root(
            ctx.comm, _load_everything, what="algorithm='auto': loading the cost model")
        layout = layout_of(ctx)
        if params is not None:
            loaded = params
            setting = mode or setting
        else:  # no calibration file: this machine's measured parameters (collectives.probe)
            loaded = _probe.machine_params(ctx, layout, loaded)
        state = ctx.put(KEY, AutoState(loaded, ctx.size, unusable_reasons(ctx), layout,
                                       setting, path, kept))
    return state
