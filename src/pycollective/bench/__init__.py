"""Benchmark and check pycollective's allreduce algorithms against native MPI.

    mpiexec -n 8 python -m pycollective.bench ring --M 1e8
    scripts/run_mpi.sh 4 -m pycollective.bench all --minbytes 4 --maxbytes 64M --stepfactor 4

This module is the allreduce-specific half of the benchmark (in the manner of
nccl-tests' ``all_reduce.cu``): bytes per rank, input data, the native
reference and the bus-bandwidth factor.  Warm-up, timing, checking and the
cross-rank agreement live in :mod:`pycollective.bench._harness`.  Run ``--help``
for the meaning of every column.
"""

import argparse
import json
import math
import os
import sys

import numpy as np
from mpi4py import MPI

from .. import _collectives as _api
from .._about import environment
from .._kernels import SUPPORTED_DTYPES
from .._ops import MPI_OPS as _MPI_OPS
from .._root import bcast_from_root
from .._table import fmt_num
from . import _harness

__all__ = ["main", "ALLREDUCE"]


# --- the allreduce collective ------------------------------------------------

def _native(comm, sendbuf, recvbuf, op):
    comm.Allreduce(sendbuf, recvbuf, op=_MPI_OPS[op])


def _allreduce_factor(nranks):
    # Each rank must send and receive 2(N-1)/N of its data at the very least
    # (reduce-scatter + allgather), so busbw is comparable across N.
    return 2.0 * (nranks - 1) / nranks


ALLREDUCE = _harness.Collective(
    name="allreduce",
    nbytes=lambda count, itemsize: count * itemsize,
    busbw_factor=_allreduce_factor,
    init=_harness.fill_exact,
    reference=_harness.Case("native", _native),
)


def algorithm_case(name):
    """The :class:`~pycollective._harness.Case` running ``pycollective.allreduce`` with ``name``."""
    def run(comm, sendbuf, recvbuf, op):
        _api.allreduce(sendbuf, recvbuf, op, comm=comm, algorithm=name)
    return _harness.Case(name, run)


# --- the cost model (optional until pycollective.model exists) ----------------

def _model():
    from .. import model
    return model


# --- command line ------------------------------------------------------------

