"""The α-β-γ cost model: predicted allreduce times, calibration, and ``algorithm="auto"``.

Model.  A message of n bytes costs ``α + n·β`` (α: start-up seconds per
message, β: seconds per byte sent), and reducing n bytes into a buffer costs
``n·γ``.  Each algorithm's registry entry carries ``cost(nranks, count,
itemsize, alpha, beta, gamma) -> seconds``, the time along its critical path
as the algorithm is actually implemented: ceil-sized chunks when M is not a
multiple of N, empty chunks that still cost a message when M < N, the fold
and unfold of a non-power-of-two butterfly, the server's two directions in
the parameter server.  :func:`predict` evaluates it; :func:`choose` takes the
fastest after calibration (below), which is what
``allreduce(..., algorithm="auto")`` runs.

Lecture formulas.  The lecture the project grew from (section 2.3 table 1,
section 4.4 and its program ``allreduce_model.c``, exercise 1) writes
``w`` for the transfer time of one element and uses textbook formulas:

=========  ===========================  =====================================
name       lecture                      implemented (``predict``, γ = 0)
=========  ===========================  =====================================
ring       2(N-1)(α + (M/N)·w)          same, with ceil(M/N)
tree       2·ceil(log2 N)·(α + M·w)     same
butterfly  ceil(log2 N)·(α + M·w)       (log2 p + 2·[N≠p])(α + M·w), p = 2^floor(log2 N)
ps         N·M·w + 2α                   2(N-1)(α + M·w)
naive      (N-1)·M·w + α                (N-1)(α + M·w)
=========  ===========================  =====================================

:func:`lecture_predict` keeps the lecture's formulas so its numbers can be
reproduced (and are pinned by tests); :func:`predict` is what the library
believes about its own code, and what :func:`choose` builds on.

Units.  The lecture's tables 7 and 8 use ``w = 5e-11`` s per element, which
its text calls "fp16 at 10 GB/s"; but 2 bytes at 10 GB/s take 2e-10 s (its
C program divides the time per byte by the bytes per element instead of
multiplying).  This module never converts implicitly: pass ``w`` directly
(``--w 5e-11`` reproduces the tables), or bytes per element and bandwidth,
from which ``w = bytes / bandwidth`` (``--bytes-per-element 2 --bandwidth
10e9`` gives 2e-10 s and times four times larger than the tables).
Exercise 1 (fp32 at 12.5 GB/s, w = 3.2e-10 s) is consistent either way.

Calibration.  ``mpiexec -n N python -m pycollective.model --calibrate``
(or ``scripts/run_mpi.sh N -m pycollective.model --calibrate``) measures on
this machine, with all N ranks busy at once as they are inside an
allreduce: α and β from ring exchanges (``Sendrecv`` to the right neighbour,
from the left) over a range of message sizes, by least squares on relative
error (α from the small sizes, β from those out of cache), γ per dtype from
the reduction kernels, β and γ also per size (a shared-memory node moves
cached data several times faster than data from memory).  Then it times
every registered algorithm at sizes 1..4^11 and stores, per algorithm and
size, measured ÷ model: the model is only a model, and on our machine it
misses by up to ~4x in places (the README lists where).  Everything is
stored per communicator size N, because oversubscribed ranks (8 ranks on 2
cores) see a much larger α than 2 ranks do; sizes that were not calibrated
are interpolated linearly in N (and clamped outside the calibrated range).
The file is JSON at ``$PYCOLLECTIVE_MODEL`` if set, else
``$XDG_CACHE_HOME/pycollective/model.json`` (``~/.cache/pycollective/model.json``);
``--output`` writes elsewhere, and calibrations at other N already in the
file are kept.  ``--check`` times every algorithm again and says whether
auto's choice is within 10 % of the fastest.

Auto.  :func:`choose` minimises :func:`explain`: per-call overhead +
(measured ÷ model ratio at this size) × α-β-γ cost; with no calibration it
is the bare model with :data:`DEFAULTS`.  It is a pure function of (N, M,
dtype, op, parameters), so ranks agree as long as they hold the same
parameters.  ``allreduce`` makes sure they do: on the first call on a
communicator rank 0 loads the parameters and broadcasts them
(:func:`_auto_for`), and choices are cached per (M, dtype, op) in the
communicator's context.
"""

import argparse
import bisect
import datetime
import json
import math
import os
import platform
import sys
import time
import warnings

import numpy as np

from .. import _registry, algorithms  # noqa: F401  (registers the algorithms)

__all__ = [
    "DEFAULTS", "predict", "predict_all", "terms", "lecture_predict", "choose", "explain",
    "load_params", "save_params", "params_for", "default_path",
    "fit_alpha_beta", "fit_two_regimes", "fit_corrections", "measure_algorithms", "calibrate",
]

# Used when no calibration file exists: `--calibrate` at N = 2 on the 2-core
# development machine (MPICH 5 shared memory; β and γ for data out of
# cache, see the README).  Only their ratios matter for choosing, and they
# are of the right order for any shared-memory node.
DEFAULTS = {
    "alpha": 3.0e-6,     # s per message (mpi4py Sendrecv through Python)
    "beta": 1.0e-10,     # s per byte sent (about 10 GB/s)
    "gamma": 1.1e-10,    # s per byte reduced (numba sum of float32, from memory)
}

LECTURE = {
    # name: (formula in the lecture's words, f(M, N, w, alpha))
    "ring": ("2(N-1)(a + (M/N)w)",
             lambda M, N, w, a: 2.0 * (N - 1) * (a + (M / N) * w)),
    "tree": ("2 ceil(log2 N)(a + Mw)",
             lambda M, N, w, a: 2.0 * math.ceil(math.log2(N)) * (a + M * w)),
    "butterfly": ("ceil(log2 N)(a + Mw)",
                  lambda M, N, w, a: math.ceil(math.log2(N)) * (a + M * w)),
    "ps": ("NMw + 2a", lambda M, N, w, a: N * M * w + 2 * a),
    "naive": ("(N-1)Mw + a", lambda M, N, w, a: (N - 1) * M * w + a),
}


# --- prediction ---------------------------------------------------------------

def _check_args(nranks, count, alpha, beta, gamma, itemsize):
    if not isinstance(nranks, (int, np.integer)) or nranks < 1:
        raise ValueError(f"nranks must be a positive integer, got {nranks!r}")
    if not isinstance(count, (int, np.integer)) or count < 0:
        raise ValueError(f"count must be a non-negative integer, got {count!r}")
    if not isinstance(itemsize, (int, np.integer)) or itemsize < 1:
        raise ValueError(f"itemsize must be a positive integer, got {itemsize!r}")
    for label, v in (("alpha", alpha), ("beta", beta), ("gamma", gamma)):
        if not (isinstance(v, (int, float, np.floating)) and v >= 0 and math.isfinite(v)):
            raise ValueError(f"{label} must be a finite number >= 0, got {v!r}")


