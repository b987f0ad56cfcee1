"""Serial tests of the drop-in communicator (one process: COMM_WORLD and COMM_SELF have size 1).

With one rank a reduction is a copy, so these tests pin down what needs no
peers: reading mpi4py buffer specs (counts, displacements, typecodes, which
elements are touched), the native-or-pycollective decision and its reasons,
errors, and the request life cycle.  tests/mpi/test_comm.py compares results
across ranks.
"""

import array
import logging

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective import _buffers
from pycollective import comm as comm_module


def _decide(sendbuf, recvbuf, op):
    """What the drop-in's Allreduce resolves to: reason set for a fallback, error, or neither."""
    return comm_module._plan(comm_module._allreduce_plan, comm_module._invalid_allreduce,
                             sendbuf, recvbuf, op)


def _data(count, dtype):
    return (np.arange(count) * 7 % 23 - 11).astype(dtype)  # per-index values, never all ones


def test_is_an_intracomm_sharing_the_handle():
    for base in (MPI.COMM_WORLD, MPI.COMM_SELF):
        drop = pycollective.Comm(base, algorithm="ring")
        assert isinstance(drop, MPI.Intracomm) and drop == base
        assert MPI._handleof(drop) == MPI._handleof(base)
        assert drop.algorithm == "ring"
        assert "ring" in repr(drop)
    assert pycollective.Comm(MPI.COMM_WORLD).algorithm is None  # pycollective's default
    assert pycollective.Comm() == MPI.COMM_NULL


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="unknown algorithm"):
        pycollective.Comm(MPI.COMM_WORLD, algorithm="no-such")
    with pytest.raises(TypeError):
        pycollective.Comm(object())


@pytest.mark.parametrize("algorithm", pycollective.algorithms() + [None])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "float16", "uint8"])
def test_buffer_forms_touch_exactly_the_described_elements(algorithm, dtype):
    drop = pycollective.Comm(MPI.COMM_SELF, algorithm=algorithm)
    code = np.dtype(dtype).char
    mpitype = MPI.Datatype.fromcode(code)
    x = _data(12, dtype)
    cases = [  # (send, recv, slice of recv written)
        (lambda r: (x, r), slice(0, 12)),
        (lambda r: ([x, mpitype], [r, mpitype]), slice(0, 12)),
        (lambda r: ([x, code], [r, code]), slice(0, 12)),
        (lambda r: ([x, 5, mpitype], [r, 5, mpitype]), slice(0, 5)),
        (lambda r: ([x, (4, 3), mpitype], [r, (4, 3), mpitype]), slice(3, 7)),
        (lambda r: ([x, 4, 3, mpitype], [r, 4, 3, mpitype]), slice(3, 7)),
        (lambda r: ([x, 6], [r, 6]), slice(0, 6)),
    ]
    for make, written in cases:
        out = np.full(12, 99, dtype)
        drop.Allreduce(*make(out))
        expected = np.full(12, 99, dtype)
        expected[written] = x[written]  # one rank: the described elements, copied
        assert np.array_equal(out, expected), (written, out, expected)


def test_array_array_and_in_place_forms():
    drop = pycollective.Comm(MPI.COMM_SELF)
    a = array.array("d", [1.5, -2.0, 3.25])
    b = array.array("d", [0.0] * 3)
    drop.Allreduce(a, b)
    assert b.tolist() == [1.5, -2.0, 3.25] and a.tolist() == [1.5, -2.0, 3.25]
    for send in (MPI.IN_PLACE, None, "same"):
        r = array.array("i", [4, -5, 6])
        drop.Allreduce(r if send == "same" else send, r, op=MPI.MAX)
        assert r.tolist() == [4, -5, 6]
    f = np.asfortranarray(_data(6, "float32").reshape(2, 3))
    out = np.zeros((2, 3), np.float32, order="F")
    drop.Allreduce([f, MPI.FLOAT], [out, MPI.FLOAT])
    assert np.array_equal(out, f)


def test_reinterpreting_bytes_like_mpi4py():
    """[float32 array, MPI.DOUBLE] reduces the same bytes as doubles, as mpi4py does."""
    drop = pycollective.Comm(MPI.COMM_SELF)
    x = _data(8, "float32")
    out = np.zeros(8, np.float32)
    drop.Allreduce([x, MPI.DOUBLE], [out, MPI.DOUBLE])
    assert out.tobytes() == x.tobytes()


@pytest.mark.parametrize("op, datatype, reason", [
    (MPI.LAND, MPI.INT, "op MPI.LAND"),
    (MPI.BXOR, MPI.INT, "op MPI.BXOR"),
    (MPI.MAXLOC, MPI.DOUBLE_INT, "op MPI.MAXLOC"),
    (MPI.SUM, MPI.C_FLOAT_COMPLEX, "no pycollective kernel"),
    (MPI.SUM, MPI.C_BOOL, "no pycollective kernel"),
    (MPI.SUM, MPI.LONG_DOUBLE, "no pycollective kernel"),
    (MPI.SUM, MPI.PACKED, "no pycollective kernel"),
])
def test_fallback_decision_depends_on_op_and_datatype(op, datatype, reason):
    extent = datatype.Get_extent()[1]
    buf = np.zeros(3 * extent, np.uint8)
    plan = _decide([buf, 3, datatype], [buf.copy(), 3, datatype], op)
    assert plan.reason is not None and reason in plan.reason


