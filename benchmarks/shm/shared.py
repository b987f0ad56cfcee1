"""shm on plain arrays against arrays from ``pycollective.shared_empty``, in one launch.

    scripts/run_mpi.sh 4 benchmarks/shm/shared.py --counts 3e5 1e6 3e6 1e7

Above 1 MiB ``shm`` reads a peer's slice of a plain array through a copy
(``process_vm_readv`` into a staging block, or the peer's copy into its
shared slot); a ``shared_empty`` array it reads where it lies.  Rounds take
turns (the order alternating) between the two kinds of buffer and the MPI
library's own Allreduce; prints the median over rounds of the slowest
rank's time per call, and shared / plain.  Results are checked against the
exact sum of the per-rank, per-index inputs, and the send buffers against
their inputs, after every round.
"""

import argparse

import numpy as np
from mpi4py import MPI

import pycollective
from pycollective.bench._exact import exact_case
from pycollective.bench._units import count_arg

from _turns import take_turns


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--counts", nargs="+", type=count_arg, default=[300_000, 1_000_000, 10_000_000])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--bytes", type=float, default=2e8,
                   help="bytes moved per contender and round, all ranks together (sets calls)")
    args = p.parse_args(argv)
    world = MPI.COMM_WORLD
    n, rank = world.size, world.rank
    if rank == 0:
        print(f"N = {n}, allreduce float32 SUM, median over {args.rounds} rounds of the "
              "slowest rank (ms)")
    for count in args.counts:
        x, expected = exact_case(count, rank, n)
        plain_src, plain_dst = x.copy(), np.empty_like(x)
        shared_src = pycollective.shared_empty(count, x.dtype)
        shared_dst = pycollective.shared_empty(count, x.dtype)
        shared_src[...] = x
        buffers = {"plain": (plain_src, plain_dst), "shared": (shared_src, shared_dst),
                   "native": (plain_src, plain_dst)}

        def way(name):
            src, dst = buffers[name]
            if name == "native":
                return lambda: world.Allreduce(src, dst)
            return lambda: pycollective.allreduce(src, dst, algorithm="shm")

        def wrong(name):
            src, dst = buffers[name]
            if not (np.array_equal(dst, expected) and np.array_equal(src, x)):
                return f"{name} gave a wrong result at M = {count}"
            return None

        calls = max(3, min(30, int(args.bytes / (count * 4 * n))))
        med = take_turns(world, {name: way(name) for name in buffers}, args.rounds, calls,
                         wrong)
        pycollective.release(shared_src)
        pycollective.release(shared_dst)
        if rank == 0:
            cells = "  ".join(f"{name} {t * 1e3:7.2f}" for name, t in med.items())
            print(f"M = {count:>9} ({count * 4 / 2**20:5.1f} MiB): {cells}  "
                  f"shared / plain {med['shared'] / med['plain']:.2f}", flush=True)


if __name__ == "__main__":
    main()
