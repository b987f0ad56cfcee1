"""What the model predicts for every algorithm, and the fastest: the model's side of ``auto``.

The calibrated prediction is per-call overhead + (measured ÷ model ratio at
this size) × α-β-γ cost, without the overhead for an algorithm that folds the
agreement into its own first sync (:func:`pays_overhead`); with no calibration it is the bare model with the
built-in defaults scaled for the machine
(:func:`~pycollective.model.params.params_for`).  On a communicator that
spans nodes the cost is priced on its :class:`~pycollective.model.topology.Topology`
(links inside and between nodes).  :func:`choose` is a pure function of
(N, M, dtype, op, parameters, layout), so ranks agree as long as they hold
the same parameters (the library makes sure they do: rank 0 loads the
calibration and broadcasts it).  ``algorithm="auto"`` times the few
algorithms ranked first here before it settles (:mod:`pycollective.model.tuning`).
"""

import bisect
import math

from ..runtime import registry as _registry
from ..data.kernels import as_dtype
from ..data.ops import resolve_op
from .formulas import check_args
from .params import ANY_DTYPE, load_params, params_for, value_at
from .topology import Topology, evaluate

__all__ = ["choose", "explain", "fastest", "ranked", "calibrated_times", "rates", "model_time",
           "gamma_of", "topology_of", "pays_overhead", "measured_ratio", "learned", "LEARN_SPAN",
           "LEARN_FROM"]


_default_params = None


def gamma_of(flat, dtype):
    """γ of ``dtype`` (its own if calibrated, else the float32 one)."""
    return flat["gamma_by_dtype"].get(dtype.name, flat["gamma"])


# A measured/model ratio below this is noise (an algorithm's time lost in
# the per-call overhead, say), not evidence that its messages are free.  Not
# higher: shm's syncs are atomics in shared memory, and the first-use
# measurement's α is a message sent by the library (its Python included), so
# shm's measured time is 0.05-0.1 of its formula at small sizes on dedicated cores.
_MIN_FACTOR = 0.03
#: Points of a measured curve at most this factor apart in size are interpolated in time
#: (:func:`_between_points`), farther ones in their ratio to the α-β-γ cost.
TIME_SPAN = 64.0


def rates(flat, count, dtype):
    """β and γ for an allreduce of ``count`` elements of ``dtype``.

    With a calibration's per-size curves, the per-byte times measured at the
    vector's size in bytes: on a shared-memory node they depend on whether
    the data fit in cache, by 2-3x on our machine.  Otherwise the scalars.
    """
    nbytes = count * dtype.itemsize
    beta = value_at(flat.get("beta_curve"), nbytes, flat["beta"])
    curves = flat.get("gamma_curves") or {}
    gamma_curve = curves.get(dtype.name)
    if gamma_curve is None and dtype.name not in flat["gamma_by_dtype"]:
        gamma_curve = curves.get(ANY_DTYPE)
    gamma = value_at(gamma_curve, nbytes, gamma_of(flat, dtype))
    return beta, gamma


def topology_of(flat, beta):
    """The :class:`Topology` of ``flat``'s layout (None on one node), links inside at ``beta``."""
    layout = flat.get("layout")
    if layout is None or not layout.spans_nodes:
        return None
    return Topology(layout.nodes, (flat["alpha"], beta), tuple(flat["inter"]))


def pays_overhead(name):
    """Whether a call of algorithm ``name`` pays the per-call overhead (the agreement step)
    beside its own steps.  One that folds the agreement into its first sync (``agreed``
    in the registry: ``shm``) does not, and its measured times hold what the agreement
    costs it: priced as overhead + ratio x cost, its small calls, faster than the
    agreement step alone, came out at the overhead (+44-48 % at 4-400 bytes, N = 2)."""
    return _registry.get(name).agreed is None


def model_time(cost, nranks, count, dtype, flat, beta_gamma=None):
    """The α-β-γ time of ``cost``: the calibrated α, per-size β and γ, ``flat``'s layout."""
    beta, gamma = beta_gamma or rates(flat, count, dtype)
    return evaluate(cost, nranks, count, dtype.itemsize, flat["alpha"], beta, gamma,
                    topology_of(flat, beta))


