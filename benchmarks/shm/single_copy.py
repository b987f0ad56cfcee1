"""shm's two ways above 1 MiB, side by side in one launch: staged in the slots, or single copy.

    scripts/run_mpi.sh 4 benchmarks/shm/single_copy.py --counts 3e5 1e6 2e6 4e6 1e7
    scripts/run_mpi.sh 4 benchmarks/shm/single_copy.py --collective reduce_scatter

Above 1 MiB per rank ``shm`` either stages the data in its shared slots
(copy-in, reduce, copy-out) or, where the system allows cross-memory reads,
reads the peers' buffers where they are (``process_vm_readv``); which one
runs depends on the size (``shm.SINGLE_COPY_BYTES``).  This script makes
each way run at every size: two communicators, one whose "shm" state was
built with ``PYCOLLECTIVE_SHM_CMA=0`` (always the slots) and one with
single copy forced from 1 MiB up, so the threshold can be checked on any
machine.  Rounds take turns (the order alternating), with ``hierarchical``
and the MPI library's own Allreduce beside them; prints the median over
rounds of the slowest rank's time per call, and slots / single copy.
Results are checked against the exact sum of the per-rank, per-index inputs.
``--collective`` times the node collectives' "shm" instead (reduce_scatter,
allgather, bcast: their own threshold, ``_node.CMA_BYTES``, 1 MiB, so the
second communicator takes the single copy at every size here unforced).
"""

import argparse
import os

import numpy as np
from mpi4py import MPI

import pycollective
from pycollective.bench._exact import exact_case
from pycollective.bench._units import count_arg
from pycollective.algorithms.shm import allreduce as shm

from _turns import take_turns


def _communicator(world, cma):
    """A duplicate of ``world`` whose "shm" state reads ``PYCOLLECTIVE_SHM_CMA=cma``."""
    before = os.environ.get("PYCOLLECTIVE_SHM_CMA")
    os.environ["PYCOLLECTIVE_SHM_CMA"] = cma
    try:
        comm = world.Dup()
        pycollective.allreduce(np.zeros(1), np.empty(1), comm=comm, algorithm="shm")
    finally:
        if before is None:
            del os.environ["PYCOLLECTIVE_SHM_CMA"]
        else:
            os.environ["PYCOLLECTIVE_SHM_CMA"] = before
    return comm


def _others(what, slots, single):
    """Both ways of the node collective ``what`` (each communicator's own way)."""
    def run(comm):
        if what == "reduce_scatter":
            return lambda s, d: pycollective.reduce_scatter(s, d, comm=comm, algorithm="shm")
        if what == "allgather":
            return lambda s, d: pycollective.allgather(s, d, comm=comm, algorithm="shm")

        def bcast(s, d):  # root's data into the buffer first, as a training step would
            d[...] = s
            pycollective.bcast(d, comm=comm, algorithm="shm")
        return bcast
    return {"slots": run(slots), "single copy": run(single)}


def _other_case(what, x, expected, rank, n):
    """(input, output, expected output) of the node collective ``what``."""
    lo, length = pycollective.partition(x.size, n, rank)
    if what == "reduce_scatter":
        return x, np.empty(length, x.dtype), expected[lo:lo + length]
    if what == "allgather":  # every rank's block of ``expected`` gathered: ``expected``
        return expected[lo:lo + length].copy(), np.empty_like(expected), expected
    # bcast: rank 0's buffer everywhere (``expected`` on rank 0 before the call)
    return (expected if rank == 0 else np.zeros_like(expected)), np.empty_like(expected), expected


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--counts", nargs="+", type=count_arg, default=[300_000, 1_000_000, 4_000_000])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--collective", default="allreduce",
                   choices=["allreduce", "reduce_scatter", "allgather", "bcast"])
    p.add_argument("--bytes", type=float, default=2e8,
                   help="bytes moved per contender and round, all ranks together (sets calls)")
    args = p.parse_args(argv)
    world = MPI.COMM_WORLD
    n, rank = world.size, world.rank
    slots, single = _communicator(world, "0"), _communicator(world, "1")
    if shm._state(pycollective.runtime.context.get_context(single)).cross is None:
        raise SystemExit("cross-memory reads are not allowed here: nothing to compare")

    def forced(src, dst):
        # The single copy at every size: the threshold moved for this call only.
        limit, shm.SINGLE_COPY_BYTES = shm.SINGLE_COPY_BYTES, 1 << 20
        try:
            pycollective.allreduce(src, dst, comm=single, algorithm="shm")
        finally:
            shm.SINGLE_COPY_BYTES = limit

    ways = {"slots": lambda s, d: pycollective.allreduce(s, d, comm=slots, algorithm="shm"),
            "single copy": forced,
            "hierarchical": lambda s, d: pycollective.allreduce(s, d, comm=single,
                                                                algorithm="hierarchical"),
            "native": lambda s, d: world.Allreduce(s, d)}
    if args.collective != "allreduce":
        ways = _others(args.collective, slots, single)
    if rank == 0:
        print(f"N = {n}, {args.collective}, float32 SUM, median over {args.rounds} rounds of "
              "the slowest rank (ms)")
    for count in args.counts:
        x, expected = exact_case(count, rank, n)
        out = np.empty_like(x)
        if args.collective != "allreduce":
            x, out, expected = _other_case(args.collective, x, expected, rank, n)
        calls = max(3, min(30, int(args.bytes / (count * 4 * n))))

        def wrong(name):
            if not np.array_equal(out, expected):
                return f"{name} gave a wrong sum at M = {count}"
            return None
        turns = {name: (lambda run=run: run(x, out)) for name, run in ways.items()}
        med = take_turns(world, turns, args.rounds, calls, wrong)
        if rank == 0:
            cells = "  ".join(f"{name} {t * 1e3:7.2f}" for name, t in med.items())
            print(f"M = {count:>9} ({count * 4 / 2**20:5.1f} MiB): {cells}  "
                  f"slots / single copy {med['slots'] / med['single copy']:.2f}", flush=True)
    slots.Free()
    single.Free()


if __name__ == "__main__":
    main()
