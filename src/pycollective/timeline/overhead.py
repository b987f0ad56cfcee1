"""What the timeline costs on the repeated-call fast path, off and on.

``scripts/run_mpi.sh 2 -m pycollective.timeline.overhead [--json FILE]``

For each algorithm, one-element float32 allreduce calls of one shape (the
fast path after the first), timed in rounds of ``--calls`` back-to-back
calls, the recorder off and on in alternate rounds (the slowest rank's time
per call, median over rounds).  Off, all the call path adds is its test of
``timeline.ACTIVE`` (one on the fast path: ``allreduce`` tests it before the bound
call, ``collectives.plans.find_bound`` and ``fast_way``): ``off_check_us`` times exactly
that, and ``spread_us`` is the noise they are compared with: the standard
deviation of the off rounds, or 1 % of the call if that is more.  ``on_us``
over ``off_us`` is what recording costs.  Rank 0 prints one row per
algorithm.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import timeit

import numpy as np
from mpi4py import MPI

import pycollective
from pycollective import timeline


def _round(x, algorithm, calls, comm):
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        pycollective.allreduce(MPI.IN_PLACE, x, algorithm=algorithm)
    mine = (time.perf_counter() - start) / calls * 1e6
    return comm.allreduce(mine, op=MPI.MAX)


def measure(algorithms=("shm", "ring"), rounds=10, calls=1000, comm=MPI.COMM_WORLD):
    """Rows ``{algorithm, off_us, on_us, on_ratio, off_check_us, spread_us}``."""
    folder = comm.bcast(tempfile.mkdtemp() if comm.rank == 0 else None)
    path = os.path.join(folder, "overhead.json")
    timeline.start(path, capacity=calls)
    recorder, timeline.ACTIVE = timeline.ACTIVE, None
    # The off call path's own test, as often as a fast-path call makes it.
    check = timeit.timeit("A.ACTIVE is None", globals={"A": timeline},
                          number=100_000) / 100_000 * 1e6
    rows = []
    try:
        for algorithm in algorithms:
            x = np.ones(1, np.float32)
            for _ in range(20):  # to the fast path, kernels compiled
                pycollective.allreduce(MPI.IN_PLACE, x, algorithm=algorithm)
            off, on = [], []
            for _ in range(rounds):
                timeline.ACTIVE = None
                off.append(_round(x, algorithm, calls, comm))
                timeline.ACTIVE = recorder
                on.append(_round(x, algorithm, calls, comm))
            timeline.ACTIVE = None
            off_us, on_us = statistics.median(off), statistics.median(on)
            spread = max(statistics.pstdev(off), 0.01 * off_us)
            rows.append({"algorithm": algorithm, "ranks": comm.size, "calls": calls,
                         "rounds": rounds, "off_us": off_us, "on_us": on_us,
                         "on_ratio": on_us / off_us, "off_check_us": check,
                         "spread_us": spread})
    finally:
        timeline.ACTIVE = recorder
        timeline.stop()
        if comm.rank == 0:
            os.remove(path)
            os.rmdir(folder)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m pycollective.timeline.overhead",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=1000, help="calls per timed round")
    parser.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    parser.add_argument("algorithms", nargs="*", default=["shm", "ring"])
    args = parser.parse_args(argv)
    rows = measure(args.algorithms, args.rounds, args.calls)
    if MPI.COMM_WORLD.rank == 0:
        print("# algorithm  N  off(us)  on(us)  on/off  off check(us)  noise(us)")
        for r in rows:
            print(f"{r['algorithm']:>11} {r['ranks']:>2} {r['off_us']:8.2f} {r['on_us']:7.2f} "
                  f"{r['on_ratio']:7.2f} {r['off_check_us']:14.4f} {r['spread_us']:10.3f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
