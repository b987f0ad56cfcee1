"""``python -m pycollective.bench compress``: compressed allreduce against uncompressed, and its error.

    scripts/run_mpi.sh 2 -m pycollective.bench compress                 # M = 1e5 ... 1e8
    scripts/run_mpi.sh 4 -m pycollective.bench compress --M 1e6 1e7 --algorithm tree

For every size, float32 gradients-like data (normal values scaled over
2^-20 .. 2^12, different on every rank) are summed three ways, taking turns
in every repetition: uncompressed, ``compress="fp16"`` and
``compress="bf16"`` (:mod:`pycollective.compression`).  Reported per way:
bytes each rank sends along the algorithm's critical path (the cost model's
count, :func:`pycollective.model.formulas.terms`, with the wire's element
size), the median time (slowest rank), its ratio to uncompressed, and the
error against the float64 sum of the same data: the largest error relative
to the sum of magnitudes Σ|x| (a sum that cancels has no meaningful relative
error), and the largest ratio of the error to the stated bound
(:meth:`pycollective.compression.Cast.error_bound`) -- above 1 on any element
counts as wrong, and so do results that differ between ranks (CRC-32
compared); the exit status is then 1.
"""

import statistics
import zlib

import numpy as np
from mpi4py import MPI

from ..collectives import api as _api
from ..collectives import options as _opts
from .. import compression
from ._table import fmt_num, format_table
from ._timing import rounds
from ._units import count_arg
from ..model.formulas import terms
from ._args import positive_int
from ._cli import command
from ._report import t_us

__all__ = ["compress"]

WAYS = ("none", "fp16", "bf16")
_BLOCK = 1 << 22  # elements per block when checking against the float64 sum


def _data(rank, count, seed=11):
    """Rank-specific float32 data, magnitudes over 2^-20 .. 2^12, signs mixed."""
    rng = np.random.default_rng([seed, rank, count])
    out = np.empty(count, np.float32)
    for s in range(0, count, _BLOCK):
        e = min(count, s + _BLOCK)
        out[s:e] = rng.standard_normal(e - s) * np.exp2(rng.uniform(-20, 12, e - s))
    return out


def _errors(comm, x, got, way):
    """(largest error / Σ|x|, largest error/bound, #elements over the bound) over ranks."""
    compressor = compression.resolve(way)
    rel = ratio = 0.0
    over = 0
    for s in range(0, x.size, _BLOCK):
        wide = x[s:s + _BLOCK].astype(np.float64)
        exact = np.empty_like(wide)
        comm.Allreduce(wide, exact, op=MPI.SUM)
        absum = np.empty_like(wide)
        comm.Allreduce(np.abs(wide), absum, op=MPI.SUM)
        err = np.abs(got[s:s + _BLOCK].astype(np.float64) - exact)
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = max(rel, float(np.nanmax(err / absum)) if err.size else 0.0)
        if compressor is not None:
            bound = compressor.error_bound(absum, comm.Get_size())
            ratio = max(ratio, float(np.max(err / bound)) if err.size else 0.0)
            over += int(np.count_nonzero(~(err <= bound)))
    rel = comm.allreduce(rel, op=MPI.MAX)
    ratio = comm.allreduce(ratio, op=MPI.MAX)
    over = comm.allreduce(over, op=MPI.SUM)
    return rel, ratio, over


def _options(p):
    p.description = ("Compressed allreduce (fp16/bf16 on the wire, float64 accumulation) "
                     "against uncompressed float32: bytes, time and error against the bound.")
    p.add_argument("--M", type=count_arg, nargs="+", default=[10 ** 5, 10 ** 6, 10 ** 7, 10 ** 8],
                   metavar="COUNT", help="float32 elements per rank (1e5 1e6 1e7 1e8)")
    p.add_argument("--algorithm", default="ring", choices=_opts.algorithms(),
                   help="the allreduce algorithm, the same for all three (ring)")
    p.add_argument("--reps", type=positive_int, default=5, help="timed repetitions (5)")


@command("compress", "compressed allreduce (fp16/bf16 on the wire) vs float32: bytes, time, "
         "error against the stated bound", options=_options, epilog=__doc__.split("\n\n", 2)[2])
def compress(args, session):
    """One row per (M, way); collective."""
    comm, n = session.comm, session.nranks
    reasons = _opts.unusable_algorithms(comm)
    if args.algorithm in reasons:
        session.skip(args.algorithm, reasons[args.algorithm])
        return []
    rows = []
    for count in args.M:
        x = _data(session.rank, count)
        outs = {way: np.empty_like(x) for way in WAYS}

        def call(way):
            return lambda: _api.allreduce(x, outs[way], comm=comm, algorithm=args.algorithm,
                                          compress=None if way == "none" else way)
        calls = {way: call(way) for way in WAYS}
        for fn in calls.values():
            fn()  # warm-up: kernels, contexts, first touch
        times = rounds(comm, calls, args.reps)
        base = statistics.median(times["none"])
        for way in WAYS:
            itemsize = 4 if way == "none" else 2
            sent = terms(args.algorithm, n, count, itemsize)[1] if n > 1 else 0.0
            rel, ratio, over = _errors(comm, x, outs[way], way)
            crcs = comm.allgather(zlib.crc32(outs[way].view(np.uint8)))
            t = statistics.median(times[way])
            rows.append(dict(name=way, nranks=n, count=count, algorithm=args.algorithm,
                             bytes=sent, times=[float(v) for v in times[way]], time=t,
                             speedup=base / t if t > 0 else float("nan"),
                             max_error_over_abs_sum=rel,
                             error_over_bound=ratio if way != "none" else None, wrong=over,
                             identical=len(set(crcs)) == 1))
        session.print(f"# M = {count}: done")
    columns = [("M", lambda r: r["count"]), ("wire", lambda r: r["name"]),
               ("bytes sent", lambda r: f"{r['bytes']:.0f}"),
               ("time(us)", lambda r: t_us(r["time"])),
               ("speed-up", lambda r: fmt_num(r["speedup"])),
               ("max err/sum|x|", lambda r: f"{r['max_error_over_abs_sum']:.2e}"),
               ("err/bound", lambda r: fmt_num(r["error_over_bound"])),
               ("#over", lambda r: r["wrong"])]
    session.print(f"# {args.algorithm} allreduce of float32 data on {n} ranks; 'none' sends "
                  "float32; speed-up = time(none) / time; err/bound <= 1 required")
    session.print(format_table(columns, rows, prefix="# "))
    return rows
