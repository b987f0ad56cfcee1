"""Device buffers staged through host memory, on several ranks, with the fake device.

The fake device (:mod:`pycollective.device.fake`) stands for CUDA memory:
DLPack or ``__cuda_array_interface__`` objects whose bytes only its backend
copies, on streams that run lazily (a copy not waited for reads stale
bytes), and which record any attempt to take their pointer (``fake.LEAKS``,
empty at the end of every test: no device pointer reached MPI).  Small
chunks (``PYCOLLECTIVE_GPU_CHUNK_BYTES``) make the pipeline run many chunks
at small counts.  Every result is compared bit for bit with the exact
reduction (``_data``), or with the plain communicator's call on numpy
arrays for the drop-in.
"""

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from _data import bitwise_equal, counts_for, env, exact_reduce, exact_values
from pycollective.device import _aware, _pool, fake
from pycollective.data.kernels import SUPPORTED_DTYPES

OPS = ["sum", "prod", "max", "min"]
DTYPES = [np.dtype(d).name for d in SUPPORTED_DTYPES]


@pytest.fixture(autouse=True)
def small_chunks():
    _aware.forget()
    fake.LEAKS.clear()
    with env("PYCOLLECTIVE_GPU_CHUNK_BYTES", "96"), env("PYCOLLECTIVE_GPU_AWARE", None):
        yield
    assert fake.LEAKS == [], f"a device pointer was offered to MPI: {fake.LEAKS}"
    _pool.clear()


def _everyone(comm, count, dtype, op, shift=0):
    n = comm.Get_size()
    arrays = [exact_values((q + shift) % n, count, dtype, op) for q in range(n)]
    return arrays, exact_reduce(arrays, op, dtype)


def _device(values, via="dlpack"):
    """A fake device array of ``values`` whose contents are still being written on its
    stream (a pending kernel): the staged call must wait for it."""
    x = fake.fake_array(np.zeros_like(values), via=via)
    x.write(values)
    return x


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_every_op_and_dtype_in_chunks(dtype, op):
    comm = MPI.COMM_WORLD
    failures = []
    for count in (comm.Get_size() + 1, 97):
        arrays, expected = _everyone(comm, count, dtype, op)
        mine = arrays[comm.Get_rank()]
        x = _device(mine)
        out = fake.fake_array(np.full_like(mine, 3), via="cai")
        pycollective.allreduce(x, out, op, comm=comm)
        if not bitwise_equal(out.read(), expected):
            failures.append(f"{count}: device to device")
        if not bitwise_equal(x.read(), mine):
            failures.append(f"{count}: sendbuf modified")
        pycollective.allreduce(MPI.IN_PLACE, x, op, comm=comm)
        if not bitwise_equal(x.read(), expected):
            failures.append(f"{count}: in place")
    assert not failures, failures


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("via", ["dlpack", "cai"])
def test_odd_and_zero_sizes_and_host_device_mixes(via):
    comm = MPI.COMM_WORLD
    r = comm.Get_rank()
    failures = []
    for count in counts_for(comm.Get_size()) + [24, 25, 23]:
        arrays, expected = _everyone(comm, count, "float32", "sum", shift=count)
        mine = arrays[r]
        cases = {
            "device->device": (_device(mine, via), fake.fake_array(np.zeros_like(mine), via=via)),
            "device->host": (_device(mine, via), np.zeros_like(mine)),
            "host->device": (mine.copy(), fake.fake_array(np.zeros_like(mine), via=via)),
        }
        for name, (src, dst) in cases.items():
            pycollective.allreduce(src, dst, comm=comm)
            got = dst if isinstance(dst, np.ndarray) else dst.read()
            if not bitwise_equal(got, expected):
                failures.append(f"{name} count={count}")
        same = _device(mine, via)
        pycollective.allreduce(same, same, comm=comm)  # the same object: in place
        if not bitwise_equal(same.read(), expected):
            failures.append(f"same object count={count}")
        drop = pycollective.Comm(comm)
        for name, (src, dst) in {"drop-in": (_device(mine, via), fake.fake_array(
                np.zeros_like(mine), via=via)), "drop-in device->host": (
                _device(mine, via), np.zeros_like(mine))}.items():
            drop.Allreduce(src, dst, MPI.SUM)
            got = dst if isinstance(dst, np.ndarray) else dst.read()
            if not bitwise_equal(got, expected):
                failures.append(f"{name} count={count}")
        x = _device(mine, via)
        drop.Iallreduce(MPI.IN_PLACE, x, MPI.SUM).Wait()
        if not bitwise_equal(x.read(), expected):
            failures.append(f"Iallreduce in place count={count}")
    assert not failures, failures


