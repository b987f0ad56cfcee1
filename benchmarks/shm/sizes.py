"""shm's time per KiB across sizes, in one launch: where a path's limit puts a step.

    scripts/run_mpi.sh 2 benchmarks/shm/sizes.py --count 2.6e5 2.8e5 5e5 1e6 2e6 4e6

Each count (float32 per rank) is called ``--warm`` times first (its trials of ways
and stores settle), then in ``--rounds`` rounds, the counts in turn, ``--calls``
calls each, every call right after a ``Barrier``; a round's time is the slowest
rank's median call, a count's time the median over rounds.  Prints one row per
count: its bytes per rank, each round's time (µs), and µs per KiB, so that a
size just above a limit of the shm paths (``DOUBLE_LIMIT``, ``SINGLE_COPY_BYTES``)
shows as a step in the last column.  Every call's result is checked against
the exact per-rank, per-index sum.
"""

import argparse
import time

import numpy as np
from mpi4py import MPI

import pycollective
from pycollective.bench import _exact


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=float, nargs="+",
                        default=[2.6e5, 2.8e5, 5e5, 1e6, 2e6, 4e6])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--warm", type=int, default=30)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    n, r = comm.Get_size(), comm.Get_rank()
    cases = []
    for count in map(int, args.count):
        everyone = [_exact.exact_values(0, count, q, n, "float32", "sum") for q in range(n)]
        cases.append((count, everyone[r], _exact.exact_reduce(everyone, "sum", "float32")))
    wrong = 0

    def call(send, expected):
        nonlocal wrong
        out = np.empty_like(send)
        comm.Barrier()
        start = time.perf_counter()
        pycollective.allreduce(send, out, "sum", comm=comm, algorithm="shm")
        seconds = time.perf_counter() - start
        wrong += not np.array_equal(out, expected)
        return seconds

    for _, send, expected in cases:
        for _ in range(args.warm):
            call(send, expected)
    rounds = {count: [] for count, _, _ in cases}
    for _ in range(args.rounds):
        for count, send, expected in cases:
            mine = np.array([np.median([call(send, expected) for _ in range(args.calls)])])
            slowest = np.empty_like(mine)
            comm.Allreduce(mine, slowest, op=MPI.MAX)
            rounds[count].append(float(slowest[0]))
    wrong = comm.allreduce(wrong, op=MPI.SUM)
    if r == 0:
        print(f"{n} ranks, shm, float32 sum; each round: the slowest rank's median of "
              f"{args.calls} calls, us")
        for count, times in rounds.items():
            kib = count * 4 / 1024
            print(f"{count:>9} {kib:9.1f} KiB  " + " ".join(f"{t * 1e6:8.1f}" for t in times)
                  + f"  | {np.median(times) * 1e6 / kib:.3f} us/KiB")
        print(f"wrong results: {wrong}")
    if wrong:
        raise SystemExit(f"{wrong} results were wrong")


if __name__ == "__main__":
    main()
