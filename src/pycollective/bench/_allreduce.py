"""``python -m pycollective.bench [allreduce]``: time and check allreduce algorithms against native MPI.

The allreduce-specific half of the benchmark (in the manner of nccl-tests'
``all_reduce.cu``): bytes per rank, input data, the native reference and the
bus-bandwidth factor; the predictions of the cost model for the same sizes;
the tables, the auto score and the plot.  Warm-up, timing, checking and the
cross-rank agreement live in :mod:`pycollective.bench._harness`.
"""

import numpy as np
from mpi4py import MPI

from ..collectives import allocate as _memory
from ..collectives import auto as _auto
from ..collectives import api as _api
from ..collectives import options as _opts
from ..runtime.context import get_context
from ._exact import compare, fill_exact
from ..data.kernels import as_dtype, is_bfloat16
from ..data.ops import MPI_OPS
from ..runtime.root import bcast_from_root
from ._timing import slowest, timed_call
from ._units import count_arg, size_arg
from ..model.choice import calibrated_times, gamma_of
from ..model.formulas import predict
from ..model.params import load_params, params_for
from ..model.tuning import MAX_TRIALS
from ._args import (add_algorithms_argument, add_data_options, check_exact, expand_algorithms,
                    factor_arg, positive_int, seconds_arg)
from ._cli import build_parser as _build_parser
from ._cli import command, input_problem, output_problem
from ._cli import parse as _parse
from ._harness import Case, Collective, busbw, failures, measure
from ._report import auto_score, plot, score_table, single_table, sweep_tables, t_us

__all__ = ["ALLREDUCE", "algorithm_case", "parse_args", "build_parser", "sweep_counts",
           "auto_score", "usable", "compare_with_native"]


# --- the allreduce collective ------------------------------------------------

def _native(comm, sendbuf, recvbuf, op):
    if is_bfloat16(recvbuf.dtype):
        # MPI has no bfloat16: reduce float32 copies natively and round back.
        # The exact data make that exact; the conversions are in its time.
        wide = (recvbuf if sendbuf is MPI.IN_PLACE else sendbuf).astype(np.float32)
        comm.Allreduce(MPI.IN_PLACE, wide, op=MPI_OPS[op])
        recvbuf[...] = wide
        return
    comm.Allreduce(sendbuf, recvbuf, op=MPI_OPS[op])


def _allreduce_factor(nranks):
    # Each rank must send and receive 2(N-1)/N of its data at the very least
    # (reduce-scatter + allgather), so busbw is comparable across N.
    return 2.0 * (nranks - 1) / nranks


ALLREDUCE = Collective(
    name="allreduce",
    nbytes=lambda count, itemsize: count * itemsize,
    busbw_factor=_allreduce_factor,
    init=fill_exact,
    reference=Case("native", _native),
)


