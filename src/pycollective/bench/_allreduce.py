"""``python -m pycollective.bench [allreduce]``: time and check allreduce algorithms against native MPI.

The allreduce-specific half of the benchmark (in the manner of nccl-tests'
``all_reduce.cu``): bytes per rank, input data, the native reference and the
bus-bandwidth factor; the predictions of the cost model for the same sizes;
the tables, the auto score and the plot.  Warm-up, timing, checking and the
cross-rank agreement live in :mod:`pycollective.bench._harness`.
"""

import argparse
import math

import numpy as np

from .. import _auto
from .. import _collectives as _api
from .._context import get_context
from .._exact import exact_values, fill_exact
from .._kernels import SUPPORTED_DTYPES
from .._ops import MPI_OPS
from .._root import bcast_from_root
from .._table import fmt_num, format_table
from .._units import count_arg, size_arg
from ..model.choice import calibrated_times, gamma_of
from ..model.formulas import predict
from ..model.params import load_params
from . import _cli, _harness

__all__ = ["ALLREDUCE", "algorithm_case", "parse_args", "build_parser", "sweep_counts",
           "auto_score", "plot", "single_table", "sweep_tables", "t_us"]


# --- the allreduce collective ------------------------------------------------

def _native(comm, sendbuf, recvbuf, op):
    comm.Allreduce(sendbuf, recvbuf, op=MPI_OPS[op])


def _allreduce_factor(nranks):
    # Each rank must send and receive 2(N-1)/N of its data at the very least
    # (reduce-scatter + allgather), so busbw is comparable across N.
    return 2.0 * (nranks - 1) / nranks


ALLREDUCE = _harness.Collective(
    name="allreduce",
    nbytes=lambda count, itemsize: count * itemsize,
    busbw_factor=_allreduce_factor,
    init=fill_exact,
    reference=_harness.Case("native", _native),
)


def algorithm_case(name):
    """The :class:`~pycollective.bench._harness.Case` running ``pycollective.allreduce`` with ``name``."""
    def run(comm, sendbuf, recvbuf, op):
        _api.allreduce(sendbuf, recvbuf, op, comm=comm, algorithm=name)
    return _harness.Case(name, run)


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
              order is exact (see pycollective._exact.exact_values), so
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
  A last table shows the measured fastest algorithm at every size, the
  model's choice (what algorithm="auto" runs), and the auto score: the
  fraction of sizes where the choice is the fastest or within 10 % of it.

Lines that are not data start with '#', table headers included.  An
algorithm that cannot run on this communicator (pycollective.
unusable_algorithms) is skipped with its reason.

