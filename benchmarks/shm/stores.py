"""shm's repeated sliced calls with plain, non-temporal or chosen stores, in one launch.

    scripts/run_mpi.sh 2 benchmarks/shm/stores.py --counts 2e3 1e4 1e5 2.5e5

Between 4 KiB and 1 MiB a repeated ``shm`` call copies its input into its
slot and the other ranks read it from there.  Its copy-in can use plain
stores (the data stay in the writer's cache) or non-temporal ones (they go
to memory); ``_shm_steps.Stores`` chooses per rank while the calls run
(docs/results/2026-12-02-entry.md says why).  This times the three ways
in batches that take turns in one launch (``_shm_steps.FORCE_STORES`` 0, 1,
or None: chosen), so all three meet the same machine state, and checks every
result.  A launch's state decides which kind wins, so run it several times:

    for i in 1 2 3 4 5 6; do scripts/run_mpi.sh 2 benchmarks/shm/stores.py; done

Above 1 MiB (to the single copy at 8 MiB) the slot path chooses the same
way for its copy-in and for the writes of its own slice into the slot, with
non-temporal stores fixed where ranks outnumber cores; there time each call
alone, as the peers' comparison does:

    scripts/run_mpi.sh 4 benchmarks/shm/stores.py --counts 3e5 5e5 1e6 2e6 --between

Printed per size: each way's median over batches of the slowest rank's time
per call, and the ratios to plain stores.
"""

import argparse
import statistics
import sys
import time

import numpy as np


def _one_launch(args):
    from mpi4py import MPI

    import pycollective
    from pycollective.bench._exact import exact_reduce, exact_values
    from pycollective.algorithms.shm import steps as _shm_steps

    comm = MPI.COMM_WORLD
    n, r = comm.Get_size(), comm.Get_rank()
    ways = [("plain", 0), ("non-temporal", 1), ("chosen", None)]
    for count in args.counts:
        send = exact_values(0, count, r, n, "float32", "sum")
        expected = exact_reduce([exact_values(0, count, q, n, "float32", "sum")
                                 for q in range(n)], "sum", "float32")
        out = np.empty_like(send)
        # at most about --megabytes through each rank per batch
        steps = max(5, min(args.steps, int(args.megabytes * 1e6 / max(1, send.nbytes))))
        times = {name: [] for name, _ in ways}
        wrong = 0
        for b in range(-1, args.batches):  # one untimed round first (compiling, probing)
            for w in range(len(ways)):
                name, force = ways[(w + b) % len(ways)]
                _shm_steps.FORCE_STORES = force
                if args.between:
                    own = []
                    for _ in range(steps):
                        out.fill(np.nan)
                        comm.Barrier()
                        t0 = time.perf_counter()
                        pycollective.allreduce(send, out, "sum", comm=comm, algorithm="shm")
                        own.append(time.perf_counter() - t0)
                    seconds = comm.allreduce(statistics.median(own), MPI.MAX)
                else:
                    comm.Barrier()
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        pycollective.allreduce(send, out, "sum", comm=comm, algorithm="shm")
                    seconds = comm.allreduce((time.perf_counter() - t0) / steps, MPI.MAX)
                wrong += int(not np.array_equal(out, expected))
                if b >= 0:
                    times[name].append(seconds)
        _shm_steps.FORCE_STORES = None
        wrong = comm.allreduce(wrong)
        if r == 0:
            med = {name: statistics.median(t) for name, t in times.items()}
            print(f"N={n} count={count:>8d}  plain {med['plain'] * 1e6:8.1f} us  "
                  f"non-temporal {med['non-temporal'] * 1e6:8.1f} us  "
                  f"chosen {med['chosen'] * 1e6:8.1f} us  "
                  f"nt/plain {med['non-temporal'] / med['plain']:5.2f}  "
                  f"chosen/plain {med['chosen'] / med['plain']:5.2f}  "
                  f"chosen/best {med['chosen'] / min(med['plain'], med['non-temporal']):5.2f}"
                  + (f"  WRONG {wrong}" if wrong else ""), flush=True)
        if wrong:
            raise SystemExit(f"{wrong} wrong results")


def main(argv=None):
    from pycollective.bench._units import count_arg

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--counts", type=count_arg, nargs="+", default=[2000, 10_000, 100_000])
    p.add_argument("--batches", type=int, default=6, help="batches of each way per size")
    p.add_argument("--steps", type=int, default=200, help="calls per batch (at most)")
    p.add_argument("--megabytes", type=float, default=100,
                   help="fewer calls per batch where they would move more than this per rank")
    p.add_argument("--between", action="store_true",
                   help="time each call alone, as the peers' loop does: fill the result with "
                        "NaN and Barrier before it; each batch's median of them")
    args = p.parse_args(argv)
    _one_launch(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
