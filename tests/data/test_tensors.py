"""torch CPU tensors through every public function and the drop-in, on one process.

Skips, saying why, where torch is not installed (it is an optional extra);
tests/mpi/data/test_tensors.py does the same on several ranks, with numpy's own
DLPack standing in for torch where torch is absent.
"""

import numpy as np
import pytest
from mpi4py import MPI

import pycollective

torch = pytest.importorskip("torch", reason="torch is not installed (an optional extra: "
                                            "pip install torch)")
SELF = MPI.COMM_SELF


def test_public_functions_write_the_tensors_in_place():
    x = torch.arange(6, dtype=torch.float32) - 2
    out = torch.zeros(6)
    assert pycollective.allreduce(x, out, comm=SELF) is out and torch.equal(out, x)
    for call in (lambda o: pycollective.reduce_scatter(x, o, comm=SELF),
                 lambda o: pycollective.reduce_scatter(x, o, counts=[6], comm=SELF),
                 lambda o: pycollective.allgather(x, o, comm=SELF),
                 lambda o: pycollective.allgatherv(x, o, [6], comm=SELF),
                 lambda o: pycollective.reduce(x, o, MPI.MAX, comm=SELF)):
        out = torch.zeros(6)
        call(out)
        assert torch.equal(out, x)
    y = x.clone()
    pycollective.bcast(y, comm=SELF)
    assert torch.equal(y, x)


def test_the_dropin_takes_tensors_as_mpi4py_does():
    drop = pycollective.Comm(SELF)
    x = torch.arange(4, dtype=torch.int64)
    for call in (lambda o: drop.Allreduce(x, o), lambda o: drop.Iallreduce(x, o).Wait(),
                 lambda o: drop.Reduce_scatter_block(x, [o, MPI.INT64_T]),
                 lambda o: drop.Allgather(x, o), lambda o: drop.Reduce(x, o)):
        out = torch.zeros(4, dtype=torch.int64)
        call(out)
        assert torch.equal(out, x)
    with pytest.raises(BufferError, match="not contiguous"):  # mpi4py's error type
        drop.Allreduce(x[::2], torch.zeros(2, dtype=torch.int64))
    half = torch.ones(3, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="bfloat16"):
        pycollective.allreduce(half, half.clone(), comm=SELF)
    assert np.array_equal(x.numpy(), np.arange(4))  # the input is untouched