exit status: 0 when every element of every run is right, replicas agree and
inputs are intact; 1 otherwise; 2 for bad arguments (on every rank, before
any message is sent).
"""


def _float_arg(text, what, ok, rule):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a {what}") from None
    if not ok(value) or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{rule}, got {text!r}")
    return value


def factor_arg(text):
    """argparse type: a number above 1."""
    return _float_arg(text, "number", lambda v: v > 1, "step factor must be a number above 1")


def seconds_arg(text):
    """argparse type: a positive number of seconds."""
    return _float_arg(text, "number of seconds", lambda v: v > 0,
                      "a time budget must be positive")


def positive_int(text):
    """argparse type: a whole number of at least 1 (``1e3`` allowed)."""
    value = count_arg(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def add_data_options(p):
    """--dtype and --op, shared by the commands that time allreduce."""
    dtypes = [d.name for d in SUPPORTED_DTYPES]
    p.add_argument("--dtype", "-d", default="float32", choices=dtypes, metavar="DTYPE",
                   help=f"element type: {', '.join(dtypes)} (float32)")
    p.add_argument("--op", "-o", default="sum", choices=list(MPI_OPS), metavar="OP",
                   help="reduction: sum, prod, max, min (sum)")


def check_exact(parser, args, nranks):
    """An argument error when no exact data exist for this dtype, op and N."""
    try:
        exact_values(0, 1, 0, nranks, np.dtype(args.dtype), args.op)
    except ValueError as exc:
        parser.error(str(exc))


def expand_algorithms(names):
    """``all`` -> every registered algorithm; duplicates dropped, order kept."""
    names = [names] if isinstance(names, str) else names
    expanded = []
    for name in names:
        for n in (_api.algorithms() if name == "all" else [name]):
            if n not in expanded:
                expanded.append(n)
    return expanded


def add_algorithms_argument(p, default="all"):
    """The positional ALGORITHM list; its choices come from the registry."""
    # "auto" times allreduce(algorithm="auto") itself (choice included); "all"
    # is every registered algorithm (not auto: it is one of them).
    choices = _api.algorithms() + ["auto", "all"]
    # a string default: argparse checks a nargs="*" default against choices.
    p.add_argument("algorithms", nargs="*", metavar="ALGORITHM", choices=choices,
                   default=default,
                   help=f"algorithms to run: {', '.join(choices)} (default: {default}; all = "
                        "every registered algorithm; auto = what algorithm='auto' picks, timed "
                        "as the user would call it)")


def _options(p):
    p.description = ("Time and check pycollective allreduce algorithms against native MPI "
                     "comm.Allreduce, at one size (--M) or over a sweep of sizes.")
    add_algorithms_argument(p)
    p.add_argument("--M", "-M", type=count_arg, default=None, metavar="COUNT",
                   help="elements per rank, e.g. 1000 or 1e8 (default 1e6 unless sweeping)")
    add_data_options(p)
    p.add_argument("--iters", "-n", type=positive_int, default=10,
                   help="timed repetitions (10)")
    p.add_argument("--warmup", "-w", type=count_arg, default=2,
                   help="untimed repetitions before timing (2)")
    p.add_argument("--inplace", action="store_const", const="ip", dest="mode",
                   help="in place only (sendbuf is MPI.IN_PLACE)")
    p.add_argument("--mode", choices=["oop", "ip", "both"], default=None,
                   help="out of place, in place or both (default: oop for --M, both for sweeps)")
    sweep = p.add_argument_group("sweeps (nccl-tests -b/-e/-f)")
    sweep.add_argument("--minbytes", "-b", type=size_arg, default=None,
                       help="smallest message in bytes per rank (e.g. 4, 1K, 1e3)")
    sweep.add_argument("--maxbytes", "-e", type=size_arg, default=None,
                       help="largest message in bytes per rank (e.g. 64M, 4e8)")
    sweep.add_argument("--mincount", type=count_arg, default=None, help="smallest count (elements)")
    sweep.add_argument("--maxcount", type=count_arg, default=None, help="largest count (elements)")
    sweep.add_argument("--stepfactor", "-f", type=factor_arg, default=2.0,
                       help="multiply the size by this much per step (2)")
    sweep.add_argument("--budget", type=seconds_arg, default=None, metavar="SECONDS",
                       help="cap the timed repetitions of one size so that all algorithms "
                            "together take about this long (at least 3 repetitions)")
    model = p.add_argument_group("cost model (pycollective.model)")
    model.add_argument("--params", default=None, metavar="FILE",
                       help="calibration file for the predictions and for algorithm='auto' "
                            "(installed on the communicator for the run, read by rank 0; "
                            "default: the one algorithm='auto' uses)")
    model.add_argument("--explain", action="store_true",
                       help="print every algorithm's predicted time and the automatic choice")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="plot busbw against size (needs matplotlib: pip install pycollective[plot])")
    p.add_argument("--no-agree", action="store_true",
                   help="turn off pycollective's cross-rank argument agreement (one small "
                        "Allreduce per call) to time the algorithms alone")


def _check(args, parser, nranks):
    args.algorithms = expand_algorithms(args.algorithms)
    itemsize = np.dtype(args.dtype).itemsize
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
                    parser.error(f"{what} {b} is not a multiple of the {args.dtype} size "
                                 f"({itemsize} B)")
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
    check_exact(parser, args, nranks)


def _params_problem(path):
    why = _cli.input_problem(path)
    if why is None:
        try:
            load_params(path)
        except ValueError as exc:
            why = str(exc)
    return why


def _plot_problem(path):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "needs matplotlib: pip install 'pycollective[plot]'"
    return _cli.output_problem(path)


def _files(args):
    checks = []
    if args.params is not None:
        checks.append(("--params", lambda: _params_problem(args.params)))
    if args.plot is not None:
        checks.append(("--plot", lambda: _plot_problem(args.plot)))
    return checks


def build_parser():
    """The argument parser; its choices come from the algorithm registry and the kernels."""
    return _cli.build_parser("allreduce")


def parse_args(argv, nranks, comm=None):
    """Parse and validate ``argv``; identical on every rank, so errors exit everywhere.

    Returns:
        The argparse namespace with ``algorithms`` expanded, ``counts`` (the
        sizes to run), ``modes`` (list of booleans: in place?) and ``sweep``.

    Raises:
        SystemExit: for bad arguments (status 2) and for --help (status 0).
    """
    return _cli.parse("allreduce", argv, nranks, comm)


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

class _Beliefs:
    """What ``algorithm="auto"`` believes on this communicator, from its own state.

    The state (:func:`pycollective._auto.auto_for`) holds the parameters,
    the algorithms that cannot run here and the choices, so the predictions
    and the choice shown are the ones ``auto`` acts on.  One rank: nothing
    to predict (allreduce sends no message).
    """

    def __init__(self, state, nranks):
        self.state, self.nranks = state, nranks
        self.flat = state.flat

    def pick(self, count, dtype, op):
        return self.state.choose(count, np.dtype(dtype), op) if self.nranks > 1 else None

    def calibrated(self, count, dtype):
        """``{algorithm: seconds}`` that ``auto`` weighs (its exclusions left out)."""
        if self.nranks < 2:
            return {}
        times = calibrated_times(self.nranks, count, np.dtype(dtype), self.flat)
        return {n: t for n, t in times.items() if n not in self.state.exclude}

    def bare(self, name, count, dtype):
        """The bare alpha-beta-gamma cost with this N's scalar parameters."""
        if self.nranks < 2:
            return None
        dtype = np.dtype(dtype)
        try:
            return predict(name, self.nranks, count, alpha=self.flat["alpha"],
                           beta=self.flat["beta"], gamma=gamma_of(self.flat, dtype),
                           itemsize=dtype.itemsize)
        except ValueError:  # an algorithm without a cost model
            return None

    def explain(self, names, count, dtype, op, reasons):
        """Every algorithm's bare and calibrated prediction, and the choice, as comments."""
        calibrated = self.calibrated(count, dtype)
        pick = self.pick(count, dtype, op)
        everyone = list(dict.fromkeys(_api.algorithms() + [n for n in names if n != "auto"]))
        rows = [(n, self.bare(n, count, dtype), calibrated.get(n)) for n in everyone]
        f = self.flat
        lines = [f"# model for N={self.nranks}, M={count} {np.dtype(dtype).name} {op}: "
                 f"alpha={f['alpha']:.3g} s, beta={f['beta']:.3g} s/B, "
                 f"gamma={gamma_of(f, np.dtype(dtype)):.3g} s/B (from {f.get('source')})",
                 f"# {'algorithm':>14s}  {'model(us)':>10s}  {'pred(us)':>10s}"]
        for n, bare, cal in sorted(rows, key=lambda x: (x[2] is None, x[2] or 0, x[1] or 0)):
            mark = "  <- choice (algorithm='auto')" if n == pick else ""
            if n in reasons:
                mark = f"  (cannot run here: {reasons[n]})"
            lines.append(f"# {n:>14s}  {t_us(bare):>10s}  {t_us(cal):>10s}{mark}")
        return "\n".join(lines)


