"""pycollective.Comm as a drop-in: mpi4py-style calls through it vs the plain communicator.

Every buffer form mpi4py accepts (numpy arrays and array.array, explicit
datatypes, counts, displacements, typecodes, in-place forms) for all four ops
and every registered algorithm, on COMM_WORLD, COMM_SELF and a Dup; the
fallbacks (ops, datatypes pycollective lacks); errors on every rank; and
Iallreduce (many in flight, every way of completing them, not blocking).

Data are exact integer values per rank and per index (tests/mpi/_data.py),
so results must equal native MPI_Allreduce bit for bit.  Failures are
collected and asserted at the end of each test, so all ranks keep issuing the
same collectives.
"""

import array
import logging

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective.data import buffers as _buffers
from pycollective.comm import arguments as _plans  # the drop-in's calls of the public functions
from pycollective.collectives import plans as _repeated  # the repeated calls' plans
from _data import MPI_OPS, bitwise_equal, exact_values

ALGORITHMS = pycollective.algorithms()
OPS = ["sum", "prod", "max", "min"]
DTYPES = ["float32", "float64", "int32", "int64"]


def _forms(x, count):
    """(label, make(send, recv) -> (sendbuf, recvbuf), elements compared) for x's dtype."""
    dt = x.dtype
    code = dt.char
    mpitype = MPI.Datatype.fromcode(code)
    half = count // 2
    return [
        ("plain", lambda s, r: (s, r), count),
        ("[buf, type]", lambda s, r: ([s, mpitype], [r, mpitype]), count),
        ("[buf, code]", lambda s, r: ([s, code], [r, code]), count),
        ("[buf, count, type]", lambda s, r: ([s, half, mpitype], [r, half, mpitype]), half),
        ("[buf, (count, displ), type]",
         lambda s, r: ([s, (half, 1), mpitype], [r, (half, 1), mpitype]), half),
        ("2-d", lambda s, r: (s.reshape(1, -1), r.reshape(1, -1)), count),
        ("array.array", lambda s, r: (array.array(code, s.tolist()), array.array(code, r.tolist())),
         count),
    ]


def _in_place_forms(code, count):
    return [
        ("IN_PLACE", lambda r: (MPI.IN_PLACE, r)),
        ("None", lambda r: (None, r)),
        ("same object", lambda r: (r, r)),
        ("IN_PLACE [buf, code]", lambda r: (MPI.IN_PLACE, [r, code])),
        ("array.array same object", "array"),
    ]


def _values(buf, dtype):
    """The elements of any buffer object, as a numpy array."""
    if isinstance(buf, np.ndarray):
        return buf.reshape(-1)
    return np.frombuffer(buf, dtype)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm", ALGORITHMS + [None])
