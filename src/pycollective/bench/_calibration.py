"""Calibration: measure α, β, γ and every algorithm's measured/model ratio on this machine.

``scripts/run_mpi.sh N -m pycollective.model calibrate`` measures, with all
N ranks busy at once as they are inside an allreduce: α and β from ring
exchanges (``Sendrecv`` to the right neighbour, from the left) over a range
of message sizes, by least squares on relative error (α from the small
sizes, β from those out of cache), γ per dtype from the reduction kernels,
β and γ also per size (a shared-memory node moves cached data several times
faster than data from memory).  On a communicator that spans nodes the
exchanges are made twice: inside every node at once (the links inside a
node) and around a ring of one rank per node (the links between nodes).
Then it times every registered algorithm through the public
``pycollective.allreduce`` at sizes 1..4^11 and stores, per algorithm and
size, measured ÷ model: the model is only a model.
"""

import datetime
import math

import numpy as np
from mpi4py import MPI

from . import _timing
from ._about import environment
from ..collectives.auto import layout_of
from ..collectives.api import allreduce
from ..collectives.options import usable_algorithms
from ..runtime.context import get_context
from ..node.group import node_comm
from ..data.kernels import get_kernel
from ._units import bytes_label
from ..algorithms._p2p import sendrecv
from ..model.fit import fit_alpha_beta, fit_corrections, fit_two_regimes, per_byte_curve

__all__ = ["calibrate", "measure_algorithms", "ALGORITHM_COUNTS", "CALIBRATED_DTYPES"]


def _sizes(lo, hi, factor):
    out, s = [], lo
    while s <= hi:
        out.append(int(s))
        s *= factor
    return out


