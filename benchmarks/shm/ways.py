"""shm above 4 MiB per rank: the slots, the single copy and the chosen way, interleaved.

    scripts/run_mpi.sh 2 benchmarks/shm/ways.py --count 1.1e6 2e6 4e6

One launch, three communicators: on one every call above the limit goes through the
node's slots, on one by single copy (``shm.ways.FORCE_WAY`` pinned while its
calls run), and on the third the calls choose as a program's do (each size's
first calls try both ways, then every rank takes the one the slowest rank found
faster: ``shm.ways.Way``).  Each size is first called ``Way.LAST_TRIAL`` times on
every communicator, so the chosen way is settled before timing.  In ``--rounds``
rounds, in rotating order, each times ``--calls`` calls, each right after a
``Barrier`` (as the peers' report times calls); the slowest rank's median, then
the median over rounds.  Every result is checked against the exact per-rank,
per-index sum.  Prints one row per size: the three times, the way the chosen
calls settled on, and chosen / the faster forced way.  Where ranks outnumber
cores the calls do not choose (the way is fixed by size), and where the system
allows no cross-memory reads there is only the slots' way.
"""

import argparse
import time

import numpy as np
from mpi4py import MPI

import pycollective
from pycollective.bench import _exact
from pycollective.runtime.context import get_context
from pycollective.algorithms.shm import allreduce as shm, ways as _ways

WAYS = {"slots": _ways.SLOTS, "single": _ways.SINGLE, "chosen": None}


def _timed(comm, send, out, calls, force):
    _ways.FORCE_WAY = force
    try:
        times = []
        for _ in range(calls):
            comm.Barrier()
            t = time.perf_counter()
            pycollective.allreduce(send, out, "sum", comm=comm, algorithm="shm")
            times.append(time.perf_counter() - t)
    finally:
        _ways.FORCE_WAY = None
    return float(np.median(times))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=float, nargs="+", default=[1.1e6, 2e6, 4e6])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=15)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    n, r = world.Get_size(), world.Get_rank()
    comms = {name: world.Dup() for name in WAYS}
    pycollective.allreduce(np.zeros(1, np.float32), np.empty(1, np.float32), comm=comms["chosen"],
                           algorithm="shm")
    state = shm._state(get_context(comms["chosen"]))
    if r == 0:
        print(f"{n} ranks, float32 sum, {args.rounds} rounds of {args.calls} calls; times in "
              f"us (slowest rank, median over calls and rounds); single copy "
              f"{'allowed' if state.cross is not None else 'not allowed'}, ranks "
              f"{'outnumber cores' if state.node.group.barrier.wakes else 'have a core each'}")
        print(f"{'count':>9} {'slots':>9} {'single':>9} {'chosen':>9} {'settled on':>11} "
              f"{'chosen/best':>11}")
    for count in args.count:
        count = int(count)
        everyone = [_exact.exact_values(0, count, q, n, "float32", "sum") for q in range(n)]
        expected = _exact.exact_reduce(everyone, "sum", "float32")
        send = everyone[r]
        for name, force in WAYS.items():
            _timed(comms[name], send, np.empty_like(send), _ways.Way.LAST_TRIAL, force)
        rows = {name: [] for name in WAYS}
        for k in range(args.rounds):
            names = list(WAYS)
            for name in names[k % 3:] + names[:k % 3]:
                out = np.empty_like(send)
                t = _timed(comms[name], send, out, args.calls, WAYS[name])
                if not np.array_equal(out, expected):
                    raise AssertionError(f"{name}: wrong result at count {count}")
                rows[name].append(world.allreduce(t, op=MPI.MAX))
        way = state.ways.get(send.nbytes)
        settled = "slots" if way is None or not state.single_copy(send.nbytes) else "single"
        if r == 0:
            med = {name: float(np.median(v)) * 1e6 for name, v in rows.items()}
            best = min(med["slots"], med["single"])
            print(f"{count:>9} {med['slots']:>9.1f} {med['single']:>9.1f} {med['chosen']:>9.1f} "
                  f"{settled:>11} {med['chosen'] / best:>11.2f}", flush=True)
    for comm in comms.values():
        comm.Free()


if __name__ == "__main__":
    main()
