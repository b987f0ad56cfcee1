"""Speed studies beside the standard sweep: ``membw``, ``latency`` and ``segments``.

    python -m pycollective.bench membw                 # the memory-traffic floor
    python -m pycollective.bench latency --inner 200   # small calls, back to back
    python -m pycollective.bench segments --M 1e7      # ring_pipelined's segment size

Each compares with native MPI or with the machine in the same run, as the
allreduce command does: the ratios are the result, the absolute numbers move
with the load of a shared machine.
"""

import statistics
import time

import numpy as np
from mpi4py import MPI

from ..collectives import api as _api
from ..collectives import options as _opts
from ._table import fmt_num, format_table
from ._timing import idle_barrier
from ._units import bytes_label, count_arg, size_arg
from ..algorithms import ring_pipelined
from ..data.kernels import as_dtype
from ._allreduce import ALLREDUCE, algorithm_case, compare_with_native, usable
from ._args import (add_algorithms_argument, add_data_options, check_exact, expand_algorithms,
                    positive_int, seconds_arg)
from ._cli import command
from ._harness import Case, measure
from ._profile import pieces
from ._report import t_us

__all__ = ["membw", "latency", "segments", "FLOOR_TRAFFIC"]

#: Bytes of memory traffic per payload byte that any allreduce on one node
#: moves on each rank at least: read its input, read the others' data, write
#: its output.
FLOOR_TRAFFIC = 3


# --- membw ------------------------------------------------------------------

def _membw_options(p):
    p.description = ("Memory bandwidth with every rank copying at once, and with rank 0 "
                     "copying alone: the floor under any allreduce on one node.")
    p.add_argument("--bytes", type=size_arg, default=256 << 20, metavar="SIZE",
                   help="bytes each rank copies per repetition (256M)")
    p.add_argument("--reps", type=positive_int, default=5, help="timed repetitions (5)")
    p.add_argument("--M", type=count_arg, nargs="+", default=[10 ** 7, 3 * 10 ** 7],
                   metavar="COUNT", help="float32 allreduce sizes to give the floor of (1e7 3e7)")


def _membw_check(args, parser, nranks):
    if args.bytes < 1:
        parser.error("--bytes must be at least 1")


_MEMBW_EPILOG = """\
A numpy copy reads and writes every byte, so traffic = 2 x bytes / time.
'together': every rank copies at the same time (what an allreduce on all
ranks competes for); its time is the span from the first rank's start to
the last rank's end on the node's clock, so where ranks outnumber cores
and take turns, the rate is what all cores together move.  'alone': rank 0
copies while the others sleep.  Times are medians over repetitions.  The
floor of an allreduce is 3 bytes of traffic per payload byte per rank (read
the input, read the others' data, write the output) at the 'together' rate;
it is conservative, since a copy also pays a read-for-ownership of its
destination.
"""

def _node_clock_ok(comm) -> bool:
    """Whether every rank reads the same monotonic clock (one host), agreed."""
    names = comm.allgather(MPI.Get_processor_name())
    return len(set(names)) == 1


def _copy_times(comm, a, b, reps, same_clock):
    """Per repetition: ('together' span, 'alone' rank 0's time), the same on every rank."""
    out = np.empty((reps, 2))
    for i in range(reps):
        idle_barrier(comm)
        t0 = time.perf_counter()
        np.copyto(b, a)
        t1 = time.perf_counter()
        if same_clock:
            starts, ends = zip(*comm.allgather((t0, t1)))
            out[i, 0] = max(ends) - min(starts)
        else:  # no common clock: the slowest rank's own time
            out[i, 0] = comm.allreduce(t1 - t0, op=MPI.MAX)
        idle_barrier(comm)
        if comm.rank == 0:
            t0 = time.perf_counter()
            np.copyto(b, a)
            lone = time.perf_counter() - t0
        idle_barrier(comm)
        out[i, 1] = comm.bcast(lone if comm.rank == 0 else None, root=0)
    return out


@command("membw", "memory bandwidth of every rank copying at once: the allreduce floor",
              options=_membw_options, check=_membw_check, epilog=_MEMBW_EPILOG)
