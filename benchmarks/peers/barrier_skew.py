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
beside the MPI library's, in turns; with ``--after COUNT``, also
``pycollective.allreduce`` of COUNT float32 timed right after each barrier
(the slowest rank's time, median over rounds): what the spread costs the call
the report times.  One machine only: clocks of two hosts are not comparable.
"""

import argparse
import json
import time

import numpy as np
from mpi4py import MPI


def spread_of(comm, barrier, rounds, after=None):
    """(median, p90) of max - min over ranks of the clock read right after ``barrier``,
    its microseconds per call back to back, and (``after``: a call) the slowest rank's
    median microseconds of ``after()`` timed right after the barrier (rank 0; the first
    100 rounds are warm-up)."""
    mine, every = np.zeros(1), np.zeros(comm.Get_size())
    spread, calls = [], []
    for i in range(rounds):
        barrier()
        mine[0] = time.perf_counter()
        comm.Gather(mine, every, root=0)
        if i >= 100:
            spread.append((every.max() - every.min()) * 1e6)
        if after is not None:
            barrier()
            t0 = time.perf_counter()
            after()
            mine[0] = time.perf_counter() - t0
            comm.Gather(mine, every, root=0)
            if i >= 100:
                calls.append(every.max() * 1e6)
    barrier()
    t0 = time.perf_counter()
    for _ in range(rounds):
        barrier()
    own = (time.perf_counter() - t0) / rounds * 1e6
    if not spread:
        return None
    return (np.median(spread), np.percentile(spread, 90), own,
            np.median(calls) if calls else np.nan)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--pycollective", action="store_true",
                        help="also pycollective.barrier, the two taking turns (3 turns each)")
    parser.add_argument("--json", help="also write the rows to this file (rank 0)")
    parser.add_argument("--after", type=lambda v: int(float(v)), default=None,
                        help="time pycollective.allreduce of this many float32 after each "
                             "barrier (implies --pycollective)")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    library = MPI.Get_library_version().splitlines()[0].strip()
    barriers = {library: comm.Barrier}
    after = None
    if args.pycollective or args.after is not None:
        import pycollective
        barriers["pycollective.barrier"] = lambda: pycollective.barrier(comm)
        if args.after is not None:
            x = np.arange(args.after, dtype=np.float32) % 13 + comm.Get_rank()
            out = np.empty_like(x)

            def after():
                pycollective.allreduce(x, out, comm=comm)
    turns = 3 if len(barriers) > 1 else 1
    got = {name: [] for name in barriers}
    for _ in range(turns):
        for name, barrier in barriers.items():
            got[name].append(spread_of(comm, barrier, args.rounds, after))
    if after is not None:
        n = comm.Get_size()
        want = n * (np.arange(args.after, dtype=np.float32) % 13) + n * (n - 1) // 2
        if comm.allreduce(0 if np.array_equal(out, want) else 1):
            raise SystemExit(f"wrong allreduce result at {args.after} float32")
    if comm.Get_rank() == 0 and args.rounds > 100:
        rows = []
        for name, runs in got.items():
            median, p90, own, call = np.median(np.array(runs), axis=0)
            rows.append(dict(barrier=name, nranks=comm.Get_size(), spread_us=float(median),
                             p90_us=float(p90), back_to_back_us=float(own),
                             after=args.after, after_us=None if np.isnan(call) else float(call)))
            print(f"{name}: {comm.Get_size()} ranks leave the barrier within {median:.2f} us "
                  f"(median), {p90:.2f} us (p90); {own:.2f} us a barrier back to back"
                  + (f"; allreduce of {args.after:g} float32 after it {call:.2f} us"
                     if after is not None else ""))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