def test_user_op_and_derived_datatype_fall_back():
    op = MPI.Op.Create(lambda a, b, t: None, commute=True)
    pair = MPI.INT.Create_contiguous(2).Commit()
    try:
        x = np.zeros(4, np.int32)
        assert _decide(x, x.copy(), op).reason == "user-defined op"
        assert _decide([x, 2, pair], [x.copy(), 2, pair], MPI.SUM).reason == "derived datatype"
    finally:
        pair.Free()
        op.Free()


def test_supported_calls_do_not_fall_back():
    for dtype in ("float16", "float32", "float64", "int8", "int16", "int32", "int64",
                  "uint16", "uint32", "uint64"):
        x = _data(5, dtype)
        for op in (MPI.SUM, MPI.PROD, MPI.MAX, MPI.MIN):
            plan = _decide(x, np.empty_like(x), op)
            assert plan.reason is None and plan.error is None, (dtype, op, plan.reason)


def test_fallback_is_logged_once_per_reason(caplog):
    drop = pycollective.Comm(MPI.COMM_SELF)
    reason = "op MPI.BOR is not implemented by pycollective"
    _buffers.forget_logged(reason)
    x = np.array([1, 2, 4], np.int32)
    with caplog.at_level(logging.INFO, logger="pycollective"):
        for _ in range(3):
            out = np.zeros_like(x)
            drop.Allreduce(x, out, op=MPI.BOR)
            assert np.array_equal(out, x)
    assert sum(reason in r.getMessage() for r in caplog.records) == 1


def test_errors_like_mpi4py():
    drop = pycollective.Comm(MPI.COMM_SELF)
    with pytest.raises(ValueError, match="4.*3|3.*4"):
        drop.Allreduce(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="3.*5|5.*3"):
        drop.Allreduce([np.zeros(6), 3, MPI.DOUBLE], [np.zeros(6), 5, MPI.DOUBLE])
    with pytest.raises(TypeError, match="bytes-like"):
        drop.Allreduce([1.0, 2.0, 3.0], np.zeros(3))
    with pytest.raises(TypeError):
        drop.Allreduce(object(), np.zeros(3))
    with pytest.raises(ValueError, match="needs 32 bytes"):
        drop.Allreduce([np.zeros(3), 4, MPI.DOUBLE], np.zeros(4))
    with pytest.raises(ValueError, match="cannot map"):
        drop.Allreduce([np.zeros(3), "?!"], np.zeros(3))
    with pytest.raises(ValueError, match="read-only"):
        drop.Allreduce(np.zeros(3), np.frombuffer(bytes(24)))
    with pytest.raises(ValueError, match="not contiguous"):
        drop.Allreduce(np.zeros(6), np.zeros(12)[::2])
    with pytest.raises(ValueError, match="mismatch in send and receive"):
        drop.Allreduce([np.zeros(3), MPI.DOUBLE], [np.zeros(6, np.float32), MPI.FLOAT])
    with pytest.raises(ValueError, match="negative count"):
        drop.Allreduce([np.zeros(3), -1, MPI.DOUBLE], np.zeros(3))
    with pytest.raises(ValueError, match="not a multiple"):
        drop.Allreduce([bytearray(10), MPI.DOUBLE], [bytearray(10), MPI.DOUBLE])


def test_iallreduce_request_life_cycle_on_one_rank():
    drop = pycollective.Comm(MPI.COMM_SELF.Dup(), algorithm="ring")
    xs = [_data(n, "float64") for n in (0, 1, 7, 1000)]
    outs = [np.full_like(x, 5) for x in xs]
    reqs = [drop.Iallreduce(x, o) for x, o in zip(xs, outs)]
    assert all(isinstance(r, pycollective.Request) and isinstance(r, MPI.Request) for r in reqs)
    MPI.Request.Waitall(reqs)
    assert all(r == MPI.REQUEST_NULL for r in reqs)
    for x, o in zip(xs, outs):
        assert np.array_equal(x, o)
    req = drop.Iallreduce(MPI.IN_PLACE, outs[2], op=MPI.MIN)
    while not req.Test():
        pass
    assert req.Wait() is True  # completed already: a no-op, as for MPI requests
    flag, msg = drop.Iallreduce(xs[1], outs[1]).test()
    assert flag is True and msg is None  # one rank: complete at once
    drop.Free()


def test_iallreduce_error_raised_by_wait():
    drop = pycollective.Comm(MPI.COMM_SELF, algorithm="ring")
    with pytest.raises(ValueError, match="3.*4|4.*3"):
        drop.Iallreduce(np.zeros(3), np.zeros(4))
    ro = np.frombuffer(bytes(24))
    with pytest.raises(BufferError, match="read-only"):  # at the call, as mpi4py
        drop.Iallreduce(np.zeros(3), ro)


def test_iallreduce_without_thread_multiple_is_native(monkeypatch):
    monkeypatch.setattr(comm_module, "_thread_multiple", lambda: False)
    drop = pycollective.Comm(MPI.COMM_SELF, algorithm="ring")
    x = _data(9, "float32")
    out = np.zeros_like(x)
    req = drop.Iallreduce(x, out)
    assert not isinstance(req, pycollective.Request) and isinstance(req, MPI.Request)
    req.Wait()
    assert np.array_equal(out, x)
