"""shm's repeated calls with two slot regions and with four, interleaved.

    scripts/run_mpi.sh 2 benchmarks/shm/regions.py --count 6e3 1e4 1.4e4 1e5

Calls of up to ``rsag_steps.BANKS_BYTES`` that fit a quarter of the slot take four
regions in turn, two in each half (``algorithms/shm/rsag.py``, ``BANK``).  One launch,
two communicators: on one the setting is off when each size's plan is made (two
regions, as before), on the other on.  In ``--rounds`` rounds, in alternating order,
each times ``--calls`` calls back to back (a training loop's pattern; the peers report
times one call after a Barrier); the slowest rank's time per call, then the median over
rounds.  ``--shift`` places the caller's buffers at that many bytes past a page (the
send buffer; the receive buffers 1 and 2 KiB further).  Every result is checked
against the exact sum.  Prints one row per size: the two times and four / two.
"""

import argparse
import time

import numpy as np
from mpi4py import MPI

import pycollective
from pycollective.algorithms.shm import rsag_steps


def _placed(count, at):
    raw = np.empty(count * 4 + 8192, np.uint8)
    base = (-raw.ctypes.data) % 4096
    return raw[base + at:base + at + count * 4].view(np.float32)


def _loop(comm, x, y, calls):
    start = time.perf_counter()
    for _ in range(calls):
        pycollective.allreduce(x, y, comm=comm, algorithm="shm")
    return (time.perf_counter() - start) / calls


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=float, nargs="+", default=[6e3, 1e4, 1.4e4, 1e5])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--shift", type=int, default=0)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    n, r = world.Get_size(), world.Get_rank()
    comms = {"two": world.Dup(), "four": world.Dup()}
    kept = rsag_steps.BANKS_BYTES
    if r == 0:
        print(f"# {n} ranks, float32 sum, {args.calls} calls back to back, median of "
              f"{args.rounds} rounds (us per call, slowest rank)")
    for count in (int(c) for c in args.count):
        x = _placed(count, args.shift % 4096)
        x[:] = np.arange(count) % 7 + r
        expect = (np.arange(count) % 7) * n + n * (n - 1) // 2
        ys = {k: _placed(count, (args.shift + 1024 * (i + 1)) % 4096)
              for i, k in enumerate(comms)}
        for name, comm in comms.items():
            rsag_steps.BANKS_BYTES = kept if name == "four" else 0
            for _ in range(30):  # the plan is made on the first calls, with the setting
                pycollective.allreduce(x, ys[name], comm=comm, algorithm="shm")
        rsag_steps.BANKS_BYTES = kept
        times = {k: [] for k in comms}
        for i in range(args.rounds):
            for name in (list(comms) if i % 2 else list(comms)[::-1]):
                world.Barrier()
                t = _loop(comms[name], x, ys[name], args.calls)
                times[name].append(world.allreduce(t, op=MPI.MAX) * 1e6)
        for name in comms:
            if not np.array_equal(ys[name], expect):
                raise SystemExit(f"rank {r}: {name}: wrong result at count {count}")
        if r == 0:
            two, four = np.median(times["two"]), np.median(times["four"])
            print(f"count {count:>8}: two regions {two:8.2f}, four {four:8.2f}, "
                  f"four / two {four / two:.2f}", flush=True)
    for comm in comms.values():
        comm.Free()


if __name__ == "__main__":
    main()