_EPILOG = """\
columns (single size, --M):
  algorithm   the pycollective algorithm timed in this row (auto->X: the
              default algorithm="auto", which chose X)
  N           number of ranks (communicator size)
  M           elements per rank (the vector every rank contributes)
  dtype, op   element type and reduction
  mode        oop = out of place (separate send and receive buffers),
              ip = in place (sendbuf is MPI.IN_PLACE; the input is restored
              before every repetition, outside the timing)
  iters       timed repetitions (after --warmup untimed ones)
  time(us)    median over repetitions of the repetition time, where each
              repetition's time is the maximum over ranks (Barrier, then
              perf_counter around the one call)
  algbw       bytes per rank / time, in GB/s (1e9 bytes)
  busbw       algbw * 2(N-1)/N, GB/s: the traffic each rank's link must
              carry at least, comparable across N (nccl-tests convention)
  native(us)  the same for MPI's own comm.Allreduce on the same data, timed
  native bw   in the same run, interleaved repetition by repetition
              (native busbw, GB/s)
  ratio       native time / our time: above 1 we are faster than native
  model(us)   the bare alpha-beta-gamma cost, pycollective.model.predict,
              with the calibration's alpha, beta, gamma for this N
  pred(us)    what algorithm="auto" believes, model.explain: that cost times
              the calibration's measured correction for this algorithm and
              size, plus the per-call overhead (= model(us) uncalibrated)
  err%        100 * (pred / time - 1)
  #wrong      elements that are not bit-for-bit equal to native
              comm.Allreduce's result, summed over ranks (worst call, warm-up
              calls included).
              The input data are small integers for which every reduction
              order is exact (see pycollective._harness.exact_values), so
              the tolerance is 0: any difference is an error
  maxerr      largest |ours - native| over all elements, ranks, repetitions
  same        yes if every rank held bitwise-identical results after every
              call (CRC-32 of the result compared across ranks)
  input       ok if the send buffer still holds its original data after all
              runs (the caller's send buffer must never be modified)

sweeps (--minbytes/--maxbytes or --mincount/--maxcount):
  one table per algorithm and one for native, in the nccl-tests layout:
  size (B), count, type, redop, then for out-of-place and in-place:
  time (us), algbw, busbw (GB/s), #wrong; then model(us), pred(us), err%.
  With the model installed, a last table shows the measured fastest
  algorithm at every size, the model's choice (what algorithm="auto"
  runs), and the auto score: the fraction of sizes where the choice is
  the fastest or within 10 % of it.

exit status: 0 when every element of every run is right, replicas agree and
inputs are intact; 1 otherwise; 2 for bad arguments (on every rank, before
any message is sent).
"""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that prints only on rank 0 but exits on every rank.

    Every rank parses the same argv, so every rank reaches the same verdict
    without any message; only the printing is limited to one rank.
    """

    def _print_message(self, message, file=None):
        if MPI.COMM_WORLD.Get_rank() == 0:
            super()._print_message(message, file)


def _count_arg(text):
    try:
        return _harness.parse_count(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _size_arg(text):
    try:
        return _harness.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text):
    value = _count_arg(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _float_arg(text, what, ok, rule):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a {what}") from None
    if not ok(value) or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{rule}, got {text!r}")
    return value


def _factor_arg(text):
    return _float_arg(text, "number", lambda v: v > 1, "step factor must be a number above 1")


def _seconds_arg(text):
    return _float_arg(text, "number of seconds", lambda v: v > 0,
                      "a time budget must be positive")


def build_parser():
    """The argument parser; its choices come from the algorithm registry and the kernels."""
    # "auto" times allreduce(algorithm="auto") itself (choice included); "all"
    # is every registered algorithm (not auto: it is one of them).
    choices = _api.algorithms() + ["auto", "all"]
    dtypes = [d.name for d in SUPPORTED_DTYPES]
    p = _Parser(
        prog="python -m pycollective.bench",
        description="Time and check pycollective allreduce algorithms against native "
                    "MPI comm.Allreduce, at one size (--M) or over a sweep of sizes.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    # default "all" as a string: argparse checks a nargs="*" default against choices.
    p.add_argument("algorithms", nargs="*", metavar="ALGORITHM", choices=choices, default="all",
                   help=f"algorithms to run: {', '.join(choices)} (default: all = every "
                        "registered algorithm; auto = what algorithm='auto' picks, timed as "
                        "the user would call it)")
    p.add_argument("--M", "-M", type=_count_arg, default=None, metavar="COUNT",
                   help="elements per rank, e.g. 1000 or 1e8 (default 1e6 unless sweeping)")
    p.add_argument("--dtype", "-d", default="float32", choices=dtypes, metavar="DTYPE",
                   help=f"element type: {', '.join(dtypes)} (float32)")
    p.add_argument("--op", "-o", default="sum", choices=list(_MPI_OPS), metavar="OP",
                   help="reduction: sum, prod, max, min (sum)")
    p.add_argument("--iters", "-n", type=_positive_int, default=10,
                   help="timed repetitions (10)")
    p.add_argument("--warmup", "-w", type=_count_arg, default=2,
                   help="untimed repetitions before timing (2)")
    p.add_argument("--inplace", action="store_const", const="ip", dest="mode",
                   help="in place only (sendbuf is MPI.IN_PLACE)")
    p.add_argument("--mode", choices=["oop", "ip", "both"], default=None,
                   help="out of place, in place or both (default: oop for --M, both for sweeps)")
    sweep = p.add_argument_group("sweeps (nccl-tests -b/-e/-f)")
    sweep.add_argument("--minbytes", "-b", type=_size_arg, default=None,
                       help="smallest message in bytes per rank (e.g. 4, 1K, 1e3)")
    sweep.add_argument("--maxbytes", "-e", type=_size_arg, default=None,
                       help="largest message in bytes per rank (e.g. 64M, 4e8)")
    sweep.add_argument("--mincount", type=_count_arg, default=None, help="smallest count (elements)")
    sweep.add_argument("--maxcount", type=_count_arg, default=None, help="largest count (elements)")
    sweep.add_argument("--stepfactor", "-f", type=_factor_arg, default=2.0,
                       help="multiply the size by this much per step (2)")
    sweep.add_argument("--budget", type=_seconds_arg, default=None, metavar="SECONDS",
                       help="cap the timed repetitions of one size so that all algorithms "
                            "together take about this long (at least 3 repetitions)")
    model = p.add_argument_group("cost model (pycollective.model)")
    model.add_argument("--params", default=None, metavar="FILE",
                       help="calibration file for the predictions and for algorithm='auto' "
                            "(sets PYCOLLECTIVE_MODEL for the run; default: the model's own)")
    model.add_argument("--explain", action="store_true",
                       help="print every algorithm's predicted time and the automatic choice")
    out = p.add_argument_group("output")
    out.add_argument("--json", default=None, metavar="FILE", help="write every measurement as JSON")
    out.add_argument("--plot", default=None, metavar="FILE.png",
                     help="plot busbw against size (needs matplotlib: pip install pycollective[plot])")
    out.add_argument("--quiet", "-q", action="store_true", help="print no tables")
    p.add_argument("--no-agree", action="store_true",
                   help="turn off pycollective's cross-rank argument agreement (one small "
                        "Allreduce per call) to time the algorithms alone")
    return p


def parse_args(argv, nranks):
    """Parse and validate ``argv``; identical on every rank, so errors exit everywhere.

    Returns:
        The argparse namespace with ``algorithms`` expanded, ``counts`` (the
        sizes to run), ``modes`` (list of booleans: in place?) and ``sweep``.

    Raises:
        SystemExit: for bad arguments (status 2) and for --help (status 0).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    names = [args.algorithms] if isinstance(args.algorithms, str) else args.algorithms
    expanded = []
    for name in names:
        for n in (_api.algorithms() if name == "all" else [name]):
            if n not in expanded:
                expanded.append(n)
    args.algorithms = expanded
    dtype = np.dtype(args.dtype)
    itemsize = dtype.itemsize

    by_bytes = args.minbytes is not None or args.maxbytes is not None
    by_count = args.mincount is not None or args.maxcount is not None
    if by_bytes and by_count:
        parser.error("give sizes either in bytes (--minbytes/--maxbytes) or in elements "
                     "(--mincount/--maxcount), not both")
    args.sweep = by_bytes or by_count
    if args.sweep and args.M is not None:
        parser.error("--M runs one size; drop it or the sweep options")
    if args.sweep:
        if by_bytes:
            lo = args.minbytes if args.minbytes is not None else itemsize
            hi = args.maxbytes if args.maxbytes is not None else lo
            for what, b in (("--minbytes", lo), ("--maxbytes", hi)):
                if b % itemsize:
                    parser.error(f"{what} {b} is not a multiple of the {args.dtype} size ({itemsize} B)")
            lo, hi = lo // itemsize, hi // itemsize
        else:
            lo = args.mincount if args.mincount is not None else 1
            hi = args.maxcount if args.maxcount is not None else lo
        if lo > hi:
            parser.error(f"the smallest size ({lo} elements) is above the largest ({hi})")
        args.counts = sweep_counts(lo, hi, args.stepfactor)
    else:
        args.counts = [1_000_000 if args.M is None else args.M]
    mode = args.mode or ("both" if args.sweep else "oop")
    args.modes = {"oop": [False], "ip": [True], "both": [False, True]}[mode]
    try:
        for op in [args.op]:
            _harness.exact_values(0, 1, 0, nranks, dtype, op)
    except ValueError as exc:
        parser.error(str(exc))
    model = _model()
    if args.explain and model is None:
        parser.error("--explain needs pycollective.model, which is not installed")
    if args.params is not None and not os.path.isfile(args.params):
        parser.error(f"--params {args.params}: no such file")
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error("--plot needs matplotlib: pip install 'pycollective[plot]'")
    return args


