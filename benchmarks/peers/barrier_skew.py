"""How far apart the ranks leave a barrier: the spread of a shared clock.

    PYTHON=$VENVS/impi/bin/python scripts/run_mpi.sh 2 benchmarks/peers/barrier_skew.py
    scripts/run_mpi.sh 2 benchmarks/peers/barrier_skew.py --pycollective

The peers report times one call after a Barrier on the slowest rank
(``point.py``); a rank that leaves the Barrier early waits inside the timed
call for the last one, so each library's call is charged its own Barrier's
spread.  Every rank reads ``time.perf_counter`` (CLOCK_MONOTONIC, one clock
for the processes of a machine) right after ``--rounds`` Barriers; rank 0
prints the median and 90th percentile of max - min (the first 100 rounds are
warm-up), and the barrier's own time back to back.  ``--pycollective``: the
same for ``pycollective.barrier`` (which the report times pycollective after)
beside the MPI library's, in turns.  One machine only: clocks of two hosts are
not comparable.
"""

import argparse
import time

import numpy as np
from mpi4py import MPI


def spread_of(comm, barrier, rounds):
    """(median, p90) of max - min over ranks of the clock read right after ``barrier``,
    and its seconds per call back to back (rank 0; the first 100 rounds are warm-up)."""
    mine, every = np.zeros(1), np.zeros(comm.Get_size())
    spread = []
    for i in range(rounds):
        barrier()
        mine[0] = time.perf_counter()
        comm.Gather(mine, every, root=0)
        if i >= 100:
            spread.append((every.max() - every.min()) * 1e6)
    barrier()
    t0 = time.perf_counter()
    for _ in range(rounds):
        barrier()
    own = (time.perf_counter() - t0) / rounds * 1e6
    return (np.median(spread), np.percentile(spread, 90), own) if spread else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--pycollective", action="store_true",
                        help="also pycollective.barrier, the two taking turns (3 turns each)")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    library = MPI.Get_library_version().splitlines()[0].strip()
    barriers = {library: comm.Barrier}
    if args.pycollective:
        import pycollective
        barriers["pycollective.barrier"] = lambda: pycollective.barrier(comm)
    turns = 3 if args.pycollective else 1
    got = {name: [] for name in barriers}
    for _ in range(turns):
        for name, barrier in barriers.items():
            got[name].append(spread_of(comm, barrier, args.rounds))
    if comm.Get_rank() == 0 and args.rounds > 100:
        for name, runs in got.items():
            median, p90, own = np.median(np.array(runs), axis=0)
            print(f"{name}: {comm.Get_size()} ranks leave the barrier within {median:.2f} us "
                  f"(median), {p90:.2f} us (p90); {own:.2f} us a barrier back to back")


if __name__ == "__main__":
    main()
