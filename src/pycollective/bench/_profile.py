"""Profiles of "shm" from the inside: the pieces of one small call, the phases of a large one.

This is the one module of the benchmark that reaches past the public API,
into the shared-memory primitives (:mod:`pycollective.node.group`,
:mod:`pycollective.node.cma`), the algorithm's own state
(:mod:`pycollective.algorithms.shm`), the fast path and the agreement step,
so that a missed speed target can be explained by where the time goes.

The phase breakdown replays :func:`~pycollective.algorithms.shm.allreduce.shm_allreduce`
step by step with a clock between the steps (the two paths: through the
shared window, and single copy with ``process_vm_readv``) and checks the
replayed result against native MPI, so a replay that drifted from the
algorithm shows as wrong elements.
"""

import statistics
import time

import numpy as np
from mpi4py import MPI

from ..collectives import agree as _agree, plans as _plans
from ..collectives import api as _api
from ..collectives import options as _opts
from ..node.atomics import CAN_SLEEP
from ..runtime.context import get_context
from ._exact import compare, fill_exact
from ..data.kernels import as_dtype, get_kernel
from ..data.ops import MPI_OPS
from ..data.partition import chunk_bounds
from ..node.group import copy_in, copy_out, reduce_block, reduce_own_slice
from ._table import format_table
from ._timing import calls_for_budget, rounds, slowest, timed_call
from ._units import count_arg
from ..algorithms.shm import allreduce as shm
from ..algorithms.shm.common import cross_reduce
from ..algorithms.shm.ways import Way
from ._args import add_data_options, check_exact, positive_int
from ._cli import command
from ._report import t_us

__all__ = ["pieces", "breakdown"]

_PIECE_REPS = 5
_WAITS = (False, True) if CAN_SLEEP else ()


def _waiting(barrier, sleep, fn):
    """``fn`` with the node's waits sleeping or spinning (switched only when that changes).

    Every rank switches at the start of a sample, after the Barrier that
    begins it, when no rank waits (see ``FlagBarrier.set_sleep``), so the
    modes can take turns in one run.
    """
    def run():
        if barrier.sleep != sleep or barrier.wakes != sleep:
            barrier.set_sleep(sleep)
        fn()
    return run


def _mode(sleep):
    return "waits sleep" if sleep else "waits spin"


def _shm_reason(session):
    """Why "shm" cannot be profiled on the session's communicator, or None (collective)."""
    reason = _opts.unusable_algorithms(session.comm).get("shm")
    if reason is None and session.nranks < 2:
        # allreduce returns at once on one rank; there is nothing to profile
        reason = "one rank: allreduce sends nothing"
    return reason


# --- the pieces of one small call -------------------------------------------

