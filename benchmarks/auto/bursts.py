"""Several algorithms in turn, in bursts: how long a call stays slowed by the switch.

    scripts/run_mpi.sh 4 benchmarks/auto/bursts.py --count 1e3

What ``auto``'s trials see: each round runs every algorithm in turn, ``--burst``
calls in a row each, from the launch's first call.  Prints, per algorithm and
position in its burst, the median over rounds (the first two left out: they
build state and compile) of the slowest rank's time of that call.  If the
first call of a burst is much slower than the last, a trial of one call per
candidate measures the switch, not the algorithm (``pycollective.model.tuning``
times the second half of bursts of ``BURST`` calls).  Results are checked.
"""

import argparse
import time

import numpy as np
from mpi4py import MPI

import pycollective
from pycollective.bench._exact import exact_case
from pycollective.bench._units import count_arg


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=count_arg, default=1000)
    p.add_argument("--algorithms", nargs="+", default=["shm", "butterfly", "hierarchical", "naive"])
    p.add_argument("--burst", type=int, default=4)
    p.add_argument("--rounds", type=int, default=10)
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    n = comm.size
    x, expected = exact_case(args.count, comm.rank, n)
    out = np.empty_like(x)
    times = np.zeros((args.rounds, len(args.algorithms), args.burst))
    for r in range(args.rounds):
        for i, name in enumerate(args.algorithms):
            for b in range(args.burst):
                t0 = time.perf_counter()
                pycollective.allreduce(x, out, MPI.SUM, algorithm=name)
                times[r, i, b] = time.perf_counter() - t0
                if not np.array_equal(out, expected):
                    raise SystemExit(f"rank {comm.rank}: {name} gave a wrong sum")
    slowest = np.empty_like(times)
    comm.Reduce(times, slowest, op=MPI.MAX, root=0)
    if comm.rank == 0:
        settled = slowest[2:] if args.rounds > 2 else slowest
        print(f"N = {n}, M = {args.count}, bursts of {args.burst}, median of rounds "
              f"3..{args.rounds} (us), by position in the burst:")
        for i, name in enumerate(args.algorithms):
            cells = " ".join(f"{np.median(settled[:, i, b]) * 1e6:8.0f}" for b in range(args.burst))
            print(f"  {name:<14} {cells}")


if __name__ == "__main__":
    main()