def sweep_counts(lo, hi, factor):
    """Counts from ``lo`` to ``hi`` multiplying by ``factor`` (``hi`` always included).

    Step k is ``round(lo * factor**k)`` (not a running product, so rounding
    does not drift); a sweep starting at 0 continues from 1.  Counts that
    round to the previous one are dropped.
    """
    counts = [0] if lo == 0 else []
    base = max(lo, 1)
    k = 0
    while True:
        n = int(round(base * factor ** k))
        if n > hi:
            break
        if not counts or n != counts[-1]:
            counts.append(n)
        k += 1
    if not counts or counts[-1] != hi:
        counts.append(hi)
    return counts


# --- predictions -------------------------------------------------------------

def _load_params(model, path, comm):
    """The calibration for this communicator size, read on rank 0 and broadcast.

    Every rank must predict and choose with the same numbers; a bad file
    raises the same ValueError on every rank.
    """
    if model is None:
        return None
    try:
        return bcast_from_root(comm, lambda: model.load_params(path, nranks=comm.Get_size()))
    except ValueError as exc:
        # An argument error like the others: status 2 on every rank, one message.
        if comm.Get_rank() == 0:
            sys.stderr.write(f"python -m pycollective.bench: error: --params: {exc}\n")
        raise SystemExit(2) from None


