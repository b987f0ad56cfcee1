"""Parameters of the model: built-in defaults, calibration files, per-N and per-machine values.

A calibration file is JSON at ``$PYCOLLECTIVE_MODEL`` if set, else
``$XDG_CACHE_HOME/pycollective/model.json`` (``~/.cache/pycollective/model.json``).
Everything is stored per communicator size N, because oversubscribed ranks
(8 ranks on 2 cores) see a much larger α than 2 ranks do; sizes that were
not calibrated are interpolated linearly in N (and clamped outside the
calibrated range).  A calibration made across nodes also holds the links
between nodes (``inter``: α and β measured between node leaders) and the
number of nodes it was made on.

Without a file the model uses built-in defaults (:data:`DEFAULTS`), scaled
for the machine the communicator runs on (:func:`params_for` with a
:class:`~pycollective.model.topology.Layout`): how many ranks share a core
and how large a core's cache is.
"""

import bisect
import json
import math
import os
import stat
import tempfile

from ..runtime import env as _env
from .topology import one_node

__all__ = ["DEFAULTS", "BUILTIN", "default_path", "load_params", "save_params", "params_for",
           "merge_calibration", "value_at", "builtin_params", "ANY_DTYPE", "read_text",
           "write_json"]


# The built-in model, for a machine without a calibration file: calibrated at
# one rank per core on the development machine (docs/results/model.md);
# :func:`params_for` scales them for oversubscription and cache.
DEFAULTS = {
    "alpha": 2.1e-6,     # s per message (mpi4py Sendrecv through Python), one rank per core
    "beta": 8.6e-11,     # s per byte sent (about 12 GB/s), data out of cache
    "gamma": 1.7e-10,    # s per byte reduced (numba sum of float32), data out of cache
}

#: The rest of the built-in model.  ``gamma_in_cache``: the kernels on data in
#: a core's cache (0.03 ns/B against 0.17 from memory); ``gamma_float16``,
#: ``gamma_bfloat16``: two-byte floats are widened, added and rounded once on
#: their bit patterns, about 6x float32's time per byte and compute bound
#: (1.14 and 0.98 ns/B against float32's 0.18 on 8e6 elements out of cache,
#: the sum kernels timed alone on an idle core of this 2-core machine);
#: ``inter_*``: links between nodes when none were measured (about a 10-25
#: Gbit/s network through TCP: α 15 µs, 2 GB/s); ``cache_bytes``: a core's
#: private cache when the machine does not say (the data fit below half of it
#: and miss from 8x it, as the kernels measured here).  ``alpha_per_rank``,
#: ``beta_power``, ``gamma_power``: with r ranks per core, α grows as
#: 1 + 3(r - 1), β as r^1.4 and γ as r^0.8 (calibrations at r = 1, 2, 4 here:
#: α 2.1, 8.5, 20 µs; β 0.086, 0.22, 0.58 ns/B; γ 0.17, 0.31, 0.45 ns/B).
BUILTIN = {
    "gamma_in_cache": 3.0e-11,
    "gamma_float16": 1.1e-9,
    "gamma_bfloat16": 1.0e-9,
    "inter_alpha": 15e-6,
    "inter_beta": 5e-10,
    "cache_bytes": 2 << 20,
    "alpha_per_rank": 3.0,
    "beta_power": 1.4,
    "gamma_power": 0.8,
}

#: Key of ``gamma_curves`` for every dtype without a curve or γ of its own.
ANY_DTYPE = "*"


def builtin_params(source):
    """The built-in parameters, marked as such (only they are scaled for the machine)."""
    return dict(DEFAULTS, source=source, builtin=True)


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


# --- reading a file that cannot hurt ----------------------------------------------------
#
# The calibration file is read by rank 0 and broadcast before a communicator's
# first automatic choice, so a bad file must never hang, exhaust or break the
# library: only a regular file under MAX_FILE_BYTES is read (never a FIFO or
# a device), parsing errors of any kind (deep nesting included) are caught,
# and every field the library uses is checked and copied into a fresh dict;
# anything else in the file is left behind, so only checked values travel.

MAX_FILE_BYTES = 8 << 20
_MEASUREMENTS = ("nranks", "residual", "exchange", "kernel", "algorithms", "machine", "created",
                 "version", "layout", "inter_exchange")


def _number(d, key, where, required=True):
    v = d.get(key)
    if v is None and not required:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{where}: {key!r} must be a number >= 0, got {v!r}")
    return float(v)