def pieces(session, seconds):
    """Time each piece of a 1-element ``allreduce(algorithm="shm")`` on its own.

    Args:
        session: the command's session (its communicator, its printing).
        seconds: about how long to spend on each piece.

    Returns:
        One row per piece (``kind="piece"``): the median over samples of the
        slowest rank's seconds per call; none when "shm" cannot run here.
    """
    comm = session.comm
    reason = _shm_reason(session)
    if reason:
        session.skip("pieces", f"they profile 'shm', which cannot run here: {reason}")
        return []
    ctx = get_context(comm)
    x = np.arange(1, dtype=np.float32) + session.rank
    out = np.empty_like(x)
    kernel = get_kernel("sum", x.dtype)

    def whole():
        _api.allreduce(x, out, MPI.SUM, comm=comm, algorithm="shm")

    previous = _opts.set_check(False)
    try:
        whole()  # builds the window and this shape's fast-path plan
        node = shm._state(ctx).node
        values = _agree.fact_values(ctx.rank, None, ())

        def region():
            offset, _ = node.begin(x.nbytes)
            node.slots(offset, x.nbytes, x.dtype)

        def copy_and_reduce():
            slots = node.slots(0, x.nbytes, x.dtype)
            slots[node.rank][...] = x
            reduce_block(kernel, slots, out)

        off, on = "allreduce(shm), agreement off", "allreduce(shm), agreement on"
        bound = "bound-call lookup (the same arrays)"
        steps = [  # (piece, what it is part of, call, agreement step on?)
            ("native comm.Allreduce", None, lambda: comm.Allreduce(x, out, op=MPI.SUM), False),
            (off, None, whole, False),
            ("shm algorithm alone", off, lambda: shm.shm_allreduce(ctx, x, out, kernel), False),
            ("fast-path lookup, out of place", off,
             lambda: _plans.lookup(x, out, MPI.SUM, comm, "shm", _api.DEFAULT), False),
            ("fast-path lookup, in place", off,
             lambda: _plans.lookup(MPI.IN_PLACE, out, MPI.SUM, comm, "shm", _api.DEFAULT),
             False),
            ("window region + slot views", off, region, False),
            ("copy-in + kernel", off, copy_and_reduce, False),
            ("flag barrier", off, node.group.sync, False),
            (on, None, whole, True),
            ("agreement (MAX over ranks)", on, lambda: _agree.agree_max(ctx, values), True),
            # found by the arrays' identity (plans.find_bound): the lookup of every repeated
            # call on the same arrays where the plan has a fast way (agreement on)
            (bound, on,
             lambda: _plans.find_bound(x, out, MPI.SUM, comm, "shm", _api.DEFAULT), True),
        ]
        rows = []
        progress = session.progress(len(steps))
        for name, within, fn, agree in steps:
            _opts.set_check(agree)
            for _ in range(20):  # a switch of the agreement step rebuilds state: not timed
                fn()
            if name == bound:
                whole()  # the full way: the switch above made the plan stale
                whole()  # found again: bound
                if fn() is None:
                    raise AssertionError("the call was not bound: the row would time a miss")
            inner = calls_for_budget(comm, fn, seconds / (_PIECE_REPS + 1), cap=100_000)
            timed_call(comm, fn, inner)  # warm-up
            times = rounds(comm, {name: fn}, _PIECE_REPS, inner)[name]
            rows.append(dict(kind="piece", name=name, within=within, nranks=session.nranks,
                             agree=agree, inner=inner, reps=_PIECE_REPS,
                             times=[float(t) for t in times], time=statistics.median(times)))
            progress.step(name[:24])
        rows += _wait_pieces(comm, session.nranks, node.group, whole, seconds)
    finally:
        _opts.set_check(previous)
    cols = [("piece of a 1-element shm call", lambda r: r["name"]),
            ("part of", lambda r: r["within"] or "-"),
            ("calls/sample", lambda r: str(r["inner"])),
            ("time(us)", lambda r: t_us(r["time"]))]
    session.print(format_table(cols, rows, prefix="# "))
    return rows


def _wait_pieces(comm, nranks, group, whole, seconds):
    """The call (agreement on) and the flag barrier with the waits spinning and sleeping.

    The two modes take turns sample by sample (:func:`rounds`), so load
    from other processes hits both alike.  Collective; the caller restores
    the agreement setting, this restores the waits.
    """
    if not _WAITS:
        return []
    barrier = group.barrier
    chosen = barrier.sleep, barrier.wakes
    _opts.set_check(True)
    calls, inner, agree = {}, {}, {}
    try:
        for name, fn, agreement in (("allreduce(shm), agreement on", whole, True),
                                    ("flag barrier", group.sync, False)):
            for sleep in _WAITS:
                label = f"{name}, {_mode(sleep)}"
                calls[label] = _waiting(barrier, sleep, fn)
                agree[label] = agreement
                comm.Barrier()  # nobody waits while the ranks switch
                for _ in range(20):
                    calls[label]()
                inner[label] = calls_for_budget(comm, calls[label], seconds / (_PIECE_REPS + 1),
                                                cap=100_000)
        times = rounds(comm, calls, _PIECE_REPS, inner)
    finally:  # rounds() ended in an Allreduce: no rank waits on the node any more
        barrier.set_sleep(*chosen)
    return [dict(kind="piece", name=label, within=None, nranks=nranks, agree=agree[label],
                 inner=inner[label], reps=_PIECE_REPS, times=[float(t) for t in t_all],
                 time=statistics.median(t_all)) for label, t_all in times.items()]


