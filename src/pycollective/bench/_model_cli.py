"""Command line of the cost model, in the manner of ``python -m mpi4py.bench``.

    python -m pycollective.model lecture
    python -m pycollective.model table --M 1.5e9 --w 5e-11 --alpha 5e-6
    python -m pycollective.model table --M 1e6 --dtype float32      # this machine's calibration
    python -m pycollective.model show
    scripts/run_mpi.sh 4 -m pycollective.model calibrate
    scripts/run_mpi.sh 4 -m pycollective.model check

Each subcommand is a function ``(args, out) -> exit status``; only rank 0
prints, every rank returns the same status.
"""

import argparse
import json
import os
import sys
import warnings

import numpy as np
from mpi4py import MPI

from ..data.kernels import as_dtype
from ..runtime import registry as _registry
from ..runtime.root import bcast_from_root
from ._table import format_rows
from ._units import count_arg, parse_count, size_arg
from ._calibration import ALGORITHM_COUNTS, calibrate, measure_algorithms
from ..model.choice import choose, explain, rates
from ..model.formulas import predict_all
from ..model.lecture import LECTURE, lecture_cases, lecture_predict
from ..model.params import default_path, load_params, merge_calibration, params_for, save_params

__all__ = ["main"]

CHECK_COUNTS = tuple(10 ** k for k in range(8))  # 1 .. 1e7


