"""The drop-in's Reduce_scatter(_block), Allgather(v), Reduce and Bcast, against the plain communicator.

Each call, in the buffer forms mpi4py accepts (plain arrays, ``[buf,
datatype]``, counts, vector specs, in-place forms), on COMM_WORLD, COMM_SELF
and a Dup, must leave bit for bit what the plain communicator's own call
leaves, and run pycollective (not MPI) where it can; the nonblocking forms
too, many in flight; fallbacks (complex reductions, datatypes with holes,
device memory where MPI takes device pointers) go to MPI; an argument that cannot be read on one rank
raises on every rank.  Data are exact integer values per rank and index.
"""

import logging

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective.data import buffers as _buffers
from pycollective.comm import arguments as _plans  # the drop-in's calls of the public functions
from _data import MPI_OPS, bitwise_equal, env, exact_values
from pycollective.device import _aware
from _tensors import DLPackOnly, FakeDevice

OPS = ["sum", "prod", "max", "min"]
DTYPES = ["float64", "int32", "float32"]
# None: auto everywhere; a name: that algorithm wherever it exists ("ring": not for bcast).
CHOICES = [None, "ring", "shm", {"bcast": "chain", "reduce": "tree",
                                 "allgather": "ring_pipelined",
                                 "reduce_scatter": "ring_pipelined"}]


def _compare(failures, where, got, want):
    if not bitwise_equal(np.asarray(got), np.asarray(want)):
        failures.append(f"{where}: {np.asarray(got)[:6]} != {np.asarray(want)[:6]}")


def _both(drop, plain, call, make, failures, where):
    """Run ``call(comm, *buffers)`` on both communicators with fresh ``make()`` buffers."""
    mine, theirs = make(), make()
    call(drop, *mine)
    call(plain, *theirs)
    for k, (a, b) in enumerate(zip(mine, theirs)):
        if isinstance(a, np.ndarray):
            _compare(failures, f"{where} buffer {k}", a, b)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("choice", CHOICES, ids=str)
def test_reductions_match_plain_comm(comms, choice):
    failures = []
    for label, plain in comms:
        drop = pycollective.Comm(plain, algorithm=choice)
        n, r = plain.Get_size(), plain.Get_rank()
        for dtype in DTYPES:
            t = MPI.Datatype.fromcode(np.dtype(dtype).char)
            for op in OPS:
                o = MPI_OPS[op]
                c = 3
                x = exact_values(r, c * n, dtype, op)
                where = f"{label} {choice} {dtype} {op}"
                _both(drop, plain, lambda m, s, v: m.Reduce_scatter_block(s, v, o),
                      lambda: (x.copy(), np.full(c, 7, dtype)), failures, where + " RSB")
                _both(drop, plain, lambda m, s, v: m.Reduce_scatter_block([s, t], [v, c, t], o),
                      lambda: (x.copy(), np.full(c + 2, 7, dtype)), failures,
                      where + " RSB spec")
                _both(drop, plain, lambda m, v: m.Reduce_scatter_block(MPI.IN_PLACE, v, o),
                      lambda: (x.copy(),), failures, where + " RSB in place")
                counts = [(q * 2 + 1) % 4 for q in range(n)]
                y = exact_values(r, sum(counts), dtype, op)
                _both(drop, plain, lambda m, s, v: m.Reduce_scatter(s, v, counts, o),
                      lambda: (y.copy(), np.full(counts[r], 7, dtype)), failures,
                      where + " RS counts")
                _both(drop, plain, lambda m, s, v: m.Reduce_scatter(s, v, None, o),
                      lambda: (y.copy(), np.full(counts[r], 7, dtype)), failures,
                      where + " RS gathered counts")
                _both(drop, plain, lambda m, v: m.Reduce_scatter(None, v, counts, o),
                      lambda: (y.copy(),), failures, where + " RS in place")
                for root in sorted({0, n - 1}):
                    _both(drop, plain, lambda m, s, v: m.Reduce(s, v, o, root),
                          lambda: (x.copy(), np.full_like(x, 7)), failures,
                          where + f" Reduce root {root}")
                    _both(drop, plain,
                          lambda m, v, w: m.Reduce(MPI.IN_PLACE if r == root else v, w, o, root),
                          lambda: (x.copy(), x.copy()), failures,
                          where + f" Reduce in place root {root}")
                    _both(drop, plain, lambda m, s, v: m.Reduce([s, 2, t], [v, (2, 1), t], o, root),
                          lambda: (x.copy(), np.full(4, 7, dtype)), failures,
                          where + f" Reduce counts {root}")
    assert not failures, f"{len(failures)} failures, first: " + "; ".join(failures[:5])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("choice", CHOICES, ids=str)
