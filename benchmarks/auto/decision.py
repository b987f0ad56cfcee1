"""What ``algorithm="auto"`` settles on in a fresh launch, and what a call costs after.

    for i in 1 2 3 4 5 6; do scripts/run_mpi.sh 8 benchmarks/auto/decision.py --count 1e4; done

The launch's first calls of the size are auto's timed trials (see
``pycollective.model.tuning``); once the size class is decided, ``--calls``
back-to-back calls are timed.  Prints the decision (its algorithm, the trial
calls it took, each surviving candidate's agreed lower median) and the
slowest rank's mean time per call after it, so launches that settled
differently can be compared.  Results are checked against the exact
per-rank, per-index sum.
"""

import argparse
import time

import numpy as np
from mpi4py import MPI

import pycollective
from pycollective.collectives import auto as _auto
from pycollective.runtime import context as _context
from pycollective.bench._exact import exact_case
from pycollective.bench._units import count_arg
from pycollective.model.tuning import MAX_TRIALS


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=count_arg, default=1000)
    p.add_argument("--calls", type=int, default=1000)
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    n = comm.size
    x, expected = exact_case(args.count, comm.rank, n)
    out = np.empty_like(x)
    for _ in range(MAX_TRIALS + 1):
        pycollective.allreduce(x, out, MPI.SUM)
        if not np.array_equal(out, expected):
            raise SystemExit(f"rank {comm.rank}: a wrong sum during the trials")
    state = _context.find_context(comm).peek(_auto.KEY)
    decision = state.decision(args.count, x.dtype, "sum")
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(args.calls):
        pycollective.allreduce(x, out, MPI.SUM)
    per_call = comm.allreduce((time.perf_counter() - t0) / args.calls, op=MPI.MAX)
    if not np.array_equal(out, expected):
        raise SystemExit(f"rank {comm.rank}: a wrong sum after the decision")
    if comm.rank == 0:
        if decision is None:
            print(f"N = {n}, M = {args.count}: undecided after {MAX_TRIALS + 1} calls")
            return
        trials = ", ".join(f"{name} {t * 1e6:.0f} us" for name, t in decision.times.items())
        print(f"N = {n}, M = {args.count}: {decision.algorithm} after {decision.calls} trial "
              f"calls ({trials or decision.how}); then {per_call * 1e6:.1f} us per call")


if __name__ == "__main__":
    main()
