"""Wall time against CPU time of a large allreduce: is the gap work or waiting?

    scripts/run_mpi.sh 4 benchmarks/peers/cpu_time.py --count 1e7
    PYCOLLECTIVE_SHM_CMA=0 scripts/run_mpi.sh 4 benchmarks/peers/cpu_time.py --count 1e7
    scripts/run_mpi.sh 8 benchmarks/peers/cpu_time.py --count 1e4 1e5 --budget 0.3 --json F

Where ranks outnumber cores, a call's wall time is either the cores working
(copying, reducing, in user space or in the kernel's ``process_vm_readv``)
or the cores idle while a rank waits for one that is not scheduled.  One
launch times ``allreduce(algorithm=...)`` and the MPI library's own
``Allreduce`` in turns (``--rounds`` of ``--calls`` calls each) and prints
per call:

* ``wall``: the slowest rank's time for a round of calls back to back,
  over the calls; and, apart, the median slowest rank's time of one call
  after a ``Barrier`` (up to 50 a round), as the peers report times calls:
  the difference is what starting together costs;
* ``user``, ``sys``: CPU time summed over all ranks (``getrusage``);
* ``busy``: that CPU time over (cores x wall): 100 % means no core was idle;
* ``ctx``: voluntary / involuntary context switches, summed over ranks;
* ``cpu/floor``: that CPU time over the CPU time the memory floor needs
  (3 bytes of traffic per payload byte and rank, at the rate one core copies
  alone, measured first while the other ranks sleep).

So at ``busy`` near 100 % a gap to the floor is work the cores do, and
``cpu/floor`` says how much more of it than the floor's; well below 100 %,
it is waiting.  Each round's last result is checked against the exact
per-rank, per-index sum.  Several ``--count`` sizes run one after the other in
one launch; ``--budget`` raises the calls per round at sizes where
``--calls`` calls would take less than that many seconds (small calls need
many: the kernel splits CPU time into user and sys by sampling at scheduler
ticks).  ``--json`` writes the rows for other scripts
(``benchmarks/peers/gaps.py``).
"""

import argparse
import json
import os
import resource
import time

import numpy as np
from mpi4py import MPI

import pycollective
from pycollective.bench._exact import exact_case
from pycollective.bench._timing import calls_for_budget, idle_barrier, timed_call
from pycollective.bench._speed import FLOOR_TRAFFIC
from pycollective.bench._units import count_arg

SINGLE_CALLS = 50  # calls per round and contender also timed one at a time after a Barrier


def copy_rate(comm, nbytes=64 << 20, reps=5):
    """Bytes of traffic per second of one core copying alone (rank 0; the others sleep)."""
    best = None
    if comm.rank == 0:
        a = np.ones(nbytes, np.uint8)
        b = np.empty_like(a)
        np.copyto(b, a)
        for _ in range(reps):
            t0 = time.perf_counter()
            np.copyto(b, a)
            t = time.perf_counter() - t0
            best = t if best is None else min(best, t)
    idle_barrier(comm)
    return comm.bcast(2 * nbytes / best if comm.rank == 0 else None, root=0)


def usage():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return np.array([r.ru_utime, r.ru_stime, r.ru_nvcsw, r.ru_nivcsw], np.float64)


