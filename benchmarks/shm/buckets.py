"""GradientBuckets on a pycollective.Comm: shared buckets against plain ones, in one launch.

    scripts/run_mpi.sh 4 benchmarks/shm/buckets.py shm     # the algorithm (default: auto)

Four gradients (25 MB, 4 MB, 12 KB, 8 MB of float32) in the default 25 MiB
buckets, reduced and averaged by ``wait()`` (``overlap=False``), once with
``shared=True`` (the default on a ``pycollective.Comm``: slices of one
``shared_empty`` allocation) and once with ``shared=False``, taking turns
step by step (order alternating); prints the median step time of the
slowest rank over 11 steps each (the first left out), checking every
average.
"""
import sys, time
import numpy as np
from mpi4py import MPI
import pycollective

world = MPI.COMM_WORLD
n, rank = world.size, world.rank
algorithm = sys.argv[1] if len(sys.argv) > 1 else None
comm = pycollective.Comm(world, algorithm=algorithm)
shapes = [(6_250_000,), (1000, 1000), (3000,), (2_000_000,)]  # 25 MB, 4 MB, 12 KB, 8 MB
kinds = {}
for shared in (True, False):
    kinds["shared" if shared else "plain"] = pycollective.GradientBuckets(
        shapes, comm, overlap=False, shared=shared)
grads = [np.full(s, rank + 1, np.float32) for s in shapes]
times = {k: [] for k in kinds}
for r in range(12):
    for k in (list(kinds) if r % 2 == 0 else list(kinds)[::-1]):
        b = kinds[k]
        for i in reversed(range(len(shapes))):
            b.ready(i, grads[i])
        world.Barrier()
        t0 = time.perf_counter()
        out = b.wait()
        t = world.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        if r:
            times[k].append(t)
        assert all(np.all(g == (n + 1) / 2) for g in out), k
if rank == 0:
    med = {k: np.median(v) * 1e3 for k, v in times.items()}
    print(f"N = {n}, algorithm {algorithm or 'auto'}, buckets {kinds['plain'].nbuckets}: "
          + "  ".join(f"{k} {v:.2f} ms" for k, v in med.items())
          + f"  shared / plain {med['shared'] / med['plain']:.2f}")
kinds["shared"].close()
