"""Where a repeated ``shm`` allreduce's time goes, by counting: step, syncs, lines, system calls.

    scripts/run_mpi.sh 2 benchmarks/shm/count.py --count 1e3 1e4 1e5 --json out.json

For each size, after three calls that make the call's plan, every rank runs
the same repeated ``pycollective.allreduce(send, out, "sum", algorithm="shm")``
(float32) in four phases, each result checked against the exact sum:

* ``wall``: ``--rounds`` rounds of ``--calls`` calls back to back; per round the
  time per call, median over rounds, then the slowest rank.  The voluntary and
  involuntary context switches of the rank (``/proc/self/status``) over these
  rounds, per call (a ``sched_yield`` that gives the core away counts as an
  involuntary one, a futex sleep as a voluntary one).
* ``split``: ``--calls`` calls with the plan's fast way (``Plan.entered`` where the
  compiled step books the call itself, else ``Plan.fast``) and the compiled step
  (or entry) it calls wrapped in ``perf_counter`` pairs, the barrier steps each
  call took read from the node group's step words after it (its syncs), and each
  whole call timed.  ``call``: a call's time,
  ``step``: the time inside the compiled step (its waits included),
  ``python``: the call's time less its step's, each the median over the calls
  (a call during which the rank lost its core is an outlier, not a cost; the
  wrappers add about 0.1 us to ``python``).  Hand-backs: calls the fast way
  returned unfinished (a slow peer: ``LATE``).
* ``strace``: ``--calls`` calls with ``strace -f`` attached to every thread of
  every rank (``--strace rank0``: rank 0's only; ``none`` skips it); the system
  calls between two marker calls around the loop, per call, by name.
  ptrace makes each system call some microseconds slower, so calls that wait
  by yielding may yield more under strace than without; the context switches
  of ``wall`` are the untraced count.
* the model: the bytes and 64-byte lines each rank reads from other ranks'
  slots and the metadata lines it reads per peer, and what it writes into the
  shared segment, derived from the step's layout at the slots' real addresses
  (see ``_traffic``), beside the vector's size.

Which step runs: ``rsag`` (``algorithms/shm/rsag.py``) where
``rsag_steps.wanted`` says so (by default: no rank of the node sleeps in its
waits, ``barrier.wakes`` false), else the older prepared steps, ``small`` up
to 4 KiB and ``mid`` (the sliced slot step) above.  Printed per size with the
node's ``sleep``/``wakes`` and whether ranks outnumber the CPUs; ``--rsag on``
or ``off`` forces either (``ENABLED``), to count the other step on the same node.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
from mpi4py import MPI

import pycollective
from pycollective.algorithms.shm import mid as _mid
from pycollective.algorithms.shm import rsag as _rsag
from pycollective.algorithms.shm import rsag_steps as _rsag_steps
from pycollective.bench import _exact
from pycollective.collectives import api as _api, plans as _plans
from pycollective.node.atomics import STRIDE
from pycollective.node.group import STEP

LINE = 64
STEP_NAMES = {"RepeatedRsag": "rsag", "RepeatedSmall": "small", "RepeatedMid": "mid"}
FIELDS = ("n", "count", "bytes", "step", "oversubscribed", "sleep", "wakes", "syncs",
          "handbacks", "wall_us", "call_us", "step_us", "python_us", "fast_us", "remote_read_bytes",
          "remote_read_lines", "remote_meta_lines", "shared_write_bytes", "shared_write_lines",
          "syscalls", "ctx_switches", "checked")


def _lines(address, nbytes):
    """64-byte lines the ``nbytes`` at ``address`` touch."""
    if nbytes <= 0:
        return 0
    return (address + nbytes - 1) // LINE - address // LINE + 1


def _switches():
    found = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                name, value = line.split(":")
                found[name.strip()] = int(value)
    return found["voluntary_ctxt_switches"], found["nonvoluntary_ctxt_switches"]


def _plan(comm, send, out):
    """(ctx, plan, memo key) of this shape's remembered call."""
    found = _plans.lookup(send, out, "sum", comm, "shm", _api.DEFAULT)
    if found is None:
        raise RuntimeError("no remembered plan for the call: is the fast path off?")
    ctx, plan = found[0], found[1]
    memo = ctx.peek(_plans._MEMO)
    key = next(k for k, v in memo.items() if v is plan)
    return ctx, plan, memo, key