# --- the phases of one large call ---------------------------------------------

def _window_path(node, src, dst, kernel):
    """One call of the window path (messages above 4 KiB); seconds per phase."""
    nbytes, rank = dst.nbytes, node.rank
    offset, trailing = node.begin(nbytes)
    slots = node.slots(offset, nbytes, dst.dtype)
    bounds = chunk_bounds(dst.size, node.size)
    node.sync()  # a common start
    stamps = [time.perf_counter()]
    copy_in(src, slots[rank], rank, bounds)
    stamps.append(time.perf_counter())
    node.sync()
    stamps.append(time.perf_counter())
    reduce_own_slice(kernel, src, slots, rank, bounds, dst)
    stamps.append(time.perf_counter())
    node.sync()
    stamps.append(time.perf_counter())
    copy_out(dst, slots, rank, bounds)
    stamps.append(time.perf_counter())
    if trailing:
        node.sync()
    stamps.append(time.perf_counter())
    return np.diff(stamps)


_WINDOW = ["copy-in", "sync", "reduce (+ copy to dst)", "sync", "copy-out", "sync (above 1 MiB)"]


def _single_copy_path(cross, src, dst, kernel):
    """One call of the single-copy path (out of place); seconds per phase."""
    n, r = cross.size, cross.rank
    bounds = chunk_bounds(dst.size, n)
    itemsize = dst.itemsize
    cross.group.sync()  # a common start
    t0 = time.perf_counter()
    cross.publish(src, dst)
    cross.group.sync()
    t1 = time.perf_counter()
    lo, hi = bounds[r], bounds[r + 1]
    reducing = [0.0]

    def timed(a, b, out):  # shm's own loop (cross_reduce) with a clock around its kernel
        k = time.perf_counter()
        kernel(a, b, out)
        reducing[0] += time.perf_counter() - k
    cross_reduce(cross, src, dst[lo:hi], lo, hi, timed)
    reducing = reducing[0]
    t2 = time.perf_counter()
    cross.group.sync()
    t3 = time.perf_counter()
    for q in range(n):
        qlo, qhi = bounds[q], bounds[q + 1]
        if q != r and qhi > qlo:
            cross.read(q, cross.DST, qlo * itemsize, dst[qlo:qhi])
    t4 = time.perf_counter()
    cross.group.sync()
    t5 = time.perf_counter()
    return [t1 - t0, t2 - t1 - reducing, reducing, t3 - t2, t4 - t3, t5 - t4]


_SINGLE = ["publish addresses + sync", "reduce: process_vm_readv", "reduce: kernel", "sync",
           "copy-out process_vm_readv", "sync"]


def _replay(comm, run, target, reps, src, dst, expected, kernel):
    """``run`` ``reps`` + 1 times (the first untimed): per-phase medians of the slowest rank, #wrong."""
    times = []
    wrong = 0
    for rep in range(reps + 1):
        dst.fill(0)
        times.append(run(target, src, dst, kernel))
        wrong = max(wrong, compare(dst, expected)[0])
    worst = slowest(comm, times[1:])
    wrong = comm.allreduce(wrong, op=MPI.SUM)
    return np.median(worst, axis=0), wrong


def _breakdown_options(p):
    p.description = ("Where the time of one large 'shm' call goes: each phase of both of its "
                     "paths, replayed with a clock between the steps.")
    p.add_argument("--M", type=count_arg, nargs="+", default=[10 ** 7], metavar="COUNT",
                   help="elements per rank (1e7)")
    add_data_options(p)
    p.add_argument("--reps", type=positive_int, default=5, help="timed repetitions (5)")
    p.add_argument("--waits", action="store_true",
                   help="also time the call with the node's waits spinning and sleeping "
                        "(PYCOLLECTIVE_SHM_WAIT), taking turns with the others")


def _breakdown_check(args, parser, nranks):
    small = [m for m in args.M if m * as_dtype(args.dtype).itemsize <= shm.REPLICATE_BYTES]
    if small:
        parser.error(f"--M {small[0]}: the breakdown covers messages above "
                     f"{shm.REPLICATE_BYTES} bytes (smaller ones take one sync and no phases)")
    check_exact(parser, args, nranks)


