"""The loop the shm benchmarks here share: ways of doing one call, timed in turns.

Imported by the scripts beside it (run as ``scripts/run_mpi.sh N benchmarks/shm/<script>.py``,
whose folder is then on ``sys.path``).
"""

import time

import numpy as np
from mpi4py import MPI


def take_turns(world, ways, rounds, calls, wrong):
    """Median over ``rounds`` of the slowest rank's seconds per call, per way (collective).

    Args:
        ways: ``{name: run}``, ``run()`` making one call.  In each round every way takes a
            turn, in the order of ``ways`` on even rounds and reversed on odd ones; a turn
            is one untimed call, a barrier, then ``calls`` timed calls back to back.
        wrong: ``wrong(name)`` after each turn: an error message if that way's last call
            left a wrong result on this rank (the script exits with it), else None.
    """
    times = {name: [] for name in ways}
    for r in range(rounds):
        for name in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
            run = ways[name]
            run()  # the first call of a turn is not timed
            world.Barrier()
            t0 = time.perf_counter()
            for _ in range(calls):
                run()
            took = world.allreduce((time.perf_counter() - t0) / calls, op=MPI.MAX)
            problem = wrong(name)
            if problem:
                raise SystemExit(f"rank {world.rank}: {problem}")
            times[name].append(took)
    return {name: float(np.median(t)) for name, t in times.items()}
