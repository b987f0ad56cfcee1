"""A repeated allreduce back to back, the simplest loop: for comparing revisions launch by
launch (the package on ``PYTHONPATH``), where ranks share cores and a launch's
scheduling moves every number.

    scripts/run_mpi.sh 4 benchmarks/shm/loop.py --count 1e3 1e5
    git worktree add /tmp/old REV
    for i in 1 2 3 4 5 6 7 8 9 10; do
        PYTHONPATH=/tmp/old/src scripts/run_mpi.sh 4 benchmarks/shm/loop.py --count 1e3
        PYTHONPATH=src scripts/run_mpi.sh 4 benchmarks/shm/loop.py --count 1e3
    done

Per size: ``--rounds`` rounds of ``--calls`` calls of
``pycollective.allreduce(send, out, algorithm=...)`` (float32 SUM) after 30 untimed
ones; each round's time per call is the slowest rank's.  Prints the lowest and the
median round (the lowest is the round the scheduler disturbed least) and whether
every result was the exact sum.  Uses only the public function, so it runs any
revision's package.
"""

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import pycollective
from pycollective.bench import _exact


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=float, nargs="+", default=[1e3])
    parser.add_argument("--algorithm", default="shm")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    n, r = comm.Get_size(), comm.Get_rank()
    for count in (int(c) for c in args.count):
        send, expected = _exact.exact_case(count, r, n)
        out = np.empty_like(send)
        for _ in range(30):
            pycollective.allreduce(send, out, algorithm=args.algorithm)
        rounds = []
        for _ in range(args.rounds):
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                pycollective.allreduce(send, out, algorithm=args.algorithm)
            rounds.append(comm.allreduce((time.perf_counter() - t0) / args.calls, op=MPI.MAX))
        right = comm.allreduce(bool(np.array_equal(out, expected)), op=MPI.LAND)
        if r == 0:
            print(f"N = {n} M = {count} {args.algorithm}: lowest {min(rounds) * 1e6:.2f} us, "
                  f"median {statistics.median(rounds) * 1e6:.2f} us per call, "
                  f"{'right' if right else 'WRONG'}")


if __name__ == "__main__":
    main()