def _cost(name):
    algo = _registry.get(name)  # ValueError naming the registered ones
    if algo.cost is None:
        raise ValueError(
            f"algorithm {name!r} has no cost model: pass cost=f(nranks, count, "
            f"itemsize, alpha, beta, gamma) to register() in its module")
    return algo.cost


def predict(algorithm, nranks, count, *, alpha, beta, gamma=0.0, itemsize=4):
    """Predicted time of one allreduce of ``count`` elements over ``nranks`` ranks.

    This is the implementation-faithful model (see the module docstring);
    use :func:`lecture_predict` for the lecture's textbook formulas.

    Args:
        algorithm: a registered algorithm name (see
            :func:`pycollective.algorithms`).
        nranks: communicator size N (>= 1).
        count: elements per rank M (>= 0).
        alpha: seconds per message.
        beta: seconds per byte sent.
        gamma: seconds per byte reduced.
        itemsize: bytes per element (pass ``itemsize=1`` and ``beta=w`` to
            work in seconds per element).

    Returns:
        Seconds (float).  0.0 for ``count == 0`` or ``nranks == 1``, which
        ``allreduce`` answers without any message.

    Raises:
        ValueError: for an unregistered algorithm (the message lists the
            registered ones), an algorithm registered without a cost model,
            or invalid numbers.
    """
    cost = _cost(algorithm)
    _check_args(nranks, count, alpha, beta, gamma, itemsize)
    if count == 0 or nranks == 1:
        return 0.0
    return float(cost(int(nranks), int(count), int(itemsize), alpha, beta, gamma))


def terms(algorithm, nranks, count, itemsize=4):
    """The three coefficients of ``algorithm``'s cost: how many α, β and γ it pays.

    Costs are linear in (α, β, γ), so evaluating them at unit vectors gives
    (messages on the critical path, bytes sent along it, bytes reduced along
    it): the model's own description of what an algorithm does.

    Returns:
        ``(messages, bytes_sent, bytes_reduced)`` as floats.

    Raises:
        ValueError: as :func:`predict`.
    """
    kw = dict(itemsize=itemsize)
    return (predict(algorithm, nranks, count, alpha=1.0, beta=0.0, **kw),
            predict(algorithm, nranks, count, alpha=0.0, beta=1.0, **kw),
            predict(algorithm, nranks, count, alpha=0.0, beta=0.0, gamma=1.0, **kw))


def predict_all(nranks, count, *, alpha, beta, gamma=0.0, itemsize=4):
    """Return ``{name: seconds}`` from :func:`predict` for every registered algorithm."""
    return {name: predict(name, nranks, count, alpha=alpha, beta=beta, gamma=gamma,
                          itemsize=itemsize)
            for name in _registry.names()}


def lecture_predict(algorithm, nranks, count, *, alpha, w):
    """The lecture's textbook time for ``algorithm`` (its ``allreduce_model.c``).

    Args:
        algorithm: one of "ring", "tree", "butterfly", "ps", "naive".
        nranks: N (>= 1); the lecture's tables use powers of two.
        count: M elements (float, as in the lecture: 1.5e9 is fine).
        alpha: seconds per step.
        w: seconds to transfer one element (not one byte).

    Returns:
        Seconds (float).

    Raises:
        ValueError: for a name the lecture has no formula for, or N < 1.
    """
    try:
        formula = LECTURE[algorithm][1]
    except KeyError:
        raise ValueError(f"the lecture has no formula for {algorithm!r}; "
                         f"it has: {', '.join(LECTURE)}") from None
    if nranks < 1:
        raise ValueError(f"nranks must be >= 1, got {nranks}")
    return float(formula(float(count), int(nranks), float(w), float(alpha)))


# --- parameters ---------------------------------------------------------------

def default_path():
    """Where calibrations are stored and looked for by default.

    ``$PYCOLLECTIVE_MODEL`` if set, else ``$XDG_CACHE_HOME/pycollective/model.json``
    (``~/.cache/pycollective/model.json`` when XDG_CACHE_HOME is unset).
    """
    env = os.environ.get("PYCOLLECTIVE_MODEL")
    if env:
        return os.path.expanduser(env)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "pycollective", "model.json")


def _number(d, key, where):
    v = d.get(key)
    if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{where}: {key!r} must be a number >= 0, got {v!r}")
    return float(v)


def _check_curve(curve, where):
    ok = isinstance(curve, list) and all(
        isinstance(p, (list, tuple)) and len(p) == 2
        and all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in p)
        for p in curve)
    if not ok or [p[0] for p in curve] != sorted(p[0] for p in curve):
        raise ValueError(f"{where}: expected [[bytes, value], ...] by increasing size "
                         "(a calibration from another version? run --calibrate again)")


def _validate(data, where):
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object")
    for key in ("alpha", "beta", "gamma"):
        _number(data, key, where)
    if data.get("beta_curve") is not None:
        _check_curve(data["beta_curve"], f"{where}: beta_curve")
    for name, curve in (data.get("gamma_curves") or {}).items():
        _check_curve(curve, f"{where}: gamma_curves[{name}]")
    for name, curve in (data.get("corrections") or {}).items():
        _check_curve(curve, f"{where}: corrections[{name}]")
    by_n = data.get("by_nranks", {})
    if not isinstance(by_n, dict):
        raise ValueError(f"{where}: 'by_nranks' must be an object keyed by N")
    for n, entry in by_n.items():
        if not str(n).isdigit() or int(n) < 1 or not isinstance(entry, dict):
            raise ValueError(f"{where}: bad 'by_nranks' entry {n!r}")
        _validate({k: v for k, v in entry.items() if k != "by_nranks"}, f"{where} [N={n}]")


def load_params(path=None, *, nranks=None):
    """Load the calibrated α, β, γ (or the documented :data:`DEFAULTS`).

    Args:
        path: a calibration JSON file; None means :func:`default_path`.  A
            missing file gives the defaults (``source`` says so).
        nranks: if given, return the parameters for a communicator of this
            size (see :func:`params_for`) instead of the whole file.

    Returns:
        A dict with at least ``alpha``, ``beta``, ``gamma`` (the values at the
        smallest calibrated N) and ``source``; a calibration file adds
        ``gamma_by_dtype`` and ``by_nranks`` ({N: {alpha, beta, gamma, ...}}).

    Raises:
        ValueError: for a file that exists but is not a valid calibration.
    """
    path = default_path() if path is None else os.fspath(path)
    if not os.path.exists(path):
        params = dict(DEFAULTS, source=f"defaults (no calibration at {path})")
    else:
        try:
            with open(path) as f:
                params = json.load(f)
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read calibration {path}: {exc}") from None
        _validate(params, path)
        params["source"] = path
    return params if nranks is None else params_for(params, nranks)


