"""The first calls of a fresh launch, 25 at a time: does a launch warm up?

    scripts/run_mpi.sh 8 benchmarks/peers/first_calls.py shm      # or: auto, ring, ..., mpi

From the launch's first call: ``--calls`` repetitions of the peers' loop
(fill the result with NaN, Barrier, ``perf_counter`` around one allreduce of
``--count`` float32; ``mpi`` is the library's own ``comm.Allreduce``).
Prints the median of the slowest rank's time over each block of 25 calls,
in µs, first block first.
"""

import argparse
import sys
import time

import numpy as np
from mpi4py import MPI


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("algorithm", help="a pycollective algorithm, or mpi")
    p.add_argument("--count", type=lambda s: int(float(s)), default=1000)
    p.add_argument("--calls", type=int, default=400)
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    x = (np.arange(args.count) % 7 + comm.rank).astype(np.float32)
    out = np.empty_like(x)
    if args.algorithm == "mpi":
        def call():
            comm.Allreduce(x, out)
    else:
        import pycollective

        def call():
            pycollective.allreduce(x, out, "sum", comm=comm, algorithm=args.algorithm)
    local = []
    for _ in range(args.calls):
        out.fill(np.nan)
        comm.Barrier()
        t0 = time.perf_counter()
        call()
        local.append(time.perf_counter() - t0)
    worst = np.empty(args.calls)
    comm.Allreduce(np.array(local), worst, op=MPI.MAX)
    if comm.rank == 0:
        blocks = [np.median(worst[i:i + 25]) * 1e6 for i in range(0, args.calls, 25)]
        print(f"{args.algorithm} N={comm.size} M={args.count}: " + " ".join(f"{b:.0f}" for b in blocks))


if __name__ == "__main__":
    sys.exit(main())