def _curve(curve, where):
    ok = isinstance(curve, list) and all(
        isinstance(p, (list, tuple)) and len(p) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                and v >= 0 for v in p)
        for p in curve)
    if not ok or [p[0] for p in curve] != sorted(p[0] for p in curve):
        raise ValueError(f"{where}: expected [[bytes, value], ...] by increasing size "
                         "(a calibration from another version? run calibrate again)")
    return [[float(a), float(b)] for a, b in curve]


def _named(d, key, where, check):
    """``d[key]`` as a dict of str -> ``check(value)`` (missing: empty)."""
    v = d.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        raise ValueError(f"{where}: {key!r} must be an object with string keys")
    return {k: check(x, f"{where}: {key}[{k}]") for k, x in v.items()}


def _clean_entry(data, where):
    """The fields of one calibration (file top level or one N), checked and copied."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object")
    out = {key: _number(data, key, where) for key in ("alpha", "beta", "gamma")}
    overhead = _number(data, "overhead", where, required=False)
    if overhead is not None:
        out["overhead"] = overhead
    out["gamma_by_dtype"] = _named(data, "gamma_by_dtype", where,
                                   lambda v, w: _number({"value": v}, "value", w))
    if data.get("beta_curve") is not None:
        out["beta_curve"] = _curve(data["beta_curve"], f"{where}: beta_curve")
    out["gamma_curves"] = _named(data, "gamma_curves", where, _curve)
    out["corrections"] = _named(data, "corrections", where, _curve)
    inter = data.get("inter")
    if inter is not None:
        if not isinstance(inter, dict):
            raise ValueError(f"{where}: 'inter' must be an object with alpha and beta")
        out["inter"] = {key: _number(inter, key, f"{where}: inter") for key in ("alpha", "beta")}
    nodes = data.get("nodes")
    if nodes is not None:
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
            raise ValueError(f"{where}: 'nodes' must be a whole number >= 1, got {nodes!r}")
        out["nodes"] = nodes
    return out


def _clean(data, where, keep_measurements=False):
    """A checked copy of a calibration: what the library uses (and, if asked, the raw data)."""
    out = _clean_entry(data, where)
    by_n = data.get("by_nranks")
    if by_n is not None:
        if not isinstance(by_n, dict):
            raise ValueError(f"{where}: 'by_nranks' must be an object keyed by N")
        out["by_nranks"] = {}
        for n, entry in by_n.items():
            if not isinstance(n, str) or not n.isdigit() or int(n) < 1:
                raise ValueError(f"{where}: bad 'by_nranks' key {n!r}")
            if not isinstance(entry, dict):
                raise ValueError(f"{where} [N={n}]: expected a JSON object")
            clean = _clean_entry(entry, f"{where} [N={n}]")
            if keep_measurements:
                clean.update({k: entry[k] for k in _MEASUREMENTS if k in entry})
            out["by_nranks"][n] = clean
    if keep_measurements and "version" in data:
        out["version"] = data["version"]
    return out


def read_text(path, what="calibration"):
    """The text of a regular file of at most MAX_FILE_BYTES (never blocks on a FIFO).

    Raises:
        FileNotFoundError: there is no such file.
        ValueError: anything else that keeps it from being read, named.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ValueError(f"cannot read {what} {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{what} {path} is not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise ValueError(f"{what} {path} has {info.st_size} bytes, more than a "
                             f"{what} ever needs ({MAX_FILE_BYTES})")
        data = os.read(fd, MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise ValueError(f"{what} {path} grew past {MAX_FILE_BYTES} bytes")
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{what} {path} is not UTF-8 text") from None
    finally:
        os.close(fd)


def load_params(path=None, *, nranks=None, keep_measurements=False):
    """Load the calibrated α, β, γ (or the documented :data:`DEFAULTS`).

    Args:
        path: a calibration JSON file; None means :func:`default_path`.  A
            missing file gives the defaults (``source`` says so).
        nranks: if given, return the parameters for a communicator of this
            size (see :func:`params_for`) instead of the whole file.
        keep_measurements: also keep each N's raw measurements (for merging
            a new calibration into the file); the library never needs them.

    Returns:
        A dict with at least ``alpha``, ``beta``, ``gamma`` (the values at the
        smallest calibrated N) and ``source``; a calibration file adds
        ``gamma_by_dtype`` and ``by_nranks`` ({N: {alpha, beta, gamma, ...}}).

    Raises:
        ValueError: for a file that exists but is not a valid calibration:
            not a regular file, too large, not JSON, or any field of the
            wrong type or range (the message names it).
    """
    path = default_path() if path is None else os.fspath(path)
    if not os.path.lexists(path):
        params = builtin_params(f"defaults (no calibration at {path})")
    else:
        try:
            text = read_text(path)
        except FileNotFoundError:  # a link to nothing
            raise ValueError(f"cannot read calibration {path}: no such file") from None
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"cannot read calibration {path}: {type(exc).__name__}: "
                             f"{str(exc)[:200]}") from None
        params = _clean(data, path, keep_measurements)
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