def _install_beliefs(args, comm):
    """The auto state of ``comm``, with ``--params`` installed on it; and the state it replaced."""
    ctx = get_context(comm)
    previous = ctx.peek(_auto.KEY)
    params = None
    if args.params is not None:
        # Rank 0 reads, every rank gets the same parameters (or error).
        params = bcast_from_root(comm, lambda: load_params(args.params), what="--params")
    return _auto.auto_for(ctx, params=params), previous


# --- reports -----------------------------------------------------------------

def t_us(seconds):
    """Seconds as microseconds with 4 significant figures; ``-`` for None."""
    return fmt_num(seconds * 1e6, 4) if seconds is not None else "-"


def _err_pct(row):
    pred, t = row.get("pred"), row["time"]
    if not pred or not t > 0:  # no prediction, or none for an empty vector
        return "-"
    return f"{100.0 * (pred / t - 1):+.0f}"


def _name(r):
    return f"auto->{r['auto']}" if r["name"] == "auto" and r.get("auto") else r["name"]


def single_table(rows):
    """Phase-1 table: one line per (mode, algorithm), native in its own columns."""
    cols = [
        ("algorithm", _name),
        ("N", lambda r: str(r["nranks"])),
        ("M", lambda r: str(r["count"])),
        ("dtype", lambda r: r["dtype"]),
        ("op", lambda r: r["op"]),
        ("mode", lambda r: "ip" if r["inplace"] else "oop"),
        ("iters", lambda r: str(r["iters"])),
        ("time(us)", lambda r: t_us(r["time"])),
        ("algbw", lambda r: fmt_num(r["algbw"])),
        ("busbw", lambda r: fmt_num(r["busbw"])),
        ("native(us)", lambda r: t_us(r["native_time"])),
        ("native bw", lambda r: fmt_num(r["native_busbw"])),
        ("ratio", lambda r: fmt_num(r["ratio"])),
    ]
    if any(r.get("pred") is not None for r in rows):
        cols += [("model(us)", lambda r: t_us(r.get("pred_bare"))),
                 ("pred(us)", lambda r: t_us(r.get("pred"))), ("err%", _err_pct)]
    cols += [
        ("#wrong", lambda r: str(r["wrong"])),
        ("maxerr", lambda r: fmt_num(r["maxerr"])),
        ("same", lambda r: "yes" if r["identical"] else "NO"),
        ("input", lambda r: "ok" if r["input_intact"] else "CHANGED"),
    ]
    return format_table(cols, rows, prefix="# ")