def test_every_buffer_form_matches_plain_comm(comms, algorithm):
    failures = []
    for label, plain in comms:
        drop = pycollective.Comm(plain, algorithm=algorithm)
        nranks, rank = plain.Get_size(), plain.Get_rank()
        for dtype in DTYPES:
            for op in OPS:
                mpi_op = MPI_OPS[op]
                count = nranks + 6  # odd chunking, and room for count/displ forms
                x = exact_values(rank, count, dtype, op)
                for form, make, ncmp in _forms(x, count):
                    s1, r1 = make(x.copy(), np.full(count, 77, dtype))
                    s2, r2 = make(x.copy(), np.full(count, 77, dtype))
                    drop.Allreduce(s1, r1, op=mpi_op)
                    plain.Allreduce(s2, r2, op=mpi_op)
                    got, want = (_values(b[0] if isinstance(b, list) else b, dtype)
                                 for b in (r1, r2))
                    sent = _values(s1[0] if isinstance(s1, list) else s1, dtype)
                    where = f"{label} {algorithm} {dtype} {op} {form}"
                    if not bitwise_equal(np.asarray(got), np.asarray(want)):
                        failures.append(f"{where}: {got[:ncmp]} != {want[:ncmp]}")
                    if not bitwise_equal(np.asarray(sent), x):
                        failures.append(f"{where}: send buffer modified")
                for form, make in _in_place_forms(x.dtype.char, count):
                    if make == "array":
                        a1 = array.array(x.dtype.char, x.tolist())
                        a2 = array.array(x.dtype.char, x.tolist())
                        drop.Allreduce(a1, a1, op=mpi_op)
                        plain.Allreduce(MPI.IN_PLACE, a2, op=mpi_op)
                        got, want = np.frombuffer(a1, dtype), np.frombuffer(a2, dtype)
                    else:
                        r1, r2 = x.copy(), x.copy()
                        drop.Allreduce(*make(r1), op=mpi_op)
                        if form == "same object":
                            plain.Allreduce(MPI.IN_PLACE, r2, op=mpi_op)  # MPI forbids aliasing
                        else:
                            plain.Allreduce(*make(r2), op=mpi_op)
                        got, want = r1, r2
                    if not bitwise_equal(got, want):
                        failures.append(f"{label} {algorithm} {dtype} {op} {form}: {got} != {want}")
        # Count 0 and count 1, plain arrays.
        for count in (0, 1):
            x = exact_values(rank, count, "float64", "sum")
            r1, r2 = np.full(count, 5.0), np.full(count, 5.0)
            drop.Allreduce(x, r1)
            plain.Allreduce(x, r2)
            if not bitwise_equal(r1, r2):
                failures.append(f"{label} {algorithm} count {count}: {r1} != {r2}")
    assert not failures, f"{len(failures)} failures, first: " + "; ".join(failures[:5])


@pytest.mark.mpi(min_size=2)
def test_dropin_uses_pycollective_and_not_the_native_call(monkeypatch):
    """The supported path never reaches MPI.Intracomm.Allreduce on the user's handle."""
    world = MPI.COMM_WORLD
    drop = pycollective.Comm(world, algorithm="ring")
    seen = []
    real = _plans.allreduce

    def spy(*args, **kwargs):
        seen.append(kwargs.get("algorithm"))
        return real(*args, **kwargs)

    monkeypatch.setattr(_plans, "allreduce", spy)
    x = exact_values(world.Get_rank(), 10, "float32", "sum")
    out = np.empty_like(x)
    drop.Allreduce(x, out)
    assert seen == ["ring"]


def _user_sum(inbuf, inoutbuf, datatype):
    a = np.frombuffer(inbuf, np.int32)
    b = np.frombuffer(inoutbuf, np.int32)
    b += 2 * a  # not SUM: a result pycollective could never produce by accident


@pytest.mark.mpi(min_size=2)
def test_a_loops_allreduce_on_the_same_arrays_repeats_the_bound_call(monkeypatch):
    """A training loop's ``Allreduce`` on the same numpy arrays: after its first calls it
    is pycollective's repeated call on them (``plans.repeat`` runs it), right as the data
    change, in place and out, the send buffer untouched; a receive buffer made read-only
    on one rank raises on every rank and the communicator stays right; a freed Comm
    raises instead of reaching its old handle."""
    world = MPI.COMM_WORLD
    n, rank = world.Get_size(), world.Get_rank()
    drop = pycollective.Comm(world.Dup(), algorithm="shm")
    hits = []
    real = _repeated.repeat

    def spy(*args):
        ran = real(*args)
        hits.append(ran)
        return ran
    monkeypatch.setattr(_repeated, "repeat", spy)
    failures = []
    for count in (1, 1000, 3001):
        for in_place in (False, True):
            send, out = np.empty(count, np.float32), np.empty(count, np.float32)
            hits.clear()
            for i in range(6):
                x = exact_values((rank + i) % n, count, "float32", "sum")
                ref = np.empty_like(x)
                world.Allreduce(x, ref)
                if in_place:
                    out[:] = x
                    drop.Allreduce(MPI.IN_PLACE, out)
                else:
                    send[:] = x
                    drop.Allreduce(send, out)
                    if not bitwise_equal(send, x):
                        failures.append(f"count {count} call {i}: sendbuf modified")
                if not bitwise_equal(out, ref):
                    failures.append(f"count {count} in place {in_place} call {i}: wrong")
            if not any(hits):
                failures.append(f"count {count} in place {in_place}: never repeated")
    assert not failures, f"{len(failures)} failures: " + "; ".join(failures[:5])
    if rank == 0:
        out.flags.writeable = False
    with pytest.raises(ValueError) as info:
        drop.Allreduce(MPI.IN_PLACE, out)
    assert "read-only" in str(info.value)
    x = exact_values(rank, 7, "float64", "sum")
    got, ref = np.empty_like(x), np.empty_like(x)
    drop.Allreduce(x, got)
    world.Allreduce(x, ref)
    assert bitwise_equal(got, ref)
    drop.Free()
    with pytest.raises(ValueError, match="COMM_NULL"):
        drop.Allreduce(x, got)


