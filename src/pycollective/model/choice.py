"""The choice of ``algorithm="auto"``: every algorithm's calibrated prediction, and the fastest.

The calibrated prediction is per-call overhead + (measured ÷ model ratio at
this size) × α-β-γ cost; with no calibration it is the bare model with
:data:`~pycollective.model.params.DEFAULTS`.  :func:`choose` is a pure
function of (N, M, dtype, op, parameters), so ranks agree as long as they
hold the same parameters (the library makes sure they do: rank 0 loads the
calibration and broadcasts it).
"""

import numpy as np

from .. import _registry
from .._ops import resolve_op
from .formulas import check_args
from .params import load_params, params_for, value_at

__all__ = ["choose", "explain", "fastest", "calibrated_times", "rates", "model_time",
           "gamma_of"]


_default_params = None


def gamma_of(flat, dtype):
    """γ of ``dtype`` (its own if calibrated, else the float32 one)."""
    return flat["gamma_by_dtype"].get(dtype.name, flat["gamma"])


# A measured/model ratio below this is noise (an algorithm's time lost in
# the per-call overhead, say), not evidence that its messages are free.
_MIN_FACTOR = 0.1


def rates(flat, count, dtype):
    """β and γ for an allreduce of ``count`` elements of ``dtype``.

    With a calibration's per-size curves, the per-byte times measured at the
    vector's size in bytes: on a shared-memory node they depend on whether
    the data fit in cache, by 2-3x on our machine.  Otherwise the scalars.
    """
    nbytes = count * dtype.itemsize
    beta = value_at(flat.get("beta_curve"), nbytes, flat["beta"])
    gamma_curve = (flat.get("gamma_curves") or {}).get(dtype.name)
    gamma = value_at(gamma_curve, nbytes, gamma_of(flat, dtype))
    return beta, gamma


def model_time(cost, nranks, count, dtype, flat, beta_gamma=None):
    """The α-β-γ time of ``cost`` with the calibrated α and per-size β, γ."""
    beta, gamma = beta_gamma or rates(flat, count, dtype)
    return cost(nranks, count, dtype.itemsize, flat["alpha"], beta, gamma)


def calibrated_times(nranks, count, dtype, flat):
    """``{name: calibrated prediction}`` for every algorithm with a cost model, in registry order.

    ``flat`` is one N's parameters (:func:`~pycollective.model.params.params_for`).
    """
    out = {}
    beta_gamma = rates(flat, count, dtype)
    for name in _registry.names():
        algo = _registry.get(name)
        if algo.cost is None:
            continue
        if count == 0 or nranks == 1:
            out[name] = 0.0
            continue
        ratio = value_at(flat["corrections"].get(name), count * dtype.itemsize, 1.0)
        out[name] = flat["overhead"] + max(ratio, _MIN_FACTOR) * model_time(
            algo.cost, nranks, count, dtype, flat, beta_gamma)
    return out


def fastest(nranks, count, dtype, flat, exclude=()):
    """The name with the smallest :func:`calibrated_times`, leaving out ``exclude``.

    Ties go to the earlier registered algorithm, the same on every rank.
    """
    times = calibrated_times(nranks, count, dtype, flat)
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
    each algorithm's measured/model ratio
    (:func:`~pycollective.model.fit.fit_corrections`) and the per-call
    overhead; without a calibration it is
    :func:`~pycollective.model.formulas.predict` with ``DEFAULTS``.

    Args:
        nranks, count, dtype: as for :func:`choose`.
        params: from :func:`load_params`; None loads the default calibration.

    Returns:
        ``{name: seconds}`` for every registered algorithm with a cost model,
        in registry order; ``min`` of it is what :func:`choose` returns.
    """
    dtype = np.dtype(dtype)
    params = _params_or_default(params)
    check_args(nranks, count, params["alpha"], params["beta"], params["gamma"], dtype.itemsize)
    return calibrated_times(int(nranks), int(count), dtype, params_for(params, nranks))


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
    resolve_op(op)
    dtype = np.dtype(dtype)
    params = _params_or_default(params)
    check_args(nranks, count, params["alpha"], params["beta"], params["gamma"], dtype.itemsize)
    return fastest(int(nranks), int(count), dtype, params_for(params, nranks))