def sweep_tables(rows, names, modes):
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
                (f"{tag} time(us)", lambda ln, k=k: t_us(ln[k]["time"])),
                (f"{tag} algbw", lambda ln, k=k: fmt_num(ln[k]["algbw"])),
                (f"{tag} busbw", lambda ln, k=k: fmt_num(ln[k]["busbw"])),
                (f"{tag} #wrong", lambda ln, k=k: str(ln[k]["wrong"]) if name != "native" else "-"),
            ]
        if with_pred and name != "native":
            cols += [("model(us)", lambda ln: t_us(ln[0].get("pred_bare"))),
                     ("pred(us)", lambda ln: t_us(ln[0].get("pred"))),
                     ("err%", lambda ln: _err_pct(ln[0]))]
        problems = [r for ln in lines for r in ln if not (r["identical"] and r["input_intact"])]
        note = ""
        if problems:
            note = (f"\n#  !! {len(problems)} runs with replicas that differ across ranks "
                    "or a modified send buffer")
        n = lines[0][0]["nranks"]
        out.append(f"# {name}  (N={n}, times are medians of the max over ranks)\n"
                   + format_table(cols, lines, prefix="# ") + note)
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
            groups.setdefault((r["nranks"], r["count"], r["dtype"], r["op"], r["inplace"]),
                              []).append(r)
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
        ("time(us)", lambda p: t_us(p["fastest_time"])),
        ("auto", lambda p: p["auto"]),
        ("auto(us)", lambda p: t_us(p["auto_time"])),
        ("ok", lambda p: "yes" if p["hit"] else "no"),
    ]
    text = format_table(cols, score["points"], prefix="# ")
    if score["score"] is not None:
        text += (f"\n# auto score: {score['hits']}/{score['scored']} = "
                 f"{100 * score['score']:.0f}% of points where the model's choice is the "
                 f"fastest or within {100 * score['within']:.0f}% of it")
    return text


