"""Calibrated parameters of the model: defaults, load, save, validation, per-N interpolation.

A calibration file is JSON at ``$PYCOLLECTIVE_MODEL`` if set, else
``$XDG_CACHE_HOME/pycollective/model.json`` (``~/.cache/pycollective/model.json``).
Everything is stored per communicator size N, because oversubscribed ranks
(8 ranks on 2 cores) see a much larger α than 2 ranks do; sizes that were
not calibrated are interpolated linearly in N (and clamped outside the
calibrated range).
"""

import bisect
import json
import math
import os

from .. import _env

__all__ = ["DEFAULTS", "default_path", "load_params", "save_params", "params_for",
           "merge_calibration", "value_at"]


# Used when no calibration file exists: `--calibrate` at N = 2 on the 2-core
# development machine (MPICH 5 shared memory; β and γ for data out of
# cache, see the README).  Only their ratios matter for choosing, and they
# are of the right order for any shared-memory node.
DEFAULTS = {
    "alpha": 3.0e-6,     # s per message (mpi4py Sendrecv through Python)
    "beta": 1.0e-10,     # s per byte sent (about 10 GB/s)
    "gamma": 1.1e-10,    # s per byte reduced (numba sum of float32, from memory)
}


def default_path():
    """Where calibrations are stored and looked for by default.

    ``$PYCOLLECTIVE_MODEL`` if set, else ``$XDG_CACHE_HOME/pycollective/model.json``
    (``~/.cache/pycollective/model.json`` when XDG_CACHE_HOME is unset).
    """
    env = _env.MODEL.get()
    if env:
        return env
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


def value_at(curve, nbytes, default):
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
    def curves(field, keys):
        """``{key: curve}`` of ``entry[field][key]`` interpolated in N, where any N has one."""
        found = {}
        for key in keys:
            curve = _interp_curves(nranks, ns, [(e.get(field) or {}).get(key) for e in entries])
            if curve:
                found[key] = curve
        return found

    out["gamma_curves"] = curves("gamma_curves", dtypes)
    # An algorithm missing at some calibrated N (registered since) is taken
    # from the nearest N that has it (no ratio at all: the bare model).
    out["corrections"] = curves("corrections",
                                set().union(*(set(e.get("corrections") or {}) for e in entries)))
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
