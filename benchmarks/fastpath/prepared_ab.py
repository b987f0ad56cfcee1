"""In-run A/B of a repeated call's plan: the algorithm's prepared run against the generic one.

    scripts/run_mpi.sh N benchmarks/fastpath/prepared_ab.py --counts 1e3 1e4 1e5

For each size, a float32 SUM with ``algorithm="shm"`` reaches the fast path;
then batches of ``--calls`` back-to-back calls take turns (``--batches``
batches each, the order alternating), once with the plan as the fast path
made it (``shm``'s ``repeated``: the slot views and compiled step prepared
once) and once with the same plan running the generic path
(:func:`pycollective.collectives.agree.run_checked` on every call, as before the
registry had ``repeated``).  Prints the median time per call of the slowest
rank per batch, and their ratio from the same run.  Results are checked.
"""

import argparse
import functools
import sys
import time

import numpy as np
from mpi4py import MPI

import pycollective
from pycollective.collectives import plans as _fastpath
from pycollective.collectives.call import DEFAULT
from pycollective.bench._units import count_arg


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--counts", nargs="+", type=count_arg, default=[1000, 10_000, 100_000])
    p.add_argument("--calls", type=int, default=2000, help="calls per batch")
    p.add_argument("--batches", type=int, default=5, help="batches per contender")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    for count in args.counts:
        x = (np.arange(count) % 7 + comm.rank).astype(np.float32)
        out = np.empty_like(x)
        expected = sum((np.arange(count) % 7 + q).astype(np.float32) for q in range(comm.size))
        for _ in range(200):
            pycollective.allreduce(x, out, "sum", comm=comm, algorithm="shm")
        hit = _fastpath.lookup(x, out, "sum", comm, "shm", DEFAULT)
        if hit is None:
            raise SystemExit(f"{count}: the call did not reach the fast path")
        ctx, plan, _, _ = hit
        memo = ctx.peek(_fastpath._MEMO)
        key = next(k for k, v in memo.items() if v is plan)
        plans = {"prepared": plan,
                 "generic": plan._replace(run=functools.partial(
                     _fastpath._checked, plan.algo, plan.kernel))}
        times = {name: [] for name in plans}
        for b in range(2 * args.batches):
            order = list(plans) if b % 2 == 0 else list(plans)[::-1]
            for name in order:
                memo[key] = plans[name]
                out.fill(np.nan)
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    pycollective.allreduce(x, out, "sum", comm=comm, algorithm="shm")
                seconds = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
                times[name].append(seconds / args.calls)
                if not np.array_equal(out, expected):
                    raise SystemExit(f"rank {comm.rank}: wrong result at {count} ({name})")
        memo[key] = plans["prepared"]
        if comm.rank == 0:
            med = {name: float(np.median(t)) * 1e6 for name, t in times.items()}
            print(f"N={comm.size} M={count}: prepared {med['prepared']:.2f} us, generic "
                  f"{med['generic']:.2f} us, prepared/generic "
                  f"{med['prepared'] / med['generic']:.3f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
