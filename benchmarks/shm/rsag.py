"""shm's repeated calls: the reduce-scatter-allgather step against the older steps, interleaved.

    scripts/run_mpi.sh 2 benchmarks/shm/rsag.py --count 1e3 1e4 1e5 2.5e5

One launch, two communicators: on one every repeated call takes the older
prepared steps (``_rsag_steps.ENABLED = False`` when its plans are made), on
the other :mod:`pycollective.algorithms.shm.rsag`'s step.  In ``--rounds``
rounds, in alternating order, each times on the same data:

* ``start``: one call right after a ``Barrier`` (as the peers' report times
  calls), ``--calls`` of them; the slowest rank's time, median over rounds;
* ``loop``: ``--calls`` calls back to back, the slowest rank's time per call,
  median over rounds.

With ``--whole`` both communicators take the reduce-scatter-allgather step, the
old one sliced at every size (``rsag_steps.WHOLE_BYTES = 0``) and the new one
with every rank folding the whole vector at every size (two ranks only; by
default the step does so up to ``WHOLE_BYTES``).

Every result is checked against the exact per-rank, per-index sum.  Prints one
row per size with both steps' times and their ratio (new / old: below 1 the new
step is faster).  Meant for nodes where every rank has a core (the step's
target); where ranks outnumber cores ``shm`` keeps the older steps by default.
"""

import argparse
import time

import numpy as np
from mpi4py import MPI

import pycollective
from pycollective.bench import _exact
from pycollective.algorithms.shm import rsag_steps as _rsag_steps
from pycollective.algorithms.shm import stores as _stores


def _timed(comm, send, out, calls):
    starts = []
    for _ in range(calls):
        comm.Barrier()
        t = time.perf_counter()
        pycollective.allreduce(send, out, "sum", comm=comm, algorithm="shm")
        starts.append(time.perf_counter() - t)
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(calls):
        pycollective.allreduce(send, out, "sum", comm=comm, algorithm="shm")
    loop = (time.perf_counter() - t) / calls
    return float(np.median(starts)), loop


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=float, nargs="+", default=[1e3, 1e4, 1e5])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--stores", type=int, choices=(0, 1), default=None,
                        help="pin the older sliced step's stores (plain 0, non-temporal 1; "
                             "default: each rank chooses while running)")
    parser.add_argument("--whole", action="store_true",
                        help="the step sliced (old) against every rank folding the whole "
                             "vector (new), at every size; two ranks")
    args = parser.parse_args()
    _stores.FORCE_STORES = args.stores
    world = MPI.COMM_WORLD
    n, r = world.Get_size(), world.Get_rank()
    comms = {}
    whole = _rsag_steps.WHOLE_BYTES
    for name, enabled in (("old", False), ("new", True)):
        _rsag_steps.ENABLED = enabled or args.whole
        if args.whole:
            _rsag_steps.WHOLE_BYTES = 1 << 20 if enabled else 0
        comms[name] = world.Dup()
        for count in args.count:  # the plans, made with this setting
            send = np.ones(int(count), np.float32)
            for _ in range(3):
                pycollective.allreduce(send, np.empty_like(send), "sum", comm=comms[name],
                                       algorithm="shm")
    _rsag_steps.ENABLED, _rsag_steps.WHOLE_BYTES = None, whole
    if r == 0:
        print(f"{n} ranks, float32 sum, {args.rounds} rounds of {args.calls} calls; "
              "times in us (slowest rank; median over rounds)")
        print(f"{'count':>9} {'old start':>10} {'new start':>10} {'ratio':>6} "
              f"{'old loop':>9} {'new loop':>9} {'ratio':>6}")
    for count in args.count:
        count = int(count)
        everyone = [_exact.exact_values(0, count, q, n, "float32", "sum") for q in range(n)]
        expected = _exact.exact_reduce(everyone, "sum", "float32")
        send = everyone[r]
        rows = {"old": [], "new": []}
        for k in range(args.rounds):
            order = ("old", "new") if k % 2 == 0 else ("new", "old")
            for name in order:
                out = np.empty_like(send)
                start, loop = _timed(comms[name], send, out, args.calls)
                if not np.array_equal(out, expected):
                    raise AssertionError(f"{name} step: wrong result at count {count}")
                slowest = np.empty(2)
                world.Allreduce(np.array([start, loop]), slowest, op=MPI.MAX)
                rows[name].append(slowest)
        if r == 0:
            med = {name: np.median(np.array(v), axis=0) * 1e6 for name, v in rows.items()}
            o, w = med["old"], med["new"]
            print(f"{count:>9} {o[0]:>10.1f} {w[0]:>10.1f} {w[0] / o[0]:>6.2f} "
                  f"{o[1]:>9.1f} {w[1]:>9.1f} {w[1] / o[1]:>6.2f}", flush=True)
    for comm in comms.values():
        comm.Free()


if __name__ == "__main__":
    main()