def plot(rows, names, path, title):
    """Draw busbw against message size, measured points and predicted lines.

    Args:
        rows: measurement dicts (from :func:`pycollective.bench.main`).
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


def usable(names, session):
    """``names`` without the algorithms that cannot run on the session's communicator.

    Each one left out is printed with its reason and recorded in the
    report's ``skipped``; collective (the answer is agreed, see
    :func:`pycollective.unusable_algorithms`).
    """
    reasons = _api.unusable_algorithms(session.comm)
    kept = []
    for n in names:
        if n in reasons:
            session.skip(n, reasons[n])
        else:
            kept.append(n)
    return kept, reasons


def compare_with_native(rows):
    """Give every row of one :func:`~pycollective.bench._harness.measure` the native columns."""
    native = rows[0]
    for r in rows:
        r["native_time"], r["native_busbw"] = native["time"], native["busbw"]
        r["ratio"] = (native["time"] / r["time"]) if r["time"] > 0 else float("nan")
    return rows


# --- the command ----------------------------------------------------------------

@_cli.command("allreduce", "time and check allreduce algorithms against native MPI "
              "(the default command)", options=_options, check=_check, files=_files,
              epilog=_EPILOG)
def run(args, session):
    """Every requested algorithm at every size and mode; returns the measurement rows."""
    comm, nranks = session.comm, session.nranks
    dtype = np.dtype(args.dtype)
    names, reasons = usable(args.algorithms, session)
    state, previous = _install_beliefs(args, comm)
    beliefs = _Beliefs(state, nranks)
    cases = [algorithm_case(n) for n in names]
    previous_check = _api.set_check(not args.no_agree)
    rows = []
    progress = session.progress(len(args.counts) * len(args.modes))
    try:
        for count in args.counts:
            if args.explain and nranks > 1:
                session.print(beliefs.explain(names, count, dtype.name, args.op, reasons))
            pick = beliefs.pick(count, dtype, args.op)
            calibrated = beliefs.calibrated(count, dtype)
            for inplace in args.modes:
                got = compare_with_native(_harness.measure(
                    comm, ALLREDUCE, cases, count, dtype, args.op, inplace=inplace,
                    iters=args.iters, warmup=args.warmup, budget=args.budget))
                for r in got:
                    predicted = pick if r["name"] == "auto" else r["name"]
                    mine = r["name"] != "native" and predicted is not None
                    r["pred_bare"] = beliefs.bare(predicted, count, dtype) if mine else None
                    r["pred"] = calibrated.get(predicted) if mine else None
                    if r["pred"] is None:
                        r["pred"] = r["pred_bare"]
                    r["pred_busbw"] = (None if not r["pred"] else _harness.busbw(
                        r["bytes"], r["pred"], ALLREDUCE.busbw_factor(nranks)))
                    r["auto"] = pick
                rows.extend(got)
                progress.step(f"{count} el {'ip' if inplace else 'oop'}")
    finally:
        _api.set_check(previous_check)
        if args.params is not None:  # the communicator's own calibration again
            get_context(comm).put(_auto.KEY, previous)

    score = auto_score(rows, [n for n in names if n != "auto"])
    session.report.update(calibration=state.flat, auto_score=score)
    ours = [r for r in rows if r["name"] != "native"]
    if args.sweep:
        session.print(sweep_tables(rows, names, args.modes))
    elif ours:
        session.print(single_table(ours))
    if score["scored"]:
        session.print("\n" + _score_table(score))
    bad = _harness.failures(rows)
    if bad:
        session.print(f"\n# FAILED: {len(bad)} runs with wrong elements, differing replicas "
                      f"or a modified input: " + ", ".join(sorted({r['name'] for r in bad})))
    if session.rank == 0 and args.plot:
        plot(rows, names, args.plot,
             f"allreduce {dtype.name} {args.op}, N={nranks}: measured busbw (points), "
             "model prediction (dashed, same colour)")
    return rows