def _gamma(params, dtype):
    return (params.get("gamma_by_dtype") or {}).get(np.dtype(dtype).name, params.get("gamma", 0.0))


def _predict(model, params, name, nranks, count, dtype):
    if model is None or params is None or nranks < 2:
        return None
    try:
        return float(model.predict(name, nranks, count, alpha=params["alpha"], beta=params["beta"],
                                   gamma=_gamma(params, dtype), itemsize=np.dtype(dtype).itemsize))
    except (KeyError, ValueError):  # an algorithm the model does not know
        return None


def _calibrated(model, params, nranks, count, dtype):
    """``{algorithm: seconds}`` that ``algorithm="auto"`` believes (``model.explain``), or {}."""
    explain = getattr(model, "explain", None)
    if explain is None or params is None or nranks < 2:
        return {}
    try:
        return {k: float(v) for k, v in explain(nranks, count, dtype, params=params).items()}
    except (KeyError, ValueError):
        return {}


def _choose(model, params, nranks, count, dtype, op):
    if model is None or params is None or nranks < 2:
        return None
    return model.choose(nranks, count, dtype, op, params=params)


# --- reports -----------------------------------------------------------------

def _t_us(seconds):
    return fmt_num(seconds * 1e6, 4) if seconds is not None else "-"


def _err_pct(row):
    pred, t = row.get("pred"), row["time"]
    if not pred or not t > 0:  # no prediction, or none for an empty vector
        return "-"
    return f"{100.0 * (pred / t - 1):+.0f}"


def _single_table(rows):
    """Phase-1 table: one line per (mode, algorithm), native in its own columns."""
    cols = [
        ("algorithm", lambda r: f"auto->{r['auto']}" if r["name"] == "auto" and r.get("auto")
         else r["name"]),
        ("N", lambda r: str(r["nranks"])),
        ("M", lambda r: str(r["count"])),
        ("dtype", lambda r: r["dtype"]),
        ("op", lambda r: r["op"]),
        ("mode", lambda r: "ip" if r["inplace"] else "oop"),
        ("iters", lambda r: str(r["iters"])),
        ("time(us)", lambda r: _t_us(r["time"])),
        ("algbw", lambda r: fmt_num(r["algbw"])),
        ("busbw", lambda r: fmt_num(r["busbw"])),
        ("native(us)", lambda r: _t_us(r["native_time"])),
        ("native bw", lambda r: fmt_num(r["native_busbw"])),
        ("ratio", lambda r: fmt_num(r["ratio"])),
    ]
    if any(r.get("pred") is not None for r in rows):
        cols += [("model(us)", lambda r: _t_us(r.get("pred_bare"))),
                 ("pred(us)", lambda r: _t_us(r.get("pred"))), ("err%", _err_pct)]
    cols += [
        ("#wrong", lambda r: str(r["wrong"])),
        ("maxerr", lambda r: fmt_num(r["maxerr"])),
        ("same", lambda r: "yes" if r["identical"] else "NO"),
        ("input", lambda r: "ok" if r["input_intact"] else "CHANGED"),
    ]
    return _harness.format_table(cols, rows)


