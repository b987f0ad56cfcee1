"""How far apart the ranks leave an MPI library's Barrier: the spread of a shared clock.

    PYTHON=$VENVS/impi/bin/python scripts/run_mpi.sh 2 benchmarks/peers/barrier_skew.py

The peers report times one call after a Barrier on the slowest rank
(``point.py``); a rank that leaves the Barrier early waits inside the timed
call for the last one, so each library's call is charged its own Barrier's
spread.  Every rank reads ``time.perf_counter`` (CLOCK_MONOTONIC, one clock
for the processes of a machine) right after ``--rounds`` Barriers; rank 0
prints the median and 90th percentile of max - min (the first 100 rounds are
warm-up).  One machine only: clocks of two hosts are not comparable.
"""

import argparse
import time

import numpy as np
from mpi4py import MPI


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3000)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    mine, every = np.zeros(1), np.zeros(comm.Get_size())
    spread = []
    for i in range(args.rounds):
        comm.Barrier()
        mine[0] = time.perf_counter()
        comm.Gather(mine, every, root=0)
        if comm.Get_rank() == 0 and i >= 100:
            spread.append((every.max() - every.min()) * 1e6)
    if comm.Get_rank() == 0 and spread:
        library = MPI.Get_library_version().splitlines()[0].strip()
        print(f"{library}: {comm.Get_size()} ranks leave the Barrier within "
              f"{np.median(spread):.2f} us (median), {np.percentile(spread, 90):.2f} us (p90)")


if __name__ == "__main__":
    main()
