"""bfloat16 through every algorithm, and compressed allreduce within its stated bound.

On the world and on Split halves of every size (``layouts``): bfloat16 exact
data through every usable algorithm, reduce-scatter and allgather, the
drop-in and the buckets; float32 data with a wide range of magnitudes summed
with ``compress="fp16"``/``"bf16"`` stay within
:meth:`pycollective.compression.Cast.error_bound` of the float64 sum on
every element, bitwise identical on every rank; bad arguments on one rank
raise on every rank.
"""

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective import compression
from pycollective.data.kernels import BFLOAT16
from _data import bitwise_equal, check_allreduce, exact_reduce, exact_values, replicas_identical


@pytest.mark.mpi(min_size=2)
def test_bfloat16_exact_through_every_algorithm(layouts):
    """Transport and placement: every op's kernel is checked bit by bit in test_kernels.py."""
    failures = []
    for label, comm in layouts:
        n = comm.Get_size()
        for algorithm in pycollective.usable_algorithms(comm):
            for op in ("sum", "max"):
                for count in (0, 1, n + 1, 13, 10007):
                    check_allreduce(comm, algorithm, "bfloat16", op, count, failures,
                                    f"{label} {algorithm}")
    assert not failures, f"{len(failures)} failures: " + "; ".join(failures[:5])


@pytest.mark.mpi(min_size=2)
def test_bfloat16_reduce_scatter_allgather_and_drop_in(layouts):
    for label, comm in layouts:
        n, r = comm.Get_size(), comm.Get_rank()
        count = 1000
        everyone = [exact_values(q, count, BFLOAT16, "sum") for q in range(n)]
        expected = exact_reduce(everyone, "sum", BFLOAT16)
        offset, length = pycollective.partition(count, n, r)
        out = np.empty(length, BFLOAT16)
        pycollective.reduce_scatter(everyone[r], out, comm=comm)
        assert bitwise_equal(out, expected[offset:offset + length]), label
        full = np.zeros(count, BFLOAT16)
        pycollective.allgather(out, full, comm=comm)
        assert bitwise_equal(full, expected), label
        mine = everyone[r].copy()
        pycollective.Comm(comm).Allreduce(MPI.IN_PLACE, mine)
        assert bitwise_equal(mine, expected), label


@pytest.mark.mpi(min_size=2)
def test_bfloat16_through_every_collective_of_the_drop_in(layouts):
    """MPI has no bfloat16: the drop-in names it itself, and serves every collective."""
    for label, comm in layouts:
        n, r = comm.Get_size(), comm.Get_rank()
        drop = pycollective.Comm(comm)
        count = 3 * n + 2  # uneven blocks for Reduce_scatter
        everyone = [exact_values(q, count, BFLOAT16, "sum") for q in range(n)]
        expected = exact_reduce(everyone, "sum", BFLOAT16)
        counts = [count // n + (q < count % n) for q in range(n)]
        start = sum(counts[:r])
        part = np.empty(counts[r], BFLOAT16)
        drop.Reduce_scatter(everyone[r], part, counts)
        assert bitwise_equal(part, expected[start:start + counts[r]]), label
        block = np.empty(3, BFLOAT16)
        drop.Ireduce_scatter_block(everyone[r][:3 * n], block).Wait()
        assert bitwise_equal(block, exact_reduce([x[:3 * n] for x in everyone], "sum",
                                                 BFLOAT16)[3 * r:3 * r + 3]), label
        gathered = np.empty(count * n, BFLOAT16)
        drop.Allgather(everyone[r], gathered)
        assert bitwise_equal(gathered, np.concatenate(everyone)), label
        root = n - 1
        reduced = np.empty(count, BFLOAT16) if r == root else None
        drop.Reduce(everyone[r], reduced, root=root)
        if r == root:
            assert bitwise_equal(reduced, expected), label
        sent = everyone[r].copy()
        drop.Bcast(sent, root=root)
        assert bitwise_equal(sent, everyone[root]), label


def _wide_range(rank, count, seed=7):
    """float32 values over about 2^-20 .. 2^14 in magnitude (float16 range), signs mixed."""
    rng = np.random.default_rng([seed, rank, count])
    return (rng.standard_normal(count) * np.exp2(rng.uniform(-20, 12, count))).astype(np.float32)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_compressed_sum_within_the_bound(layouts, name):
    compressor = compression.resolve(name)
    failures = []
    for label, comm in layouts:
        n, r = comm.Get_size(), comm.Get_rank()
        count = 20011
        everyone = [_wide_range(q, count) for q in range(n)]
        exact = np.sum([x.astype(np.float64) for x in everyone], axis=0)
        bound = compressor.error_bound(np.sum([np.abs(x.astype(np.float64)) for x in everyone],
                                              axis=0), n)
        for algorithm in pycollective.usable_algorithms(comm):
            out = np.empty(count, np.float32)
            pycollective.allreduce(everyone[r], out, comm=comm, algorithm=algorithm,
                                   compress=name)
            err = np.abs(out.astype(np.float64) - exact)
            if not np.all(err <= bound):
                failures.append(f"{label} {algorithm}: error/bound {np.max(err / bound):.3g}")
            if not replicas_identical(comm, out):
                failures.append(f"{label} {algorithm}: ranks differ")
    assert not failures, "; ".join(failures[:5])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_drop_in_and_buckets_compress_alike(name):
    comm = MPI.COMM_WORLD
    x = _wide_range(comm.Get_rank(), 5003, seed=3)
    want = np.empty_like(x)
    pycollective.allreduce(x, want, comm=comm, algorithm="ring", compress=name)
    drop_in = pycollective.Comm(comm, algorithm="ring", compress=name)
    assert drop_in.Dup().compress is drop_in.compress
    got = x.copy()
    drop_in.Allreduce(MPI.IN_PLACE, got)
    assert bitwise_equal(got, want)
    later = x.copy()
    drop_in.Iallreduce(MPI.IN_PLACE, later).Wait()
    assert bitwise_equal(later, want)
    counts = np.arange(4, dtype=np.int64) + comm.Get_rank()
    drop_in.Allreduce(MPI.IN_PLACE, counts, op=MPI.MAX)  # not a floating sum: uncompressed
    assert list(counts) == list(np.arange(4) + comm.Get_size() - 1)
    for overlap in (False, True):
        buckets = pycollective.GradientBuckets([(3, 1000), (2003,)], pycollective.Comm(
            comm, algorithm="ring"), cap_bytes=0, overlap=overlap, average=False, compress=name)
        for i, g in enumerate(buckets.grads):
            g.reshape(-1)[...] = x[:3000] if i == 0 else x[3000:]
            buckets.ready(i)
        grads = buckets.wait()
        for g, part in zip(grads, (want[:3000], want[3000:])):
            reduced = np.empty_like(part)
            src = x[:3000] if part.size == 3000 else x[3000:]
            pycollective.allreduce(src, reduced, comm=comm, algorithm="ring", compress=name)
            assert bitwise_equal(g.reshape(-1), reduced)


@pytest.mark.mpi(min_size=2)
def test_a_bad_argument_on_one_rank_raises_on_every_rank():
    comm = MPI.COMM_WORLD
    x = np.ones(100, np.float32)
    out = np.empty(100 if comm.Get_rank() else 99, np.float32)
    with pytest.raises((ValueError, TypeError)):
        pycollective.allreduce(x, out, comm=comm, compress="fp16")
    # The communicator still works: the error was found before any data moved.
    out = np.empty_like(x)
    pycollective.allreduce(x, out, comm=comm, compress="fp16")
    assert np.all(out == comm.Get_size())
