"""In-run A/B of this checkout's allreduce against an earlier revision's, in one launch.

    scripts/run_mpi.sh 2 benchmarks/fastpath/against.py be9e740 --counts 1 1e3 1e4
    scripts/run_mpi.sh 4 benchmarks/fastpath/against.py HEAD~1 --algorithm shm --batches 30

Rank 0 extracts ``src/pycollective`` of the revision (``git archive``) into
a temporary directory as a package of another name, and every rank imports
both: the two libraries live side by side in each process, each with its own
context and shared-memory slots on ``COMM_WORLD``.  For each size, batches of
``--calls`` back-to-back ``allreduce`` calls take turns (the order alternating
batch by batch), so both see the same machine; the ratio is taken batch pair
by batch pair (then the median), which cancels most of the drift of a
shared 2-core machine that separate launches do not.  A difference of a few
percent between two launches is noise here; the paired ratio is not.

Prints, per size: the median time per call (the slowest rank's, per batch)
of the revision and of this checkout, and the median paired ratio
(this / revision).  Both libraries' results are checked against each other
and against the exact sum of the per-rank, per-index inputs.  The package
keeps no files: the extracted copy is removed at exit.
"""

import argparse
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from mpi4py import MPI

import pycollective
from pycollective.bench._exact import exact_case
from pycollective.bench._units import count_arg

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def extract(revision, into):
    """``src/pycollective`` at ``revision`` as the package ``pycollective_then`` in ``into``."""
    archive = subprocess.run(["git", "-C", ROOT, "archive", revision, "src/pycollective"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    # Every import inside the package is relative, so it runs under another name.
    os.rename(os.path.join(into, "src", "pycollective"), os.path.join(into, "pycollective_then"))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("revision", help="a git revision of this repository (commit, tag, HEAD~1)")
    p.add_argument("--algorithm", default="shm")
    p.add_argument("--counts", nargs="+", type=count_arg, default=[1, 1000, 10_000])
    p.add_argument("--calls", type=int, default=2000, help="calls per batch")
    p.add_argument("--batches", type=int, default=20, help="batches per contender")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    where, error = None, None
    if comm.rank == 0:
        try:
            where = tempfile.mkdtemp(prefix="pycollective-ab-")
            extract(args.revision, where)
        except (OSError, subprocess.CalledProcessError) as exc:
            error = f"cannot extract {args.revision}: {exc}"
    where, error = comm.bcast((where, error), root=0)
    if error:
        raise SystemExit(error)
    try:
        sys.path.insert(0, where)
        then = importlib.import_module("pycollective_then")
        compare(comm, args, {"then": then.allreduce, "now": pycollective.allreduce})
    finally:
        comm.Barrier()
        if comm.rank == 0:
            shutil.rmtree(where, ignore_errors=True)


def compare(comm, args, calls):
    n = comm.size
    if comm.rank == 0:
        print(f"# N = {n}, algorithm {args.algorithm!r}, float32 SUM; {args.batches} batches of "
              f"{args.calls} calls each, alternating; then = {args.revision}, now = this checkout")
    for count in args.counts:
        x, expected = exact_case(count, comm.rank, n)
        out = {name: np.empty_like(x) for name in calls}
        for name, allreduce in calls.items():
            for _ in range(200):  # first calls compile, map the slots, reach the fast path
                allreduce(x, out[name], MPI.SUM, algorithm=args.algorithm)
            if not np.array_equal(out[name], expected):
                raise SystemExit(f"rank {comm.rank}: {name} gave a wrong sum at {count}")
        times = {name: [] for name in calls}
        buffers = list(out.values())
        for b in range(2 * args.batches):
            order = list(calls) if b % 2 == 0 else list(calls)[::-1]
            for k, name in enumerate(order):
                # Each library writes each output buffer in turn: where a buffer
                # lies (its pages, their alignment) must not favour one of them.
                allreduce, dst = calls[name], buffers[(k + b // 2) % 2]
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    allreduce(x, dst, MPI.SUM, algorithm=args.algorithm)
                times[name].append(comm.allreduce((time.perf_counter() - t0) / args.calls,
                                                  op=MPI.MAX))
            for dst in buffers:  # each library's last call of the batch wrote one
                if not np.array_equal(dst, expected):
                    raise SystemExit(f"rank {comm.rank}: a wrong sum at {count}, batch {b}")
        then, now = (np.array(times[k]) for k in ("then", "now"))
        if comm.rank == 0:
            print(f"M = {count:>9}: then {np.median(then) * 1e6:9.2f} us   "
                  f"now {np.median(now) * 1e6:9.2f} us   now/then {np.median(now / then):.3f}")


if __name__ == "__main__":
    main()