@pytest.mark.mpi(min_size=2)
def test_fallbacks_match_plain_comm_and_log_once(comms, caplog):
    user_op = MPI.Op.Create(_user_sum, commute=True)
    pair = MPI.INT.Create_contiguous(2).Commit()
    failures = []
    try:
        for label, plain in comms:
            drop = pycollective.Comm(plain)
            rank = plain.Get_rank()
            ints = (np.arange(11, dtype=np.int32) * 7 + rank * 3) % 5
            cases = [
                ("LAND", lambda s, r: (s, r), MPI.LAND, ints),
                ("BAND", lambda s, r: (s, r), MPI.BAND, ints),
                ("LOR", lambda s, r: (s, r), MPI.LOR, ints),
                ("BXOR", lambda s, r: (s, r), MPI.BXOR, ints),
                ("user op", lambda s, r: (s, r), user_op, ints),
                ("derived datatype", lambda s, r: ([s, 5, pair], [r, 5, pair]), user_op, ints[:10]),
                ("complex64", lambda s, r: (s, r), MPI.SUM,
                 (ints + 1j * (ints + 1)).astype(np.complex64)),
                ("in place LAND", lambda s, r: (MPI.IN_PLACE, r), MPI.LAND, ints),
            ]
            for name, make, op, x in cases:
                r1, r2 = np.zeros_like(x), np.zeros_like(x)
                if name.startswith("in place"):
                    r1[...] = x
                    r2[...] = x
                drop.Allreduce(*make(x.copy(), r1), op=op)
                plain.Allreduce(*make(x.copy(), r2), op=op)
                if not bitwise_equal(r1, r2):
                    failures.append(f"{label} {name}: {r1} != {r2}")
            # A derived datatype with MPI.SUM goes to MPI too, which rejects it
            # (predefined ops need predefined types): the same error as plain.
            errors = []
            for c in (drop, plain):
                try:
                    c.Allreduce([ints[:10].copy(), 5, pair], [np.zeros(10, np.int32), 5, pair])
                    errors.append(None)
                except MPI.Exception as exc:
                    errors.append(exc.Get_error_class())
            if errors[0] != errors[1]:
                failures.append(f"{label} derived datatype with SUM: {errors}")
            req = drop.Iallreduce(ints, np.zeros_like(ints), op=MPI.BOR)
            assert not isinstance(req, pycollective.Request)  # the native request
            req.Wait()
        # Logged once per reason: forget one reason, trigger it twice.
        reason = "op MPI.LXOR is not implemented by pycollective"
        _buffers.forget_logged(reason)
        drop = pycollective.Comm(MPI.COMM_WORLD)
        with caplog.at_level(logging.INFO, logger="pycollective"):
            for _ in range(2):
                out = np.zeros_like(ints)
                drop.Allreduce(ints, out, op=MPI.LXOR)
        hits = [r for r in caplog.records if reason in r.getMessage()]
        if len(hits) != 1:
            failures.append(f"fallback reason logged {len(hits)} times, expected once")
    finally:
        pair.Free()
        user_op.Free()
    assert not failures, f"{len(failures)} failures, first: " + "; ".join(failures[:5])


