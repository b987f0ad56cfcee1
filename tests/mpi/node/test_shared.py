"""Arrays from pycollective.shared_empty: shm reads them in place, peer by peer."""

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective.node import arrays as _shared
from pycollective.runtime.context import get_context
from pycollective.algorithms.shm import allreduce as shm, ways as _ways

from _data import exact_reduce, exact_values, replicas_identical

# Just above 1 MiB of float32 (the large paths, which end with a sync), and prime.
COUNT = 262_147
MODES = ["both", "src", "dst", "odd ranks plain", "in place", "offset"]


@pytest.fixture(params=["slots", "single copy"])
def path(request, monkeypatch):
    """Which large path shm takes at COUNT: the slots, or cross-memory reads (pinned:
    where ranks have cores of their own a size's calls would otherwise try both)."""
    if request.param == "single copy":
        state = shm._state(get_context(MPI.COMM_WORLD))
        if state.cross is None:
            pytest.skip("cross-memory reads are not allowed here")
    monkeypatch.setattr(_ways, "FORCE_WAY",
                        _ways.SINGLE if request.param == "single copy" else _ways.SLOTS)
    return request.param


def _buffers(mode, x, rank):
    """``(src, dst, in place, allocations)`` for one mode; shared allocations where the mode
    says (every rank makes the same two, to release them together)."""
    n = x.size
    src = pycollective.shared_empty(n + 7 if mode == "offset" else n, x.dtype)
    dst = pycollective.shared_empty(n + 7 if mode == "offset" else n, x.dtype)
    allocations = (src, dst)
    if mode == "offset":  # views inside the allocation, at offsets that differ by rank
        src, dst = src[rank % 7:rank % 7 + n], dst[7 - rank % 7:7 - rank % 7 + n]
    src[...] = x
    if mode == "src":
        dst = np.empty_like(x)
    elif mode == "dst":
        src = x.copy()
    elif mode == "odd ranks plain" and rank % 2:
        src, dst = x.copy(), np.empty_like(x)
    elif mode == "in place":
        return src, src, True, allocations
    return src, dst, False, allocations


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", MODES)
def test_shared_buffers_give_the_exact_sum(path, mode):
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    x = exact_values(rank, COUNT, "float32", "sum")
    expected = exact_reduce([exact_values(q, COUNT, "float32", "sum") for q in range(size)],
                            "sum", "float32")
    src, dst, in_place, allocations = _buffers(mode, x, rank)
    before = src.copy()
    for _ in range(2):  # a second call reuses every registration
        if in_place:
            src[...] = x
            pycollective.allreduce(MPI.IN_PLACE, dst, algorithm="shm")
        else:
            pycollective.allreduce(src, dst, algorithm="shm")
            assert np.array_equal(src, before), "the send buffer changed"
        np.testing.assert_array_equal(dst, expected)
    for a in allocations:
        assert pycollective.release(a)


