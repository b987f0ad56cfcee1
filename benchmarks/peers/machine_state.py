"""One launch's machine state: pycollective, native MPI and a local copy in turn.

    for i in 1 2 3 4 5 6 7 8; do
        scripts/run_mpi.sh 2 benchmarks/peers/machine_state.py --count 1e5; done

On the shared 2-core VMs the time of a call that moves data between the
cores changes by up to 6x from one launch to the next (and sometimes within
one), while a copy inside one process does not: the cores' shared caches
and the path between them are not the same from minute to minute.  A launch
prints, for one size, the slowest rank's median time per call of
``allreduce(algorithm=...)``, of the MPI library's own ``Allreduce``, of a
local ``dst[...] = src`` (no other core involved), and of ``allreduce``
again: when pycollective and native MPI are slow together while the local
copy is not, the launch met a slow machine state, not a slow library.
Results are checked against the exact per-rank, per-index sum.
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
    p.add_argument("--count", type=count_arg, default=100_000)
    p.add_argument("--algorithm", default="shm")
    p.add_argument("--calls", type=int, default=2000)
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    n = comm.size
    src, expected = exact_case(args.count, comm.rank, n)
    dst = np.empty_like(src)

    def ours():
        pycollective.allreduce(src, dst, MPI.SUM, algorithm=args.algorithm)

    def native():
        comm.Allreduce(src, dst, MPI.SUM)

    def local():
        dst[...] = src

    def timed(fn, check):
        for _ in range(200):
            fn()
        if check and not np.array_equal(dst, expected):
            raise SystemExit(f"rank {comm.rank}: wrong sum from {fn.__name__}")
        samples = []
        for _ in range(5):
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(max(1, args.calls // 5)):
                fn()
            samples.append((time.perf_counter() - t0) / max(1, args.calls // 5))
        return comm.allreduce(float(np.median(samples)), op=MPI.MAX)

    times = [timed(ours, True), timed(native, True), timed(local, False), timed(ours, True)]
    if comm.rank == 0:
        print(f"N = {n}, M = {args.count}: {args.algorithm} {times[0] * 1e6:.1f} us, "
              f"native {times[1] * 1e6:.1f} us, local copy {times[2] * 1e6:.1f} us, "
              f"{args.algorithm} again {times[3] * 1e6:.1f} us")


if __name__ == "__main__":
    main()
