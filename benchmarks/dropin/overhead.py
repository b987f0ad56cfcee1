"""What the drop-in costs per call: ``pycollective.Comm.Allreduce`` beside ``pycollective.allreduce``
and the wrapped library's own ``Allreduce``, on the same arrays, in one launch.

    scripts/run_mpi.sh 2 benchmarks/dropin/overhead.py --count 1 1e3 1e4 1e5
    scripts/run_mpi.sh 2 benchmarks/dropin/overhead.py --count 1e3 1e4 --rows 10   # shaped

A training script that swaps ``MPI.COMM_WORLD`` for ``pycollective.Comm(MPI.COMM_WORLD)``
calls ``comm.Allreduce(grad, out, op=MPI.SUM)`` (or in place) on the same arrays every
step.  Per size this times, in batches that take turns, calls back to back of:

* ``public``: ``pycollective.allreduce(send, out)`` (auto);
* ``dropin``: ``Comm.Allreduce(send, out, op=MPI.SUM)``;
* ``dropin in place``: ``Comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)``, each call after
  refilling ``buf`` from the send array (a copy the others do not make);
* ``native``: the wrapped communicator's own ``Allreduce(send, out, op=MPI.SUM)``.

Each cell is the median over batches of the slowest rank's time per call; every
result is checked against the exact sum (tolerance 0).
"""

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import pycollective
from pycollective.bench import _exact


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=float, nargs="+", default=[1, 1e3, 1e4, 1e5])
    parser.add_argument("--batches", type=int, default=7)
    parser.add_argument("--rows", type=int, default=1,
                        help="arrays shaped (ROWS, count / ROWS) where it divides (a layer's "
                             "gradient), else flat")
    parser.add_argument("--calls", type=int, default=1000,
                        help="calls per batch at most (fewer for large counts)")
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    n, r = world.Get_size(), world.Get_rank()
    drop = pycollective.Comm(world)
    if r == 0:
        print(f"N={n}: time per call, back to back (slowest rank, median of {args.batches} "
              "batches); ratios to the public function", flush=True)
        print(f"{'count':>9} {'public':>10} {'dropin':>10} {'in place':>10} {'native':>10} "
              f"{'dropin/public':>14} {'dropin/native':>14}", flush=True)
    for count in (int(c) for c in args.count):
        send, expected = _exact.exact_case(count, r, n)
        if args.rows > 1 and count % args.rows == 0:
            send, expected = send.reshape(args.rows, -1), expected.reshape(args.rows, -1)
        out, buf = np.empty_like(send), np.empty_like(send)
        calls = max(5, min(args.calls, int(4e8 // max(1, send.nbytes * 100))))
        ways = {
            "public": lambda: pycollective.allreduce(send, out),
            "dropin": lambda: drop.Allreduce(send, out, op=MPI.SUM),
            "in place": lambda: (buf.__setitem__(Ellipsis, send),
                                 drop.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)),
            "native": lambda: world.Allreduce(send, out, op=MPI.SUM),
        }
        times = {name: [] for name in ways}
        wrong = 0
        names = list(ways)
        for b in range(-1, args.batches):  # an untimed round first (plans, auto's trials)
            for w in range(len(names)):
                name = names[(w + b) % len(names)]
                run = ways[name]
                for _ in range(3 if b >= 0 else 300):
                    run()
                world.Barrier()
                t = time.perf_counter()
                for _ in range(calls):
                    run()
                seconds = world.allreduce((time.perf_counter() - t) / calls, op=MPI.MAX)
                got = buf if name == "in place" else out
                wrong += int(not np.array_equal(got, expected))
                if b >= 0:
                    times[name].append(seconds)
        wrong = world.allreduce(wrong)
        if r == 0:
            med = {name: statistics.median(t) for name, t in times.items()}
            print(f"{count:>9} " + " ".join(f"{med[k] * 1e6:8.2f}us" for k in names)
                  + f" {med['dropin'] / med['public']:14.2f} {med['dropin'] / med['native']:14.2f}"
                  + ("" if not wrong else f"  {wrong} WRONG"), flush=True)
        if wrong:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