def _traffic(run, rank, size, count, itemsize):
    """What one call reads from other ranks' memory and writes into the shared segment, by
    the step's layout: ``(remote data bytes, remote data lines, remote metadata lines,
    shared bytes written, shared lines written)``.  Region 0's addresses (the other
    region lies a whole, line-aligned half-segment further)."""
    kind = STEP_NAMES.get(type(run).__name__)
    if kind is None:
        return None
    group = run.node.group
    board, headers, flags = group.boards[0], group.headers[0], group.barrier.words

    def row(a, q):  # rank q's row of a (ranks, words) table
        return _lines(a.ctypes.data + q * a.strides[0], a.shape[1] * a.itemsize)

    def counter(q):
        return _lines(flags.ctypes.data + q * STRIDE * 8, 8)

    peers = [q for q in range(size) if q != rank]
    if kind == "rsag":
        c = run.base
        bounds = np.array(_rsag.line_bounds(count, size, itemsize))
        slot = lambda q: int(c[_rsag.SLOTS]) + q * int(c[_rsag.SLOT_BYTES])  # noqa: E731
    elif kind == "mid":
        bounds = np.asarray(run.bounds)
        flat, stride, base = run.views[0]
        slot = lambda q: flat.ctypes.data + (base + q * stride) * itemsize  # noqa: E731
    else:
        rows = run.views[0]
        slot = lambda q: rows.ctypes.data + q * rows.strides[0]  # noqa: E731
    if kind == "small":
        # every rank reads every other slot whole; metadata: counter, board row, header row
        read = [(slot(q), count * itemsize) for q in peers]
        meta = sum(counter(q) + row(board, q) + row(headers, q) for q in peers)
        wrote = [(slot(rank), count * itemsize)]
        wrote_meta = counter(rank) + row(board, rank) + row(headers, rank)
    else:
        lo, hi = int(bounds[rank]), int(bounds[rank + 1])
        # fold: the own slice of every other slot; copy-out: every other slice from its owner
        read = [(slot(q) + lo * itemsize, (hi - lo) * itemsize) for q in peers]
        read += [(slot(q) + int(bounds[q]) * itemsize, int(bounds[q + 1] - bounds[q]) * itemsize)
                 for q in peers]
        # copy-in: all but the own slice; the fold's result: the own slice
        wrote = [(slot(rank), lo * itemsize), (slot(rank) + hi * itemsize, (count - hi) * itemsize),
                 (slot(rank) + lo * itemsize, (hi - lo) * itemsize)]
        if kind == "rsag":
            # the counter line (call word beside it) at both waits; rows only when words differ
            meta = sum(2 * counter(q) for q in peers)
        else:
            # both waits' counters, the board row and the header row of every peer
            meta = sum(2 * counter(q) + row(board, q) + row(headers, q) for q in peers)
        wrote_meta = 2 * counter(rank) + row(board, rank) + row(headers, rank)
    return (sum(n for _, n in read), sum(_lines(a, n) for a, n in read), meta,
            sum(n for _, n in wrote), sum(_lines(a, n) for a, n in wrote) + wrote_meta)


def _timed(fn, into):
    def wrapper(*args):
        t = time.perf_counter()
        result = fn(*args)
        into[-1] += time.perf_counter() - t  # this call's (a LATE resumes: twice)
        return result
    return wrapper