def _sweep_tables(rows, names, modes):
    """nccl-tests layout: one table per algorithm (and native), one line per size."""
    out = []
    by = {(r["name"], r["count"], r["inplace"]): r for r in rows}
    counts = sorted({r["count"] for r in rows})
    with_pred = any(r.get("pred") is not None for r in rows)
    for name in ["native"] + names:
        lines = []
        for c in counts:
            lines.append([by.get((name, c, m)) for m in modes])
        first = lambda ln: next(r for r in ln if r is not None)  # noqa: E731
        cols = [
            ("size(B)", lambda ln: str(first(ln)["bytes"])),
            ("count", lambda ln: str(first(ln)["count"])),
            ("type", lambda ln: first(ln)["dtype"]),
            ("redop", lambda ln: first(ln)["op"]),
        ]
        for k, m in enumerate(modes):
            tag = "ip" if m else "oop"
            cols += [
                (f"{tag} time(us)", lambda ln, k=k: _t_us(ln[k]["time"])),
                (f"{tag} algbw", lambda ln, k=k: fmt_num(ln[k]["algbw"])),
                (f"{tag} busbw", lambda ln, k=k: fmt_num(ln[k]["busbw"])),
                (f"{tag} #wrong", lambda ln, k=k: str(ln[k]["wrong"]) if name != "native" else "-"),
            ]
        if with_pred and name != "native":
            cols += [("model(us)", lambda ln: _t_us(ln[0].get("pred_bare"))),
                     ("pred(us)", lambda ln: _t_us(ln[0].get("pred"))),
                     ("err%", lambda ln: _err_pct(ln[0]))]
        problems = [r for ln in lines for r in ln if not (r["identical"] and r["input_intact"])]
        note = ""
        if problems:
            note = (f"\n#  !! {len(problems)} runs with replicas that differ across ranks "
                    "or a modified send buffer")
        n = lines[0][0]["nranks"]
        out.append(f"# {name}  (N={n}, times are medians of the max over ranks)\n"
                   + _harness.format_table(cols, lines) + note)
    return "\n\n".join(out)


def auto_score(rows, names, within=0.10):
    """Score the model's choice against the measurements.

    For every (N, count, dtype, op, mode) where at least two algorithms were
    measured and the row carries ``auto`` (the model's pick), the point scores
    when the pick's measured time is at most ``(1 + within)`` times the
    fastest measured algorithm's.  Native MPI is not a candidate.

    Returns:
        ``dict(points=[...], scored=int, hits=int, score=float or None)``.
    """
    groups = {}
    for r in rows:
        if r["name"] in names:
            groups.setdefault((r["nranks"], r["count"], r["dtype"], r["op"], r["inplace"]), []).append(r)
    points = []
    for key, grp in sorted(groups.items()):
        pick = grp[0].get("auto")
        if pick is None or len(grp) < 2:
            continue
        times = {r["name"]: r["time"] for r in grp}
        fastest = min(times, key=times.get)
        entry = dict(nranks=key[0], count=key[1], dtype=key[2], op=key[3], inplace=key[4],
                     fastest=fastest, fastest_time=times[fastest], auto=pick,
                     auto_time=times.get(pick))
        entry["hit"] = bool(entry["auto_time"] is not None
                            and entry["auto_time"] <= (1 + within) * times[fastest])
        points.append(entry)
    hits = sum(p["hit"] for p in points)
    return dict(points=points, scored=len(points), hits=hits, within=within,
                score=(hits / len(points)) if points else None)


def _score_table(score):
    cols = [
        ("N", lambda p: str(p["nranks"])),
        ("count", lambda p: str(p["count"])),
        ("mode", lambda p: "ip" if p["inplace"] else "oop"),
        ("fastest", lambda p: p["fastest"]),
        ("time(us)", lambda p: _t_us(p["fastest_time"])),
        ("auto", lambda p: p["auto"]),
        ("auto(us)", lambda p: _t_us(p["auto_time"])),
        ("ok", lambda p: "yes" if p["hit"] else "no"),
    ]
    text = _harness.format_table(cols, score["points"])
    if score["score"] is not None:
        text += (f"\n# auto score: {score['hits']}/{score['scored']} = {100 * score['score']:.0f}% "
                 f"of points where the model's choice is the fastest or within "
                 f"{100 * score['within']:.0f}% of it")
    return text