def _interp(x, xs, ys):
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:]):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _interp_curves(nranks, ns, curves):
    """Per-size curves ``[[bytes, s/B], ...]`` of several N, interpolated in N.

    Curves measured on the same sizes are interpolated point by point; if
    any N lacks a curve or the sizes differ, the nearest N's curve is used.
    """
    if not any(curves):
        return None
    have = [(n, c) for n, c in zip(ns, curves) if c]
    if len(have) == len(curves) and all([x for x, _ in c] == [x for x, _ in have[0][1]]
                                        for _, c in have):
        sizes = [x for x, _ in have[0][1]]
        return [[x, _interp(nranks, ns, [c[i][1] for c in curves])] for i, x in enumerate(sizes)]
    return min(have, key=lambda nc: abs(nc[0] - nranks))[1]


def _at(curve, nbytes, default):
    """Value of a per-size curve at ``nbytes`` (log-linear, clamped at the ends).

    Plain Python on purpose: it runs for every algorithm on auto's first
    call of each size, where numpy's per-call overhead would dominate.
    """
    if not curve or nbytes <= 0:
        return default
    if nbytes <= curve[0][0]:
        return curve[0][1]
    if nbytes >= curve[-1][0]:
        return curve[-1][1]
    i = bisect.bisect_right(curve, [nbytes, math.inf])
    (x0, y0), (x1, y1) = curve[i - 1], curve[i]
    return y0 + (y1 - y0) * math.log(nbytes / x0) / math.log(x1 / x0)


def params_for(params, nranks):
    """The α, β, γ of ``params`` for a communicator of ``nranks`` ranks.

    Calibrated sizes are used as measured; others are interpolated linearly
    in N between the neighbouring calibrated sizes, and clamped to the
    nearest one outside the calibrated range (oversubscription makes
    extrapolation meaningless).  Parameters without ``by_nranks`` (the
    defaults, a hand-written file) are returned as they are.

    Returns:
        dict with ``alpha``, ``beta``, ``gamma``, ``gamma_by_dtype``, ``source``.
    """
    by_n = params.get("by_nranks") or {}
    out = {"alpha": params["alpha"], "beta": params["beta"], "gamma": params["gamma"],
           "gamma_by_dtype": dict(params.get("gamma_by_dtype") or {}),
           "overhead": params.get("overhead", 0.0),
           "corrections": dict(params.get("corrections") or {}),
           "beta_curve": params.get("beta_curve"),
           "gamma_curves": dict(params.get("gamma_curves") or {}),
           "source": params.get("source", "given")}
    if not by_n:
        return out
    ns = sorted(int(n) for n in by_n)
    entries = [by_n[str(n)] if str(n) in by_n else by_n[n] for n in ns]
    for key in ("alpha", "beta", "gamma"):
        out[key] = _interp(nranks, ns, [e[key] for e in entries])
    out["overhead"] = _interp(nranks, ns, [e.get("overhead", 0.0) for e in entries])
    dtypes = set.intersection(*(set(e.get("gamma_by_dtype") or {}) for e in entries))
    out["gamma_by_dtype"] = {
        dt: _interp(nranks, ns, [e["gamma_by_dtype"][dt] for e in entries]) for dt in dtypes}
    out["beta_curve"] = _interp_curves(nranks, ns, [e.get("beta_curve") for e in entries])
    out["gamma_curves"] = {}
    for dt in dtypes:
        curve = _interp_curves(nranks, ns, [(e.get("gamma_curves") or {}).get(dt)
                                            for e in entries])
        if curve:
            out["gamma_curves"][dt] = curve
    # An algorithm missing at some calibrated N (registered since) is taken
    # from the nearest N that has it (no ratio at all: the bare model).
    names = set().union(*(set(e.get("corrections") or {}) for e in entries))
    out["corrections"] = {}
    for name in names:
        curve = _interp_curves(nranks, ns, [(e.get("corrections") or {}).get(name)
                                            for e in entries])
        if curve:
            out["corrections"][name] = curve
    return out


def save_params(params, path=None):
    """Write ``params`` as JSON to ``path`` (default :func:`default_path`); return the path.

    Raises:
        ValueError: if ``params`` is not a valid calibration.
    """
    path = default_path() if path is None else os.fspath(path)
    data = {k: v for k, v in params.items() if k != "source"}
    _validate(data, "params")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)  # readers never see half a file
    return path


# --- choice -------------------------------------------------------------------

_default_params = None


def _gamma(flat, dtype):
    return flat["gamma_by_dtype"].get(dtype.name, flat["gamma"])


# A measured/model ratio below this is noise (an algorithm's time lost in
# the per-call overhead, say), not evidence that its messages are free.
_MIN_FACTOR = 0.1


def _rates(flat, count, dtype):
    """β and γ for an allreduce of ``count`` elements of ``dtype``.

    With a calibration's per-size curves, the per-byte times measured at the
    vector's size in bytes: on a shared-memory node they depend on whether
    the data fit in cache, by 2-3x on our machine.  Otherwise the scalars.
    """
    nbytes = count * dtype.itemsize
    beta = _at(flat.get("beta_curve"), nbytes, flat["beta"])
    gamma = _at((flat.get("gamma_curves") or {}).get(dtype.name), nbytes, _gamma(flat, dtype))
    return beta, gamma


def _model_time(cost, nranks, count, dtype, flat, rates=None):
    """The α-β-γ time of ``cost`` with the calibrated α and per-size β, γ."""
    beta, gamma = rates or _rates(flat, count, dtype)
    return cost(nranks, count, dtype.itemsize, flat["alpha"], beta, gamma)


def _all_calibrated(nranks, count, dtype, flat):
    out = {}
    rates = _rates(flat, count, dtype)
    for name in _registry.names():
        algo = _registry.get(name)
        if algo.cost is None:
            continue
        if count == 0 or nranks == 1:
            out[name] = 0.0
            continue
        ratio = _at(flat["corrections"].get(name), count * dtype.itemsize, 1.0)
        out[name] = flat["overhead"] + max(ratio, _MIN_FACTOR) * _model_time(
            algo.cost, nranks, count, dtype, flat, rates)
    return out


def _fastest(nranks, count, dtype, flat, exclude=()):
    times = _all_calibrated(nranks, count, dtype, flat)
    for name in exclude:
        times.pop(name, None)
    if not times:
        raise ValueError("no registered algorithm has a cost model")
    best = min(times.values())
    # registry order breaks ties, the same on every rank
    return next(name for name, t in times.items() if t == best)


