"""Serial tests of gradient bucketing: layout, zero-copy views, start order, averaging.

A recording communicator stands in for MPI so that the order and content
of the collectives can be checked exactly; the multi-rank behaviour is
covered by tests/mpi/training/test_example.py (training through the buckets).
"""

import numpy as np
import pytest
from mpi4py import MPI

from pycollective import GradientBuckets
from pycollective.training.bucketing import DEFAULT_CAP_BYTES, bucket_layout


class Recorder:
    """Pretends to be an N-rank communicator where every rank holds the same data."""

    def __init__(self, size=3):
        self.size, self.calls = size, []

    def Get_size(self):
        return self.size

    def _reduce(self, sendbuf, buf, op, kind):
        assert sendbuf is MPI.IN_PLACE and op == MPI.SUM
        self.calls.append((kind, buf.copy()))
        buf *= self.size  # N identical contributions

    def Allreduce(self, sendbuf, buf, op):
        self._reduce(sendbuf, buf, op, "Allreduce")

    def Iallreduce(self, sendbuf, buf, op):
        self._reduce(sendbuf, buf, op, "Iallreduce")
        return self

    def Test(self):
        return True

    def Wait(self):
        return True


def test_layout():
    nbytes = [40, 400, 40, 4000, 40]
    assert bucket_layout(nbytes, 0, [4, 3, 2, 1, 0]) == [[4], [3], [2], [1], [0]]
    assert bucket_layout(nbytes, 10 ** 6, [4, 3, 2, 1, 0]) == [[4, 3, 2, 1, 0]]
    # 4000 > cap: a bucket of its own; order is respected.
    assert bucket_layout(nbytes, 500, [4, 3, 2, 1, 0]) == [[4], [3], [2, 1, 0]]
    assert bucket_layout(nbytes, 480, [0, 1, 2, 3, 4]) == [[0, 1, 2], [3], [4]]  # fills to the cap
    assert bucket_layout(nbytes, 479, [0, 1, 2, 3, 4]) == [[0, 1], [2], [3], [4]]
    assert bucket_layout([], 100, []) == []
    assert DEFAULT_CAP_BYTES == 25 * 2 ** 20


def test_grads_are_views_into_flat_buckets():
    shapes = [(3, 4), (4,), (4, 2), (2,), ()]
    b = GradientBuckets(shapes, Recorder(), dtype=np.float64, cap_bytes=100)
    assert [g.shape for g in b.grads] == shapes
    for i, g in enumerate(b.grads):
        assert any(np.shares_memory(g, buf) for buf in b.buffers)
        assert g.dtype == np.float64
    total = sum(int(np.prod(s)) for s in shapes)
    assert sum(buf.size for buf in b.buffers) == total
    # Distinct tensors never overlap.
    marks = [np.zeros(buf.size, bool) for buf in b.buffers]
    for g in b.grads:
        for buf, mark in zip(b.buffers, marks):
            if np.shares_memory(g, buf):
                start = (g.__array_interface__["data"][0] - buf.__array_interface__["data"][0]) // 8
                assert not mark[start:start + g.size].any()
                mark[start:start + g.size] = True
    assert all(m.all() for m in marks)


def _fill(b):
    for i, g in enumerate(b.grads):
        g[...] = (np.arange(g.size).reshape(g.shape) * 3 + 10 * i + 1) % 17 - 8


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("average", [True, False])
def test_reduced_values(overlap, average):
    comm = Recorder(size=4)
    shapes = [(5, 3), (3,), (3, 2), (2,)]
    b = GradientBuckets(shapes, comm, dtype=np.float32, cap_bytes=64, overlap=overlap,
                        average=average)
    _fill(b)
    before = [g.copy() for g in b.grads]
    for i in reversed(range(len(shapes))):
        b.ready(i)
    grads = b.wait()
    for g, g0 in zip(grads, before):
        np.testing.assert_array_equal(g, g0 if average else 4 * g0)
    kinds = {k for k, _ in comm.calls}
    assert kinds == ({"Iallreduce"} if overlap else {"Allreduce"})
    assert len(comm.calls) == b.nbuckets


def test_overlap_starts_buckets_as_they_complete_and_in_bucket_order():
    comm = Recorder()
    # Four tensors of 16 bytes, cap 32: buckets [3, 2] and [1, 0].
    b = GradientBuckets([(4,)] * 4, comm, dtype=np.float32, cap_bytes=32, average=False)
    assert b.layout == [[3, 2], [1, 0]]
    _fill(b)
    b.ready(1)
    b.ready(0)          # bucket 1 complete, but bucket 0 is not: nothing may start
    assert comm.calls == []
    b.ready(3)
    assert comm.calls == []
    b.ready(2)          # bucket 0 complete: both start, in bucket order
    assert len(comm.calls) == 2
    np.testing.assert_array_equal(comm.calls[0][1][:4], (np.arange(4) * 3 + 31) % 17 - 8)
    b.wait()
    assert len(comm.calls) == 2
    # Next step: the state was reset.
    comm.calls.clear()
    b.ready(3)
    b.ready(2)
    assert len(comm.calls) == 1
    b.wait()            # starts the incomplete bucket
    assert len(comm.calls) == 2


def test_ready_with_value_copies_and_double_ready_raises():
    b = GradientBuckets([(2,), (3,)], Recorder(size=2), dtype=np.float64, average=False)
    b.ready(1, np.array([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="twice"):
        b.ready(1)
    b.ready(0, np.array([4.0, 5.0]))
    grads = b.wait()
    np.testing.assert_array_equal(grads[1], [2.0, 4.0, 6.0])
    np.testing.assert_array_equal(grads[0], [8.0, 10.0])
    b.zero()
    assert all(not g.any() for g in b.grads)


def test_bad_arguments():
    with pytest.raises(ValueError, match="permutation"):
        GradientBuckets([(2,), (2,)], Recorder(), order=[0, 0])
    with pytest.raises(ValueError, match="cap_bytes"):
        GradientBuckets([(2,)], Recorder(), cap_bytes=-1)
    with pytest.raises(ValueError, match="floating"):
        GradientBuckets([(2,)], Recorder(), dtype=np.int32)


def test_on_a_real_one_rank_communicator():
    import pycollective
    for comm in (MPI.COMM_SELF, pycollective.Comm(MPI.COMM_SELF)):
        b = GradientBuckets([(3, 2), (2,)], comm, dtype=np.float64, cap_bytes=16)
        _fill(b)
        before = [g.copy() for g in b.grads]
        b.ready(1)
        b.ready(0)
        for g, g0 in zip(b.wait(), before):
            np.testing.assert_array_equal(g, g0)