@pytest.mark.mpi(min_size=2)
def test_count_mismatch_raises_on_every_rank_naming_both_counts():
    world = MPI.COMM_WORLD
    drop = pycollective.Comm(world)
    rank = world.Get_rank()
    # On every rank.
    with pytest.raises(ValueError) as info:
        drop.Allreduce(np.zeros(3), np.zeros(4))
    assert "3" in str(info.value) and "4" in str(info.value)
    # On rank 0 only: the others raise too, naming rank 0 and both counts.
    send = np.zeros(3)
    recv = np.zeros(4) if rank == 0 else np.zeros(3)
    with pytest.raises(ValueError) as info:
        drop.Allreduce(send, recv)
    assert "3" in str(info.value) and "4" in str(info.value)
    # Explicit counts that differ: [buf, 2, type] vs [buf, 3, type].
    with pytest.raises(ValueError) as info:
        drop.Allreduce([np.zeros(5), 2, MPI.DOUBLE], [np.zeros(5), 3, MPI.DOUBLE])
    assert "2" in str(info.value) and "3" in str(info.value)
    # Nothing was left in flight: the communicator still works.
    x = exact_values(rank, 9, "int64", "sum")
    out, ref = np.empty_like(x), np.empty_like(x)
    drop.Allreduce(x, out)
    world.Allreduce(x, ref)
    assert bitwise_equal(out, ref)


@pytest.mark.mpi(min_size=2)
def test_malformed_buffer_on_one_rank_raises_everywhere():
    world = MPI.COMM_WORLD
    drop = pycollective.Comm(world, algorithm="ring")
    rank = world.Get_rank()
    cases = [
        ("not a buffer", TypeError, lambda: ([1.5, 2.5, 3.5], np.zeros(3))),
        ("count beyond buffer", ValueError, lambda: ([np.zeros(3), 4, MPI.DOUBLE], np.zeros(4))),
        ("unknown typecode", ValueError, lambda: ([np.zeros(3), "?!"], np.zeros(3))),
        ("read-only recvbuf", ValueError, lambda: (np.zeros(3), np.frombuffer(bytes(24)))),
        ("send/recv types differ", (TypeError, ValueError),
         lambda: ([np.zeros(3), MPI.DOUBLE], [np.zeros(6, np.float32), MPI.FLOAT])),
    ]
    for name, error, bad in cases:
        args = bad() if rank == 0 else (np.zeros(3), np.zeros(3))
        with pytest.raises(error if rank == 0 else (TypeError, ValueError)):
            drop.Allreduce(*args)
    x = exact_values(rank, 12, "float64", "max")
    out, ref = np.empty_like(x), np.empty_like(x)
    drop.Allreduce(x, out, op=MPI.MAX)
    world.Allreduce(x, ref, op=MPI.MAX)
    assert bitwise_equal(out, ref)