def explain(nranks, count, dtype="float32", params=None):
    """What ``algorithm="auto"`` believes: every algorithm's calibrated prediction.

    The calibrated prediction is the α-β-γ cost with this N's parameters,
    each algorithm's measured/model ratio (:func:`fit_corrections`) and the
    per-call overhead; without a calibration it is :func:`predict` with
    :data:`DEFAULTS`.

    Args:
        nranks, count, dtype: as for :func:`choose`.
        params: from :func:`load_params`; None loads the default calibration.

    Returns:
        ``{name: seconds}`` for every registered algorithm with a cost model,
        in registry order; ``min`` of it is what :func:`choose` returns.
    """
    dtype = np.dtype(dtype)
    params = _params_or_default(params)
    _check_args(nranks, count, params["alpha"], params["beta"], params["gamma"], dtype.itemsize)
    return _all_calibrated(int(nranks), int(count), dtype, params_for(params, nranks))


def _params_or_default(params):
    global _default_params
    if params is None:
        if _default_params is None:
            _default_params = load_params()
        params = _default_params
    return params


def choose(nranks, count, dtype, op="sum", params=None):
    """Name of the algorithm predicted fastest: what ``algorithm="auto"`` runs.

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

    Returns:
        A registered algorithm name.

    Raises:
        ValueError: for an unsupported op, bad sizes, or when no algorithm
            has a cost model.
    """
    from .._kernels import resolve_op
    resolve_op(op)
    dtype = np.dtype(dtype)
    params = _params_or_default(params)
    _check_args(nranks, count, params["alpha"], params["beta"], params["gamma"],
                dtype.itemsize)
    return _fastest(int(nranks), int(count), dtype, params_for(params, nranks))


class _Auto:
    """Per-communicator state of ``algorithm="auto"``: rank 0's parameters, cached choices."""

    __slots__ = ("params", "flat", "size", "choices", "exclude")
    _LIMIT = 4096  # bound the cache for programs that sweep many sizes

    def __init__(self, params, size, exclude=()):
        self.params = params
        self.size = size
        self.flat = params_for(params, size)
        self.choices = {}
        self.exclude = tuple(exclude)  # algorithms that cannot run on this communicator

    def choose(self, count, dtype, opname):
        key = (count, dtype.num, opname)
        name = self.choices.get(key)
        if name is None:
            if len(self.choices) >= self._LIMIT:
                self.choices.clear()
            name = self.choices[key] = _fastest(self.size, count, dtype, self.flat,
                                                self.exclude)
        return name


def _auto_for(comm):
    """The :class:`_Auto` state of ``comm``; collective on its first use.

    Rank 0 alone reads the calibration and broadcasts it, so every rank holds
    the same parameters and therefore makes the same choice; algorithms that
    cannot run on this communicator ("shm" across nodes) are left out.  An unreadable
    calibration file gives the defaults (with a warning on rank 0); any other
    failure on rank 0 is broadcast and raised on every rank as ValueError.
    """
    from .._context import get_context
    ctx = get_context(comm)
    state = ctx.cache.get("model.auto")
    if state is None:
        payload = None
        if ctx.rank == 0:
            try:
                try:
                    payload = (load_params(), None)
                except ValueError as exc:
                    # A broken or outdated file must not break every allreduce.
                    warnings.warn(f"pycollective: ignoring the calibration: {exc}")
                    payload = (dict(DEFAULTS, source=f"defaults ({exc})"), None)
            except Exception as exc:  # any failure must reach every rank
                payload = (None, f"{type(exc).__name__}: {exc}")
        params, error = ctx.comm.bcast(payload, root=0) if ctx.size > 1 else payload
        if error is not None:
            raise ValueError(f"algorithm='auto': rank 0 could not load the cost model: {error}")
        state = ctx.cache["model.auto"] = _Auto(params, ctx.size, _unusable(ctx))
    return state


def _unusable(ctx):
    """Registered algorithms that cannot run on ``ctx``; the same on every rank.

    "shm" needs every rank on one shared-memory node; asking is collective on
    a context's first use, which is why it happens here, where every rank is.
    """
    if ctx.size == 1 or "shm" not in _registry.names():
        return ()
    from ..algorithms import shm
    return () if shm.on_one_node(ctx) else ("shm",)


# --- calibration ----------------------------------------------------------------

def _fit_relative(columns, times, offset=0.0):
    """Non-negative least squares on relative error: the c >= 0 minimising
    Σ((offset + Σ_j c_j·x_ij − t_i)/t_i)².  Exact for a few columns: every
    subset of free coefficients is solved and the best feasible one kept.

    Returns:
        ``(coefficients, rms relative residual)``.
    """
    t = np.asarray(times, float)
    x = np.column_stack([np.asarray(c, float) for c in columns]) / t[:, None]
    y = (t - offset) / t
    k = x.shape[1]
    best = None
    for free in range(1 << k):
        idx = [j for j in range(k) if free >> j & 1]
        c = np.zeros(k)
        if idx:
            sol = np.linalg.lstsq(x[:, idx], y, rcond=None)[0]
            if np.any(sol < 0):
                continue
            c[idx] = sol
        err = float(np.sum((x @ c - y) ** 2))
        if best is None or err < best[0] - 1e-15 * max(1.0, best[0]):
            best = (err, c)
    return best[1], float(np.sqrt(best[0] / len(t)))


def fit_alpha_beta(sizes, times):
    """Least-squares fit of ``times ≈ alpha + beta * sizes`` on relative error.

    Minimises Σ((α + β·n_i − t_i)/t_i)², so a 5 µs point counts as much as a
    50 ms one; α and β are kept >= 0 (the best fit with the other fixed at
    0 when the free fit would make one negative).

    Args:
        sizes: message sizes (bytes), at least two distinct.
        times: measured seconds, all > 0.

    Returns:
        ``(alpha, beta, residual)``, residual being the root-mean-square
        relative error of the fit (0.05 means 5 %).

    Raises:
        ValueError: for mismatched lengths, fewer than two distinct sizes or
            non-positive times.
    """
    n = np.asarray(sizes, float)
    t = np.asarray(times, float)
    if n.shape != t.shape or n.ndim != 1:
        raise ValueError("sizes and times must be 1-d and of the same length")
    if len(np.unique(n)) < 2:
        raise ValueError("need at least two distinct sizes to fit alpha and beta")
    if np.any(t <= 0) or not np.all(np.isfinite(t)):
        raise ValueError("times must be finite and > 0")
    (alpha, beta), residual = _fit_relative([np.ones_like(n), n], t)
    return float(alpha), float(beta), residual


# Message sizes (bytes) that decide α and β: α where the start-up dominates,
# β where the data no longer fit in cache, as in the large allreduces where
# β matters.  One straight line through all sizes would take β from the
# in-cache sizes and predict large messages 1.5-2x too fast on our machine.
SMALL_BYTES = 1 << 16
LARGE_BYTES = 1 << 20