def _explain(model, params, names, nranks, count, dtype, op):
    """Every registered algorithm's bare and calibrated prediction, and the choice."""
    calibrated = _calibrated(model, params, nranks, count, dtype)
    pick = _choose(model, params, nranks, count, dtype, op)
    everyone = list(dict.fromkeys(list(calibrated) + [n for n in names if n != "auto"]))
    rows = [(n, _predict(model, params, n, nranks, count, dtype), calibrated.get(n))
            for n in everyone]
    lines = [f"# model for N={nranks}, M={count} {dtype} {op}: alpha={params['alpha']:.3g} s, "
             f"beta={params['beta']:.3g} s/B, gamma={_gamma(params, dtype):.3g} s/B "
             f"(from {params.get('source')})",
             f"# {'algorithm':>14s}  {'model(us)':>10s}  {'pred(us)':>10s}"]
    for n, bare, cal in sorted(rows, key=lambda x: (x[2] is None, x[2] or 0, x[1] or 0)):
        mark = "  <- choice (algorithm='auto')" if n == pick else ""
        lines.append(f"# {n:>14s}  {_t_us(bare):>10s}  {_t_us(cal):>10s}{mark}")
    return "\n".join(lines)


class _Progress:
    """A one-line progress bar on rank 0's stderr, only when it is a terminal."""

    def __init__(self, total, enabled):
        self.total, self.done = total, 0
        self.enabled = enabled and total > 1 and sys.stderr.isatty()

    def step(self, label):
        self.done += 1
        if self.enabled:
            width = 30
            filled = int(width * self.done / self.total)
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] "
                             f"{self.done}/{self.total} {label:<24s}")
            if self.done == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


