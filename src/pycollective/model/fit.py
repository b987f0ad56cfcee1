"""Fitting the model to measurements: α and β from exchanges, measured/model ratios per algorithm."""

import numpy as np

from ..data.kernels import as_dtype
from .choice import measured_ratio
from .formulas import cost_of
from .params import params_for

__all__ = ["fit_alpha_beta", "fit_two_regimes", "fit_corrections", "per_byte_curve",
           "SMALL_BYTES", "LARGE_BYTES", "CURVE_MIN_BYTES"]


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


CURVE_MIN_BYTES = 1 << 14  # below this the per-byte part is too small to measure


def fit_corrections(nranks, measured, params, dtype="float32", smooth=1, layout=None):
    """Measured ÷ modelled time of every algorithm at every measured size.

    The α-β-γ cost (with this N's α and the per-size β, γ) is what the
    model says; an allreduce measured at the same size, minus the per-call
    ``overhead`` an algorithm pays beside its steps (none for one that folds the
    agreement in: :func:`~pycollective.model.choice.pays_overhead`), is what happened.  Their ratio per
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
        layout: where the measured ranks ran (the model prices links between
            nodes with the calibration's ``inter``); default one node.

    Returns:
        ``{name: [[bytes, ratio], ...]}`` for every measured algorithm that
        has a cost model, sizes ascending.
    """
    flat = params_for({k: v for k, v in params.items() if k != "by_nranks"}, nranks, layout)
    dtype = as_dtype(dtype)
    o = measured["overhead"]
    out = {}
    for name, rows in measured["times"].items():
        try:
            cost_of(name)  # unknown, or without a cost model: no ratios
        except ValueError:
            continue
        sizes, ratios = [], []
        for count, t in sorted(rows):
            count = int(count)
            if count == 0:
                continue
            ratio = measured_ratio(name, t, nranks, count, dtype, flat, o)
            sizes.append(count * dtype.itemsize)
            ratios.append(1.0 if ratio is None else ratio)
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


def per_byte_curve(rows, fixed):
    """Per-byte time ``(t - fixed)/n`` at each size from CURVE_MIN_BYTES up.

    Smaller sizes take the value of the smallest listed one; ``None`` if the
    measurements do not reach CURVE_MIN_BYTES.
    """
    curve = [[int(n), max(t - fixed, 0.0) / n] for n, t in rows if n >= CURVE_MIN_BYTES]
    return curve or None