def membw(args, session):
    """Rows ``together`` and ``alone``: seconds per copy and bytes of traffic per second."""
    comm, nranks = session.comm, session.nranks
    a = np.ones(args.bytes, np.uint8)
    b = np.empty_like(a)
    np.copyto(b, a)  # first touch of the destination stays out of the timing
    times = _copy_times(comm, a, b, args.reps, _node_clock_ok(comm))
    rows = []
    for j, (name, copiers) in enumerate((("together", nranks), ("alone", 1))):
        t = statistics.median(times[:, j])
        traffic = 2 * args.bytes / t / 1e9 if t > 0 else float("nan")
        rows.append(dict(name=name, nranks=nranks, copiers=copiers, bytes=args.bytes,
                         reps=args.reps, times=[float(x) for x in times[:, j]], time=float(t),
                         traffic=traffic, total_traffic=traffic * copiers))
    cols = [("copying", lambda r: r["name"]), ("ranks", lambda r: str(r["copiers"])),
            ("bytes", lambda r: bytes_label(r["bytes"])), ("time(us)", lambda r: t_us(r["time"])),
            ("GB/s per rank", lambda r: fmt_num(r["traffic"])),
            ("GB/s total", lambda r: fmt_num(r["total_traffic"]))]
    session.print(format_table(cols, rows, prefix="# "))
    per_rank = rows[0]["traffic"] * 1e9
    for count in args.M:
        floor = FLOOR_TRAFFIC * 4 * count / per_rank
        session.print(f"# allreduce floor, M={count} float32 on {nranks} ranks: "
                      f"{FLOOR_TRAFFIC} x {4 * count} B / {fmt_num(per_rank / 1e9)} GB/s "
                      f"= {t_us(floor)} us")
    session.report["floor_traffic"] = FLOOR_TRAFFIC
    return rows


# --- latency ------------------------------------------------------------------

def _latency_options(p):
    p.description = ("Small messages: the pieces of one 1-element 'shm' call, then every "
                     "algorithm and native MPI timed over back-to-back calls.")
    add_algorithms_argument(p)
    p.add_argument("--M", type=count_arg, nargs="+", default=[1, 1000], metavar="COUNT",
                   help="elements per rank (1 1000)")
    add_data_options(p)
    p.add_argument("--inner", type=positive_int, default=100,
                   help="back-to-back calls per timed sample (100)")
    p.add_argument("--iters", "-n", type=positive_int, default=10,
                   help="timed samples per algorithm and size (10)")
    p.add_argument("--warmup", "-w", type=count_arg, default=20,
                   help="single calls before timing, each one checked (20)")
    p.add_argument("--agree", choices=["on", "off", "both"], default="on",
                   help="pycollective's cross-rank agreement step during the calls (on)")
    p.add_argument("--no-pieces", action="store_true", help="skip the pieces of one call")
    p.add_argument("--piece-time", type=seconds_arg, default=0.2, metavar="SECONDS",
                   help="time spent on each piece (0.2)")


def _latency_check(args, parser, nranks):
    args.algorithms = expand_algorithms(args.algorithms)
    check_exact(parser, args, nranks)


_LATENCY_EPILOG = """\
A sample is --inner calls back to back, divided by --inner (how latency
benchmarks such as OSU time calls shorter than the skew a barrier leaves
between ranks); time(us) is the median over samples of the slowest rank's
time per call.  ratio = native time / our time, from the same run.  The
pieces are timed one at a time in loops of their own, so they add up to
less than a whole call (the cache lines that travel between ranks in a
real call are not all there).
"""


@command("latency", "small calls: the pieces of one call, then back-to-back timing",
              options=_latency_options, check=_latency_check, epilog=_LATENCY_EPILOG)