def _split(comm, send, out, calls):
    """Per call: (time in fast, time in the compiled step: medians over the calls; syncs,
    hand-backs: means)."""
    ctx, plan, memo, key = _plan(comm, send, out)
    run = plan.run
    kind = STEP_NAMES.get(type(run).__name__)
    fast_t, step_t, handbacks, syncs = [], [], [0], [0]
    fast, entered = plan.fast, plan.entered

    def counted_fast(number, p, src, dst):
        t = time.perf_counter()
        rest = fast(number, p, src, dst)
        fast_t.append(time.perf_counter() - t)
        if rest is not None:
            handbacks[0] += 1
        return rest

    def counted_entered(p, src, dst, bound=None):
        t = time.perf_counter()
        rest = entered(p, src, dst, bound)
        fast_t.append(time.perf_counter() - t)
        if rest is not None:
            handbacks[0] += 1
        return rest

    group = run.node.group if kind else None
    restore = []
    if kind == "rsag":
        restore += [(run, "step", run.step), (run, "entry", run.entry)]
        run.step = _timed(run.step, step_t)
        run.entry = _timed(run.entry, step_t)
        run.natives.clear()  # bound calls take the wrapped entry, not its native wrapper
    elif kind == "small":
        restore.append((run, "prepared", run.prepared))
        run.prepared = _timed(run.prepared, step_t)
    elif kind == "mid":
        restore.append((_mid, "prepared_step", _mid.prepared_step))
        _mid.prepared_step = _timed(_mid.prepared_step, step_t)
    memo[key] = plan._replace(fast=counted_fast if fast is not None else None,
                              entered=counted_entered if entered is not None else None)
    _plans.forget_bound()  # the next call binds the plan above
    try:
        step_t.append(0.0)
        pycollective.allreduce(send, out, "sum", comm=comm, algorithm="shm")  # re-prepares
        del fast_t[:], step_t[:]
        handbacks[0] = syncs[0] = 0
        whole = []
        comm.Barrier()
        for _ in range(calls):
            step_t.append(0.0)  # this call's step time (none if the fast way was not taken)
            t = time.perf_counter()
            pycollective.allreduce(send, out, "sum", comm=comm, algorithm="shm")
            whole.append(time.perf_counter() - t)
            if group is not None:
                syncs[0] += group.words[STEP]  # the barrier steps this call took
    finally:
        memo[key] = plan
        _plans.forget_bound()
        for obj, name, value in restore:
            setattr(obj, name, value)
    whole, step_t = np.array(whole), np.array(step_t[-calls:])
    # medians per call: a call during which the rank lost its core is an outlier, not a cost
    return (float(np.median(fast_t)) if fast_t else 0.0, float(np.median(step_t)),
            float(np.median(whole)), float(np.median(whole - step_t)),
            syncs[0] / calls, handbacks[0] / calls)


BEGIN, END = "/pycollective-count-begin", "/pycollective-count-end"  # marker paths, never there
_CALL = re.compile(r"^(?:\[pid\s+\d+\]\s+|\d+\s+)?([a-z_0-9]+)\(")  # -o: "PID call(...)"


def _strace_counts(path):
    """System calls by name in a ``strace -f`` log, between the two markers (``access`` or
    ``faccessat`` of BEGIN and END, made by this rank's main thread); None without them."""
    counts, inside = {}, False
    with open(path, errors="replace") as f:
        for line in f:
            if BEGIN in line:
                inside, counts = True, {}
                continue
            if END in line:
                return counts if inside else None
            m = _CALL.match(line)  # "<... resumed>" halves and signals are not new calls
            if inside and m:
                counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return None  # the log ended before the END marker


