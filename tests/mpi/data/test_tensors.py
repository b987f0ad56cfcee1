"""Tensors as training scripts pass them: the same results as numpy arrays, everywhere.

Every public function and every drop-in collective gets a numpy array, a
DLPack-only tensor (the shape of a torch or JAX CPU tensor, built on numpy:
versioned and legacy capsules) and, where torch is installed, a torch CPU
tensor; each must leave bit for bit what the plain communicator's call
leaves for numpy arrays, with the tensor's own memory written in place.
Without torch, its cases skip and say so.
"""

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from _data import bitwise_equal, exact_values
from _tensors import as_kind, torch_or_reason

_torch, _no_torch = torch_or_reason()
KINDS = ["numpy", "dlpack", "legacy-dlpack",
         pytest.param("torch", marks=pytest.mark.skipif(_torch is None, reason=str(_no_torch)))]


def _check(failures, where, got, want):
    if not bitwise_equal(np.asarray(got), np.asarray(want)):
        failures.append(f"{where}: {np.asarray(got)[:4]} != {np.asarray(want)[:4]}")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind", KINDS)
def test_public_functions(kind):
    comm = MPI.COMM_WORLD
    n, r = comm.Get_size(), comm.Get_rank()
    x = exact_values(r, 3 * n + 1, "float32", "sum")
    failures = []

    def arg(values):
        return as_kind(kind, values)

    send, _ = arg(x)
    out, view = arg(np.zeros_like(x))
    pycollective.allreduce(send, out, MPI.SUM, comm=comm)
    want = np.empty_like(x)
    comm.Allreduce(x, want)
    _check(failures, "allreduce", view, want)
    buf, view = arg(x)
    pycollective.allreduce(MPI.IN_PLACE, buf, "max", comm=comm)
    comm.Allreduce(x, want, MPI.MAX)
    _check(failures, "allreduce in place", view, want)

    counts = [pycollective.partition(x.size, n, q)[1] for q in range(n)]
    out, view = arg(np.zeros(counts[r], np.float32))
    pycollective.reduce_scatter(send, out, comm=comm)
    mine = np.empty(counts[r], np.float32)
    comm.Reduce_scatter(x, mine, counts)
    _check(failures, "reduce_scatter", view, mine)

    full, view = arg(np.zeros(x.size, np.float32))
    block, _ = arg(x[:counts[r]])
    pycollective.allgather(block, full, comm=comm)
    gathered = np.empty(x.size, np.float32)
    comm.Allgatherv(x[:counts[r]], [gathered, counts])
    _check(failures, "allgather", view, gathered)
    full, view = arg(np.zeros(x.size, np.float32))
    pycollective.allgatherv(block, full, counts, comm=comm)
    _check(failures, "allgatherv", view, gathered)

    # PROD needs its own exact data: products of the sum data overflow the
    # exact range and then depend on the order of operations (Open MPI's
    # reduce order differs from ours).
    xp = exact_values(r, 3 * n + 1, "float32", "prod")
    sendp, _ = arg(xp)
    out, view = arg(np.zeros_like(xp))
    pycollective.reduce(sendp, out, MPI.PROD, root=n - 1, comm=comm)
    comm.Reduce(xp, want, MPI.PROD, root=n - 1)
    if r == n - 1:
        _check(failures, "reduce", view, want)

    buf, view = arg(x if r == 0 else np.zeros_like(x))
    pycollective.bcast(buf, root=0, comm=comm)
    root = x.copy()
    comm.Bcast(root, 0)
    _check(failures, "bcast", view, root)
    assert not failures, "; ".join(failures)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind", KINDS)