def _native(comm, method, *args):
    getattr(MPI.Intracomm, method)(comm, *args)


@pytest.mark.mpi(min_size=2)
def test_dropin_collectives_as_the_plain_communicator():
    comm = MPI.COMM_WORLD
    n, r = comm.Get_size(), comm.Get_rank()
    drop = pycollective.Comm(comm)
    failures = []
    x = exact_values(r, 3 * n + 2, "int32", "sum")

    def check(label, device, want):
        if not bitwise_equal(device.read(), want):
            failures.append(label)

    # Reduce_scatter_block / Reduce_scatter
    block = 3
    send = exact_values(r, block * n, "float64", "sum")
    for form in ("blocking", "nonblocking"):
        out = fake.fake_array(np.zeros(block))
        want = np.zeros(block)
        comm.Reduce_scatter_block(send, want)
        if form == "blocking":
            drop.Reduce_scatter_block(_device(send), out)
        else:
            drop.Ireduce_scatter_block(_device(send), out).Wait()
        check(f"Reduce_scatter_block {form}", out, want)
        counts = [1 + (q % 2) for q in range(n)]
        sendv = exact_values(r, sum(counts), "float64", "sum")
        outv, wantv = fake.fake_array(np.zeros(counts[r])), np.zeros(counts[r])
        comm.Reduce_scatter(sendv, wantv, counts)
        (drop.Reduce_scatter if form == "blocking" else
         (lambda *a: drop.Ireduce_scatter(*a).Wait()))(_device(sendv), outv, counts)
        check(f"Reduce_scatter {form}", outv, wantv)
    # Allgather, Allgatherv (with a spec), Reduce, Bcast, Allreduce with a spec
    out, want = fake.fake_array(np.zeros(n * x.size, x.dtype)), np.zeros(n * x.size, x.dtype)
    comm.Allgather(x, want)
    drop.Allgather(_device(x), out)
    check("Allgather", out, want)
    counts = [q + 1 for q in range(n)]
    part = x[:counts[r]].copy()
    out = fake.fake_array(np.full(sum(counts) + 2, -1, x.dtype))
    want = np.full(sum(counts) + 2, -1, x.dtype)
    comm.Allgatherv(part, [want, counts])
    drop.Iallgatherv(_device(part), [out, counts]).Wait()
    check("Iallgatherv with counts", out, want)
    for root in (0, n - 1):
        out, want = fake.fake_array(np.full_like(x, 5)), np.full_like(x, 5)
        comm.Reduce(x, want, MPI.MAX, root)
        drop.Reduce(_device(x), out, MPI.MAX, root)
        check(f"Reduce root={root}", out, want)
        buf = _device(x if r == root else np.zeros_like(x))
        want = x.copy()
        comm.Bcast(want, root)
        drop.Ibcast(buf, root).Wait()
        check(f"Ibcast root={root}", buf, want)
    out, want = fake.fake_array(np.zeros_like(x)), np.zeros_like(x)
    comm.Allreduce([x, 4, MPI.INT], [want, 4, MPI.INT])
    drop.Allreduce([_device(x), 4, MPI.INT], [out, 4, MPI.INT])
    check("Allreduce of specs", out, want)
    # An op pycollective does not reduce: the native call, on host mirrors.
    out, want = fake.fake_array(np.zeros_like(x)), np.zeros_like(x)
    comm.Allreduce(x, want, MPI.BXOR)
    drop.Allreduce(_device(x), out, MPI.BXOR)
    check("Allreduce BXOR (native on host mirrors)", out, want)
    # The public functions other than allreduce
    out = fake.fake_array(np.zeros(n * x.size, x.dtype))
    pycollective.allgather(_device(x), out, comm=comm)
    want = np.zeros(n * x.size, x.dtype)
    comm.Allgather(x, want)
    check("allgather", out, want)
    out = fake.fake_array(np.zeros(block))
    pycollective.reduce_scatter(_device(send), out, comm=comm)
    want = np.zeros(block)
    comm.Reduce_scatter_block(send, want)
    check("reduce_scatter", out, want)
    buf = _device(x if r == 0 else np.zeros_like(x))
    pycollective.bcast(buf, root=0, comm=comm)
    want = x.copy()
    comm.Bcast(want, 0)
    check("bcast", buf, want)
    out = fake.fake_array(np.zeros_like(x))
    pycollective.reduce(_device(x), out, "min", root=0, comm=comm)
    want = np.zeros_like(x)
    comm.Reduce(x, want, MPI.MIN, 0)
    if r == 0:
        check("reduce", out, want)
    assert not failures, failures


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("count_differs", [False, True])
def test_a_rank_that_cannot_stage_raises_everywhere(count_differs):
    """Rank 0 has a non-contiguous device array (or another count): every rank raises."""
    comm = MPI.COMM_WORLD
    r = comm.Get_rank()
    count = 200 + (r if count_differs else 0)  # many chunks of 96 bytes
    x = fake.fake_array(np.ones(count, np.float32), contiguous=count_differs or r != 0)
    with pytest.raises(ValueError) as info:
        pycollective.allreduce(MPI.IN_PLACE, x, comm=comm)
    if count_differs:
        assert "counts differ" in str(info.value)
    elif r == 0:
        assert isinstance(info.value, pycollective.DeviceMemoryError)
        assert "non-contiguous" in str(info.value)
    else:
        assert "rank 0" in str(info.value) and "non-contiguous" in str(info.value)
    assert np.array_equal(x.read(), np.ones(count, np.float32))  # nothing moved
    drop = pycollective.Comm(comm)
    y = fake.fake_array(np.ones(8, np.float32), contiguous=r != 0)
    with pytest.raises(ValueError, match="non-contiguous"):
        drop.Allreduce(MPI.IN_PLACE, y)
    with pytest.raises(ValueError, match="non-contiguous"):
        drop.Bcast(y, 0)
    # the communicator still works afterwards
    z = _device(np.ones(8, np.float32))
    drop.Allreduce(MPI.IN_PLACE, z)
    assert np.array_equal(z.read(), np.full(8, comm.Get_size(), np.float32))


@pytest.mark.mpi(min_size=2)
def test_training_helpers_take_device_arrays():
    comm = MPI.COMM_WORLD
    r = comm.Get_rank()
    params = {"w": fake.fake_array(np.full((3, 4), r, np.float32)),
              "b": fake.fake_array(np.arange(5, dtype=np.int64) * (r + 1))}
    checksum = pycollective.broadcast_parameters(params, root=0, comm=comm)
    assert np.array_equal(params["w"].read(), np.zeros((3, 4), np.float32))
    assert np.array_equal(params["b"].read(), np.arange(5, dtype=np.int64))
    assert pycollective.check_replicas(params, comm=comm) == checksum
    if r == 1:
        params["w"].write(np.ones((3, 4)))
    with pytest.raises(pycollective.ReplicaMismatch) as info:
        pycollective.check_replicas(params, comm=comm)
    assert list(info.value.ranks) == [1]