def plot(rows, names, path, title):
    """Draw busbw against message size, measured points and predicted lines.

    Args:
        rows: measurement dicts (from :func:`main`).
        names: algorithms to draw (native is always drawn).
        path: output image file.
        title: the figure title.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5.5))
    colors = plt.get_cmap("tab20").colors[::2] + plt.get_cmap("tab20").colors[1::2]
    # Out of place only when there is any (in place looks alike and would
    # double the lines); in place when that is all there is.
    modes = [False] if any(not r["inplace"] for r in rows) else [True]
    for k, name in enumerate(["native"] + names):
        color = "black" if name == "native" else colors[(k - 1) % len(colors)]
        for inplace, marker in ((False, "o"), (True, "s")):
            if inplace not in modes:
                continue
            sel = sorted((r for r in rows if r["name"] == name and r["inplace"] == inplace
                          and r["bytes"] > 0), key=lambda r: r["bytes"])
            if not sel:
                continue
            label = f"{name}{' (in place)' if inplace else ''}"
            ax.plot([r["bytes"] for r in sel], [r["busbw"] for r in sel], marker=marker,
                    linestyle=":" if inplace else "-", color=color, label=label,
                    fillstyle="none" if inplace else "full", markersize=4)
            pred = [(r["bytes"], r["pred_busbw"]) for r in sel if r.get("pred_busbw")]
            if pred and name != "auto":  # auto's prediction is its pick's line
                ax.plot(*zip(*pred), linestyle="--", color=color, alpha=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("message size per rank (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- main --------------------------------------------------------------------

def main(argv=None, comm=None, out=None):
    """Run the benchmark; collective over ``comm``.

    Args:
        argv: command-line arguments (default ``sys.argv[1:]``).
        comm: communicator (default ``MPI.COMM_WORLD``).
        out: text stream for the tables on rank 0 (default ``sys.stdout``).

    Returns:
        ``(rows, report)``: every measurement (dicts as from
        :func:`pycollective._harness.measure`, with native and model columns
        added), the same on every rank; ``report`` holds the environment,
        calibration and auto score.

    Raises:
        SystemExit: for bad arguments or ``--help`` (on every rank).
    """
    comm = MPI.COMM_WORLD if comm is None else comm
    out = sys.stdout if out is None else out
    nranks, rank = comm.Get_size(), comm.Get_rank()
    args = parse_args(sys.argv[1:] if argv is None else argv, nranks)
    verbose = rank == 0 and not args.quiet
    dtype = np.dtype(args.dtype)

    model = _model()
    params = _load_params(model, args.params, comm)
    cases = [algorithm_case(n) for n in args.algorithms]

    previous_check = _api.set_check(not args.no_agree)
    # algorithm="auto" must run on the calibration the predictions use: the
    # library reads $PYCOLLECTIVE_MODEL on a communicator's first call.
    previous_model = os.environ.get("PYCOLLECTIVE_MODEL")
    if args.params is not None:
        os.environ["PYCOLLECTIVE_MODEL"] = os.path.abspath(args.params)
    rows = []
    progress = _Progress(len(args.counts) * len(args.modes), enabled=rank == 0)
    try:
        for count in args.counts:
            if args.explain and verbose and params is not None:
                print(_explain(model, params, args.algorithms, nranks, count, dtype.name,
                               args.op), file=out, flush=True)
            pick = _choose(model, params, nranks, count, dtype.name, args.op)
            calibrated = _calibrated(model, params, nranks, count, dtype.name)
            for inplace in args.modes:
                got = _harness.measure(comm, ALLREDUCE, cases, count, dtype, args.op,
                                       inplace=inplace, iters=args.iters, warmup=args.warmup,
                                       budget=args.budget)
                native = got[0]
                for r in got:
                    r["native_time"], r["native_busbw"] = native["time"], native["busbw"]
                    r["ratio"] = (native["time"] / r["time"]) if r["time"] > 0 else float("nan")
                    predicted_name = pick if r["name"] == "auto" else r["name"]
                    mine = r["name"] != "native" and predicted_name is not None
                    r["pred_bare"] = (_predict(model, params, predicted_name, nranks, count, dtype)
                                      if mine else None)
                    r["pred"] = calibrated.get(predicted_name) if mine else None
                    if r["pred"] is None:
                        r["pred"] = r["pred_bare"]
                    r["pred_busbw"] = (None if not r["pred"] else
                                       _harness.busbw(r["bytes"], r["pred"],
                                                      ALLREDUCE.busbw_factor(nranks)))
                    r["auto"] = pick
                rows.extend(got)
                progress.step(f"{count} el {'ip' if inplace else 'oop'}")
    finally:
        _api.set_check(previous_check)
        if args.params is not None:
            if previous_model is None:
                os.environ.pop("PYCOLLECTIVE_MODEL", None)
            else:
                os.environ["PYCOLLECTIVE_MODEL"] = previous_model

    score = auto_score(rows, [n for n in args.algorithms if n != "auto"])
    report = dict(environment=environment(comm), calibration=params,
                  options={k: v for k, v in vars(args).items()}, auto_score=score)
    if verbose:
        ours = [r for r in rows if r["name"] != "native"]
        if args.sweep:
            print(_sweep_tables(rows, args.algorithms, args.modes), file=out)
        else:
            print(_single_table(ours), file=out)
        if score["scored"]:
            print("\n" + _score_table(score), file=out)
        bad = failures(rows)
        if bad:
            print(f"\n# FAILED: {len(bad)} runs with wrong elements, differing replicas "
                  f"or a modified input: " + ", ".join(sorted({r['name'] for r in bad})), file=out)
        out.flush()
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(dict(report, measurements=rows), f, default=_json_default)
    if rank == 0 and args.plot:
        plot(rows, args.algorithms, args.plot,
             f"allreduce {dtype.name} {args.op}, N={nranks}: measured busbw (points), "
             "model prediction (dashed, same colour)")
    return rows, report


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.dtype):
        return obj.name
    return str(obj)


def failures(rows):
    """Rows with wrong elements, replicas that differ, or a modified input."""
    return [r for r in rows if r["wrong"] or not r["identical"] or not r["input_intact"]]


def _cli():
    rows, _ = main()
    # Every rank holds the same agreed rows, so every rank exits the same way.
    sys.exit(1 if failures(rows) else 0)


