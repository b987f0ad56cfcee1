"""Wall time against CPU time of a large allreduce: is the gap work or waiting?

    scripts/run_mpi.sh 4 benchmarks/shm/cpu_time.py --count 1e7
    PYCOLLECTIVE_SHM_CMA=0 scripts/run_mpi.sh 4 benchmarks/shm/cpu_time.py --count 1e7

Where ranks outnumber cores, a call's wall time is either the cores working
(copying, reducing, in user space or in the kernel's ``process_vm_readv``)
or the cores idle while a rank waits for one that is not scheduled.  One
launch times ``allreduce(algorithm=...)`` and the MPI library's own
``Allreduce`` in turns (``--rounds`` of ``--calls`` calls each) and prints
per call:

* ``wall``: the slowest rank's time;
* ``user``, ``sys``: CPU time summed over all ranks (``getrusage``);
* ``busy``: that CPU time over (cores x wall): 100 % means no core was idle;
* ``ctx``: voluntary / involuntary context switches, summed over ranks;
* ``cpu/floor``: that CPU time over the CPU time the memory floor needs
  (3 bytes of traffic per payload byte and rank, at the rate one core copies
  alone, measured first while the other ranks sleep).

So at ``busy`` near 100 % a gap to the floor is work the cores do, and
``cpu/floor`` says how much more of it than the floor's; well below 100 %,
it is waiting.  Results are checked against the exact per-rank, per-index
sum after every call.
"""

import argparse
import os
import resource
import time

import numpy as np
from mpi4py import MPI

import pycollective
from pycollective._exact import exact_case
from pycollective._timing import idle_barrier
from pycollective.bench._speed import FLOOR_TRAFFIC
from pycollective._units import count_arg

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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=count_arg, default=10 ** 7, help="float32 per rank (1e7)")
    p.add_argument("--algorithm", default="shm")
    p.add_argument("--calls", type=int, default=5, help="calls per round and contender (5)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, contenders taking turns (3)")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    n = comm.size
    cores = len(set().union(*comm.allgather(os.sched_getaffinity(0))))
    rate = copy_rate(comm)
    src, expected = exact_case(args.count, comm.rank, n)
    dst = np.empty_like(src)

    def ours():
        pycollective.allreduce(src, dst, algorithm=args.algorithm)

    def native():
        comm.Allreduce(src, dst, op=MPI.SUM)

    contenders = [(args.algorithm, ours), ("native", native)]
    totals = {name: np.zeros(5) for name, _ in contenders}  # wall, user, sys, vcsw, ivcsw
    for name, fn in contenders:  # warm-up: slots, compiled steps, MPI's buffers
        fn()
    for _ in range(args.rounds):
        for name, fn in contenders:
            wall = 0.0
            spent = np.zeros(4)
            for _ in range(args.calls):
                dst.fill(np.nan)
                comm.Barrier()
                before = usage()
                t0 = time.perf_counter()
                fn()
                wall_here = time.perf_counter() - t0
                spent += usage() - before
                wall += comm.allreduce(wall_here, op=MPI.MAX)
                if comm.allreduce(0 if np.array_equal(dst, expected) else 1, op=MPI.SUM):
                    raise SystemExit(f"{name}: wrong result at M={args.count}")
            summed = np.empty(4)
            comm.Allreduce(spent, summed, op=MPI.SUM)
            totals[name] += np.concatenate([[wall], summed])
    if comm.rank == 0:
        calls = args.calls * args.rounds
        floor_cpu = n * FLOOR_TRAFFIC * src.nbytes / rate
        print(f"N = {n} ranks on {cores} cores, M = {args.count} float32; one core copies "
              f"{rate / 1e9:.1f} GB/s of traffic alone, so the floor needs {floor_cpu * 1e3:.1f} "
              f"ms of CPU a call ({floor_cpu / min(n, cores) * 1e3:.1f} ms on {min(n, cores)} "
              f"cores); per call, {calls} calls:")
        for name, (wall, user, sys_, vcsw, ivcsw) in totals.items():
            wall, user, sys_ = wall / calls, user / calls, sys_ / calls
            print(f"  {name:<8} wall {wall * 1e3:7.2f} ms  user {user * 1e3:7.2f} ms  "
                  f"sys {sys_ * 1e3:7.2f} ms  busy {100 * (user + sys_) / (cores * wall):3.0f} %  "
                  f"ctx {vcsw / calls:.0f}/{ivcsw / calls:.0f}  "
                  f"cpu/floor {(user + sys_) / floor_cpu:.2f}")


if __name__ == "__main__":
    main()
