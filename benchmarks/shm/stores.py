"""shm's repeated calls with plain, non-temporal or chosen stores, taking turns in one launch.

    scripts/run_mpi.sh 2 benchmarks/shm/stores.py --count 1e4 1e5 2.5e5

A repeated ``shm`` call below 1 MiB writes what the other ranks read (its input
past its own slice, then its slice of the result) into its slot.  Plain stores
leave those lines in the writer's cache, where a reader on another core takes
them from; non-temporal stores send them to memory.  Which is faster depends on
the machine's state: on some VMs a launch reads another core's cache lines
several times slower than the launch before (docs/results/stores.md).  From
``rsag_steps.CHOOSE_BYTES`` each rank chooses while running
(``stores.Stores``); this times the three ways (``stores.FORCE_STORES`` 0, 1,
None) in batches that take turns, so all three meet the same state, and checks
every result against the exact sum.  A launch's state decides which kind wins:
run it several times.

Prints per size: each way's median over batches of the slowest rank's time per
call (calls back to back), and the ratios to plain stores.
"""

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import pycollective
from pycollective.algorithms.shm import rsag_steps as _rsag_steps
from pycollective.algorithms.shm import stores as _stores
from pycollective.bench import _exact

WAYS = (("plain", 0), ("non-temporal", 1), ("chosen", None))


def _batch(comm, send, out, calls):
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(calls):
        pycollective.allreduce(send, out, "sum", comm=comm, algorithm="shm")
    return comm.allreduce((time.perf_counter() - t) / calls, op=MPI.MAX)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=float, nargs="+", default=[1e4, 1e5, 2.5e5])
    parser.add_argument("--batches", type=int, default=9)
    parser.add_argument("--megabytes", type=float, default=40.0,
                        help="about this much input per rank and batch (sets the calls)")
    parser.add_argument("--choose-bytes", type=int, default=None,
                        help="the size from which the step chooses its stores "
                             "(rsag_steps.CHOOSE_BYTES; default: the library's)")
    args = parser.parse_args()
    if args.choose_bytes is not None:
        _rsag_steps.CHOOSE_BYTES = args.choose_bytes  # read when a shape's plan is made
    comm = MPI.COMM_WORLD
    n, r = comm.Get_size(), comm.Get_rank()
    for count in (int(c) for c in args.count):
        send, expected = _exact.exact_case(count, r, n)
        out = np.empty_like(send)
        calls = max(20, min(2000, int(args.megabytes * 1e6 / max(1, send.nbytes))))
        times = {name: [] for name, _ in WAYS}
        wrong = 0
        for b in range(-1, args.batches):  # an untimed round first (compiling, the choice)
            for w in range(len(WAYS)):
                name, force = WAYS[(w + b) % len(WAYS)]
                _stores.FORCE_STORES = force
                out.fill(np.nan)
                seconds = _batch(comm, send, out, calls)
                wrong += int(not np.array_equal(out, expected))
                if b >= 0:
                    times[name].append(seconds)
        _stores.FORCE_STORES = None
        wrong = comm.allreduce(wrong)
        if r == 0:
            med = {name: statistics.median(t) for name, t in times.items()}
            plain = med["plain"]
            print(f"N={n} count={count:>8d}  plain {plain * 1e6:8.1f} us  "
                  f"non-temporal/plain {med['non-temporal'] / plain:5.2f}  "
                  f"chosen/plain {med['chosen'] / plain:5.2f}  "
                  f"{'all right' if not wrong else f'{wrong} WRONG'}", flush=True)
        if wrong:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
