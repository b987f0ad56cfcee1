"""Speed measurements for issue 4: our algorithms against native MPI_Allreduce, same run.

Run it under the project's launcher, for example::

    PYTHON=/work/venv/bin/python scripts/run_mpi.sh 2 benchmarks/speed/measure.py \\
        --M 1e7 3e7 --algs native ring ring_pipelined rabenseifner shm hierarchical

What it does (rank 0 prints):

* For every size M, every algorithm (``native`` = ``comm.Allreduce``) runs
  ``--warmup`` untimed calls and is checked against native (exact integer
  data in float32, so any misplaced element shows); then ``--reps`` rounds
  in which the algorithms take turns (round robin, so drift in the machine's
  load hits all of them alike).  Each timing starts after a barrier; the
  time of a call is the max over ranks; the table shows the median.
* busbw = (M·s / t)·2(N-1)/N, the nccl-tests convention; "x native" is the
  ratio of native's median time to the algorithm's.
* ``--membw``: every rank copies a 256 MB array at the same time (numpy
  copy, read + write = 2 bytes of traffic per byte copied); the floor of an
  allreduce is 3 bytes of traffic per payload byte per rank (read the input,
  read others' data, write the output) at that per-rank bandwidth, and
  "floor x" is the algorithm's time over that floor.
* ``--no-check`` turns pycollective's cross-rank agreement step off
  (``set_check(False)``) to time the algorithms alone.
* ``--breakdown``: times the phases of "shm" (copy-in, sync, reduce,
  sync, copy-out) separately, median of max over ranks, using the module's
  own helpers, so a missed target can be explained by where time goes.
* ``--segments``: times ring_pipelined at several segment sizes.
"""

import argparse
import sys
import time

import numpy as np
from mpi4py import MPI

import pycollective
from pycollective._context import get_context
from pycollective._kernels import get_kernel
from pycollective._partition import chunk_bounds
from pycollective.algorithms import ring_pipelined, shm


def _count(text):
    return int(float(text))


def _data(rank, count):
    # Integer-valued floats, exact in float32 for sums over <= 8 ranks.
    h = np.arange(count, dtype=np.int64) * 37 + rank * 101 + 7
    return (h % 2001 - 1000).astype(np.float32)


def _caller(comm, name, send, out):
    if name == "native":
        return lambda: comm.Allreduce(send, out, op=MPI.SUM)
    return lambda: pycollective.allreduce(send, out, MPI.SUM, comm=comm, algorithm=name)


def _time_rounds(comm, calls, reps, inner=1):
    """Round-robin timing; returns {name: array of max-over-ranks times per call}.

    With ``inner`` > 1 a sample is ``inner`` back-to-back calls divided by
    ``inner`` (how latency benchmarks such as OSU time small messages: one
    call is shorter than the skew a barrier leaves between ranks).
    """
    names = list(calls)
    local = np.zeros((reps, len(names)))
    for i in range(reps):
        for j, name in enumerate(names):
            call = calls[name]
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(inner):
                call()
            local[i, j] = (time.perf_counter() - t0) / inner
    worst = np.empty_like(local)
    comm.Allreduce(local, worst, op=MPI.MAX)
    return {name: worst[:, j] for j, name in enumerate(names)}