def test_dropin(kind):
    comm = MPI.COMM_WORLD
    drop = pycollective.Comm(comm)
    n, r = comm.Get_size(), comm.Get_rank()
    x = exact_values(r, 2 * n, "int64", "sum")
    failures = []

    def pair(values, call_drop, call_plain, where, only_root=None):
        obj, view = as_kind(kind, values)
        plain = np.array(values, copy=True)
        call_drop(obj)
        call_plain(plain)
        if only_root is None or r == only_root:
            _check(failures, where, view, plain)

    send, _ = as_kind(kind, x)
    pair(np.zeros_like(x), lambda o: drop.Allreduce(send, o), lambda p: comm.Allreduce(x, p),
         "Allreduce")
    pair(np.zeros_like(x), lambda o: drop.Allreduce(send, [o, MPI.INT64_T]),
         lambda p: comm.Allreduce(x, p), "Allreduce [buf, datatype]")
    pair(np.zeros_like(x), lambda o: drop.Iallreduce(send, o).Wait(),
         lambda p: comm.Allreduce(x, p), "Iallreduce")
    pair(np.zeros(2, np.int64), lambda o: drop.Reduce_scatter_block(send, o),
         lambda p: comm.Reduce_scatter_block(x, p), "Reduce_scatter_block")
    pair(np.zeros(2, np.int64), lambda o: drop.Ireduce_scatter(send, o, [2] * n).Wait(),
         lambda p: comm.Reduce_scatter(x, p, [2] * n), "Ireduce_scatter")
    pair(x, lambda o: drop.Reduce_scatter_block(MPI.IN_PLACE, o),
         lambda p: comm.Reduce_scatter_block(MPI.IN_PLACE, p), "Reduce_scatter_block in place")
    mine, _ = as_kind(kind, x[:2])
    pair(np.zeros_like(x), lambda o: drop.Allgather(mine, o), lambda p: comm.Allgather(x[:2], p),
         "Allgather")
    pair(np.zeros_like(x), lambda o: drop.Iallgather(mine, o).Wait(),
         lambda p: comm.Allgather(x[:2], p), "Iallgather")
    pair(np.zeros_like(x), lambda o: drop.Allgatherv(mine, [o, [2] * n]),
         lambda p: comm.Allgatherv(x[:2], [p, [2] * n]), "Allgatherv")
    pair(np.zeros_like(x), lambda o: drop.Reduce(send, o, MPI.MAX, root=0),
         lambda p: comm.Reduce(x, p, MPI.MAX, root=0), "Reduce", only_root=0)
    pair(np.zeros_like(x), lambda o: drop.Ireduce(send, o, MPI.MIN, root=n - 1).Wait(),
         lambda p: comm.Reduce(x, p, MPI.MIN, root=n - 1), "Ireduce", only_root=n - 1)
    pair(x, lambda o: drop.Bcast(o, root=n - 1), lambda p: comm.Bcast(p, root=n - 1), "Bcast")
    pair(x, lambda o: drop.Ibcast(o, root=0).Wait(), lambda p: comm.Bcast(p, root=0), "Ibcast")
    assert not failures, "; ".join(failures)


@pytest.mark.mpi(min_size=2)
@pytest.mark.skipif(_torch is None, reason=str(_no_torch))
def test_torch_errors_like_mpi4py():
    """A strided tensor gets mpi4py's BufferError on every rank; bfloat16 is not reduced."""
    comm = MPI.COMM_WORLD
    drop = pycollective.Comm(comm)
    t = _torch.arange(8, dtype=_torch.float32)
    with pytest.raises(BufferError, match="not contiguous"):
        drop.Allreduce(t[::2], _torch.zeros(4))
    with pytest.raises(ValueError, match="not contiguous"):
        pycollective.allreduce(t[::2], _torch.zeros(4), comm=comm)
    b = _torch.ones(4, dtype=_torch.bfloat16)
    with pytest.raises(TypeError, match="bfloat16"):
        pycollective.allreduce(b, b.clone(), comm=comm)
    out = _torch.zeros(8)
    drop.Allreduce(t, out)  # still usable
    assert _torch.equal(out, t * comm.Get_size())
