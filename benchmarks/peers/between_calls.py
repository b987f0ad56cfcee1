"""What the work between timed calls does to the next call's time (native MPI_Allreduce).

    scripts/run_mpi.sh 4 benchmarks/peers/between_calls.py --count 1e6

Times ``comm.Allreduce`` of ``--count`` float32 the way the peers' loop does
(fill the result with NaN, Barrier, ``perf_counter`` around one call; the
slowest rank's time, median over ``--reps``), with different work between
one call and the next Barrier, the variants taking turns for ``--rounds``
rounds: nothing but the loop's own check (``plain``), two ``zlib.crc32`` of
the 4 MB buffers (what ``python -m pycollective.bench`` computes per call),
numpy arithmetic of about the same CPU time, and a sleep of that long.
Prints each variant's median per round, in ms, and the CPU time of the work.
"""

import argparse
import statistics
import sys
import time
import zlib

import numpy as np
from mpi4py import MPI


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=lambda s: int(float(s)), default=1_000_000)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    x = (np.arange(args.count) % 7 + comm.rank).astype(np.float32)
    out, tmp, expected = np.empty_like(x), np.empty_like(x), np.empty_like(x)
    comm.Allreduce(x, expected)

    def timed():
        out.fill(np.nan)
        comm.Barrier()
        t0 = time.perf_counter()
        comm.Allreduce(x, out)
        return time.perf_counter() - t0

    def check():
        return np.count_nonzero(out != expected)

    def crcs():
        return zlib.crc32(out), zlib.crc32(x)

    def arithmetic():
        for _ in range(4):
            np.add(out, expected, out=tmp)

    t0 = time.perf_counter()
    crcs()
    crc_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    arithmetic()
    arithmetic_s = time.perf_counter() - t0
    variants = {
        "plain": check,
        "crc32 x2": lambda: (check(), crcs()),
        "numpy arithmetic": lambda: (check(), arithmetic()),
        "sleep": lambda: (check(), time.sleep(crc_s)),
    }
    medians = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, between in variants.items():
            local = []
            for _ in range(args.reps):
                local.append(timed())
                between()
            worst = np.empty(args.reps)
            comm.Allreduce(np.array(local), worst, op=MPI.MAX)
            medians[name].append(statistics.median(worst) * 1e3)
    if comm.rank == 0:
        print(f"# N={comm.size} M={args.count}: rank 0's work between calls: crc32 x2 "
              f"{crc_s * 1e3:.2f} ms, numpy arithmetic {arithmetic_s * 1e3:.2f} ms "
              f"(sleep: as long as the CRCs)")
        for name, ms in medians.items():
            print(f"{name:18s} " + "  ".join(f"{m:.2f}" for m in ms) + "  ms")


if __name__ == "__main__":
    sys.exit(main())