def measure(comm, count, algorithm, calls, budget, rounds):
    """{contender: [wall, user, sys, voluntary, involuntary context switches] per call}."""
    src, expected = exact_case(count, comm.rank, comm.size)
    dst = np.empty_like(src)

    def ours():
        pycollective.allreduce(src, dst, algorithm=algorithm)

    def native():
        comm.Allreduce(src, dst, op=MPI.SUM)

    contenders = [(algorithm, ours), ("native", native)]
    # Each after its own library's barrier, as the peers report times them.
    barriers = {algorithm: lambda: pycollective.barrier(comm), "native": comm.Barrier}
    totals = {name: np.zeros(5) for name, _ in contenders}
    single = {name: [] for name, _ in contenders}
    n_calls = {}
    for name, fn in contenders:  # warm-up: slots, compiled steps, MPI's buffers
        for _ in range(3):
            fn()
        # more calls where ``calls`` would fill less than ``budget`` seconds (the same on
        # every rank: the slowest rank's call decides)
        n_calls[name] = (max(calls, calls_for_budget(comm, fn, budget / rounds, cap=5000))
                         if budget else calls)
    for _ in range(rounds):
        for name, fn in contenders:
            # One clock and one rusage around the round's calls, not around each: reading
            # them costs about a microsecond of CPU that no call's wall time would hold.
            dst.fill(np.nan)
            comm.Barrier()
            before = usage()
            t0 = time.perf_counter()
            for _ in range(n_calls[name]):
                fn()
            wall = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            spent = usage() - before
            if comm.allreduce(0 if np.array_equal(dst, expected) else 1, op=MPI.SUM):
                raise SystemExit(f"{name}: wrong result at M={count}")
            summed = np.empty(4)
            comm.Allreduce(spent, summed, op=MPI.SUM)
            totals[name] += np.concatenate([[wall], summed])
            # The same calls one at a time after a Barrier, as the peers report times them:
            # what starting together costs where the Barrier leaves ranks descheduled.
            single[name].extend(comm.allreduce(timed_call(comm, fn, barrier=barriers[name]),
                                               op=MPI.MAX)
                                for _ in range(min(n_calls[name], SINGLE_CALLS)))
    return ({name: totals[name] / (n_calls[name] * rounds) for name in totals}, n_calls,
            {name: float(np.median(t)) for name, t in single.items()})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=count_arg, nargs="+", default=[10 ** 7],
                   help="float32 per rank, one or more sizes (1e7)")
    p.add_argument("--algorithm", default="shm")
    p.add_argument("--calls", type=int, default=5, help="calls per round and contender (5)")
    p.add_argument("--budget", type=float, default=0.0,
                   help="seconds per size and contender that the calls should fill at least "
                        "(0: just --calls)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, contenders taking turns (3)")
    p.add_argument("--json", help="also write the rows to this file (rank 0)")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    n = comm.size
    cores = len(set().union(*comm.allgather(os.sched_getaffinity(0))))
    rate = copy_rate(comm)
    rows = []
    for count in args.count:
        per_call, n_calls, after_barrier = measure(comm, count, args.algorithm, args.calls,
                                                   args.budget, args.rounds)
        floor_cpu = n * FLOOR_TRAFFIC * 4 * count / rate
        if comm.rank == 0:
            print(f"N = {n} ranks on {cores} cores, M = {count} float32; one core copies "
                  f"{rate / 1e9:.1f} GB/s of traffic alone, so the floor needs "
                  f"{floor_cpu * 1e3:.3f} ms of CPU a call ({floor_cpu / min(n, cores) * 1e3:.3f} "
                  f"ms on {min(n, cores)} cores); per call:")
        for name, (wall, user, sys_, vcsw, ivcsw) in per_call.items():
            rows.append(dict(count=count, name=name, calls=n_calls[name] * args.rounds,
                             wall=wall, after_barrier=after_barrier[name], user=user, sys=sys_,
                             vcsw=vcsw, ivcsw=ivcsw, busy=(user + sys_) / (cores * wall),
                             cpu_floor=(user + sys_) / floor_cpu))
            if comm.rank == 0:
                row = rows[-1]
                print(f"  {name:<8} wall {wall * 1e3:8.3f} ms  user {user * 1e3:8.3f} ms  "
                      f"sys {sys_ * 1e3:8.3f} ms  busy {100 * row['busy']:3.0f} %  "
                      f"ctx {vcsw:.0f}/{ivcsw:.0f}  cpu/floor {row['cpu_floor']:.2f}  "
                      f"({n_calls[name] * args.rounds} calls); one call after a Barrier "
                      f"{after_barrier[name] * 1e3:8.3f} ms")
    if args.json and comm.rank == 0:
        with open(args.json, "w") as f:
            json.dump(dict(nranks=n, cores=cores, copy_rate=rate, algorithm=args.algorithm,
                           floor_traffic=FLOOR_TRAFFIC, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