def _traced(comm, send, out, calls, strace):
    """System calls per call, by name: strace logs every thread of this rank, and only the
    calls between two marker system calls around the loop count (not the Barriers that
    wait for the other ranks' strace to attach and detach)."""
    handle, path = tempfile.mkstemp(prefix="count-strace-", suffix=".txt")
    os.close(handle)
    tids = sorted(int(t) for t in os.listdir("/proc/self/task"))
    argv = [strace, "-f", "-qq", "-o", path]
    for tid in tids:
        argv += ["-p", str(tid)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    attached = False
    try:
        deadline = time.monotonic() + 20
        while not attached:  # the kernel names the tracer once it is attached
            with open("/proc/self/status") as f:
                tracer = int(re.search(r"TracerPid:\s*(\d+)", f.read()).group(1))
            attached = tracer == proc.pid
            if not attached and (proc.poll() is not None or time.monotonic() > deadline):
                # no ptrace here (a container without it): the context switches stand in;
                # the loop still runs, as the other ranks' windows wait for it
                sys.stderr.write(f"rank {comm.Get_rank()}: strace did not attach "
                                 f"(exit {proc.poll()}); no system call counts\n")
                break
            time.sleep(0.01)
        comm.Barrier()
        os.access(BEGIN, os.F_OK)
        for _ in range(calls):
            pycollective.allreduce(send, out, "sum", comm=comm, algorithm="shm")
        os.access(END, os.F_OK)
        comm.Barrier()
    finally:
        proc.send_signal(signal.SIGINT)  # detaches
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    counts = _strace_counts(path) if attached else None
    os.unlink(path)
    if counts is None:
        return None
    for marker in ("access", "faccessat", "faccessat2"):  # the END marker's own call
        counts.pop(marker, None)
    return {name: n / calls for name, n in sorted(counts.items(), key=lambda kv: -kv[1])}


def _cpus(comm):
    """Whether the node's ranks outnumber the CPUs in the union of their affinity masks."""
    mine = np.zeros(4096, np.uint8)
    mine[list(os.sched_getaffinity(0))] = 1
    union = np.empty_like(mine)
    comm.Allreduce(mine, union, op=MPI.MAX)
    return int(union.sum())


def measure(world, count, args):
    n, r = world.Get_size(), world.Get_rank()
    everyone = [_exact.exact_values(0, count, q, n, "float32", "sum") for q in range(n)]
    expected = _exact.exact_reduce(everyone, "sum", "float32")
    send = everyone[r]
    out = np.empty_like(send)
    checked = [0]

    def check(phase):
        if not np.array_equal(out, expected):
            raise AssertionError(f"rank {r}: wrong result at count {count} ({phase})")
        checked[0] += 1
        out[:] = np.nan

    for _ in range(3):  # the plan, then two repeated calls
        pycollective.allreduce(send, out, "sum", comm=world, algorithm="shm")
    check("warm-up")
    _, plan, _, _ = _plan(world, send, out)
    run = plan.run
    kind = STEP_NAMES.get(type(run).__name__, f"none ({type(run).__name__})")
    barrier = run.node.group.barrier if kind in ("rsag", "small", "mid") else None

    v0, i0 = _switches()
    per_round = []
    for _ in range(args.rounds):
        world.Barrier()
        t = time.perf_counter()
        for _ in range(args.calls):
            pycollective.allreduce(send, out, "sum", comm=world, algorithm="shm")
        per_round.append((time.perf_counter() - t) / args.calls)
        check("wall")
    v1, i1 = _switches()
    calls_made = args.rounds * args.calls
    wall = float(np.median(per_round))

    fast_t, step_t, call_t, python_t, syncs, handbacks = _split(world, send, out, args.calls)
    check("split")
    syscalls = None
    if args.strace != "none" and (args.strace == "all" or r == 0):
        syscalls = _traced(world, send, out, args.calls, args.strace_path)
        check("strace")
    elif args.strace == "rank0":
        world.Barrier()  # rank 0's attach
        for _ in range(args.calls):
            pycollective.allreduce(send, out, "sum", comm=world, algorithm="shm")
        world.Barrier()
        check("strace")

    traffic = _traffic(run, r, n, count, send.itemsize)
    row = {
        "rank": r, "n": n, "count": count, "bytes": count * send.itemsize, "step": kind,
        "sleep": None if barrier is None else bool(barrier.sleep),
        "wakes": None if barrier is None else bool(barrier.wakes),
        "wanted": None if barrier is None else bool(_rsag_steps.wanted(run.board)),
        "syncs": syncs, "handbacks": handbacks, "wall_us": wall * 1e6,
        "call_us": call_t * 1e6, "step_us": step_t * 1e6, "python_us": python_t * 1e6,
        "fast_us": fast_t * 1e6,
        "ctx_switches": {"voluntary": (v1 - v0) / calls_made,
                         "involuntary": (i1 - i0) / calls_made},
        "syscalls": syscalls, "checked": checked[0],
    }
    for name, value in zip(("remote_read_bytes", "remote_read_lines", "remote_meta_lines",
                            "shared_write_bytes", "shared_write_lines"),
                           traffic or (None,) * 5):
        row[name] = value
    return row


def _summary(rows, cpus):
    """One row per size from every rank's: the slowest rank's times, rank 0's counts, the
    mean of the per-rank system calls and switches (ranks differ in what they own)."""
    first = dict(rows[0])
    first.pop("rank")
    n = first["n"]
    # each rank's call = its step (waits included) + its Python: the rank that spends
    # longest in Python waits least; the table shows the slowest rank's times, the mean split
    first["wall_us"] = max(x["wall_us"] for x in rows)
    first["call_us"] = max(x["call_us"] for x in rows)
    for name in ("step_us", "python_us", "fast_us"):
        first[name + "_per_rank"] = [x[name] for x in rows]
        first[name] = float(np.mean(first[name + "_per_rank"]))
    first["oversubscribed"] = n > cpus
    first["cpus"] = cpus
    first["ctx_switches"] = {k: float(np.mean([x["ctx_switches"][k] for x in rows]))
                             for k in ("voluntary", "involuntary")}
    traced = [x["syscalls"] for x in rows if x["syscalls"] is not None]
    first["syscalls"] = None
    if traced:
        names = sorted({k for t in traced for k in t})
        first["syscalls"] = {k: float(np.mean([t.get(k, 0.0) for t in traced])) for k in names}
        first["syscalls_ranks"] = len(traced)
    first["checked"] = sum(x["checked"] for x in rows)
    return first


def _print(rows, args):
    n = rows[0]["n"]
    over = rows[0]["oversubscribed"]
    forced = {"on": ", rsag step forced", "off": ", older steps forced"}.get(args.rsag, "")
    kind = "OVERSUBSCRIBED" if over else "dedicated cores"
    print(f"{n} ranks on {rows[0]['cpus']} CPUs ({kind}{forced}),"
          f" float32 sum, {args.rounds} rounds of {args.calls} calls; us per call: loop = back to"
          " back, median over rounds; call = one call, median; step, python: the call's split"
          " (medians, mean over ranks); loop, call: slowest rank; counts per call per rank")
    print(f"{'count':>7} {'KB':>6} {'path':>5} {'syncs':>5} {'loop':>7} {'call':>7} {'step':>7}"
          f" {'python':>6} {'rd B':>7} {'rd ln':>6} {'meta':>5} {'wr ln':>6} {'yield':>7}"
          f" {'futex':>6} {'vm_rd':>5} {'other':>6} {'vcsw':>6} {'ivcsw':>6}")
    for x in rows:
        s = x.get("syscalls")
        known = ("sched_yield", "futex", "process_vm_readv")
        other = sum(v for k, v in (s or {}).items() if k not in known)
        if s is None:
            sc = f"{'-':>7} {'-':>6} {'-':>5} {'-':>6}"
        else:
            sc = (f"{s.get('sched_yield', 0):>7.1f} {s.get('futex', 0):>6.1f} "
                  f"{s.get('process_vm_readv', 0):>5.1f} {other:>6.1f}")
        cs = x["ctx_switches"]
        print(f"{x['count']:>7} {x['bytes'] / 1e3:>6.1f} {x['step']:>5} {x['syncs']:>5.1f}"
              f" {x['wall_us']:>7.1f} {x['call_us']:>7.1f} {x['step_us']:>7.1f}"
              f" {x['python_us']:>6.1f}"
              f" {x['remote_read_bytes'] or 0:>7} {x['remote_read_lines'] or 0:>6}"
              f" {x['remote_meta_lines'] or 0:>5} {x['shared_write_lines'] or 0:>6} {sc}"
              f" {cs['voluntary']:>6.2f} {cs['involuntary']:>6.2f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=float, nargs="+", default=[1e3, 1e4, 1e5])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--strace", choices=("all", "rank0", "none"), default="all",
                        help="attach strace to every rank, to rank 0 only, or not at all")
    parser.add_argument("--strace-path", default="/usr/bin/strace")
    parser.add_argument("--rsag", choices=("auto", "on", "off"), default="auto",
                        help="rsag_steps.ENABLED when the plans are made: the default choice "
                             "(auto), or the rsag step (on) or the older steps (off) forced")
    parser.add_argument("--json", default=None, help="write the rows here (rank 0)")
    args = parser.parse_args()
    _rsag_steps.ENABLED = {"auto": None, "on": True, "off": False}[args.rsag]
    world = MPI.COMM_WORLD
    if args.strace != "none" and not os.access(args.strace_path, os.X_OK):
        args.strace = "none"  # the context switches stand in
    cpus = _cpus(world)
    rows = []
    for count in args.count:
        mine = measure(world, int(count), args)
        every = world.gather(mine, root=0)
        if world.Get_rank() == 0:
            rows.append(_summary(every, cpus))
    if world.Get_rank() == 0:
        _print(rows, args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": world.Get_size(), "cpus": cpus, "rounds": args.rounds,
                           "calls": args.calls, "strace": args.strace, "rsag": args.rsag,
                           "fields": FIELDS,
                           "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