@pytest.mark.mpi(min_size=2)
def test_shared_replicas_are_bitwise_identical_with_nans(path):
    """max over float64 with NaNs of two payloads and signed zeros: same bits everywhere."""
    comm = MPI.COMM_WORLD
    rank = comm.rank
    rng = np.random.default_rng(rank)
    x = rng.standard_normal(COUNT // 2 + 3)
    x[rank::11] = np.nan
    x[5::13] = -0.0 if rank % 2 else 0.0
    x.view(np.uint64)[7::17] = 0x7FF8_0000_0000_0000 | (rank + 1)
    src = pycollective.shared_empty(x.size, x.dtype)
    dst = pycollective.shared_empty(x.size, x.dtype)
    src[...] = x
    pycollective.allreduce(src, dst, MPI.MAX, algorithm="shm")
    assert replicas_identical(comm, dst)
    plain = np.empty_like(x)
    pycollective.allreduce(x, plain, MPI.MAX, algorithm="shm")
    assert plain.tobytes() == dst.tobytes()
    pycollective.release(src)
    pycollective.release(dst)


@pytest.mark.mpi(min_size=2)
def test_released_arrays_are_plain_memory_again():
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    x = exact_values(rank, COUNT, "int32", "sum")
    expected = exact_reduce([exact_values(q, COUNT, "int32", "sum") for q in range(size)],
                            "sum", "int32")
    src = pycollective.shared_empty((COUNT,), np.int32)
    dst = pycollective.shared_empty(COUNT, "int32")
    src[...] = x
    registry = get_context(comm).peek(_shared._KEY)
    held = len(registry.entries)
    assert pycollective.release(src) and pycollective.release(dst)
    assert len(registry.entries) == held - 2
    assert not pycollective.release(dst), "released twice"
    assert registry.locate(src) is None
    pycollective.allreduce(src, dst, algorithm="shm")  # still valid memory, copied as usual
    np.testing.assert_array_equal(dst, expected)


@pytest.mark.mpi(min_size=2)
def test_shapes_and_dtypes_may_differ_between_ranks():
    comm = MPI.COMM_WORLD
    rank = comm.rank
    a = pycollective.shared_empty((rank + 1, 3), np.float64 if rank % 2 else np.int8)
    assert a.shape == (rank + 1, 3) and a.flags.c_contiguous and a.flags.writeable
    a[...] = rank
    assert np.all(a == rank)
    b = pycollective.shared_empty(0)
    assert b.size == 0 and b.dtype == np.float32
    assert pycollective.release(a) and pycollective.release(b)


@pytest.mark.mpi(min_size=2)
def test_releasing_different_allocations_raises_on_every_rank():
    """Rank 0 releases one allocation, the others another: every rank raises, naming the
    ranks, and nothing is dropped (a later call with either still works)."""
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    a = pycollective.shared_empty(COUNT)
    b = pycollective.shared_empty(COUNT)
    with pytest.raises(ValueError, match=r"rank 0: shared allocation #\d+, rank 1: shared "
                                         r"allocation #\d+.*same shared_empty call"):
        pycollective.release(a if rank == 0 else b)
    x = exact_values(rank, COUNT, "float32", "sum")
    a[...] = x
    pycollective.allreduce(a, b, algorithm="shm")
    expected = exact_reduce([exact_values(q, COUNT, "float32", "sum") for q in range(size)],
                            "sum", "float32")
    np.testing.assert_array_equal(b, expected)
    with pytest.raises(ValueError, match="plain memory"):
        pycollective.release(a if rank == 0 else np.empty(3))
    assert pycollective.release(a) and pycollective.release(b)


@pytest.mark.mpi(min_size=2)
def test_bad_shapes_raise_on_every_rank():
    with pytest.raises(ValueError, match="negative dimension"):
        pycollective.shared_empty((4, -1))
    with pytest.raises(TypeError, match="object arrays"):
        pycollective.shared_empty(4, object)
    with pytest.raises(TypeError):
        pycollective.shared_empty((2.5, 3))


@pytest.mark.mpi(min_size=2)
def test_a_communicator_across_nodes_gets_plain_arrays(monkeypatch):
    """Where the ranks span nodes there is nothing to share: numpy.empty, no registry."""
    comm = MPI.COMM_WORLD.Dup()
    try:
        monkeypatch.setattr(_shared, "whole_node", lambda ctx: None)
        a = pycollective.shared_empty(10, comm=comm)
        assert a.shape == (10,) and get_context(comm).peek(_shared._KEY) is None
        assert not pycollective.release(a, comm=comm)
    finally:
        comm.Free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("overlap", [True, False])
def test_buckets_of_a_pycollective_comm_are_shared(overlap):
    """GradientBuckets on a pycollective.Comm: shared buckets, the exact average, close."""
    comm = pycollective.Comm(MPI.COMM_WORLD, algorithm="shm")
    rank, size = comm.rank, comm.size
    shapes = [(COUNT,), (3, 5)]
    buckets = pycollective.GradientBuckets(shapes, comm, cap_bytes=0, overlap=overlap)
    registry = get_context(MPI.COMM_WORLD).peek(_shared._KEY)
    assert all(registry.locate(buf) is not None for buf in buckets.buffers)
    xs = [exact_values(rank, int(np.prod(s)), "float32", "sum").reshape(s) for s in shapes]
    for step in range(2):
        for i in reversed(range(len(shapes))):
            buckets.ready(i, xs[i])
        grads = buckets.wait()
        for i, s in enumerate(shapes):
            n = int(np.prod(s))
            total = exact_reduce([exact_values(q, n, "float32", "sum") for q in range(size)],
                                 "sum", "float32")
            np.testing.assert_array_equal(grads[i], (total / np.float32(size)).reshape(s))
    held = len(registry.entries)
    buckets.close()  # one allocation holds every bucket
    assert len(registry.entries) == held - 1
    assert all(registry.locate(buf) is None for buf in buckets.buffers)
    plain = pycollective.GradientBuckets(shapes, MPI.COMM_WORLD)
    assert all(registry.locate(buf) is None for buf in plain.buffers)
    with pycollective.GradientBuckets(shapes, comm) as scoped:
        assert len(registry.entries) == held
        assert all(buf.ctypes.data % 64 == 0 for buf in scoped.buffers)
    assert len(registry.entries) == held - 1
    # A block that raises (maybe on this rank only) leaves the memory to the communicator.
    with pytest.raises(KeyError):
        with pycollective.GradientBuckets(shapes, comm) as scoped:
            raise KeyError("this rank's own trouble")
    assert len(registry.entries) == held
    scoped.close()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm", ["shm", "auto", "ring"])
def test_shared_buffers_at_every_small_size(algorithm):
    """Below 1 MiB shared arrays take the usual paths: still exact at 0, 1, N-1, N, N+1,
    primes, in place and out of place, and the send buffer unchanged."""
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    src = pycollective.shared_empty(10_007, np.int32)
    dst = pycollective.shared_empty(10_007, np.int32)
    for count in (0, 1, size - 1, size, size + 1, 1021, 10_007):
        x = exact_values(rank, count, "int32", "sum")
        expected = exact_reduce([exact_values(q, count, "int32", "sum") for q in range(size)],
                                "sum", "int32")
        s, d = src[:count], dst[:count]
        s[...] = x
        pycollective.allreduce(s, d, algorithm=algorithm)
        np.testing.assert_array_equal(d, expected)
        np.testing.assert_array_equal(s, x)
        pycollective.allreduce(MPI.IN_PLACE, s, algorithm=algorithm)
        np.testing.assert_array_equal(s, expected)
    assert pycollective.release(src) and pycollective.release(dst)