def _number_arg(text):
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def _counts_arg(text):
    if text.strip().lower() == "none":
        return ()
    try:
        return tuple(parse_count(x) for x in text.split(",") if x)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ranks_arg(text):
    try:
        values = [parse_count(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"N values must be >= 1: {text!r}")
    return values


def _ms(t):
    return f"{t * 1e3:.6g}"


def _print_table(out, ns, count, alpha, w_or_beta, gamma, itemsize, formula):
    names = _registry.names()
    lecture_names = [n for n in names if n in LECTURE]
    if formula in ("lecture", "both"):
        print("lecture formulas (ms):", file=out)
        rows = []
        for n in ns:
            t = {a: lecture_predict(a, n, count, alpha=alpha, w=w_or_beta * itemsize)
                 for a in lecture_names}
            rows.append([n] + [_ms(t[a]) for a in lecture_names] + [min(t, key=t.get)])
        print(format_rows(["N"] + lecture_names + ["fastest"], rows), file=out)
    if formula in ("implementation", "both"):
        print(f"implementation model (ms), gamma = {gamma:g} s/B:", file=out)
        rows = []
        for n in ns:
            t = predict_all(n, int(count), alpha=alpha, beta=w_or_beta, gamma=gamma,
                            itemsize=itemsize)
            rows.append([n] + [_ms(t[a]) for a in names] + [min(t, key=t.get)])
        print(format_rows(["N"] + names + ["fastest"], rows), file=out)


def cmd_lecture(args, out):
    """The lecture's tables 7 and 8 and exercise 1, by its formulas and by ours."""
    for title, M, w, alpha, ns, quoted in lecture_cases():
        print(f"\n{title}", file=out)
        _print_table(out, ns, M, alpha, w, 0.0, 1, "both")
        for (name, n), t in quoted.items():
            got = lecture_predict(name, n, M, alpha=alpha, w=w)
            print(f"  lecture quotes {name} at N = {n}: {_ms(t)} ms; formula gives "
                  f"{_ms(got)} ms", file=out)
    return 0


def cmd_table(args, out):
    """Predicted times: from explicit parameters, or from this machine's calibration."""
    explicit = args.w is not None or args.bandwidth is not None or args.alpha is not None
    if explicit:
        if args.alpha is None:
            args.parser.error("--alpha is needed with explicit parameters")
        if args.w is not None:
            if args.bandwidth is not None or args.bytes_per_element is not None:
                args.parser.error("give either --w or --bytes-per-element with --bandwidth, "
                                  "not both")
            beta, itemsize = args.w, 1  # seconds per element, elements as the unit
        elif args.bandwidth and args.bytes_per_element:
            beta, itemsize = 1.0 / args.bandwidth, args.bytes_per_element
        else:
            args.parser.error("give --w, or --bytes-per-element and --bandwidth")
        M = 1.5e9 if args.M is None else args.M
        ns = args.N or [2 ** k for k in range(1, 11)]
        print(f"M = {M:g} elements, w = {beta * itemsize:g} s/element, alpha = {args.alpha:g} s",
              file=out)
        _print_table(out, ns, M, args.alpha, beta, args.gamma, itemsize, args.formula)
        return 0

    params = load_params(args.params)
    dtype = as_dtype(args.dtype)
    M = 10 ** 6 if args.M is None else args.M
    ns = args.N or sorted(int(n) for n in params.get("by_nranks") or {}) or [2, 4, 8]
    print(f"calibration: {params['source']}; M = {M} {dtype.name} elements", file=out)
    print("times in us: the bare alpha-beta-gamma model / the calibrated prediction "
          "(overhead + measured/model ratio x model), which auto minimises", file=out)
    names = _registry.names()
    rows = []
    for n in ns:
        flat = params_for(params, n)
        beta, gamma = rates(flat, M, dtype)
        bare = predict_all(n, M, alpha=flat["alpha"], beta=beta, gamma=gamma,
                           itemsize=dtype.itemsize)
        cal = explain(n, M, dtype, params)
        rows.append([n, f"{flat['alpha'] * 1e6:.3g}", f"{beta * 1e9:.3g}", f"{gamma * 1e9:.3g}"]
                    + [f"{bare[a] * 1e6:.4g}/{cal[a] * 1e6:.4g}" for a in names]
                    + [choose(n, M, dtype, "sum", params)])
    print(format_rows(["N", "alpha_us", "beta_ns/B", "gamma_ns/B"] + names + ["auto"], rows),
          file=out)
    return 0


def cmd_show(args, out):
    """The calibration in use, as JSON."""
    print(json.dumps(load_params(args.params), indent=1, sort_keys=True), file=out)
    return 0


def cmd_calibrate(args, out):
    """Measure alpha, beta, gamma and the algorithms' ratios on these ranks; save them."""
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if comm.Get_size() < 2:
        print("calibration needs several ranks: scripts/run_mpi.sh N -m pycollective.model "
              "calibrate", file=sys.stderr)
        return 2
    say = (lambda line: print(line, file=out, flush=True)) if not args.quiet else None
    if rank == 0 and say:
        library = MPI.Get_library_version().splitlines()[0]
        say(f"calibrating on {comm.Get_size()} ranks ({library})")
    counts = ALGORITHM_COUNTS if args.counts is None else args.counts
    entry = calibrate(comm, min_bytes=args.min_bytes, max_bytes=args.max_bytes,
                      factor=args.factor, reps=args.reps, counts=counts, log=say)

    def save():
        path = args.output or default_path()
        existing = None
        if os.path.exists(path) and not args.fresh:
            try:
                existing = load_params(path, keep_measurements=True)
            except ValueError as exc:
                warnings.warn(f"replacing unreadable calibration: {exc}")
        save_params(merge_calibration(existing, entry), path)
        print(f"saved N = {entry['nranks']} to {path}"
              + ("" if path == default_path() else
                 f" (use it with PYCOLLECTIVE_MODEL={path})"), file=out, flush=True)

    bcast_from_root(comm, save, what="saving the calibration")
    return 0


def cmd_check(args, out):
    """Time every algorithm now (float32 sum) and say whether auto's choice is within 10 %."""
    comm = MPI.COMM_WORLD
    n, rank = comm.Get_size(), comm.Get_rank()
    params = bcast_from_root(comm, lambda: load_params(args.params), what="calibration")
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
    print(f"N = {n}, float32 sum, calibration: {params['source']}", file=out, flush=True)
    print(format_rows(["count", "fastest", "time_us", "auto", "auto_us", "predicted_us",
                       "ratio", "within_10%"], rows), file=out, flush=True)
    print(f"auto within 10% of the fastest at {hits}/{len(counts)} sizes", file=out, flush=True)
    return 0


def build_parser():
    """The parser: one subcommand per function above."""
    p = argparse.ArgumentParser(
        prog="python -m pycollective.model",
        description="Predicted allreduce times from the alpha-beta-gamma model, the "
                    "lecture's examples, and calibration on this machine.",
        epilog="Examples:\n"
               "  python -m pycollective.model lecture\n"
               "  python -m pycollective.model table --M 1.5e9 --w 5e-11 --alpha 5e-6\n"
               "  python -m pycollective.model table --M 4e6 --bytes-per-element 4 "
               "--bandwidth 12.5e9 --alpha 5e-6 --N 512\n"
               "  python -m pycollective.model table --M 1e6 --dtype float32   "
               "(this machine's calibration)\n"
               "  scripts/run_mpi.sh 4 -m pycollective.model calibrate\n"
               "  scripts/run_mpi.sh 4 -m pycollective.model check",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    params_help = "calibration file (default: $PYCOLLECTIVE_MODEL or ~/.cache/pycollective/model.json)"

    s = sub.add_parser("lecture", help="the lecture's tables 7 and 8 and exercise 1")
    s.set_defaults(run=cmd_lecture)

    s = sub.add_parser("table", help="predicted times, from explicit parameters or the calibration")
    s.set_defaults(run=cmd_table)
    s.add_argument("--N", type=_ranks_arg, default=None,
                   help="comma-separated communicator sizes (default 2,4,...,1024; "
                        "with a calibration: the calibrated sizes)")
    s.add_argument("--M", type=count_arg, default=None, help="elements per rank, e.g. 1.5e9")
    s.add_argument("--w", type=_number_arg, help="seconds to transfer one element")
    s.add_argument("--bytes-per-element", type=count_arg,
                   help="bytes per element (with --bandwidth: w = bytes / bandwidth)")
    s.add_argument("--bandwidth", type=_number_arg, help="link bandwidth in bytes/s")
    s.add_argument("--alpha", type=_number_arg, help="seconds per message")
    s.add_argument("--gamma", type=_number_arg, default=0.0,
                   help="seconds per byte reduced (default 0, as in the lecture)")
    s.add_argument("--formula", choices=("lecture", "implementation", "both"), default="both",
                   help="which model to tabulate with explicit parameters (default both)")
    s.add_argument("--dtype", default="float32", help="dtype for the calibrated table")
    s.add_argument("--params", help=params_help)

    s = sub.add_parser("show", help="print the calibration in use")
    s.set_defaults(run=cmd_show)
    s.add_argument("--params", help=params_help)

    s = sub.add_parser("calibrate", help="measure on these ranks (run under MPI) and save")
    s.set_defaults(run=cmd_calibrate)
    s.add_argument("--output", help="file to save to (default: the default path)")
    s.add_argument("--fresh", action="store_true", help="drop calibrations of other N in the file")
    s.add_argument("--min-bytes", type=size_arg, default=4, help="smallest exchange (4)")
    s.add_argument("--max-bytes", type=size_arg, default=1 << 26, help="largest exchange (64M)")
    s.add_argument("--factor", type=count_arg, default=4, help="size step factor (4)")
    s.add_argument("--reps", type=count_arg, default=7, help="timed repetitions (7)")
    s.add_argument("--counts", type=_counts_arg, default=None,
                   help="element counts at which to time every algorithm (default "
                        "1,4,...,4^11; 'none' skips it)")
    s.add_argument("--quiet", action="store_true")

    s = sub.add_parser("check", help="time every algorithm now (run under MPI) and score auto")
    s.set_defaults(run=cmd_check)
    s.add_argument("--params", help=params_help)
    s.add_argument("--reps", type=count_arg, default=7, help="timed repetitions (7)")
    s.add_argument("--counts", type=_counts_arg, default=None,
                   help="element counts (default 1,10,...,1e7)")
    return p


def main(argv=None, out=None):
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.parser = parser
    out = sys.stdout if out is None else out
    return args.run(args, out)


if __name__ == "__main__":
    sys.exit(main())