def fit_two_regimes(sizes, times, small=SMALL_BYTES, large=LARGE_BYTES):
    """α from the sizes up to ``small``, β from those from ``large`` up (α fixed).

    Falls back to one straight line (:func:`fit_alpha_beta`) when either
    range has fewer than two sizes.

    Returns:
        ``(alpha, beta, residual)`` with the residual over all sizes.
    """
    n = np.asarray(sizes, float)
    t = np.asarray(times, float)
    lo, hi = n <= small, n >= large
    if len(np.unique(n[lo])) < 2 or len(np.unique(n[hi])) < 2:
        return fit_alpha_beta(n, t)
    alpha, _, _ = fit_alpha_beta(n[lo], t[lo])
    (beta,), _ = _fit_relative([n[hi]], t[hi], offset=alpha)
    rel = (alpha + beta * n - t) / t
    return float(alpha), float(beta), float(np.sqrt(np.mean(rel ** 2)))


def fit_corrections(nranks, measured, params, dtype="float32", smooth=1):
    """Measured ÷ modelled time of every algorithm at every measured size.

    The α-β-γ cost (with this N's α and the per-size β, γ) is what the
    model says; an allreduce measured at the same size, minus the per-call
    ``overhead`` every algorithm pays, is what happened.  Their ratio per
    algorithm and size is where the model misses on this machine (1 means
    it was right); :func:`choose` multiplies the model by it, interpolated
    in log(bytes) between measured sizes and held constant beyond them.

    Args:
        nranks: N of the measurements.
        measured: from :func:`measure_algorithms`.
        params: the calibrated parameters of this N (a calibration entry or
            :func:`params_for` output: alpha, beta, gamma, optional curves).
        dtype: dtype of the measurements.
        smooth: below CURVE_MIN_BYTES, each ratio is averaged with this many
            neighbours on each side (also below CURVE_MIN_BYTES).

    Returns:
        ``{name: [[bytes, ratio], ...]}`` for every measured algorithm that
        has a cost model, sizes ascending.
    """
    flat = params_for({k: v for k, v in params.items() if k != "by_nranks"}, nranks)
    dtype = np.dtype(dtype)
    o = measured["overhead"]
    out = {}
    for name, rows in measured["times"].items():
        try:
            cost = _cost(name)
        except ValueError:
            continue
        sizes, ratios = [], []
        for count, t in sorted(rows):
            count = int(count)
            if count == 0:
                continue
            model_t = _model_time(cost, nranks, count, dtype, flat)
            sizes.append(count * dtype.itemsize)
            ratios.append(max(t - o, 0.0) / model_t if model_t else 1.0)
        # Below CURVE_MIN_BYTES the time is start-ups and overhead, the same
        # at every size, so one sample's ratio is mostly noise: average it
        # with its neighbours there.  Above, the ratio has a real shape
        # (cache regimes) that averaging would blur.
        k = smooth
        small = [x < CURVE_MIN_BYTES for x in sizes]
        curve = []
        for i, x in enumerate(sizes):
            window = [ratios[j] for j in range(max(0, i - k), min(len(sizes), i + k + 1))
                      if small[j]] if small[i] else [ratios[i]]
            curve.append([x, float(np.mean(window))])
        out[name] = curve
    return out


def _bytes_label(n):
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n}B"


CURVE_MIN_BYTES = 1 << 14  # below this the per-byte part is too small to measure


def _curve(rows, fixed):
    """Per-byte time ``(t - fixed)/n`` at each size from CURVE_MIN_BYTES up.

    Smaller sizes take the value of the smallest listed one; ``None`` if the
    measurements do not reach CURVE_MIN_BYTES.
    """
    curve = [[int(n), max(t - fixed, 0.0) / n] for n, t in rows if n >= CURVE_MIN_BYTES]
    return curve or None


def _sizes(lo, hi, factor):
    out, s = [], lo
    while s <= hi:
        out.append(int(s))
        s *= factor
    return out


def _typical(samples):
    """The lower quartile of timing samples.

    Other processes on a shared machine only ever add time, in bursts; the
    lower quartile ignores the bursts without trusting one lucky sample.
    """
    return float(np.percentile(samples, 25))


def _timed(comm, body, steps, reps):
    """Lower quartile over ``reps`` of the slowest rank's time per call of ``body``."""
    from mpi4py import MPI
    samples = []
    for rep in range(reps + 1):  # the first repetition warms up
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(steps):
            body()
        dt = (time.perf_counter() - t0) / steps
        dt = comm.allreduce(dt, op=MPI.MAX)
        if rep:
            samples.append(dt)
    return _typical(samples)


