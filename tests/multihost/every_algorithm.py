"""Every allreduce algorithm, and auto, across emulated hosts: exact results, identical replicas.

Run under MPI by tests/test_multihost.py through scripts/multihost/emulate.sh:

    scripts/multihost/emulate.sh -H 2x2 -- tests/multihost/every_algorithm.py 2,2 [quick]

The first argument is the number of ranks each host should hold (what
``Split_type(COMM_TYPE_SHARED)`` must find); ``quick`` checks one (dtype, op)
pair at fewer counts.  For every registered algorithm
that can run on the world (the others must say why: shm needs one node), at
counts around the chunk and segment edges, three (dtype, op) pairs, in place
and out of place, the result must be bit for bit the exact reduction of
integer data (tolerance 0) and the same on every rank; auto runs until each
of its size classes is decided, every call checked the same way; and
``pycollective.barrier`` lets no rank out before the last one arrived.  Errors are
collected, not raised, so every rank takes part in every collective; rank 0
prints one summary line that the test reads, and the exit status says
whether everything was right.  MPI_Finalize runs after all of it, on the
network module chosen by the launcher, so a clean exit is part of the check.
"""

import sys
import time
import zlib

import numpy as np
from mpi4py import MPI

import pycollective
from pycollective.collectives import auto as _auto, barrier as _barrier
from pycollective.bench import _exact
from pycollective.runtime.context import get_context
from pycollective.model.tuning import MAX_TRIALS

CASES = (("float32", "sum"), ("int64", "prod"), ("float64", "max"))


def counts(n, quick=False):
    # 0, the chunk edges, above the butterfly/ring and 64 KiB leader thresholds, above 1 MiB
    if quick:
        return (0, 1, n + 1, 20_011, 300_007)
    return (0, 1, n - 1, n + 1, 1000, 20_011, 300_007)


def check(comm, algorithm, count, dtype, op, in_place, wrong):
    n, r = comm.Get_size(), comm.Get_rank()
    x = _exact.exact_values(0, count, r, n, np.dtype(dtype), op)
    want = _exact.exact_reduce([_exact.exact_values(0, count, q, n, np.dtype(dtype), op)
                                for q in range(n)], op, dtype)
    if in_place:
        out = x.copy()
        pycollective.allreduce(MPI.IN_PLACE, out, op, comm=comm, algorithm=algorithm)
    else:
        out = np.full_like(x, 7)
        pycollective.allreduce(x, out, op, comm=comm, algorithm=algorithm)
    bad, _ = _exact.compare(out, want)
    crcs = comm.allgather(zlib.crc32(out.tobytes()))
    if bad or len(set(crcs)) != 1:
        wrong.append(f"{algorithm} M={count} {dtype} {op} {'ip' if in_place else 'oop'}: "
                     f"{bad} wrong on rank {r}, {len(set(crcs))} different replicas")


def main():
    world = MPI.COMM_WORLD
    n, rank = world.Get_size(), world.Get_rank()
    expected = [int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else None
    quick = "quick" in sys.argv[2:]
    cases = CASES[:1] if quick else CASES
    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    leaders = world.allgather(node.bcast(rank, root=0))
    node.Free()
    found = [leaders.count(lead) for lead in sorted(set(leaders))]
    problems = []
    if expected is not None and sorted(found) != sorted(expected):
        problems.append(f"ranks per node {found}, expected {expected}")
    names = sorted(set(world.allgather(MPI.Get_processor_name())))

    unusable = pycollective.unusable_algorithms(world)
    ran = [a for a in pycollective.algorithms() if a not in unusable]
    for algorithm in ran:
        for dtype, op in cases:
            for count in counts(n, quick):
                for in_place in (False, True):
                    check(world, algorithm, count, dtype, op, in_place, problems)
    # auto: every call is checked, trials included, until every class is decided
    state = _auto.auto_for(get_context(world))
    decided = {}
    for count in counts(n, quick)[1:]:
        for _ in range(MAX_TRIALS + 1):
            check(world, "auto", count, "float32", "sum", False, problems)
        d = state.decision(count, np.dtype("float32"), "sum")
        decided[count] = d.algorithm if d is not None else None
    if None in decided.values():
        problems.append(f"auto did not decide every class: {decided}")

    # the barrier across hosts (MPI's Ibarrier, bounded): nobody leaves before the last
    # rank arrives (the emulated hosts share one machine's clock)
    for round_ in range(3):
        world.Barrier()
        time.sleep(0.01 * rank)
        arrived = time.monotonic()
        pycollective.barrier(world)
        left = time.monotonic()
        if min(world.allgather(left)) < max(world.allgather(arrived)):
            problems.append(f"barrier round {round_}: a rank left before the last arrived")
    if get_context(world).peek(_barrier._KEY).group is not None:
        problems.append("the barrier took the one-node way across hosts")
    problems = [p for part in world.allgather(problems) for p in part]
    if rank == 0:
        sys.stdout.write(
            f"multihost-check: {n} ranks, nodes {found}, hosts {names}, "
            f"layout {state.layout.describe()}, ran {ran}, "
            f"unusable {sorted(unusable)}, auto {decided}, problems {len(problems)}\n")
        for p in problems[:20]:
            sys.stdout.write(f"  problem: {p}\n")
        sys.stdout.flush()
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