@pytest.mark.mpi(min_size=2)
def test_constructors_return_wrapped_comms_and_the_rest_is_native():
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    drop = pycollective.Comm(world, algorithm="tree")
    assert isinstance(drop, MPI.Intracomm) and drop == world
    assert (drop.Get_rank(), drop.Get_size()) == (rank, size)
    assert drop.allreduce(rank) == size * (size - 1) // 2           # lowercase: native
    data = np.arange(4.0) + rank
    drop.Bcast(data, root=0)
    assert np.array_equal(data, np.arange(4.0))
    made = [drop.Dup(), drop.Split(rank % 2, rank), drop.Create(drop.Get_group()),
            drop.Create_group(drop.Get_group()), drop.Split_type(MPI.COMM_TYPE_SHARED)]
    dup_info = drop.Dup_with_info(MPI.INFO_NULL)
    made.append(dup_info)
    idup, req = drop.Idup()
    req.Wait()
    made.append(idup)
    for new in made:
        assert isinstance(new, pycollective.Comm) and new.algorithm == "tree", repr(new)
        x = exact_values(new.Get_rank(), 7, "int32", "sum")
        out, ref = np.empty_like(x), np.empty_like(x)
        new.Allreduce(x, out)
        MPI.Intracomm(new).Allreduce(x, ref)
        assert bitwise_equal(out, ref)
    none = drop.Split(MPI.UNDEFINED if rank == 0 else 0, rank)
    assert (none == MPI.COMM_NULL) == (rank == 0)
    if rank != 0:
        assert isinstance(none, pycollective.Comm) and none.Get_size() == size - 1
        none.Free()
    for new in made:
        new.Free()
    group = drop.Get_group()
    group.Free()


# --- Iallreduce ---------------------------------------------------------------------

def _batch(comm, nreq, seed):
    """nreq (send, recv, expected, op) with varied counts, dtypes and ops."""
    rank = comm.Get_rank()
    items = []
    for k in range(nreq):
        dtype = DTYPES[(k + seed) % len(DTYPES)]
        op = OPS[(k * 3 + seed) % len(OPS)]
        count = [0, 1, 5, comm.Get_size() + 1, 257, 3001][k % 6]
        x = exact_values(rank + 11 * k, count, dtype, op)
        expected = np.empty_like(x)
        comm.Allreduce(x, expected, op=MPI_OPS[op])
        items.append((x, np.full_like(x, 99), expected, op))
    return items


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm", ALGORITHMS + [None])
def test_iallreduce_many_in_flight(comms, algorithm):
    failures = []
    for label, plain in comms:
        drop = pycollective.Comm(plain, algorithm=algorithm)
        for how in ("Request.Waitall", "MPI.Request.Waitall", "reverse Wait", "Test loop",
                    "mixed with native"):
            items = _batch(plain, 12, seed=len(how))
            sends = [x.copy() for x, _, _, _ in items]
            reqs = [drop.Iallreduce(x, r, op=MPI_OPS[op]) for x, r, _, op in items]
            native_out = np.empty(4)
            if how == "mixed with native":
                reqs.append(plain.Iallreduce(np.arange(4.0) + plain.Get_rank(), native_out))
            # A blocking call on the same communicator while the requests fly.
            y = exact_values(plain.Get_rank(), 50, "int64", "sum")
            out, ref = np.empty_like(y), np.empty_like(y)
            drop.Allreduce(y, out)
            plain.Allreduce(y, ref)
            if not bitwise_equal(out, ref):
                failures.append(f"{label} {algorithm} {how}: blocking call during Iallreduce wrong")
            if how == "Request.Waitall":
                pycollective.Request.Waitall(reqs)
            elif how in ("MPI.Request.Waitall", "mixed with native"):
                MPI.Request.Waitall(reqs)
            elif how == "reverse Wait":
                for req in reversed(reqs):
                    assert req.Wait() is True
            else:
                pending = list(reqs)
                while pending:
                    pending = [req for req in pending if not req.Test()]
            for (x, r, expected, op), sent in zip(items, sends):
                if not bitwise_equal(r, expected):
                    failures.append(f"{label} {algorithm} {how} {x.dtype} {op} n={x.size}: "
                                    f"{r[:4]} != {expected[:4]}")
                if not bitwise_equal(x, sent):
                    failures.append(f"{label} {algorithm} {how}: send buffer modified")
            if how == "mixed with native":
                n = plain.Get_size()
                if not np.array_equal(native_out, n * np.arange(4.0) + n * (n - 1) / 2):
                    failures.append(f"{label} native request in the mix: {native_out}")
            # In place, on a request completed twice (second Wait is a no-op).
            z = exact_values(plain.Get_rank(), 33, "float32", "sum")
            zz, ref = z.copy(), np.empty_like(z)
            req = drop.Iallreduce(MPI.IN_PLACE, zz)
            req.Wait()
            req.Wait()
            plain.Allreduce(z, ref)
            if not bitwise_equal(zz, ref):
                failures.append(f"{label} {algorithm} in-place Iallreduce wrong")
    assert not failures, f"{len(failures)} failures, first: " + "; ".join(failures[:5])


