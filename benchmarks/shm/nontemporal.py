"""Plain against non-temporal stores for data one core writes and the other reads.

    python benchmarks/shm/nontemporal.py --count 1e5 --launches 10

On the 2-core VMs a launch sometimes moves data between the two cores 5-8x
slower than the launch before (docs/results/2026-12-01-python.md, "the
machine changes under the runs"), for pycollective and the MPI libraries
alike, while Intel MPI's times stay put.  This isolates the effect from
everything else: each launch forks two fresh processes that share an
anonymous mapping and, step after step, each write ``--count`` float32
into its row, raise a counter, wait for the other's, and add the other's
row to their own input (the small path of ``shm`` without the library).
The row is written either with plain stores (the data stay in the writer's
cache, and the reader takes them from there) or with non-temporal stores
(they go to memory, and the reader takes them from memory).  Batches of
both kinds take turns inside one launch, so both see the same machine
state; printed per launch: the median time per step of each kind and
their ratio.  Each result is checked.  Linux and x86-64 or AArch64 only
(the counters are ``pycollective.node.atomics``'); no MPI.
"""

import argparse
import mmap
import os
import statistics
import sys
import time

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from pycollective.node.atomics import STRIDE, raise_counter, wait_counters
from pycollective.bench._units import count_arg


@intrinsic
def _store_nontemporal(typingctx, address, value):
    """Store the float32 ``value`` at ``address`` past the caches (LLVM ``!nontemporal``)."""
    sig = types.void(types.int64, types.float32)

    def codegen(context, builder, signature, args):
        pointer = builder.inttoptr(args[0], ir.PointerType(ir.FloatType()))
        store = builder.store(args[1], pointer, align=4)
        store.set_metadata("nontemporal",
                           builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()
    return sig, codegen


@numba.njit(nogil=True)
def _steps(first, count, words, rank, rows0, rows1, src, dst, nontemporal):
    """Steps ``first`` .. ``first + count - 1``; the two regions alternate, as shm's do."""
    other = 1 - rank
    for step in range(first, first + count):
        rows = rows0 if step & 1 else rows1
        if nontemporal:
            base = rows[rank].ctypes.data
            for i in range(src.shape[0]):
                _store_nontemporal(base + 4 * i, src[i])
        else:
            for i in range(src.shape[0]):
                rows[rank, i] = src[i]
        raise_counter(words, rank, step, False)  # fences before the counter
        wait_counters(words, rank, 2, step, 1 << 40, 63, 0, 0)
        for i in range(dst.shape[0]):
            dst[i] = src[i] + rows[other, i]


def _launch(count, batches, steps):
    """One pair of fresh processes; returns (plain, non-temporal) median seconds per step."""
    region = 4096 + ((count * 4 * 2 + 4095) // 4096) * 4096
    shared = mmap.mmap(-1, 4096 + 2 * region)
    words = np.frombuffer(shared, np.int64, 2 * STRIDE)
    rows = [np.frombuffer(shared, np.float32, 2 * count, offset=4096 + p * region)
            .reshape(2, count) for p in (0, 1)]
    times = [0.0] * (2 * batches)  # rank 0's
    pid = os.fork()
    rank = 0 if pid else 1
    src = np.full(count, rank + 1, np.float32)
    dst = np.empty(count, np.float32)
    ok = True
    step = 1
    for b in range(-2, 2 * batches):  # two untimed batches first (compiling, faulting in)
        nontemporal = b % 2 == 1
        t0 = time.perf_counter()
        _steps(step, steps, words, rank, rows[0], rows[1], src, dst, nontemporal)
        elapsed = time.perf_counter() - t0
        step += steps
        ok = ok and bool(np.all(dst == 3))
        if b >= 0 and rank == 0:
            times[b] = elapsed / steps
    if rank == 1:
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    if not ok or status != 0:
        raise SystemExit("wrong sums")
    return statistics.median(times[0::2]), statistics.median(times[1::2])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=count_arg, default=100_000, help="float32 per row")
    p.add_argument("--launches", type=int, default=10)
    p.add_argument("--batches", type=int, default=6, help="batches of each kind per launch")
    p.add_argument("--steps", type=int, default=500, help="steps per batch")
    args = p.parse_args(argv)
    print(f"# {args.count} float32 per row, {args.batches} batches of {args.steps} steps "
          "of each kind per launch, taking turns")
    for launch in range(1, args.launches + 1):
        plain, nontemporal = _launch(args.count, args.batches, args.steps)
        print(f"launch {launch:2d}: plain {plain * 1e6:8.1f} us   non-temporal "
              f"{nontemporal * 1e6:8.1f} us   non-temporal / plain {nontemporal / plain:5.2f}",
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