def test_data_movers_match_plain_comm(comms, choice):
    pair = MPI.INT.Create_contiguous(2).Commit()  # no holes: pycollective moves it
    failures = []
    try:
        for label, plain in comms:
            drop = pycollective.Comm(plain, algorithm=choice)
            n, r = plain.Get_size(), plain.Get_rank()
            for dtype in ("float64", "int8", "complex128", "bool"):
                x = (exact_values(r, 5, "int16", "sum") % 7).astype(dtype)
                t = MPI.Datatype.fromcode(np.dtype(dtype).char)
                where = f"{label} {choice} {dtype}"
                _both(drop, plain, lambda m, s, v: m.Allgather(s, v),
                      lambda: (x.copy(), np.zeros(5 * n, dtype)), failures, where + " Allgather")
                _both(drop, plain, lambda m, s, v: m.Allgather([s, 3, t], [v, 3, t]),
                      lambda: (x.copy(), np.zeros(3 * n + 2, dtype)), failures,
                      where + " Allgather counts")

                def fill_own(v):
                    v[5 * r:5 * r + 5] = x
                    return v
                _both(drop, plain, lambda m, v: m.Allgather(MPI.IN_PLACE, v),
                      lambda: (fill_own(np.zeros(5 * n, dtype)),), failures,
                      where + " Allgather in place")
                counts = [(q + 2) % 4 for q in range(n)]
                displs = [1 + sum(k + 1 for k in counts[q + 1:]) for q in range(n)]  # reversed, gaps
                size = max(d + k for d, k in zip(displs, counts)) + 2
                _both(drop, plain,
                      lambda m, s, v: m.Allgatherv(s, [v, (counts, displs), t]),
                      lambda: (x[:counts[r]].copy(), np.zeros(size, dtype)), failures,
                      where + " Allgatherv")
                _both(drop, plain, lambda m, s, v: m.Allgatherv(s, [v, counts]),
                      lambda: (x[:counts[r]].copy(), np.zeros(sum(counts), dtype)), failures,
                      where + " Allgatherv counts")
                _both(drop, plain, lambda m, s, v: m.Allgatherv(s, v),
                      lambda: (x[:1].copy(), np.zeros(n, dtype)), failures,
                      where + " Allgatherv bare")
                for root in sorted({0, n - 1}):
                    _both(drop, plain, lambda m, b: m.Bcast(b, root),
                          lambda: (x.copy() if r == root else np.zeros(5, dtype),), failures,
                          where + f" Bcast {root}")
                    _both(drop, plain, lambda m, b: m.Bcast([b, (2, 1), t], root=root),
                          lambda: (x.copy() if r == root else np.zeros(5, dtype),), failures,
                          where + f" Bcast count, displ {root}")
            ints = (np.arange(8, dtype=np.int32) + 3 * r) % 11
            _both(drop, plain, lambda m, b: m.Bcast([b, 4, pair], 0),
                  lambda: (ints.copy(),), failures, f"{label} Bcast contiguous derived")
    finally:
        pair.Free()
    assert not failures, f"{len(failures)} failures, first: " + "; ".join(failures[:5])


@pytest.mark.mpi(min_size=2)
def test_nonblocking_forms_in_flight_together(comms):
    failures = []
    for label, plain in comms:
        drop = pycollective.Comm(plain, algorithm="ring")
        n, r = plain.Get_size(), plain.Get_rank()
        x = exact_values(r, 4 * n, "int64", "sum")
        counts = [(q + 1) % 3 for q in range(n)]
        y = exact_values(r, sum(counts), "int64", "sum")

        def start(m, bufs):
            return [m.Ireduce_scatter_block(x, bufs[0]), m.Ireduce_scatter(y, bufs[1], counts),
                    m.Ireduce_scatter(y, bufs[2]), m.Iallgather(x[:4], bufs[3]),
                    m.Iallgatherv(x[:counts[r]], [bufs[4], counts]), m.Ireduce(x, bufs[5]),
                    m.Ibcast(bufs[6], root=n - 1), m.Iallreduce(x, bufs[7], MPI.MAX)]

        def fresh():
            return [np.full(4, -1, np.int64), np.full(counts[r], -1, np.int64),
                    np.full(counts[r], -1, np.int64), np.full(4 * n, -1, np.int64),
                    np.full(sum(counts), -1, np.int64), np.full(4 * n, -1, np.int64),
                    x.copy(), np.full(4 * n, -1, np.int64)]
        mine, theirs = fresh(), fresh()
        requests = start(drop, mine)
        if n > 1 and not all(isinstance(q, pycollective.Request) for q in requests):
            failures.append(f"{label}: a nonblocking call did not go through pycollective")
        MPI.Request.Waitall(start(plain, theirs))
        pycollective.Request.Waitall(requests)
        for k, (a, b) in enumerate(zip(mine, theirs)):
            if k == 5 and r != 0:
                continue  # Reduce: only the root's buffer has a defined result
            _compare(failures, f"{label} request {k}", a, b)
    assert not failures, f"{len(failures)} failures, first: " + "; ".join(failures[:5])