def _steps(nbytes, budget=1 << 22):
    return max(2, min(64, budget // max(nbytes, 1024)))


def _per_call(comm, body, steps, reps):
    """Lower quartile over ``reps`` samples (after one warm-up) of the slowest rank's time."""
    samples = _timing.rounds(comm, {"body": body}, reps + 1, steps)["body"]
    return _timing.lower_quartile(samples[1:])


CALIBRATED_DTYPES = ("float32", "float64", "float16", "int32", "int64")


def measure_algorithms(comm, counts, *, dtype="float32", reps=5, names=None, budget=0.25,
                       most=40):
    """Time ``pycollective.allreduce`` with every algorithm at every count (collective).

    Each sample is one call after a ``Barrier``, the slowest rank's time, as
    the bench times a call (and as a call between two steps of a training
    loop runs: back-to-back calls would overlap the ranks' skew and look
    faster); the result is the median of the samples, again as the bench
    reports it.  Algorithms take turns within each repetition, so a burst of
    load from another process hits all of them rather than one.  There are
    ``reps`` repetitions, more (up to ``most``) where all calls of a
    repetition together take less than ``budget`` seconds.  ``overhead`` is
    the time of a call with count 0: the argument checks and the agreement
    step that every call pays, whatever the algorithm.

    Returns:
        ``{"overhead": seconds, "times": {name: [[count, seconds], ...]}}``.
    """
    names = list(usable_algorithms(comm) if names is None else names)
    dtype = np.dtype(dtype)
    rank = comm.Get_rank()
    empty, empty_out = np.empty(0, dtype), np.empty(0, dtype)
    times = {name: [] for name in names}
    overhead = None
    for count in counts:
        x = ((np.arange(count) % 251) + rank).astype(dtype)
        out = np.empty_like(x)
        calls = {name: (lambda name=name: allreduce(x, out, comm=comm, algorithm=name))
                 for name in names}
        if overhead is None:  # take turns with the first count's calls
            calls[""] = lambda: allreduce(empty, empty_out, comm=comm, algorithm=names[0])
        # one warm-up call of each, whose time sizes the repetitions
        one = _timing.slowest(comm, [_timing.timed_call(comm, fn) for fn in calls.values()])
        count_reps = max(reps, min(most, int(budget / max(float(one.sum()), 1e-9))))
        samples = _timing.rounds(comm, calls, count_reps)
        if overhead is None:
            # Every call pays it, so it cannot exceed the fastest first-count call.
            overhead = min(float(np.median(samples.pop(""))),
                           min(float(np.median(v)) for v in samples.values()))
        for name in names:
            times[name].append([int(count), float(np.median(samples[name]))])
    return {"overhead": overhead or 0.0, "times": times}


ALGORITHM_COUNTS = tuple(4 ** k for k in range(12))  # 1 .. 4194304 elements


def _exchange(comm, ring, sizes, reps, say, where):
    """``[[bytes, seconds]]`` of ring exchanges on ``ring`` (None: this rank idles).

    Collective over ``comm``: every rank times the same steps, so the
    slowest rank's time is that of the ring's ranks.
    """
    rows = []
    if ring is not None:
        rank, size = ring.Get_rank(), ring.Get_size()
        right, left = (rank + 1) % size, (rank - 1) % size
    for n in sizes:
        # Fresh arrays of exactly n bytes, as an allreduce's buffers are:
        # slices of one huge (huge-page backed) buffer move 2x faster here.
        sbuf = (np.arange(n) % 251).astype(np.uint8)
        rbuf = np.empty(n, np.uint8)

        def body(sbuf=sbuf, rbuf=rbuf):
            if ring is not None:
                sendrecv(ring, sbuf, right, rbuf, left, 7)
        t = _per_call(comm, body, _steps(n), reps)
        rows.append([n, t])
        say(f"  exchange {where}{n:>10d} B  {t * 1e6:12.2f} us")
        del sbuf, rbuf
    return rows


def calibrate(comm=None, *, min_bytes=4, max_bytes=1 << 26, factor=4, reps=7,
              dtypes=CALIBRATED_DTYPES, counts=ALGORITHM_COUNTS, log=None):
    """Measure α, β, γ and each algorithm's measured/model ratios on ``comm`` (collective).

    α and β come from ring exchanges of n bytes (every rank ``Sendrecv``s to
    its right neighbour and from its left one at the same time, through the
    same helper the algorithms use): α fitted on the sizes up to 64 KiB, β
    on those from 1 MiB (:func:`fit_two_regimes`).  γ for each dtype is the
    time per byte of its ``sum`` kernel, run on every rank at once, at the
    largest size (out of cache).  Both are also kept per size, as curves.
    Then every registered algorithm is timed at ``counts`` float32 elements
    (:func:`measure_algorithms`) and compared with the model
    (:func:`fit_corrections`).  Times are the slowest rank's: for the
    exchanges and kernels, lower quartiles of ``reps`` repetitions (other
    processes only ever add time); for the algorithms, the median of single
    calls after a barrier, as the bench measures them.

    Args:
        comm: an mpi4py intracommunicator with at least 2 ranks; None means
            ``MPI.COMM_WORLD``.
        min_bytes, max_bytes, factor: message sizes min_bytes·factor^k.
        reps: timed repetitions per size (after a warm-up).
        dtypes: dtypes whose γ to measure; the first one gives ``gamma``.
        counts: element counts at which to time the algorithms (at least
            two), or empty to skip that step (then the bare model is used).
        log: callable receiving progress lines (on rank 0), or None.

    Returns:
        The calibration of this N as a dict: ``nranks``, ``alpha``, ``beta``,
        ``gamma``, ``gamma_by_dtype``, ``residual`` (RMS relative error of the
        α-β fit over all sizes), ``beta_curve`` and ``gamma_curves`` (per-byte
        time by size), ``overhead``, ``corrections`` (measured/model ratios
        per algorithm and size, :func:`fit_corrections`), the raw
        ``exchange``, ``kernel`` and ``algorithms`` measurements, and a
        description of the machine and MPI library.

    Raises:
        ValueError: on a communicator of one rank, or bad sizes.
    """
    comm = MPI.COMM_WORLD if comm is None else comm
    size, rank = comm.Get_size(), comm.Get_rank()
    if size < 2:
        raise ValueError("calibration needs at least 2 ranks (run it under mpiexec -n N)")
    if not 1 <= min_bytes < max_bytes or factor < 2:
        raise ValueError("need 1 <= min_bytes < max_bytes and factor >= 2")
    if len([n for n in _sizes(min_bytes, max_bytes, factor) if n >= 16]) < 2:
        raise ValueError("the size range must hold at least two sizes of 16 bytes or more")
    if len(counts) == 1:
        raise ValueError("give at least two counts to compare the algorithms with, or none")
    say = log if (log is not None and rank == 0) else (lambda line: None)
    layout = layout_of(get_context(comm))
    comm = comm.Dup()  # our messages never meet the caller's
    try:
        sizes = _sizes(min_bytes, max_bytes, factor)
        node, whole = node_comm(comm)
        leaders = comm.Split(0 if node.Get_rank() == 0 else MPI.UNDEFINED, rank)
        inter = None
        try:
            if whole:
                exchange = _exchange(comm, comm, sizes, reps, say, "")
            else:
                # Inside every node at once (nothing to measure if no node has two
                # ranks), then between the nodes' first ranks, the others idle.
                inside = comm.allreduce(node.Get_size(), op=MPI.MAX) > 1
                exchange = (_exchange(comm, node if node.Get_size() > 1 else None, sizes, reps,
                                      say, "inside nodes ") if inside else None)
                between = _exchange(comm, leaders if leaders != MPI.COMM_NULL else None, sizes,
                                    reps, say, "between nodes ")
                a, b, _ = fit_two_regimes(*zip(*between))
                inter = {"alpha": a, "beta": b}
                say(f"  between nodes: alpha = {a * 1e6:.3f} us, beta = {b * 1e9:.4f} ns/B "
                    f"({1e-9 / b if b else math.inf:.2f} GB/s)")
                if exchange is None:
                    exchange = between
        finally:
            node.Free()
            if leaders != MPI.COMM_NULL:
                leaders.Free()
        alpha, beta, residual = fit_two_regimes(*zip(*exchange))
        beta_curve = per_byte_curve(exchange, alpha)
        say(f"  alpha = {alpha * 1e6:.3f} us, beta = {beta * 1e9:.4f} ns/B "
            f"({1e-9 / beta if beta else math.inf:.2f} GB/s), rms rel. residual {residual:.1%}")

        kernel_sizes = [n for n in sizes if n >= 16]  # at least 2 elements of any dtype
        gamma_by_dtype, gamma_curves, kernel = {}, {}, {}
        for dt in map(np.dtype, dtypes):
            k = get_kernel("sum", dt)
            rows = []
            for n in kernel_sizes:
                m = n // dt.itemsize
                av, bv, ov = np.ones(m, dt), np.ones(m, dt), np.empty(m, dt)
                rows.append([m * dt.itemsize, _per_call(
                    comm, lambda k=k, av=av, bv=bv, ov=ov: k(av, bv, ov), _steps(n), reps)])
                del av, bv, ov
            curve = per_byte_curve(rows, rows[0][1])
            if curve:
                gamma_curves[dt.name] = curve
                g, g_res = curve[-1][1], None  # out of cache, where γ matters
            else:
                _, g, g_res = fit_alpha_beta(*zip(*rows))
            gamma_by_dtype[dt.name] = g
            kernel[dt.name] = rows
            say(f"  gamma[{dt.name}] = {g * 1e9:.4f} ns/B"
                + (f", rms rel. residual {g_res:.1%}" if g_res is not None else
                   f" at {bytes_label(curve[-1][0])}; "
                   + ", ".join(f"{bytes_label(x)}: {v * 1e9:.3g}" for x, v in curve[:-1])))
        first = np.dtype(dtypes[0]).name
        gamma = gamma_by_dtype[first]
        entry = {
            "nranks": size, "alpha": alpha, "beta": beta,
            "gamma": gamma, "gamma_by_dtype": gamma_by_dtype,
            "residual": residual, "exchange": exchange, "kernel": kernel,
            "beta_curve": beta_curve, "gamma_curves": gamma_curves,
            "overhead": 0.0, "corrections": {}, "nodes": len(layout.nodes),
            "layout": list(layout.nodes),
            "machine": environment(comm), "created": datetime.datetime.now(
                datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        if inter is not None:
            entry["inter"] = inter
            entry["inter_exchange"] = between
        if counts:
            measured = measure_algorithms(comm, counts, dtype="float32", reps=reps)
            entry["algorithms"] = measured
            entry["overhead"] = measured["overhead"]
            entry["corrections"] = fit_corrections(size, measured, entry, layout=layout)
            say(f"  per-call overhead {measured['overhead'] * 1e6:.1f} us; "
                "measured/model ratio by vector size:")
            say("    " + " " * 16 + "".join(f"{bytes_label(b):>8s}"
                                        for b, _ in next(iter(entry["corrections"].values()))))
            for name, curve in entry["corrections"].items():
                say(f"    {name:>16s}" + "".join(f"{r:8.2f}" for _, r in curve))
        return entry
    finally:
        comm.Free()
