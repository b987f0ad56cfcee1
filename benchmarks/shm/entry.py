"""Where a repeated small ``shm`` call's time goes: entered in compiled code or booked in
Python, beside the library's own ``Allreduce``, in one launch.

    scripts/run_mpi.sh 2 benchmarks/shm/entry.py --count 1e3 1e4

A repeated ``shm`` call up to 1 MiB where every rank has a core is numbered and booked
by its compiled step (``rsag.enter``, ``algorithms/shm/books.py``).  Per size this times,
in batches that take turns, on the same two arrays:

* ``public``: ``pycollective.allreduce(send, out, algorithm="shm")``;
* ``entered``: the same call from its bound entry (``collectives.plans.fast_way`` with
  the bound call), without the public function's lookup around it;
* ``booked in Python``: the same call numbered and booked in Python, then the compiled
  step (``RepeatedRsag.fast``: how every repeated call ran before the entry);
* ``lookup``: ``plans.find_bound`` alone (no communication);
* ``native``: MPI's own ``comm.Allreduce(send, out)``.

each back to back (a loop of calls) and after a Barrier (one call at a time, as the
peers report times them).  Each cell is the median over batches of the slowest rank's
time per call; every result is checked against the exact sum (tolerance 0).  Needs
ranks with cores of their own (the entry is the reduce-scatter-allgather step's).
"""

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import pycollective
from pycollective.bench import _exact
from pycollective.collectives import plans as _plans
from pycollective.collectives.api import DEFAULT


def _timed(comm, fn, calls, after_barrier):
    if after_barrier:
        times = []
        for _ in range(calls):
            comm.Barrier()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        mine = statistics.median(times)
    else:
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        mine = (time.perf_counter() - t0) / calls
    return comm.allreduce(mine, op=MPI.MAX)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=float, nargs="+", default=[1e3, 1e4])
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000, help="calls per batch")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    n, r = comm.Get_size(), comm.Get_rank()
    for count in (int(c) for c in args.count):
        send, expected = _exact.exact_case(count, r, n)
        out = np.empty_like(send)
        for _ in range(20):
            pycollective.allreduce(send, out, algorithm="shm")
        bound = _plans.find_bound(send, out, MPI.SUM, None, "shm", DEFAULT)
        if bound is None or bound.plan.entered is None:
            if r == 0:
                print(f"M = {count}: no entered call here (ranks share cores, or above 1 MiB)")
            continue
        ctx, plan = bound.ctx, bound.plan
        wrong = [0]

        def check():
            if not np.array_equal(out, expected):
                wrong[0] += 1

        def public():
            pycollective.allreduce(send, out, algorithm="shm")

        def entered():
            _plans.fast_way(ctx, plan, send, out, None, bound)

        def booked():
            with ctx.lock:
                number = ctx.next_call()
                values = plan.template
                values[0], values[1] = number, -number
                rest = plan.fast(number, plan, send, out)
                if rest is not None:  # a slow rank: the rest with the call's record
                    _plans._run_rest(ctx, plan, number, rest, send, out)

        def lookup():
            _plans.find_bound(send, out, MPI.SUM, None, "shm", DEFAULT)

        def native():
            comm.Allreduce(send, out)

        cases = [("public", public), ("entered", entered), ("booked in Python", booked),
                 ("lookup", lookup), ("native", native)]
        cells = {(name, b): [] for name, _ in cases for b in (False, True)}
        for _ in range(args.batches):
            for name, fn in cases:
                for after_barrier in (False, True):
                    out[...] = -1
                    calls = args.calls // 4 if after_barrier else args.calls
                    cells[name, after_barrier].append(_timed(comm, fn, calls, after_barrier))
                    if name != "lookup":
                        check()
        wrong = comm.allreduce(wrong[0], op=MPI.SUM)
        if r == 0:
            print(f"M = {count} float32, N = {n}, {args.batches} batches, wrong results: {wrong}")
            print(f"  {'call':18s} {'back to back':>14s} {'after a Barrier':>16s}")
            for name, _ in cases:
                b2b = statistics.median(cells[name, False]) * 1e6
                bar = statistics.median(cells[name, True]) * 1e6
                print(f"  {name:18s} {b2b:11.2f} us {bar:13.2f} us")


if __name__ == "__main__":
    main()