def measured_ratio(name, seconds, nranks, count, dtype, flat, overhead):
    """A call of ``name`` that took ``seconds`` over its α-β-γ time (:func:`model_time`),
    ``overhead`` taken off where the algorithm pays it apart (:func:`pays_overhead`):
    the ratio :func:`calibrated_times` multiplies its cost by.  None where the model
    gives no time."""
    model_t = model_time(_registry.get(name).cost, nranks, count, dtype, flat)
    if not model_t:
        return None
    return max(seconds - (overhead if pays_overhead(name) else 0.0), 0.0) / model_t


def _corrections(flat):
    """The measured ratios, if they were measured on as many nodes as ``flat``'s layout has."""
    layout = flat.get("layout")
    nodes = 1 if layout is None else len(layout.nodes)
    return flat["corrections"] if flat.get("nodes", 1) == nodes else {}


#: A size auto timed replaces a curve's points within this factor of it: they were
#: measured earlier in the job or at other sizes, the trial is the nearest evidence.
LEARN_SPAN = 4.0
#: Only trials above this many bytes per rank are learned from.  A small call's trial
#: time carries the switches between candidates (a shape's first calls of each, which
#: the first-use measurement's warm-up calls leave out): learned from, the trials of
#: the job's first class (12 bytes) priced shm's later 4-400 byte calls at 2.5-5x their
#: time where ranks share cores (N = 4, 8).  A large call's time is its data's.
LEARN_FROM = 1 << 20


def learned(flat, nranks, count, dtype, times):
    """``flat`` with auto's trials of ``count`` elements of ``dtype`` put into the measured
    ratios: ``times`` is ``{name: agreed seconds of a call}``; each timed algorithm that the
    model prices by measured ratios (the first-use measurement's ``shm``, a calibration's
    corrections) gets the ratio of that time to its α-β-γ cost at this size, replacing
    the points within :data:`LEARN_SPAN` of it (above :data:`LEARN_FROM` bytes per rank
    only).  So sizes auto has not timed yet are
    priced from the nearest sizes it has, on the machine as it is now: a ratio measured at
    first use is held beyond its largest size (9 MiB), where a call of 40 MB at N = 2
    took 1.15-1.45x the time the 9 MiB rate gave before β followed the far copy out of
    the caches (docs/results/auto-score.md).  Pure; the same agreed times give every rank
    the same parameters."""
    dtype = as_dtype(dtype)
    if count * dtype.itemsize <= LEARN_FROM or nranks <= 1 or not times:
        return flat
    base = _corrections(flat)
    curves = dict(flat.get("learned") or {})
    nbytes = float(count * dtype.itemsize)
    for name, seconds in sorted(times.items()):
        curve = curves.get(name, base.get(name))
        if not curve or name not in _registry.names() or _registry.get(name).cost is None:
            continue
        ratio = measured_ratio(name, seconds, nranks, count, dtype, flat, flat["overhead"])
        if ratio is None:
            continue
        kept = [point for point in curve
                if not nbytes / LEARN_SPAN < point[0] < nbytes * LEARN_SPAN]
        curves[name] = sorted(kept + [[nbytes, ratio]])
    return {**flat, "learned": curves}


def calibrated_times(nranks, count, dtype, flat, exclude=()):
    """``{name: calibrated prediction}`` for every algorithm with a cost model (but ``exclude``),
    in registry order.

    ``flat`` is one N's parameters (:func:`~pycollective.model.params.params_for`).
    The measured ratios apply only where the calibration was made on as
    many nodes as the layout has (on one node, links between nodes were not
    in them).
    """
    out = {}
    beta, gamma = rates(flat, count, dtype)
    corrections = {**_corrections(flat), **(flat.get("learned") or {})}
    # what every algorithm's price shares, found once (auto's first call of each
    # shape ranks every algorithm, in Python)
    topo, alpha, overhead = topology_of(flat, beta), flat["alpha"], flat["overhead"]
    nbytes, itemsize = count * dtype.itemsize, dtype.itemsize
    trivial = count == 0 or nranks == 1
    for name in _registry.names():
        if name in exclude:
            continue
        cost = _registry.get(name).cost
        if cost is None:
            continue
        if trivial:
            out[name] = 0.0
            continue
        curve = corrections.get(name)
        t = _between_points(curve, cost, nranks, nbytes, dtype, flat) if curve else None
        if t is None:
            t = max(value_at(curve, nbytes, 1.0), _MIN_FACTOR) * (
                evaluate(cost, nranks, count, itemsize, alpha, beta, gamma, topo))
        out[name] = (overhead if pays_overhead(name) else 0.0) + t
    return out