def membw(comm, nbytes=256 << 20, reps=5):
    """Per-rank memory traffic bandwidth (bytes/s) with every rank copying at once."""
    a = np.ones(nbytes, np.uint8)
    b = np.empty_like(a)
    times = []
    for _ in range(reps):
        comm.Barrier()
        t0 = time.perf_counter()
        np.copyto(b, a)
        times.append(time.perf_counter() - t0)
    worst = comm.allreduce(sorted(times)[len(times) // 2], op=MPI.MAX)
    return 2 * nbytes / worst


def run_sizes(comm, sizes, algs, reps, warmup, bw, inner=1):
    n, r = comm.Get_size(), comm.Get_rank()
    rows = []
    for count in sizes:
        send = _data(r, count)
        outs = {name: np.empty_like(send) for name in algs}
        calls = {name: _caller(comm, name, send, outs[name]) for name in algs}
        for _ in range(warmup):
            for call in calls.values():
                call()
        ref = outs.get("native")
        if ref is None:
            ref = np.empty_like(send)
            comm.Allreduce(send, ref, op=MPI.SUM)
        wrong = {name: comm.allreduce(int(np.count_nonzero(outs[name] != ref)))
                 for name in algs}
        times = _time_rounds(comm, calls, reps, inner if count * 4 <= (1 << 16) else 1)
        native = np.median(times["native"]) if "native" in times else None
        nbytes = count * 4
        for name in algs:
            t = float(np.median(times[name]))
            row = dict(alg=name, N=n, M=count, t=t,
                       busbw=nbytes / t * 2 * (n - 1) / n / 1e9 if t > 0 else 0.0,
                       xnative=native / t if native else float("nan"),
                       wrong=wrong[name])
            if bw:
                row["floor_x"] = t / (3 * nbytes / bw)
            rows.append(row)
            if r == 0:
                extra = f" floor_x={row['floor_x']:.2f}" if bw else ""
                print(f"{name:15s} N={n} M={count:<10d} t={t * 1e6:12.1f} us "
                      f"busbw={row['busbw']:7.3f} GB/s  x_native={row['xnative']:6.2f}"
                      f" wrong={row['wrong']}{extra}", flush=True)
        del outs, calls
    return rows


def _shm_state(comm):
    ctx = get_context(comm)
    state = ctx.cache.get("shm")
    if state is None:
        state = ctx.cache["shm"] = shm._ShmState(ctx)
    return state


def _report(comm, title, phases, local):
    worst = np.empty_like(local)
    comm.Allreduce(local, worst, op=MPI.MAX)
    med = np.median(worst, axis=0)
    if comm.Get_rank() == 0:
        total = med.sum()
        print(title)
        for name, v in zip(phases, med):
            print(f"  {name:18s} {v * 1e3:9.3f} ms  {100 * v / total:5.1f} %")
        print(f"  {'sum':18s} {total * 1e3:9.3f} ms")
    return dict(zip(phases, med.tolist()))


def breakdown_cma(comm, count, reps):
    """Phases of the single-copy shm path (process_vm_readv): where the time goes."""
    r = comm.Get_rank()
    cross = _shm_state(comm).cross
    if cross is None:
        return None
    n = cross.size
    src = _data(r, count)
    dst = np.empty_like(src)
    kernel = get_kernel("sum", src.dtype)
    bounds = chunk_bounds(count, n)
    lo, hi = bounds[r], bounds[r + 1]
    itemsize = src.itemsize
    block = max(1, max(16 << 10, shm._CMA_STAGE_BYTES // (n - 1)) // itemsize)
    tmp = [np.empty(block, src.dtype) for _ in range(n)]
    phases = ["publish+sync", "reduce: readv", "reduce: kernel", "sync", "copy-out readv", "sync"]
    local = np.zeros((reps, len(phases)))
    for i in range(reps):
        comm.Barrier()
        t0 = time.perf_counter()
        cross.publish(src, dst)
        cross.sync()
        srcs = [int(h[1]) for h in cross.headers]
        dsts = [int(h[2]) for h in cross.headers]
        t1 = time.perf_counter()
        t_read = t_kernel = 0.0
        for b in range(lo, hi, block):
            e = min(b + block, hi)
            a = time.perf_counter()
            ops = []
            for q in range(n):
                if q == r:
                    ops.append(src[b:e])
                else:
                    part = tmp[q][:e - b]
                    cross.read(q, srcs[q] + b * itemsize, part)
                    ops.append(part)
            m = time.perf_counter()
            shm.reduce_block(kernel, ops, dst[b:e])
            t_read += m - a
            t_kernel += time.perf_counter() - m
        t2 = time.perf_counter()
        cross.sync()
        t3 = time.perf_counter()
        for q in range(n):
            if q != r and bounds[q + 1] > bounds[q]:
                cross.read(q, dsts[q] + bounds[q] * itemsize, dst[bounds[q]:bounds[q + 1]])
        t4 = time.perf_counter()
        cross.sync()
        t5 = time.perf_counter()
        local[i] = [t1 - t0, t_read, t_kernel, t3 - t2, t4 - t3, t5 - t4]
    return _report(comm, f"shm single-copy breakdown N={n} M={count} "
                   "(median of max over ranks, per phase):", phases, local)


def breakdown(comm, count, reps):
    """Median (max over ranks) of each phase of the shm window path at ``count``."""
    r = comm.Get_rank()
    node = _shm_state(comm).node
    src = _data(r, count)
    dst = np.empty_like(src)
    kernel = get_kernel("sum", src.dtype)
    bounds = chunk_bounds(count, node.size)
    phases = ["copy_in", "sync1", "reduce", "sync2", "copy_out", "sync3"]
    local = np.zeros((reps, len(phases)))
    for i in range(reps):
        offset, trailing = node.begin(dst.nbytes)
        slots = node.slots(offset, dst.nbytes, dst.dtype)
        comm.Barrier()
        t = [time.perf_counter()]
        shm.copy_in(src, slots[r], r, bounds)
        t.append(time.perf_counter())
        node.sync()
        t.append(time.perf_counter())
        shm.reduce_own_slice(kernel, src, slots, r, bounds, dst)
        t.append(time.perf_counter())
        node.sync()
        t.append(time.perf_counter())
        shm.copy_out(dst, slots, r, bounds)
        t.append(time.perf_counter())
        node.sync()
        t.append(time.perf_counter())
        local[i] = np.diff(t)
    return _report(comm, f"shm window-copy breakdown N={comm.Get_size()} M={count} "
                   "(median of max over ranks, per phase):", phases, local)


def pieces(comm, n=20000):
    """Per-call cost of the pieces of a 1-element shm allreduce (latency profile)."""
    from pycollective import _api
    x = np.arange(1, dtype=np.float32) + comm.Get_rank()
    out = np.empty_like(x)
    previous = pycollective.set_check(False)
    pycollective.allreduce(x, out, algorithm="shm")
    ctx = get_context(comm)
    kernel = get_kernel("sum", x.dtype)
    node = _shm_state(comm).node
    slots = node.slots(0, x.nbytes, x.dtype)

    def copy_and_reduce():
        slots[node.rank][...] = x
        shm.reduce_block(kernel, slots, out)

    steps = [
        ("native comm.Allreduce", lambda: comm.Allreduce(x, out)),
        ("allreduce(shm), check off", lambda: pycollective.allreduce(x, out, algorithm="shm")),
        ("  shm algorithm alone", lambda: shm.shm_allreduce(ctx, x, out, kernel)),
        ("  fast-path checks, out of place", lambda: _api._fast_plan(x, out, MPI.SUM, None, "shm")),
        ("  fast-path checks, in place",
         lambda: _api._fast_plan(MPI.IN_PLACE, out, MPI.SUM, None, "shm")),
        ("  region + slot views", lambda: (node.begin(x.nbytes), node.slots(0, x.nbytes, x.dtype))),
        ("  copy-in + kernel", copy_and_reduce),
        ("  flag barrier", node.barrier.sync),
    ]
    pycollective.set_check(True)
    pycollective.allreduce(x, out, algorithm="shm")
    steps.append(("allreduce(shm), check on",
                  lambda: pycollective.allreduce(x, out, algorithm="shm")))
    board = ctx.cache[_api._BOARD]
    values = np.zeros(9, np.int64)
    steps.append(("  agreement (shared-memory MAX)", lambda: board.max(values)))
    for name, fn in steps:
        if name == "allreduce(shm), check on":
            pycollective.set_check(True)
        for _ in range(500):
            fn()
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t = comm.allreduce((time.perf_counter() - t0) / n, op=MPI.MAX)
        if comm.Get_rank() == 0:
            print(f"{name:36s} {t * 1e6:8.2f} us", flush=True)
        if name == "allreduce(shm), check off":
            pycollective.set_check(False)
    pycollective.set_check(previous)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--M", nargs="+", type=_count, default=[10_000_000])
    parser.add_argument("--algs", nargs="+",
                        default=["native", "ring", "ring_pipelined", "rabenseifner", "shm",
                                 "hierarchical"])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--membw", action="store_true")
    parser.add_argument("--no-check", action="store_true")
    parser.add_argument("--inner", type=int, default=1,
                        help="back-to-back calls per sample for messages up to 64 KiB")
    parser.add_argument("--breakdown", type=_count, nargs="*")
    parser.add_argument("--pieces", action="store_true",
                        help="time the pieces of a 1-element shm call and stop")
    parser.add_argument("--segments", type=_count, nargs="*",
                        help="ring_pipelined segment sizes in bytes to compare")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    if args.no_check:
        pycollective.set_check(False)
    bw = membw(comm) if args.membw else None
    if comm.rank == 0:
        print(f"# N={comm.size} check={'off' if args.no_check else 'on'} reps={args.reps} "
              f"warmup={args.warmup} inner={args.inner}"
              + (f" membw_per_rank={bw / 1e9:.1f} GB/s traffic" if bw else ""),
              flush=True)
    if args.pieces:
        pieces(comm)
        return 0
    wrong = 0
    if args.segments:
        for seg in args.segments:
            ring_pipelined.set_segment_bytes(seg)
            if comm.rank == 0:
                print(f"# segment {seg} bytes", flush=True)
            rows = run_sizes(comm, args.M, ["ring_pipelined"], args.reps, args.warmup, bw)
            wrong += sum(row["wrong"] for row in rows)
    else:
        rows = run_sizes(comm, args.M, args.algs, args.reps, args.warmup, bw, args.inner)
        wrong += sum(row["wrong"] for row in rows)
    for count in args.breakdown or []:
        breakdown_cma(comm, count, args.reps)
        breakdown(comm, count, args.reps)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