@pytest.mark.mpi(min_size=2)
def test_every_collective_runs_pycollective(monkeypatch):
    world = MPI.COMM_WORLD
    n, r = world.Get_size(), world.Get_rank()
    drop = pycollective.Comm(world)
    seen = []
    for name in ("allreduce", "reduce_scatter", "allgatherv", "reduce", "bcast"):
        real = getattr(_plans, name)
        monkeypatch.setattr(_plans, name,
                            lambda *a, _real=real, _name=name, **k: (seen.append(_name),
                                                                     _real(*a, **k))[1])
    x = np.arange(2 * n, dtype=np.float64)
    drop.Allreduce(x, np.empty_like(x))
    drop.Reduce_scatter_block(x, np.empty(2))
    drop.Reduce_scatter(x, np.empty(2), [2] * n)
    drop.Allgather(x[:2], np.empty(2 * n))
    drop.Allgatherv(x[:2], np.empty(2 * n))
    drop.Reduce(x, np.empty_like(x) if r == 0 else None)
    drop.Bcast(x)
    assert seen == ["allreduce", "reduce_scatter", "reduce_scatter", "allgatherv", "allgatherv",
                    "reduce", "bcast"]


@pytest.mark.mpi(min_size=2)
def test_fallbacks_go_to_mpi_and_are_logged(caplog):
    world = MPI.COMM_WORLD
    n, r = world.Get_size(), world.Get_rank()
    drop = pycollective.Comm(world)
    indexed = MPI.DOUBLE.Create_indexed_block(1, [0, 2, 4]).Commit()  # holes: MPI's
    reasons = []
    try:
        with caplog.at_level(logging.INFO, logger="pycollective"):
            for reason in ("datatype MPI_C_DOUBLE_COMPLEX", "has holes",
                           "__cuda_array_interface__", "op MPI.BOR"):
                for known in list(_buffers._logged):
                    if reason in known:
                        _buffers.forget_logged(known)
            z = (np.arange(2 * n) + 1j * r).astype(np.complex128)
            got, want = np.zeros(2, np.complex128), np.zeros(2, np.complex128)
            drop.Reduce_scatter_block(z, got)
            world.Reduce_scatter_block(z, want)
            assert bitwise_equal(got, want)
            b1 = np.arange(6.0) if r == 0 else np.zeros(6)
            b2 = b1.copy()
            drop.Bcast([b1, 1, indexed], 0)
            world.Bcast([b2, 1, indexed], 0)
            assert bitwise_equal(b1, b2)
            host = np.arange(3 * n, dtype=np.float64) * (r + 1)
            out = np.zeros(3 * n)
            # Device memory goes to MPI only when MPI takes device pointers (this
            # "device" memory is host memory behind __cuda_array_interface__).
            _aware.forget()
            with env("PYCOLLECTIVE_GPU_AWARE", "1"):
                drop.Allreduce(FakeDevice(host), FakeDevice(out))
            _aware.forget()
            assert np.array_equal(out, host / (r + 1) * n * (n + 1) / 2)
            ints = np.arange(4, dtype=np.int32) << r
            got = np.zeros(4, np.int32) if r == 0 else None
            drop.Reduce(ints, got, MPI.BOR)
            if r == 0:
                assert np.array_equal(got, np.bitwise_or.reduce([np.arange(4) << q
                                                                 for q in range(n)]))
            reasons = [rec.getMessage() for rec in caplog.records]
    finally:
        indexed.Free()
    for reason in ("has no pycollective kernel", "has holes", "__cuda_array_interface__",
                   "op MPI.BOR"):
        assert sum(reason in m for m in reasons) == 1, (reason, reasons)


@pytest.mark.mpi(min_size=2)
def test_unreadable_argument_on_one_rank_raises_everywhere():
    world = MPI.COMM_WORLD
    n, r = world.Get_size(), world.Get_rank()
    drop = pycollective.Comm(world, algorithm="ring")
    x = np.arange(2 * n, dtype=np.float64)
    strided = DLPackOnly(np.zeros(4 * n)[::2])
    cases = [
        ("Reduce_scatter_block", lambda bad: drop.Reduce_scatter_block(
            strided if bad else x, np.zeros(2))),
        ("Reduce_scatter gathered counts", lambda bad: drop.Reduce_scatter(
            [x, 2 * n + 1, MPI.DOUBLE] if bad else x, np.zeros(2))),
        ("Allgather", lambda bad: drop.Allgather(x[:2], [np.zeros(2 * n), "?!"] if bad
                                                 else np.zeros(2 * n))),
        ("Allgatherv", lambda bad: drop.Allgatherv(x[:2], [np.zeros(2 * n), [2] * (n + 1)]
                                                   if bad else np.zeros(2 * n))),
        ("Reduce", lambda bad: drop.Reduce([1.0, 2.0] if bad else x, np.zeros(2 * n))),
        ("Bcast", lambda bad: drop.Bcast(np.frombuffer(bytes(8 * 2 * n)) if bad and r != 0
                                         else x.copy(), root=0)),
    ]
    bad_rank = n - 1
    for name, call in cases:
        with pytest.raises((TypeError, ValueError), match=None if r == bad_rank else
                           f"invalid arguments on rank {bad_rank}|rank {bad_rank} could not"):
            call(r == bad_rank)
    with pytest.raises(BufferError):  # mpi4py's type for a strided tensor
        drop.Reduce_scatter_block(strided, np.zeros(2))
    out = np.zeros(2)
    drop.Reduce_scatter_block(x, out)  # still usable
    assert np.array_equal(out, n * x[2 * r:2 * r + 2])