def algorithm_case(name):
    """The :class:`~pycollective.bench._harness.Case` running ``pycollective.allreduce`` with ``name``."""
    def run(comm, sendbuf, recvbuf, op):
        _api.allreduce(sendbuf, recvbuf, op, comm=comm, algorithm=name)
    return Case(name, run)


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
              (native busbw, GB/s); for bfloat16, which MPI cannot reduce,
              MPI's float32 Allreduce of converted copies, conversions timed
  ratio       native time / our time: above 1 we are faster than native
  model(us)   the bare alpha-beta-gamma cost, pycollective.model.predict,
              with the calibration's alpha, beta, gamma for this N
  pred(us)    what the model predicts, model.explain: that cost times the
              calibration's measured correction for this algorithm and size,
              plus the per-call overhead (= model(us) uncalibrated)
  err%        100 * (pred / time - 1)
  tune        (auto only) the calls auto spent timing its candidates before
              it decided this size (they run before the timed repetitions;
              each is a checked, correct allreduce)
  tune cost   their time beyond as many calls of auto's steady time (us)
  #wrong      elements that are not bit-for-bit equal to native
              comm.Allreduce's result, summed over ranks (worst call, warm-up
              calls included).
              The input data are small integers for which every reduction
              order is exact (see pycollective.bench._exact.exact_values), so
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
  A last table shows the measured fastest algorithm at every size, auto's
  choice (its decision after tuning when auto is among the algorithms,
  else the model's first choice), and the auto score: the fraction of
  sizes where the choice is the fastest or within 10 % of it.

Lines that are not data start with '#', table headers included.  An
algorithm that cannot run on this communicator (pycollective.
unusable_algorithms) is skipped with its reason.

exit status: 0 when every element of every run is right, replicas agree and
inputs are intact; 1 otherwise; 2 for bad arguments (on every rank, before
any message is sent).
"""


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
    model.add_argument("--predict-with", default=None, metavar="FILE",
                       help="predict (model(us), pred(us), err%%) with this calibration, "
                            "leaving algorithm='auto' on its own parameters: a fresh "
                            "machine's auto and a calibrated model's error in one run")
    model.add_argument("--explain", action="store_true",
                       help="print every algorithm's predicted time, the layout and auto's "
                            "decision (with the times of its trials)")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="plot busbw against size (needs matplotlib: pip install pycollective[plot])")
    p.add_argument("--shared", action="store_true",
                   help="the input and result buffers come from pycollective.shared_empty, "
                        "which shm reads in place above 1 MiB (the MPI library's Allreduce "
                        "gets the same buffers)")
    p.add_argument("--no-agree", action="store_true",
                   help="turn off pycollective's cross-rank argument agreement (one small "
                        "Allreduce per call) to time the algorithms alone")


def _check(args, parser, nranks):
    args.algorithms = expand_algorithms(args.algorithms)
    itemsize = as_dtype(args.dtype).itemsize
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
    why = input_problem(path)
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
    return output_problem(path)


def _files(args):
    checks = []
    if args.params is not None:
        checks.append(("--params", lambda: _params_problem(args.params)))
    if args.predict_with is not None:
        checks.append(("--predict-with", lambda: _params_problem(args.predict_with)))
    if args.plot is not None:
        checks.append(("--plot", lambda: _plot_problem(args.plot)))
    return checks


def build_parser():
    """The argument parser; its choices come from the algorithm registry and the kernels."""
    return _build_parser("allreduce")


def parse_args(argv, nranks, comm=None):
    """Parse and validate ``argv``; identical on every rank, so errors exit everywhere.

    Returns:
        The argparse namespace with ``algorithms`` expanded, ``counts`` (the
        sizes to run), ``modes`` (list of booleans: in place?) and ``sweep``.

    Raises:
        SystemExit: for bad arguments (status 2) and for --help (status 0).
    """
    return _parse("allreduce", argv, nranks, comm)


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

    The state (:func:`pycollective.collectives.auto.auto_for`) holds the parameters,
    the layout, the algorithms that cannot run here and the decisions, so
    the predictions and the choice shown are the ones ``auto`` acts on.  One
    rank: nothing to predict (allreduce sends no message).
    """

    def __init__(self, state, nranks, predict=None):
        self.state, self.nranks = state, nranks
        # predictions from ``predict`` (parameters), if given, on auto's layout
        self.flat = state.flat if predict is None else params_for(predict, nranks, state.layout)

    def pick(self, count, dtype, op):
        """Auto's decision for this shape, else the model's first choice."""
        return self.state.choose(count, as_dtype(dtype), op) if self.nranks > 1 else None

    def calibrated(self, count, dtype):
        """``{algorithm: seconds}`` that the model predicts (auto's exclusions left out)."""
        if self.nranks < 2:
            return {}
        times = calibrated_times(self.nranks, count, as_dtype(dtype), self.flat)
        return {n: t for n, t in times.items() if n not in self.state.exclude}

    def bare(self, name, count, dtype):
        """The bare alpha-beta-gamma cost with this N's scalar parameters."""
        if self.nranks < 2:
            return None
        dtype = as_dtype(dtype)
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
        decided = self.state.decision(count, as_dtype(dtype), op) is not None
        everyone = list(dict.fromkeys(_opts.algorithms() + [n for n in names if n != "auto"]))
        rows = [(n, self.bare(n, count, dtype), calibrated.get(n)) for n in everyone]
        f = self.flat
        lines = [f"# model for N={self.nranks}, M={count} {as_dtype(dtype).name} {op}: "
                 f"alpha={f['alpha']:.3g} s, beta={f['beta']:.3g} s/B, "
                 f"gamma={gamma_of(f, as_dtype(dtype)):.3g} s/B"
                 + (f", between nodes alpha={f['inter'][0]:.3g} s, beta={f['inter'][1]:.3g} s/B"
                    if self.state.layout.spans_nodes else "")
                 + f" (from {f.get('source')})",
                 f"# {'algorithm':>14s}  {'model(us)':>10s}  {'pred(us)':>10s}"]
        mark_text = "auto's decision" if decided else "the model's first choice"
        for n, bare, cal in sorted(rows, key=lambda x: (x[2] is None, x[2] or 0, x[1] or 0)):
            mark = f"  <- {mark_text}" if n == pick else ""
            if n in reasons:
                mark = f"  (cannot run here: {reasons[n]})"
            lines.append(f"# {n:>14s}  {t_us(bare):>10s}  {t_us(cal):>10s}{mark}")
        lines += [f"# {line}" for line in self.state.explain(count, dtype, op)]
        return "\n".join(lines)


def _settle(comm, state, count, dtype, op, inplace):
    """Call ``algorithm="auto"`` until it has decided this shape: its tuning, timed and checked.

    Every call is timed as the harness times one (Barrier, the call) and its
    result compared bit for bit with native ``MPI_Allreduce``'s.  Returns
    ``{"calls", "time" (their total, the slowest rank's), "wrong"}`` (agreed).
    """
    dtype = as_dtype(dtype)
    send = np.empty(count, dtype)
    fill_exact(send, comm.Get_rank(), comm.Get_size(), op)
    expected = np.empty_like(send)
    comm.Allreduce(send, expected, op=MPI_OPS[op])
    out = np.empty_like(send)
    times, wrong = [], 0
    for _ in range(MAX_TRIALS + 1):  # the most a class can take, and one more
        if state.decision(count, dtype, op) is not None:
            break
        if inplace:
            out[...] = send

        def call():
            _api.allreduce(MPI.IN_PLACE if inplace else send, out, op, comm=comm,
                           algorithm="auto")
        times.append(timed_call(comm, call))
        wrong = max(wrong, compare(out, expected)[0])
    agreed = slowest(comm, np.array(times + [float(wrong)]))
    return {"calls": len(times), "time": float(agreed[:-1].sum()), "wrong": int(agreed[-1])}


def _install_beliefs(args, comm):
    """The auto state of ``comm``, with ``--params`` installed on it; and the state it replaced."""
    ctx = get_context(comm)
    previous = ctx.peek(_auto.KEY)
    params = None
    if args.params is not None:
        # Rank 0 reads, every rank gets the same parameters (or error).
        params = bcast_from_root(comm, lambda: load_params(args.params), what="--params")
    return _auto.auto_for(ctx, params=params), previous


def usable(names, session):
    """``names`` without the algorithms that cannot run on the session's communicator.

    Each one left out is printed with its reason and recorded in the
    report's ``skipped``; collective (the answer is agreed, see
    :func:`pycollective.unusable_algorithms`).
    """
    reasons = _opts.unusable_algorithms(session.comm)
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

@command("allreduce", "time and check allreduce algorithms against native MPI "
              "(the default command)", options=_options, check=_check, files=_files,
              epilog=_EPILOG)
def run(args, session):
    """Every requested algorithm at every size and mode; returns the measurement rows."""
    comm, nranks = session.comm, session.nranks
    dtype = as_dtype(args.dtype)
    names, reasons = usable(args.algorithms, session)
    state, previous = _install_beliefs(args, comm)
    predict = None
    if args.predict_with is not None:
        predict = bcast_from_root(comm, lambda: load_params(args.predict_with),
                                  what="--predict-with")
    beliefs = _Beliefs(state, nranks, predict)
    cases = [algorithm_case(n) for n in names]
    previous_check = _opts.set_check(not args.no_agree)
    if args.shared:
        session.print("# buffers: pycollective.shared_empty (shm reads them in place above "
                      "1 MiB; docs/usage.md#shared-buffers)")
    rows = []
    progress = session.progress(len(args.counts) * len(args.modes))
    try:
        for count in args.counts:
            for inplace in args.modes:
                tuning = None
                if "auto" in names and nranks > 1 and count > 0:
                    tuning = _settle(comm, state, count, dtype, args.op, inplace)
                if args.explain and nranks > 1 and inplace == args.modes[0]:
                    session.print(beliefs.explain(names, count, dtype.name, args.op, reasons))
                pick = beliefs.pick(count, dtype, args.op)
                calibrated = beliefs.calibrated(count, dtype)
                made = []

                def empty(n, d):
                    made.append(_memory.shared_empty(n, d, comm=comm))
                    return made[-1]
                try:
                    got = compare_with_native(measure(
                        comm, ALLREDUCE, cases, count, dtype, args.op, inplace=inplace,
                        iters=args.iters, warmup=args.warmup, budget=args.budget,
                        empty=empty if args.shared else np.empty))
                finally:
                    for a in made:
                        _memory.release(a, comm=comm)
                for r in got:
                    if r["name"] == "auto" and tuning is not None:
                        r["tune_calls"], r["tune_time"] = tuning["calls"], tuning["time"]
                        r["tune_cost"] = max(0.0, tuning["time"] - tuning["calls"] * r["time"])
                        r["wrong"] = max(r["wrong"], tuning["wrong"])
                    predicted = pick if r["name"] == "auto" else r["name"]
                    mine = r["name"] != "native" and predicted is not None
                    r["pred_bare"] = beliefs.bare(predicted, count, dtype) if mine else None
                    r["pred"] = calibrated.get(predicted) if mine else None
                    if r["pred"] is None:
                        r["pred"] = r["pred_bare"]
                    r["pred_busbw"] = (None if not r["pred"] else busbw(
                        r["bytes"], r["pred"], ALLREDUCE.busbw_factor(nranks)))
                    r["auto"] = pick
                rows.extend(got)
                progress.step(f"{count} el {'ip' if inplace else 'oop'}")
    finally:
        _opts.set_check(previous_check)
        if args.params is not None:  # the communicator's own calibration again
            get_context(comm).put(_auto.KEY, previous)

    score = auto_score(rows, [n for n in names if n != "auto"])
    score["choice"] = "auto's decision" if "auto" in names else "the model's first choice"
    session.report.update(calibration=beliefs.flat, auto_score=score,
                          auto_calibration=state.flat.get("source"),
                          layout=state.layout.describe() if nranks > 1 else None)
    ours = [r for r in rows if r["name"] != "native"]
    if args.sweep:
        session.print(sweep_tables(rows, names, args.modes))
    elif ours:
        session.print(single_table(ours))
    if score["scored"]:
        session.print("\n" + score_table(score))
    bad = failures(rows)
    if bad:
        session.print(f"\n# FAILED: {len(bad)} runs with wrong elements, differing replicas "
                      f"or a modified input: " + ", ".join(sorted({r['name'] for r in bad})))
    if session.rank == 0 and args.plot:
        plot(rows, names, args.plot,
             f"allreduce {dtype.name} {args.op}, N={nranks}: measured busbw (points), "
             "model prediction (dashed, same colour)")
    return rows