def latency(args, session):
    """Piece rows (``kind="piece"``), then one measurement row per algorithm, size and agreement."""
    comm = session.comm
    dtype = as_dtype(args.dtype)
    names, _ = usable(args.algorithms, session)
    rows = [] if args.no_pieces else pieces(session, args.piece_time)
    cases = [algorithm_case(n) for n in names]
    agrees = {"on": [True], "off": [False], "both": [True, False]}[args.agree]
    progress = session.progress(len(agrees) * len(args.M))
    calls = []
    previous = _opts.set_check(True)
    try:
        for agree in agrees:
            _opts.set_check(agree)
            for count in args.M:
                got = compare_with_native(measure(
                    comm, ALLREDUCE, cases, count, dtype, args.op, iters=args.iters,
                    warmup=args.warmup, inner=args.inner))
                for r in got:
                    r.update(kind="call", agree=agree)
                calls.extend(got)
                progress.step(f"{count} el agree {'on' if agree else 'off'}")
    finally:
        _opts.set_check(previous)
    cols = [("algorithm", lambda r: r["name"]), ("N", lambda r: str(r["nranks"])),
            ("M", lambda r: str(r["count"])), ("agree", lambda r: "on" if r["agree"] else "off"),
            ("inner", lambda r: str(r["inner"])), ("iters", lambda r: str(r["iters"])),
            ("time(us)", lambda r: t_us(r["time"])), ("native(us)", lambda r: t_us(r["native_time"])),
            ("ratio", lambda r: fmt_num(r["ratio"])), ("#wrong", lambda r: str(r["wrong"])),
            ("same", lambda r: "yes" if r["identical"] else "NO")]
    session.print(format_table(cols, [r for r in calls if r["name"] != "native"], prefix="# "))
    return rows + calls


# --- segments -----------------------------------------------------------------

def _segments_options(p):
    p.description = ("ring_pipelined at several segment sizes, taking turns in one run, "
                     "against native MPI.")
    p.add_argument("--M", type=count_arg, nargs="+", default=[10 ** 7], metavar="COUNT",
                   help="elements per rank (1e7)")
    p.add_argument("--segments", type=size_arg, nargs="+", metavar="SIZE",
                   default=[64 << 10, 256 << 10, 1 << 20, 4 << 20],
                   help="segment sizes in bytes (64K 256K 1M 4M)")
    add_data_options(p)
    p.add_argument("--iters", "-n", type=positive_int, default=5, help="timed repetitions (5)")
    p.add_argument("--warmup", "-w", type=count_arg, default=1,
                   help="untimed repetitions before timing (1)")


def _segments_check(args, parser, nranks):
    if min(args.segments) < 1:
        parser.error("a segment must be at least 1 byte")
    args.segments = list(dict.fromkeys(args.segments))
    check_exact(parser, args, nranks)


def _segment_case(nbytes):
    def run(comm, sendbuf, recvbuf, op):
        # Every rank runs the cases in the same order, so the setting agrees.
        ring_pipelined.set_segment_bytes(nbytes)
        _api.allreduce(sendbuf, recvbuf, op, comm=comm, algorithm="ring_pipelined")
    return Case(f"ring_pipelined/{bytes_label(nbytes)}", run)


@command("segments", "ring_pipelined's segment size: several sizes in one run",
              options=_segments_options, check=_segments_check)
def segments(args, session):
    """One measurement row per size and segment (and native), with ``segment_bytes``."""
    comm = session.comm
    names, _ = usable(["ring_pipelined"], session)
    if not names:
        return []
    cases = [_segment_case(s) for s in args.segments]
    segment_of = {c.name: s for c, s in zip(cases, args.segments)}
    previous = ring_pipelined.get_segment_bytes()
    progress = session.progress(len(args.M))
    rows = []
    try:
        for count in args.M:
            got = compare_with_native(measure(
                comm, ALLREDUCE, cases, count, as_dtype(args.dtype), args.op,
                iters=args.iters, warmup=args.warmup))
            for r in got:
                r["segment_bytes"] = segment_of.get(r["name"])
            rows.extend(got)
            progress.step(f"{count} el")
    finally:
        ring_pipelined.set_segment_bytes(previous)
    cols = [("segment", lambda r: bytes_label(r["segment_bytes"]) if r["segment_bytes"]
             else "native"),
            ("N", lambda r: str(r["nranks"])), ("M", lambda r: str(r["count"])),
            ("time(us)", lambda r: t_us(r["time"])), ("busbw", lambda r: fmt_num(r["busbw"])),
            ("ratio", lambda r: fmt_num(r["ratio"])), ("#wrong", lambda r: str(r["wrong"]))]
    session.print(format_table(cols, rows, prefix="# "))
    session.print(f"# ratio = native time / time; the default segment is "
                  f"{bytes_label(previous)} (PYCOLLECTIVE_SEGMENT_BYTES)")
    return rows