@pytest.mark.mpi(min_size=2)
def test_iallreduce_returns_before_the_peers_join():
    """Rank 0 starts, tests (must be False: the others have not started), then lets them go.

    If Iallreduce blocked until the reduction completed, rank 0 would never
    send the go-ahead and the job would hang (the suite's timeout catches it).
    """
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    drop = pycollective.Comm(world, algorithm="ring")
    side = world.Dup()  # the go-ahead travels on its own communicator
    x = exact_values(rank, 1000, "float64", "sum")
    out, ref = np.empty_like(x), np.empty_like(x)
    world.Allreduce(x, ref)
    # Collective set-up first (helper thread, private communicators, kernels),
    # so that only the reduction itself is left to wait for the peers.
    drop.Iallreduce(x, out).Wait()
    if rank == 0:
        req = drop.Iallreduce(x, out)
        done_early = req.Test()
        for peer in range(1, world.Get_size()):
            side.send("go", dest=peer, tag=7)
        req.Wait()
    else:
        assert side.recv(source=0, tag=7) == "go"
        done_early = False
        drop.Iallreduce(x, out).Wait()
    side.Free()
    assert done_early is False
    assert bitwise_equal(out, ref)


@pytest.mark.mpi(min_size=2)
def test_iallreduce_errors_reach_every_rank():
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    drop = pycollective.Comm(world, algorithm="ring")
    # Count mismatch on rank 0: raised at the call there, at Wait elsewhere.
    recv = np.zeros(4) if rank == 0 else np.zeros(3)
    if rank == 0:
        with pytest.raises(ValueError, match="3.*4|4.*3"):
            drop.Iallreduce(np.zeros(3), recv)
    else:
        req = drop.Iallreduce(np.zeros(3), recv)
        with pytest.raises(ValueError, match="3.*4|4.*3"):
            req.Wait()
    # Malformed on rank 0: same pattern.
    if rank == 0:
        with pytest.raises(TypeError):
            drop.Iallreduce([1.0, 2.0], np.zeros(2))
    else:
        req = drop.Iallreduce(np.zeros(2), np.zeros(2))
        with pytest.raises(TypeError, match="invalid arguments on rank 0"):
            req.Wait()
    # Still usable, in order.
    items = _batch(world, 4, seed=3)
    reqs = [drop.Iallreduce(x, r, op=MPI_OPS[op]) for x, r, _, op in items]
    pycollective.Request.Waitall(reqs)
    for x, r, expected, op in items:
        assert bitwise_equal(r, expected)


@pytest.mark.mpi(min_size=2)
def test_a_completed_nonblocking_call_keeps_no_buffer_alive():
    """After Wait and del, nothing of pycollective holds the caller's arrays (the helper
    thread used to keep its last job, and so a freed optimizer's gradients, until the next)."""
    import gc
    import time
    import weakref
    comm = pycollective.Comm(MPI.COMM_WORLD)
    n = comm.Get_size()
    buf, out = np.ones(10 * n), np.empty(10)
    refs = [weakref.ref(buf), weakref.ref(out)]
    comm.Ireduce_scatter_block(buf, out).Wait()
    assert np.all(out == n)
    del buf, out
    deadline = time.monotonic() + 10  # the helper thread lets go after completing
    while any(r() is not None for r in refs) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    assert all(r() is None for r in refs)