@command("breakdown", "where the time of one large 'shm' call goes, phase by phase",
              options=_breakdown_options, check=_breakdown_check)
def breakdown(args, session):
    """One row per (path, phase) and one per whole call (``path="call"``), per size."""
    comm, rank, nranks = session.comm, session.rank, session.nranks
    reason = _shm_reason(session)
    if reason:
        session.skip("shm", reason)
        return []
    state = shm._state(get_context(comm))
    dtype = as_dtype(args.dtype)
    kernel = get_kernel(args.op, dtype)
    rows = []
    progress = session.progress(len(args.M))
    for count in args.M:
        src = np.empty(count, dtype)
        fill_exact(src, rank, nranks, args.op)
        expected = np.empty_like(src)
        dst = np.empty_like(src)
        comm.Allreduce(src, expected, op=MPI_OPS[args.op])

        def native():
            comm.Allreduce(src, dst, op=MPI_OPS[args.op])

        def whole():
            _api.allreduce(src, dst, args.op, comm=comm, algorithm="shm")

        for _ in range(Way.LAST_TRIAL):  # above 1 MiB the size's first calls try both ways
            whole()
        contenders = {"native": native, "shm": whole}
        if args.waits:
            barrier = state.node.group.barrier
            chosen = barrier.sleep, barrier.wakes
            contenders.update({f"shm, {_mode(sleep)}": _waiting(barrier, sleep, whole)
                               for sleep in _WAITS})
        try:
            calls = rounds(comm, contenders, args.reps)
        finally:
            if args.waits:  # after rounds()' Allreduce: no rank waits on the node
                barrier.set_sleep(*chosen)
        whole()
        single = state.single_copy(dst.nbytes)  # the way the calls above took (chose)
        wrong = comm.allreduce(compare(dst, expected)[0], op=MPI.SUM)
        base = dict(nranks=nranks, count=count, dtype=dtype.name)
        for name, times in calls.items():
            rows.append(dict(base, path="call", phase=name, time=statistics.median(times),
                             share=None, used=True, wrong=wrong if name == "shm" else 0))
        paths = [("window", _window_path, _WINDOW, state.node, not single)]
        if state.cross is not None:
            paths.append(("single-copy", _single_copy_path, _SINGLE, state.cross, single))
        for label, run, phases, target, used in paths:
            medians, wrong = _replay(comm, run, target, args.reps, src, dst, expected, kernel)
            total = float(medians.sum())
            for phase, t in zip(phases, medians):
                rows.append(dict(base, path=label, phase=phase, time=float(t),
                                 share=float(t) / total if total > 0 else None, used=used,
                                 wrong=wrong))
        progress.step(f"{count} el")
        _print_breakdown(session, [r for r in rows if r["count"] == count], count, dtype)
    return rows


def _print_breakdown(session, rows, count, dtype):
    calls = {r["phase"]: r["time"] for r in rows if r["path"] == "call"}
    session.print(f"# shm on {session.nranks} ranks, M={count} {dtype.name}: one call "
                  f"{t_us(calls['shm'])} us, native {t_us(calls['native'])} us "
                  "(medians of the slowest rank)")
    modes = [name for name in calls if name.startswith("shm, ")]
    if modes:
        session.print("# the same call, taking turns: " + ", ".join(
            f"{name} {t_us(calls[name])} us" for name in modes))
    phases = [r for r in rows if r["path"] != "call"]
    cols = [("path", lambda r: r["path"] + (" (used)" if r["used"] else "")),
            ("phase", lambda r: r["phase"]), ("time(us)", lambda r: t_us(r["time"])),
            ("share", lambda r: "-" if r["share"] is None else f"{100 * r['share']:.1f}%"),
            ("#wrong", lambda r: str(r["wrong"]))]
    session.print(format_table(cols, phases, prefix="# "))
    for label in dict.fromkeys(r["path"] for r in phases):
        total = sum(r["time"] for r in phases if r["path"] == label)
        session.print(f"# {label}: the phases add up to {t_us(total)} us (each phase's "
                      "slowest rank, so more than one call)")