def _between_points(curve, cost, nranks, nbytes, dtype, flat):
    """The price of a size between two points of a measured curve at most
    :data:`TIME_SPAN` apart: the times the curve gives at the two points (ratio x α-β-γ
    cost there), interpolated log-log; None elsewhere (the ratio is interpolated then).

    Interpolating the ratio multiplies it by the cost at the size between, whose shape
    need not follow the measured times': shm's cost changes its steps above 4 KiB, and
    the ratio of its 4 KiB point times the cost just above priced 16-40 KB calls at 8
    ranks above the time measured at 64 KiB (1e4 floats +31-39 % in the auto score,
    docs/results/auto-score.md).  Points far apart (a calibration's few sizes, a ratio
    held over decades) leave the shape to the cost model."""
    if not curve[0][0] < nbytes < curve[-1][0]:
        return None
    i = bisect.bisect_right(curve, [nbytes, math.inf])
    (x0, _), (x1, _) = curve[i - 1], curve[i]
    if x1 > TIME_SPAN * x0:
        return None
    t0, t1 = (max(ratio, _MIN_FACTOR)
              * model_time(cost, nranks, max(1, int(round(at / dtype.itemsize))), dtype, flat)
              for at, ratio in (curve[i - 1], curve[i]))
    if t0 <= 0.0 or t1 <= 0.0:
        return None
    return t0 * (t1 / t0) ** (math.log(nbytes / x0) / math.log(x1 / x0))


def ranked(nranks, count, dtype, flat, exclude=()):
    """``[(name, predicted seconds)]`` fastest first, leaving out ``exclude``.

    Ties keep registry order, the same on every rank.
    """
    times = calibrated_times(nranks, count, dtype, flat, exclude)
    order = {name: i for i, name in enumerate(times)}
    kept = list(times.items())
    if not kept:
        raise ValueError("no registered algorithm has a cost model")
    return sorted(kept, key=lambda nt: (nt[1], order[nt[0]]))


def fastest(nranks, count, dtype, flat, exclude=()):
    """The name with the smallest :func:`calibrated_times`, leaving out ``exclude``.

    Ties go to the earlier registered algorithm, the same on every rank.
    """
    return ranked(nranks, count, dtype, flat, exclude)[0][0]


def explain(nranks, count, dtype="float32", params=None, layout=None):
    """What ``algorithm="auto"`` believes: every algorithm's calibrated prediction.

    The calibrated prediction is the α-β-γ cost with this N's parameters,
    each algorithm's measured/model ratio
    (:func:`~pycollective.model.fit.fit_corrections`) and the per-call
    overhead; without a calibration it is
    :func:`~pycollective.model.formulas.predict` with ``DEFAULTS``.

    Args:
        nranks, count, dtype, layout: as for :func:`choose`.
        params: from :func:`load_params`; None loads the default calibration.

    Returns:
        ``{name: seconds}`` for every registered algorithm with a cost model,
        in registry order; ``min`` of it is what :func:`choose` returns.
    """
    dtype = as_dtype(dtype)
    params = _params_or_default(params)
    check_args(nranks, count, params["alpha"], params["beta"], params["gamma"], dtype.itemsize)
    return calibrated_times(int(nranks), int(count), dtype, params_for(params, nranks, layout))


def _params_or_default(params):
    global _default_params
    if params is None:
        if _default_params is None:
            _default_params = load_params()
        params = _default_params
    return params


def choose(nranks, count, dtype, op="sum", params=None, layout=None):
    """Name of the algorithm predicted fastest: what ``algorithm="auto"`` tries first.

    A pure function of its arguments, so ranks holding the same parameters
    choose the same algorithm.  The op is accepted for the interface but does
    not change the choice: the four kernels run at the same speed per byte.

    Args:
        nranks: communicator size N.
        count: elements per rank M.
        dtype: anything ``numpy.dtype`` accepts; its itemsize and its γ count.
        op: reduction (name or MPI op), validated.
        params: from :func:`load_params` (whole file or one N); None loads
            the default calibration once per process.
        layout: where the ranks run (:class:`~pycollective.model.topology.Layout`);
            default one node with one core per rank.

    Returns:
        A registered algorithm name.

    Raises:
        ValueError: for an unsupported op, bad sizes, or when no algorithm
            has a cost model.
    """
    resolve_op(op)
    dtype = as_dtype(dtype)
    params = _params_or_default(params)
    check_args(nranks, count, params["alpha"], params["beta"], params["gamma"], dtype.itemsize)
    return fastest(int(nranks), int(count), dtype, params_for(params, nranks, layout))