def _scaled_builtin(out, layout):
    """The built-in parameters for ``layout``: oversubscription and cache accounted for."""
    b = BUILTIN
    r = layout.ranks_per_core
    out["alpha"] = DEFAULTS["alpha"] * (1 + b["alpha_per_rank"] * (r - 1))
    out["beta"] = DEFAULTS["beta"] * r ** b["beta_power"]
    out["gamma"] = gamma_out = DEFAULTS["gamma"] * r ** b["gamma_power"]
    # Ranks that share a core share its cache (and evict each other's data).
    cache = (layout.cache_bytes or b["cache_bytes"]) / r
    gamma_in = min(b["gamma_in_cache"], gamma_out)
    out["gamma_curves"] = {ANY_DTYPE: [[max(1.0, cache / 2), gamma_in], [8 * cache, gamma_out]]}
    # Two-byte floats are compute bound: they slow down with the share of a core.
    out["gamma_by_dtype"] = {"float16": b["gamma_float16"] * r,
                             "bfloat16": b["gamma_bfloat16"] * r}
    return out


def params_for(params, nranks, layout=None):
    """The α, β, γ of ``params`` for a communicator of ``nranks`` ranks placed as ``layout``.

    Calibrated sizes are used as measured; others are interpolated linearly
    in N between the neighbouring calibrated sizes, and clamped to the
    nearest one outside the calibrated range (oversubscription makes
    extrapolation meaningless).  The built-in defaults
    (:func:`builtin_params`) are scaled for ``layout``'s ranks per core and
    cache; a hand-written file without ``by_nranks`` is used as it is.

    Args:
        params: from :func:`load_params`.
        nranks: communicator size N.
        layout: where the ranks run (default: one node, one core per rank).

    Returns:
        dict with ``alpha``, ``beta``, ``gamma``, ``gamma_by_dtype``,
        ``gamma_curves``, ``beta_curve``, ``overhead``, ``corrections``,
        ``inter`` ((α, β) between nodes), ``nodes`` (how many nodes the
        calibration was made on), ``layout`` and ``source``.
    """
    layout = one_node(nranks) if layout is None else layout
    by_n = params.get("by_nranks") or {}
    inter = params.get("inter") or {}
    out = {"alpha": params["alpha"], "beta": params["beta"], "gamma": params["gamma"],
           "gamma_by_dtype": dict(params.get("gamma_by_dtype") or {}),
           "overhead": params.get("overhead", 0.0),
           "corrections": dict(params.get("corrections") or {}),
           "beta_curve": params.get("beta_curve"),
           "gamma_curves": dict(params.get("gamma_curves") or {}),
           "inter": (inter.get("alpha", BUILTIN["inter_alpha"]),
                     inter.get("beta", BUILTIN["inter_beta"])),
           "nodes": params.get("nodes", 1),
           "layout": layout,
           "source": params.get("source", "given")}
    if params.get("builtin"):
        return _scaled_builtin(out, layout)
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
    # Links between nodes and the number of nodes: from the nearest N measured across nodes.
    nearest = sorted(zip(ns, entries), key=lambda ne: (abs(ne[0] - nranks), ne[0]))
    across = next((e for _, e in nearest if e.get("inter")), None)
    if across is not None:
        out["inter"] = (across["inter"]["alpha"], across["inter"]["beta"])
    out["nodes"] = nearest[0][1].get("nodes", 1)

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

    The file is written to a new temporary file in the same directory
    (created exclusively, mode 0600, never through an existing name or link)
    and renamed over ``path``, so readers never see half a file and a planted
    link cannot redirect the write.

    Raises:
        ValueError: if ``params`` is not a valid calibration.
    """
    path = default_path() if path is None else os.fspath(path)
    data = {k: v for k, v in params.items() if k not in ("source", "builtin")}
    _clean(data, "params")
    return write_json(data, path)


def write_json(data, path):
    """Write ``data`` as JSON to ``path`` atomically; return the path.

    The file is written to a new temporary file in the same directory
    (created exclusively, mode 0600, never through an existing name or link)
    and renamed over ``path``, so readers never see half a file and a planted
    link cannot redirect the write.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".pycollective-", suffix=".json.tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
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
            "corrections": dict(low.get("corrections") or {}),
            **{k: low[k] for k in ("inter", "nodes") if k in low}}