def _steps(nbytes, budget=1 << 22):
    return max(2, min(64, budget // max(nbytes, 1024)))


CALIBRATED_DTYPES = ("float32", "float64", "float16", "int32", "int64")


def measure_algorithms(comm, counts, *, dtype="float32", reps=5, names=None, budget=5e-3):
    """Time ``pycollective.allreduce`` with every algorithm at every count (collective).

    Algorithms take turns within each repetition, so a burst of load from
    another process hits all of them rather than one.  A sample is the
    slowest rank's mean over enough back-to-back calls to last ``budget``
    seconds; the result is the lower quartile of ``reps`` samples.  ``overhead``
    is the time of a call with count 0: the argument checks and the
    agreement step that every call pays, whatever the algorithm.

    Returns:
        ``{"overhead": seconds, "times": {name: [[count, seconds], ...]}}``.
    """
    from mpi4py import MPI
    from .._api import allreduce

    names = list(_registry.names() if names is None else names)
    dtype = np.dtype(dtype)
    rank = comm.Get_rank()

    def sample(fn, inner):
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        return comm.allreduce((time.perf_counter() - t0) / inner, op=MPI.MAX)

    def loops(fn):
        fn()  # warm-up: kernels, scratch buffers, shared windows
        one = sample(fn, 1)
        return max(1, min(1000, int(budget / max(one, 1e-7))))

    empty, empty_out = np.empty(0, dtype), np.empty(0, dtype)
    times = {name: [] for name in names}
    overhead = None
    for count in counts:
        x = ((np.arange(count) % 251) + rank).astype(dtype)
        out = np.empty_like(x)
        calls = {name: (lambda name=name: allreduce(x, out, comm=comm, algorithm=name))
                 for name in names}
        if overhead is None:  # take turns with the first count's calls
            calls[None] = lambda: allreduce(empty, empty_out, comm=comm, algorithm=names[0])
        inner = {name: loops(fn) for name, fn in calls.items()}
        samples = {name: [] for name in calls}
        for _ in range(reps):
            for name, fn in calls.items():
                samples[name].append(sample(fn, inner[name]))
        if overhead is None:
            # Every call pays it, so it cannot exceed the fastest first-count call.
            overhead = min(_typical(samples.pop(None)),
                           min(_typical(v) for v in samples.values()))
        for name in names:
            times[name].append([int(count), _typical(samples[name])])
    return {"overhead": overhead or 0.0, "times": times}


ALGORITHM_COUNTS = tuple(4 ** k for k in range(12))  # 1 .. 4194304 elements


def calibrate(comm=None, *, min_bytes=4, max_bytes=1 << 26, factor=4, reps=7,
              dtypes=CALIBRATED_DTYPES, counts=ALGORITHM_COUNTS, log=None):
    """Measure α, β, γ and each algorithm's measured/model ratios on ``comm`` (collective).

    α and β come from ring exchanges of n bytes (every rank ``Sendrecv``s to
    its right neighbour and from its left one at the same time, through the
    same helper the algorithms use): α fitted on the sizes up to 64 KiB, β
    on those from 1 MiB (:func:`fit_two_regimes`).  γ for each dtype is the
    time per byte of its ``sum`` kernel, run on every rank at once, at the
    largest size (out of cache).  Both are also kept per size, as curves.
    Then every registered algorithm is timed at ``counts`` float32 elements
    (:func:`measure_algorithms`) and compared with the model
    (:func:`fit_corrections`).  Times are the slowest rank's, lower quartiles
    of ``reps`` repetitions (other processes only ever add time).

    Args:
        comm: an mpi4py intracommunicator with at least 2 ranks; None means
            ``MPI.COMM_WORLD``.
        min_bytes, max_bytes, factor: message sizes min_bytes·factor^k.
        reps: timed repetitions per size (after a warm-up).
        dtypes: dtypes whose γ to measure; the first one gives ``gamma``.
        counts: element counts at which to time the algorithms (at least
            two), or empty to skip that step (then the bare model is used).
        log: callable receiving progress lines (on rank 0), or None.

    Returns:
        The calibration of this N as a dict: ``nranks``, ``alpha``, ``beta``,
        ``gamma``, ``gamma_by_dtype``, ``residual`` (RMS relative error of the
        α-β fit over all sizes), ``beta_curve`` and ``gamma_curves`` (per-byte
        time by size), ``overhead``, ``corrections`` (measured/model ratios
        per algorithm and size, :func:`fit_corrections`), the raw
        ``exchange``, ``kernel`` and ``algorithms`` measurements, and a
        description of the machine and MPI library.

    Raises:
        ValueError: on a communicator of one rank, or bad sizes.
    """
    from mpi4py import MPI
    from .._kernels import get_kernel
    from ..algorithms._p2p import sendrecv

    comm = MPI.COMM_WORLD if comm is None else comm
    size, rank = comm.Get_size(), comm.Get_rank()
    if size < 2:
        raise ValueError("calibration needs at least 2 ranks (run it under mpiexec -n N)")
    if not 1 <= min_bytes < max_bytes or factor < 2:
        raise ValueError("need 1 <= min_bytes < max_bytes and factor >= 2")
    if len([n for n in _sizes(min_bytes, max_bytes, factor) if n >= 16]) < 2:
        raise ValueError("the size range must hold at least two sizes of 16 bytes or more")
    if len(counts) == 1:
        raise ValueError("give at least two counts to compare the algorithms with, or none")
    say = log if (log is not None and rank == 0) else (lambda line: None)
    comm = comm.Dup()  # our messages never meet the caller's
    try:
        right, left = (rank + 1) % size, (rank - 1) % size
        sizes = _sizes(min_bytes, max_bytes, factor)
        exchange = []
        for n in sizes:
            # Fresh arrays of exactly n bytes, as an allreduce's buffers are:
            # slices of one huge (huge-page backed) buffer move 2x faster here.
            sbuf = (np.arange(n) % 251).astype(np.uint8)
            rbuf = np.empty(n, np.uint8)

            def body(sbuf=sbuf, rbuf=rbuf):
                sendrecv(comm, sbuf, right, rbuf, left, 7)
            t = _timed(comm, body, _steps(n), reps)
            exchange.append([n, t])
            say(f"  exchange {n:>10d} B  {t * 1e6:12.2f} us")
            del sbuf, rbuf
        alpha, beta, residual = fit_two_regimes(*zip(*exchange))
        beta_curve = _curve(exchange, alpha)
        say(f"  alpha = {alpha * 1e6:.3f} us, beta = {beta * 1e9:.4f} ns/B "
            f"({1e-9 / beta if beta else math.inf:.2f} GB/s), rms rel. residual {residual:.1%}")

        kernel_sizes = [n for n in sizes if n >= 16]  # at least 2 elements of any dtype
        gamma_by_dtype, gamma_curves, kernel = {}, {}, {}
        for dt in map(np.dtype, dtypes):
            k = get_kernel("sum", dt)
            rows = []
            for n in kernel_sizes:
                m = n // dt.itemsize
                av, bv, ov = np.ones(m, dt), np.ones(m, dt), np.empty(m, dt)
                rows.append([m * dt.itemsize,
                             _timed(comm, lambda: k(av, bv, ov), _steps(n), reps)])
                del av, bv, ov
            curve = _curve(rows, rows[0][1])
            if curve:
                gamma_curves[dt.name] = curve
                g, g_res = curve[-1][1], None  # out of cache, where γ matters
            else:
                _, g, g_res = fit_alpha_beta(*zip(*rows))
            gamma_by_dtype[dt.name] = g
            kernel[dt.name] = rows
            say(f"  gamma[{dt.name}] = {g * 1e9:.4f} ns/B"
                + (f", rms rel. residual {g_res:.1%}" if g_res is not None else
                   f" at {_bytes_label(curve[-1][0])}; "
                   + ", ".join(f"{_bytes_label(x)}: {v * 1e9:.3g}" for x, v in curve[:-1])))
        first = np.dtype(dtypes[0]).name
        gamma = gamma_by_dtype[first]
        entry = {
            "nranks": size, "alpha": alpha, "beta": beta,
            "gamma": gamma, "gamma_by_dtype": gamma_by_dtype,
            "residual": residual, "exchange": exchange, "kernel": kernel,
            "beta_curve": beta_curve, "gamma_curves": gamma_curves,
            "overhead": 0.0, "corrections": {},
            "machine": _machine(), "created": datetime.datetime.now(
                datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        if counts:
            measured = measure_algorithms(comm, counts, dtype="float32", reps=reps)
            entry["algorithms"] = measured
            entry["overhead"] = measured["overhead"]
            entry["corrections"] = fit_corrections(size, measured, entry)
            say(f"  per-call overhead {measured['overhead'] * 1e6:.1f} us; "
                "measured/model ratio by vector size:")
            say("    " + " " * 16 + "".join(f"{_bytes_label(b):>8s}"
                                        for b, _ in next(iter(entry["corrections"].values()))))
            for name, curve in entry["corrections"].items():
                say(f"    {name:>16s}" + "".join(f"{r:8.2f}" for _, r in curve))
        return entry
    finally:
        comm.Free()


def _machine():
    from mpi4py import MPI
    import mpi4py
    return {"host": platform.node(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "mpi4py": mpi4py.__version__,
            "mpi": MPI.Get_library_version().strip().splitlines()[0]}


def merge_calibration(existing, entry):
    """Add the calibration ``entry`` (from :func:`calibrate`) to a calibration file's data.

    Entries for other N are kept; the top-level α, β, γ become those of the
    smallest calibrated N (the least oversubscribed, the library's default
    when N is unknown).
    """
    by_n = dict((existing or {}).get("by_nranks") or {})
    by_n[str(entry["nranks"])] = entry
    low = by_n[str(min(int(n) for n in by_n))]
    return {"version": 1, "by_nranks": by_n,
            "alpha": low["alpha"], "beta": low["beta"], "gamma": low["gamma"],
            "gamma_by_dtype": dict(low.get("gamma_by_dtype") or {}),
            "overhead": low.get("overhead", 0.0),
            "corrections": dict(low.get("corrections") or {})}


# --- command line ---------------------------------------------------------------

def _number_arg(text):
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def _count_arg(text):
    v = _number_arg(text)
    if v < 0 or v != int(v):
        raise argparse.ArgumentTypeError(f"not a non-negative integer: {text!r}")
    return int(v)


def _counts_arg(text):
    if text.strip().lower() == "none":
        return ()
    return tuple(_count_arg(x) for x in text.split(",") if x)


def _list_arg(text):
    try:
        values = [int(float(x)) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"N values must be >= 1: {text!r}")
    return values


def _ms(t):
    return f"{t * 1e3:.6g}"


def _table(rows, header):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(str(h).rjust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(str(c).rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def lecture_cases():
    """The lecture's worked examples: ``[(title, M, w, alpha, Ns, quoted)]``.

    ``quoted`` maps (algorithm, N) to the time in seconds the lecture states.
    """
    return [
        ("table 7: M = 1.5e9, w = 5e-11 s/element (the lecture's 'fp16 at 10 GB/s'), "
         "alpha = 5 us", 1.5e9, 5e-11, 5e-6, [2 ** k for k in range(1, 11)],
         {("ring", 8): 0.131, ("ring", 1024): 0.160, ("ps", 1024): 76.8}),
        ("table 8: M = 1e6, w = 5e-11 s/element, alpha = 5 us",
         1e6, 5e-11, 5e-6, [2 ** k for k in range(1, 11)],
         {("butterfly", 1024): 0.55e-3, ("ring", 1024): 10.33e-3}),
        ("exercise 1: M = 4e6 fp32 at 12.5 GB/s (w = 3.2e-10 s/element), alpha = 5 us",
         4e6, 4 / 12.5e9, 5e-6, [512],
         {("ring", 512): 7.7e-3, ("butterfly", 512): 11.6e-3, ("tree", 512): 23.1e-3}),
    ]


def _print_table(out, ns, count, alpha, w_or_beta, gamma, itemsize, formula):
    names = [n for n in _registry.names()]
    lecture_names = [n for n in names if n in LECTURE]
    if formula in ("lecture", "both"):
        print("lecture formulas (ms):", file=out)
        rows = []
        for n in ns:
            t = {a: lecture_predict(a, n, count, alpha=alpha, w=w_or_beta * itemsize)
                 for a in lecture_names}
            rows.append([n] + [_ms(t[a]) for a in lecture_names] + [min(t, key=t.get)])
        print(_table(rows, ["N"] + lecture_names + ["fastest"]), file=out)
    if formula in ("implementation", "both"):
        print(f"implementation model (ms), gamma = {gamma:g} s/B:", file=out)
        rows = []
        for n in ns:
            t = predict_all(n, int(count), alpha=alpha, beta=w_or_beta, gamma=gamma,
                            itemsize=itemsize)
            rows.append([n] + [_ms(t[a]) for a in names] + [min(t, key=t.get)])
        print(_table(rows, ["N"] + names + ["fastest"]), file=out)


def _lecture_report(out):
    for title, M, w, alpha, ns, quoted in lecture_cases():
        print(f"\n{title}", file=out)
        _print_table(out, ns, M, alpha, w, 0.0, 1, "both")
        for (name, n), t in quoted.items():
            got = lecture_predict(name, n, M, alpha=alpha, w=w)
            print(f"  lecture quotes {name} at N = {n}: {_ms(t)} ms; formula gives "
                  f"{_ms(got)} ms", file=out)


def _main_calibrate(args):
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if comm.Get_size() < 2:
        print("calibration needs several ranks: scripts/run_mpi.sh N -m pycollective.model "
              "--calibrate", file=sys.stderr)
        return 2
    say = (lambda line: print(line, flush=True)) if not args.quiet else None
    if rank == 0 and say:
        library = MPI.Get_library_version().splitlines()[0]
        say(f"calibrating on {comm.Get_size()} ranks ({library})")
    entry = calibrate(comm, min_bytes=args.min_bytes, max_bytes=args.max_bytes,
                      factor=args.factor, reps=args.reps, counts=args.counts, log=say)
    status = 0
    if rank == 0:
        path = args.output or default_path()
        existing = None
        if os.path.exists(path) and not args.fresh:
            try:
                existing = load_params(path)
            except ValueError as exc:
                warnings.warn(f"replacing unreadable calibration: {exc}")
        save_params(merge_calibration(existing, entry), path)
        print(f"saved N = {entry['nranks']} to {path}"
              + ("" if path == default_path() else
                 f" (use it with PYCOLLECTIVE_MODEL={path})"), flush=True)
    return comm.bcast(status, root=0)


CHECK_COUNTS = tuple(10 ** k for k in range(8))  # 1 .. 1e7, the sweep


def _main_check(args):
    """Time every algorithm now and compare with what auto would choose."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    n, rank = comm.Get_size(), comm.Get_rank()
    payload = None
    if rank == 0:
        try:
            payload = (load_params(args.params), None)
        except ValueError as exc:
            payload = (None, str(exc))
    params, error = comm.bcast(payload, root=0)
    if error is not None:
        raise ValueError(error)
    counts = CHECK_COUNTS if args.counts is None else args.counts
    measured = measure_algorithms(comm, counts, reps=args.reps)
    if rank != 0:
        return 0
    rows, hits = [], 0
    for i, count in enumerate(counts):
        t = {name: rows_[i][1] for name, rows_ in measured["times"].items()}
        best = min(t, key=t.get)
        auto = choose(n, count, "float32", "sum", params)
        ok = t[auto] <= 1.10 * t[best]
        hits += ok
        rows.append([count, best, f"{t[best] * 1e6:.4g}", auto, f"{t[auto] * 1e6:.4g}",
                     f"{explain(n, count, 'float32', params)[auto] * 1e6:.4g}",
                     f"{t[auto] / t[best]:.2f}", "yes" if ok else "no"])
    print(f"N = {n}, float32 sum, calibration: {params['source']}", flush=True)
    print(_table(rows, ["count", "fastest", "time_us", "auto", "auto_us", "predicted_us",
                        "ratio", "within_10%"]), flush=True)
    print(f"auto within 10% of the fastest at {hits}/{len(counts)} sizes", flush=True)
    return 0


def main(argv=None):
    """Command line: predicted-time tables, the lecture's examples, calibration."""
    p = argparse.ArgumentParser(
        prog="python -m pycollective.model",
        description="Predicted allreduce times from the alpha-beta-gamma model, the "
                    "lecture's examples, and calibration on this machine.",
        epilog="Examples:\n"
               "  python -m pycollective.model --lecture\n"
               "  python -m pycollective.model --M 1.5e9 --w 5e-11 --alpha 5e-6\n"
               "  python -m pycollective.model --M 4e6 --bytes-per-element 4 "
               "--bandwidth 12.5e9 --alpha 5e-6 --N 512\n"
               "  python -m pycollective.model --M 1e6 --dtype float32   "
               "(this machine's calibration)\n"
               "  scripts/run_mpi.sh 4 -m pycollective.model --calibrate\n"
               "  scripts/run_mpi.sh 4 -m pycollective.model --check",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--N", type=_list_arg, default=None,
                   help="comma-separated communicator sizes (default 2,4,...,1024; "
                        "with a calibration: the calibrated sizes)")
    p.add_argument("--M", type=_count_arg, default=None, help="elements per rank, e.g. 1.5e9")
    p.add_argument("--w", type=_number_arg, help="seconds to transfer one element")
    p.add_argument("--bytes-per-element", type=_count_arg,
                   help="bytes per element (with --bandwidth: w = bytes / bandwidth)")
    p.add_argument("--bandwidth", type=_number_arg, help="link bandwidth in bytes/s")
    p.add_argument("--alpha", type=_number_arg, help="seconds per message")
    p.add_argument("--gamma", type=_number_arg, default=0.0,
                   help="seconds per byte reduced (default 0, as in the lecture)")
    p.add_argument("--formula", choices=("lecture", "implementation", "both"), default="both",
                   help="which model to tabulate with explicit parameters (default both)")
    p.add_argument("--dtype", default="float32", help="dtype for the calibrated table")
    p.add_argument("--params", help="calibration file (default: $PYCOLLECTIVE_MODEL or "
                                    "~/.cache/pycollective/model.json)")
    p.add_argument("--lecture", action="store_true",
                   help="print the lecture's tables 7 and 8 and exercise 1")
    p.add_argument("--show", action="store_true", help="print the calibration in use")
    g = p.add_argument_group("calibration and check (run under MPI)")
    g.add_argument("--calibrate", action="store_true",
                   help="measure alpha, beta, gamma on these ranks and save them")
    g.add_argument("--output", help="file to save to (default: the default path)")
    g.add_argument("--fresh", action="store_true", help="drop calibrations of other N in the file")
    g.add_argument("--min-bytes", type=_count_arg, default=4)
    g.add_argument("--max-bytes", type=_count_arg, default=1 << 26)
    g.add_argument("--factor", type=_count_arg, default=4)
    g.add_argument("--reps", type=_count_arg, default=7)
    g.add_argument("--counts", type=_counts_arg, default=None,
                   help="element counts at which to time every algorithm (calibration: "
                        "default 1,4,...,4^11, 'none' skips it; --check: default 1,10,...,1e7)")
    g.add_argument("--check", action="store_true",
                   help="time every algorithm now (float32 sum) and report whether auto's "
                        "choice is within 10%% of the fastest, with the calibration in use")
    g.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    out = sys.stdout

    if args.calibrate:
        if args.counts is None:
            args.counts = ALGORITHM_COUNTS
        return _main_calibrate(args)
    if args.check:
        return _main_check(args)
    if args.lecture:
        _lecture_report(out)
        return 0
    if args.show:
        print(json.dumps(load_params(args.params), indent=1, sort_keys=True), file=out)
        return 0

    explicit = args.w is not None or args.bandwidth is not None or args.alpha is not None
    if explicit:
        if args.alpha is None:
            p.error("--alpha is needed with explicit parameters")
        if args.w is not None:
            if args.bandwidth is not None or args.bytes_per_element is not None:
                p.error("give either --w or --bytes-per-element with --bandwidth, not both")
            beta, itemsize = args.w, 1  # seconds per element, elements as the unit
        elif args.bandwidth and args.bytes_per_element:
            beta, itemsize = 1.0 / args.bandwidth, args.bytes_per_element
        else:
            p.error("give --w, or --bytes-per-element and --bandwidth")
        M = 1.5e9 if args.M is None else args.M
        ns = args.N or [2 ** k for k in range(1, 11)]
        print(f"M = {M:g} elements, w = {beta * itemsize:g} s/element, alpha = {args.alpha:g} s",
              file=out)
        _print_table(out, ns, M, args.alpha, beta, args.gamma, itemsize, args.formula)
        return 0

    params = load_params(args.params)
    dtype = np.dtype(args.dtype)
    M = 10 ** 6 if args.M is None else args.M
    ns = args.N or sorted(int(n) for n in params.get("by_nranks") or {}) or [2, 4, 8]
    print(f"calibration: {params['source']}; M = {M} {dtype.name} elements", file=out)
    print("times in us: the bare alpha-beta-gamma model / the calibrated prediction "
          "(overhead + measured/model ratio x model), which auto minimises", file=out)
    names = _registry.names()
    rows = []
    for n in ns:
        flat = params_for(params, n)
        beta, gamma = _rates(flat, M, dtype)
        bare = predict_all(n, M, alpha=flat["alpha"], beta=beta, gamma=gamma,
                           itemsize=dtype.itemsize)
        cal = explain(n, M, dtype, params)
        rows.append([n, f"{flat['alpha'] * 1e6:.3g}", f"{beta * 1e9:.3g}", f"{gamma * 1e9:.3g}"]
                    + [f"{bare[a] * 1e6:.4g}/{cal[a] * 1e6:.4g}" for a in names]
                    + [choose(n, M, dtype, "sum", params)])
    print(_table(rows, ["N", "alpha_us", "beta_ns/B", "gamma_ns/B"] + names + ["auto"]),
          file=out)
    return 0

