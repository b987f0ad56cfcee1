"""shm's single copy: ``common.cross_reduce`` reads the other ranks' buffers by address.

On one process: the "other ranks" here are arrays of this process, published by
address under this process's pid (``process_vm_readv`` reads one's own memory too),
so the block loop, compiled for the native kernels and in Python for the rest, runs
on several operands without MPI.  On several ranks: tests/mpi/node/test_shmem.py and
the allreduce matrix.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from pycollective.algorithms.shm import common as _common
from pycollective.data.kernels import get_kernel
from pycollective.node import cma as _cma

pytestmark = pytest.mark.skipif(not _cma.available() or not sys.platform.startswith("linux"),
                                reason="no process_vm_readv here")


def _cross(rank, inputs, pid=None):
    """A CrossMemory of len(inputs) ranks, this process in every place, the inputs published."""
    cross = object.__new__(_cma.CrossMemory)
    cross.rank, cross.size = rank, len(inputs)
    cross.headers = np.array([[pid or os.getpid(), x.ctypes.data, x.ctypes.data, x.nbytes]
                              for x in inputs], np.int64)
    cross.pids = [int(h[0]) for h in cross.headers]
    cross.pid_words = np.array(cross.pids, np.int64)
    cross._local, cross._remote = _cma._IoVec(), _cma._IoVec()
    cross.iovecs = np.zeros(4, np.int64)
    cross._tmp = np.empty(0, np.uint8)
    return cross


def _fold(op, operands):
    out = operands[0].copy()
    for x in operands[1:]:
        out = {"sum": np.add, "prod": np.multiply, "max": np.maximum,
               "min": np.minimum}[op](out, x).astype(out.dtype)
    return out


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "uint64", "float16", "int8"])
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
def test_the_compiled_and_the_python_loop_fold_the_same_bits(dtype, op, monkeypatch):
    """4 ranks, a range over several blocks and a ragged last one, every rank's place,
    in place too (ranks past the first two stage their own block): the exact fold, the
    same bits either way; the native kernels take the compiled loop, the others not."""
    rng = np.random.default_rng(5)
    n, count, block = 4, 10007, 1000
    inputs = [rng.integers(-3, 4, count).astype(dtype) for _ in range(n)]
    if np.dtype(dtype).kind == "f":
        inputs[1][[3, 4000]] = [np.nan, -0.0]
    lo, hi = 17, count - 5
    expected = _fold(op, [x[lo:hi] for x in inputs])
    kernel = get_kernel(op, dtype)
    compiled = [0]
    real = _common._cross_fold

    def counted(*args):
        compiled[0] += 1
        return real(*args)
    monkeypatch.setattr(_common, "_cross_fold", counted)
    for rank in range(n):
        for in_place in (False, True):
            mine = [x.copy() for x in inputs]
            out = mine[rank][lo:hi] if in_place else np.empty(hi - lo, dtype)
            _common.cross_reduce(_cross(rank, mine), mine[rank], out, lo, hi, kernel,
                                 block_bytes=block * np.dtype(dtype).itemsize)
            assert out.tobytes() == expected.tobytes(), (rank, in_place)
            others = [q for q in range(n) if q != rank]
            assert all(np.array_equal(mine[q], inputs[q], equal_nan=True) for q in others)
    native = np.dtype(dtype).name != "float16"  # float16 and bfloat16 fold in Python
    assert compiled[0] == (2 * n if native else 0)


def test_a_refused_read_raises_with_the_kernel_s_error():
    """A peer whose process is gone: the compiled loop stops at its read and the error
    names the rank and the system's reason, as the Python loop's read does."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    inputs = [np.ones(5000, np.float32) for _ in range(2)]
    cross = _cross(0, inputs)
    cross.pids[1] = cross.pid_words[1] = gone.pid
    with pytest.raises(OSError, match="node rank 1"):
        _common.cross_reduce(cross, inputs[0], np.empty(5000, np.float32), 0, 5000,
                             get_kernel("sum", np.float32))


def test_a_range_past_what_a_peer_published_is_refused():
    inputs = [np.ones(100, np.float32), np.ones(50, np.float32)]
    with pytest.raises(ValueError, match="refusing to read"):
        _common.cross_reduce(_cross(0, inputs), np.ones(100, np.float32),
                             np.empty(100, np.float32), 0, 100, get_kernel("sum", np.float32))

@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_recorded_call_runs_the_same_loop_and_marks_it(dtype, monkeypatch):
    """Under pycollective.timeline the kernel comes wrapped (each application a "reduce"
    phase): the native kernel still takes the compiled loop, marked as one phase; the
    Python loop marks each peer's read as a copy."""
    from pycollective import timeline
    from pycollective.timeline._recorder import Recorder
    n, count, block = 3, 5000, 1000
    inputs = [np.arange(count, dtype=dtype) % 7 + q for q in range(n)]
    recorder = Recorder(4)
    monkeypatch.setattr(timeline, "ACTIVE", recorder)
    kernel, = recorder.kernels((get_kernel("sum", dtype),))
    out = np.empty(count, dtype)
    recorder.traced(_common.cross_reduce, "allreduce",
                    (_cross(1, inputs), inputs[1], out, 0, count, kernel),
                    dict(block_bytes=block * np.dtype(dtype).itemsize))
    assert out.tobytes() == _fold("sum", inputs).tobytes()
    (_, _, [call], _, _), = recorder.snapshot()
    phases = [(name, category) for _, _, name, category, _ in call[4]]
    if dtype == "float32":
        assert phases == [("read and reduce", "reduce")]
    else:  # 5 blocks, two peers each: read, fold, read, fold (joined where they follow)
        assert ("read", "copy") in phases and ("reduce", "reduce") in phases
        assert len(phases) == 5 * 4
