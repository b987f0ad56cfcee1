"""Serial tests of the drop-in communicator (one process: COMM_WORLD and COMM_SELF have size 1).

With one rank a reduction is a copy, so these tests pin down what needs no
peers: reading mpi4py buffer specs (counts, displacements, typecodes, which
elements are touched), the native-or-pycollective decision and its reasons,
errors, and the request life cycle.  tests/mpi/comm/test_comm.py compares results
across ranks.
"""

import array
import logging

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective.data import buffers as _buffers
from pycollective.comm import dropin as comm_module


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


# --- the other collectives on one rank --------------------------------------------------

def test_algorithm_names_and_mappings():
    chosen = comm_module._algorithm_map("ring")
    assert chosen == {c: "ring" for c in ("allreduce", "reduce_scatter", "allgather", "reduce")}
    assert comm_module._algorithm_map("chain") == {"bcast": "chain"}
    assert comm_module._algorithm_map({"bcast": "shm", "allreduce": "auto"}) == {"bcast": "shm"}
    assert comm_module._algorithm_map(None) == comm_module._algorithm_map("auto") == {}
    with pytest.raises(ValueError, match="unknown algorithm 'chain' for allreduce"):
        comm_module._algorithm_map({"allreduce": "chain"})
    with pytest.raises(ValueError, match="unknown collective"):
        comm_module._algorithm_map({"gather": "ring"})
    drop = pycollective.Comm(MPI.COMM_SELF, algorithm={"reduce": "tree"})
    assert drop.Dup().algorithm == {"reduce": "tree"}


def test_new_collectives_on_one_rank_touch_what_mpi4py_touches():
    drop = pycollective.Comm(MPI.COMM_SELF)
    plain = MPI.COMM_SELF
    x = _data(6, "float64")
    cases = [  # (call, make buffers)
        (lambda c, s, v: c.Reduce_scatter_block(s, v), lambda: (x.copy(), np.full(6, 5.0))),
        (lambda c, v: c.Reduce_scatter_block(MPI.IN_PLACE, [v, 3, MPI.DOUBLE]),
         lambda: (x.copy(),)),
        (lambda c, s, v: c.Reduce_scatter(s, v, [6]), lambda: (x.copy(), np.full(6, 5.0))),
        (lambda c, s, v: c.Reduce_scatter(s, v), lambda: (x.copy(), np.full(6, 5.0))),
        (lambda c, v: c.Reduce_scatter(None, [v, 4, MPI.DOUBLE], [4]),
         lambda: (np.r_[x[:4], 9.0, 9.0],)),
        (lambda c, s, v: c.Allgather([s, 2, MPI.DOUBLE], [v, 2, MPI.DOUBLE]),
         lambda: (x.copy(), np.full(6, 5.0))),
        (lambda c, s, v: c.Allgatherv(s[:3], [v, ([3], [2]), MPI.DOUBLE]),
         lambda: (x.copy(), np.full(6, 5.0))),
        (lambda c, s, v: c.Reduce([s, (2, 1), "d"], [v, (2, 3), "d"], MPI.MIN),
         lambda: (x.copy(), np.full(6, 5.0))),
        (lambda c, v: c.Bcast([v, 4, MPI.BYTE]), lambda: (x.copy(),)),
    ]
    for call, make in cases:
        mine, theirs = make(), make()
        call(drop, *mine)
        call(plain, *theirs)
        for a, b in zip(mine, theirs):
            assert np.array_equal(a, b), (a, b)


def test_new_collectives_raise_mpi4py_errors():
    drop = pycollective.Comm(MPI.COMM_SELF)
    with pytest.raises(ValueError, match="mismatch in send count 6 and receive count 5"):
        drop.Reduce_scatter_block(np.zeros(6), np.zeros(5))
    with pytest.raises(ValueError, match="add up to"):
        drop.Reduce_scatter(np.zeros(6), np.zeros(6), [5])
    with pytest.raises(ValueError, match="needs recvcounts"):
        drop.Reduce_scatter(MPI.IN_PLACE, np.zeros(6))
    with pytest.raises(ValueError, match="mismatch in send size 16 bytes"):
        drop.Allgather(np.zeros(2), np.zeros(3))
    with pytest.raises(ValueError, match="outside the buffer"):
        drop.Allgatherv(np.zeros(2), [np.zeros(3), ([2], [2])])
    with pytest.raises(BufferError, match="read-only"):
        drop.Reduce(np.zeros(1), np.frombuffer(bytes(8)))
    with pytest.raises(TypeError):
        drop.Bcast(object())


@pytest.mark.parametrize("call, reason", [
    (lambda c: c.Reduce_scatter_block(np.zeros(2, complex), np.zeros(2, complex)),
     "no pycollective kernel"),
    (lambda c: c.Reduce(np.zeros(2, np.int32), np.zeros(2, np.int32), MPI.BXOR), "op MPI.BXOR"),
    (lambda c: c.Allgather([np.zeros(4), 1, MPI.DOUBLE_INT], [np.zeros(4), 1, MPI.DOUBLE_INT]),
     "has holes"),
])
def test_new_collectives_fall_back_by_op_and_datatype(call, reason, caplog):
    drop = pycollective.Comm(MPI.COMM_SELF)
    for known in list(_buffers._logged):
        if reason in known:
            _buffers.forget_logged(known)
    with caplog.at_level(logging.INFO, logger="pycollective"):
        call(drop)
    assert any(reason in r.getMessage() for r in caplog.records)


def test_dlpack_tensors_through_the_dropin_and_the_public_functions(monkeypatch):
    from test_buffers import DLPackOnly, FakeDevice, LegacyDLPack  # noqa: PLC0415
    drop = pycollective.Comm(MPI.COMM_SELF)
    for wrap in (DLPackOnly, LegacyDLPack):
        x = _data(6, "float32")
        out = np.zeros(6, np.float32)
        drop.Allreduce(wrap(x), wrap(out))
        assert np.array_equal(out, x)
        out[...] = 0
        pycollective.allreduce(wrap(x), wrap(out), comm=MPI.COMM_SELF)
        assert np.array_equal(out, x)
        out[...] = 0
        drop.Iallreduce(wrap(x), [wrap(out), MPI.FLOAT]).Wait()
        assert np.array_equal(out, x)
    host, out = _data(4, "float64"), np.zeros(4)
    # A __cuda_array_interface__ object is device memory unless a CUDA driver says
    # otherwise; with no runtime to stage it, a typed error, never MPI's call ...
    with pytest.raises(pycollective.DeviceMemoryError, match="no runtime to copy it with"):
        pycollective.allreduce(FakeDevice(host), FakeDevice(out), comm=MPI.COMM_SELF)
    # ... unless the user says MPI takes device pointers (this one is host memory).
    from pycollective.device import _aware  # noqa: PLC0415
    monkeypatch.setenv("PYCOLLECTIVE_GPU_AWARE", "1")
    _aware.forget()
    try:
        pycollective.allreduce(FakeDevice(host), FakeDevice(out), comm=MPI.COMM_SELF.Dup())
    finally:
        monkeypatch.delenv("PYCOLLECTIVE_GPU_AWARE")
        _aware.forget()
    assert np.array_equal(out, host)
