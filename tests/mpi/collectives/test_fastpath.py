"""The repeated-call fast path (pycollective.collectives.plans) keeps every check of the full path."""

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective.runtime import context as _context, settings as _settings, threads as _threads
from pycollective.collectives import plans as _fastpath
from pycollective.algorithms.shm import allreduce as shm
from pycollective.collectives.api import DEFAULT
from pycollective.model.tuning import MAX_TRIALS
from _data import exact_reduce, exact_values


def _float32_sum(comm, count):
    """``(x, expected, out)``: this rank's exact float32 input of ``count``, the sum over
    ``comm``'s ranks, and an output array."""
    n, r = comm.Get_size(), comm.Get_rank()
    x = exact_values(r, count, "float32", "sum")
    expected = exact_reduce([exact_values(q, count, "float32", "sum") for q in range(n)],
                            "sum", "float32")
    return x, expected, np.empty_like(x)


def _bound(comm, x, out):
    """The bound call of ``allreduce(x, out, algorithm="shm")`` after three such calls."""
    for _ in range(3):
        pycollective.allreduce(x, out, "sum", comm=comm, algorithm="shm")
    return _fastpath.find_bound(x, out, "sum", comm, "shm", DEFAULT)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm", ["shm", "ring", "auto"])
def test_repeated_call_fast_path_keeps_every_check(algorithm):
    """After a good call, calls of the same shape take the cached path (see
    _fastpath.lookup): results stay right, and a bad argument on one rank still
    raises on every rank."""
    comm = MPI.COMM_WORLD
    n, r = comm.Get_size(), comm.Get_rank()
    x = exact_values(r, 100, "float64", "sum")
    expected = exact_reduce([exact_values(q, 100, "float64", "sum") for q in range(n)],
                            "sum", "float64")
    out = np.empty_like(x)
    pycollective.allreduce(x, out, "sum", comm=comm, algorithm=algorithm)
    # auto's timed trials are never kept: the shape reaches the fast path once decided
    for _ in range(MAX_TRIALS):
        if _fastpath.lookup(x, out, "sum", comm, algorithm, DEFAULT) is not None:
            break
        pycollective.allreduce(x, out, "sum", comm=comm, algorithm=algorithm)
    assert _fastpath.lookup(x, out, "sum", comm, algorithm, DEFAULT) is not None
    for in_place in (False, True, False):  # the cached path, both ways
        if in_place:
            out = x.copy()
            pycollective.allreduce(MPI.IN_PLACE, out, "sum", comm=comm, algorithm=algorithm)
        else:
            out = np.empty((10, 10))  # another shape of the same count and dtype
            pycollective.allreduce(x, out, "sum", comm=comm, algorithm=algorithm)
        assert np.array_equal(out.reshape(-1), expected)

    ro = np.empty_like(x)
    if r == 0:
        ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        pycollective.allreduce(x, ro, "sum", comm=comm, algorithm=algorithm)

    strided = np.empty(200)[::2] if r == n - 1 else np.empty(100)
    with pytest.raises(ValueError, match="contiguous"):
        pycollective.allreduce(x, strided, "sum", comm=comm, algorithm=algorithm)

    count = 101 if r == 0 else 100  # rank 0 misses the cache, the others hit it
    y = exact_values(r, count, "float64", "sum")
    with pytest.raises(ValueError, match="disagree on count"):
        pycollective.allreduce(y, np.empty_like(y), "sum", comm=comm, algorithm=algorithm)

    # After a disagreement found on the cached path, every rank still uses the
    # same slot region: calls with fresh data each time stay right.
    for k in range(3):
        z = x * (k + 2)
        out = np.empty_like(x)
        pycollective.allreduce(z, out, "sum", comm=comm, algorithm=algorithm)
        assert np.array_equal(out, expected * (k + 2)), k

    overlap = np.zeros(150)
    with pytest.raises(ValueError, match="overlap"):
        pycollective.allreduce(overlap[:100], overlap[50:], "sum", comm=comm,
                               algorithm=algorithm)

    previous = pycollective.set_check(False)
    try:
        out = np.empty_like(x)
        pycollective.allreduce(x, out, "sum", comm=comm, algorithm=algorithm)
        assert np.array_equal(out, expected)
    finally:
        pycollective.set_check(previous)


@pytest.mark.mpi(min_size=2)
def test_a_freed_communicator_is_not_found_again():
    """The fast path remembers the last communicator object it found a context for
    (_context.find_context): freeing that communicator forgets it, so a later call
    with the freed object takes the full path and hears what is wrong, and a new
    communicator gets a context of its own."""
    comm = MPI.COMM_WORLD.Dup()
    x = np.arange(10, dtype=np.float32) + comm.Get_rank()
    out = np.empty_like(x)
    for _ in range(3):
        pycollective.allreduce(x, out, "sum", comm=comm, algorithm="shm")
    ctx = _context.find_context(comm)
    assert ctx is not None and _context.find_context(comm) is ctx
    comm.Free()
    assert _context.find_context(comm) is None
    with pytest.raises(ValueError, match="COMM_NULL"):
        pycollective.allreduce(x, out, "sum", comm=comm, algorithm="shm")
    again = MPI.COMM_WORLD.Dup()
    try:
        pycollective.allreduce(x, out, "sum", comm=again, algorithm="shm")
        assert _context.find_context(again) not in (None, ctx)
        assert np.array_equal(out, sum(np.arange(10, dtype=np.float32) + q
                                       for q in range(again.Get_size())))
    finally:
        again.Free()


@pytest.mark.mpi(min_size=2)
def test_algorithms_taking_turns_on_the_same_arrays_each_repeat_their_bound_call(monkeypatch):
    """A loop that takes turns among algorithms on the same arrays (a benchmark's) keeps
    one bound call per algorithm: a call of one does not send the other's next call the
    full way, and every result is right.  (auto is made to pick shm at once, so both
    plans have a fast way.)"""
    from pycollective.collectives import auto as _auto
    from pycollective.runtime import registry as _registry
    monkeypatch.setattr(_auto.AutoState, "resolve", lambda self, *a: _registry.get("shm"))
    monkeypatch.setattr(_fastpath, "_BOUND", {})  # without the earlier tests' entries
    comm = MPI.COMM_WORLD.Dup()
    count = 1000
    x, expected, out = _float32_sum(comm, count)
    try:
        for _ in range(50):  # until both calls are bound on every rank
            for algorithm in ("shm", "auto"):
                pycollective.allreduce(x, out, "sum", comm=comm, algorithm=algorithm)
            if comm.allreduce(all(_fastpath.find_bound(x, out, "sum", comm, a, DEFAULT)
                                  is not None for a in ("shm", "auto")), op=MPI.LAND):
                break
        assert _fastpath.find_bound(x, out, "sum", comm, "auto", DEFAULT) is not None
        for _ in range(4):
            for algorithm in ("shm", "auto"):
                out[...] = -1
                repeated = _fastpath.repeat(x, out, "sum", comm, algorithm, DEFAULT)
                if not repeated:
                    pycollective.allreduce(x, out, "sum", comm=comm, algorithm=algorithm)
                assert np.array_equal(out, expected), algorithm
                assert repeated, algorithm
    finally:
        comm.Free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("count", [1, 1000, 3001])  # shm's small and sliced paths
def test_a_bound_call_sees_what_changes_on_the_same_arrays(count):
    """A call repeated on the same two array objects runs from their identity
    (_fastpath.repeat): whatever can change on those objects between calls
    (flags, dtype, settings, the thread's pairing name, the communicator) sends
    the call back the full way, which checks and raises as before."""
    comm = MPI.COMM_WORLD.Dup()
    n, r = comm.Get_size(), comm.Get_rank()
    x, expected, out = _float32_sum(comm, count)

    def call(send=x, recv=out):
        if recv.flags.writeable and send is not MPI.IN_PLACE:
            recv[...] = -1  # a call that did not write recv fails the comparisons below
        pycollective.allreduce(send, recv, "sum", comm=comm, algorithm="shm")

    def bound():
        return _fastpath._BOUND.get((id(x), id(out), "shm"))

    try:
        for _ in range(3):
            call()
        assert bound() is not None
        out[...] = -1
        assert _fastpath.repeat(x, out, "sum", comm, "shm", DEFAULT)  # a call on every rank
        assert np.array_equal(out, expected)

        out.flags.writeable = r != 0
        with pytest.raises(ValueError, match="read-only"):
            call()
        out.flags.writeable = True
        call()
        assert np.array_equal(out, expected)

        # the same objects as int32 (same itemsize): the int32 sum, not float32's
        ints = np.arange(count, dtype=np.int32) * (r + 1)
        x.dtype, out.dtype = np.int32, np.int32
        x[...] = ints
        call()
        assert np.array_equal(out, np.arange(count, dtype=np.int32) * sum(range(1, n + 1)))
        x.dtype, out.dtype = np.float32, np.float32
        x[...] = exact_values(r, count, "float32", "sum")
        call()
        assert np.array_equal(out, expected)

        out.dtype = np.int32  # recvbuf alone: dtypes differ
        with pytest.raises(TypeError):
            call()
        out.dtype = np.float32

        previous = pycollective.set_check(False)  # a settings change: the plan is stale
        try:
            assert not _fastpath.repeat(x, out, "sum", comm, "shm", DEFAULT)
            call()
            assert np.array_equal(out, expected)
        finally:
            pycollective.set_check(previous)
        assert not _fastpath.repeat(x, out, "sum", comm, "shm", DEFAULT)
        call()
        call()
        assert bound().epoch == _settings.epoch

        # a call the table had to resolve again (a subclass never takes the cached
        # ways) keeps a new plan: the bound calls find theirs again
        call(x.view(_Sub), out.view(_Sub))
        assert not _fastpath.repeat(x, out, "sum", comm, "shm", DEFAULT)
        call()
        call()

        with _threads.pairing("another name"):  # the bound call's pairing code is not this
            assert not _fastpath.repeat(x, out, "sum", comm, "shm", DEFAULT)
            call()
            assert np.array_equal(out, expected)

        for _ in range(2):  # in place and out of place on the same recvbuf, alternating
            out[...] = exact_values(r, count, "float32", "sum")
            call(MPI.IN_PLACE)
            assert np.array_equal(out, expected)
            call()
            assert np.array_equal(out, expected)

        # shaped arrays are bound too (their flat views made per call), and a shape set
        # in place on the same objects still reduces every element
        xs, outs = x.reshape(count, 1).copy(), np.empty((count, 1), np.float32)
        for shape in ((count, 1), (count, 1), (1, count), (count,), (1, 1, count)):
            xs.shape, outs.shape = shape, shape
            outs[...] = -1
            pycollective.allreduce(xs, outs, "sum", comm=comm, algorithm="shm")
            assert np.array_equal(outs.reshape(-1), expected), shape
        assert _fastpath._BOUND.get((id(xs), id(outs), "shm")) is not None
        outs[...] = -1
        assert _fastpath.repeat(xs, outs, "sum", comm, "shm", DEFAULT)
        assert np.array_equal(outs.reshape(-1), expected)
        outs[...] = x.reshape(outs.shape)
        pycollective.allreduce(MPI.IN_PLACE, outs, "sum", comm=comm, algorithm="shm")
        pycollective.allreduce(xs, outs, "sum", comm=comm, algorithm="shm")
        outs[...] = x.reshape(outs.shape)
        assert _fastpath.repeat(MPI.IN_PLACE, outs, "sum", comm, "shm", DEFAULT)
        assert np.array_equal(outs.reshape(-1), expected)

        for k in range(4):  # fresh arrays every call: ids of dead ones come back
            y = exact_values(r, count, "float32", "sum") * np.float32(k + 1)
            z = np.empty_like(y)
            call(y, z)
            assert np.array_equal(z, expected * np.float32(k + 1)), k
            del y, z
    finally:
        comm.Free()
    with pytest.raises(ValueError, match="COMM_NULL"):  # the freed communicator's bound call
        call()


@pytest.mark.mpi(min_size=2)
def test_a_full_table_of_bound_calls_drops_those_of_dead_arrays_first(monkeypatch):
    """Arrays made new for each call (a hook's ``tensor.numpy()``) bind an entry each; when
    the table is full the entries of arrays that died go, and a loop's own arrays stay
    bound."""
    monkeypatch.setattr(_fastpath, "_BOUND_LIMIT", 8)
    monkeypatch.setattr(_fastpath, "_BOUND", {})  # without the earlier tests' entries
    comm = MPI.COMM_WORLD.Dup()
    n, r = comm.Get_size(), comm.Get_rank()
    count = 100
    x, expected, out = _float32_sum(comm, count)
    try:
        assert _bound(comm, x, out) is not None
        for k in range(4):
            # seven pairs alive at once, then dead: with x's, the table is full
            pairs = [(exact_values(r, count, "float32", "sum"), np.empty(count, np.float32))
                     for _ in range(7)]
            for y, z in pairs:
                pycollective.allreduce(y, z, "sum", comm=comm, algorithm="shm")
                assert np.array_equal(z, expected), k
            del pairs, y, z
            assert len(_fastpath._BOUND) <= 8
            assert _fastpath.find_bound(x, out, "sum", comm, "shm", DEFAULT) is not None, k
        out[...] = -1
        assert _fastpath.repeat(x, out, "sum", comm, "shm", DEFAULT)
        assert np.array_equal(out, expected)
    finally:
        comm.Free()


class _Sub(np.ndarray):
    """An ndarray subclass: reduced as a plain array, but never on the fast path."""


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("count", [100, 3001])  # shm's small path, and its sliced one
def test_ranks_that_agree_but_take_different_paths_give_right_results(count):
    """In each call one rank misses the fast path (its buffers are a subclass:
    the full path's agreement, then the data), the others take it (shm folds
    the agreement into its data step): the folded ranks must wait for that
    rank's data, not reduce what its slot held before."""
    comm = MPI.COMM_WORLD
    n, r = comm.Get_size(), comm.Get_rank()
    wrong = []
    for k in range(3 * n + 2):
        x = exact_values((r + k) % n, count, "float32", "sum")
        expected = exact_reduce([exact_values((q + k) % n, count, "float32", "sum")
                                 for q in range(n)], "sum", "float32")
        odd = k >= 2 and r == k % n  # the first two calls make the shape known
        send = x.view(_Sub) if odd else x
        out = np.empty(count, np.float32)
        pycollective.allreduce(send, out.view(_Sub) if odd else out, "sum", comm=comm,
                               algorithm="shm")
        if not np.array_equal(out, expected):
            wrong.append((k, int(np.count_nonzero(out != expected))))
    assert not wrong, wrong


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("count", [300, 3001])  # shm's small path, and its sliced one
def test_repeated_call_follows_the_slots_when_they_grow(dtype, count):
    """shm prepares a repeated call once (its ``repeated``: the slot views
    kept in the plan).  After a larger call grows the slots, results stay right
    with one rank on the full path in each call, and the prepared call holds
    the new slots, not the old ones (which it would keep mapped)."""
    comm = MPI.COMM_WORLD.Dup()
    try:
        n, r = comm.Get_size(), comm.Get_rank()
        wrong = []
        for k in range(3 + 2 * n):
            if k == 3:
                big = np.full(200_000, r + 1, np.float32)  # 800 KB in each half: new slots
                out = np.empty_like(big)
                pycollective.allreduce(big, out, "sum", comm=comm, algorithm="shm")
                assert np.all(out == n * (n + 1) // 2)
            x = exact_values((r + k) % n, count, dtype, "sum")
            expected = exact_reduce([exact_values((q + k) % n, count, dtype, "sum")
                                     for q in range(n)], "sum", dtype)
            odd = k > 4 and r == k % n
            out = np.empty(count, dtype)
            pycollective.allreduce(x.view(_Sub) if odd else x, out.view(_Sub) if odd else out,
                                   "sum", comm=comm, algorithm="shm")
            if not np.array_equal(out, expected):
                wrong.append((k, int(np.count_nonzero(out != expected))))
            if k == 4:  # every rank ran the prepared call once on the new slots
                ctx, plan, _, _ = _fastpath.lookup(x, out, "sum", comm, "shm", DEFAULT)
                slots = ctx.peek(shm._STATE).node
                assert plan.run.segment is slots.segment
        assert not wrong, wrong
    finally:
        comm.Free()


@pytest.mark.mpi(min_size=2)
def test_state_put_in_the_context_sends_bound_calls_the_full_way():
    """A bound call keeps the context's version (``Context.put`` and ``free`` move it): a
    new auto state (``bench`` puts the caller's back after its own), even the same one put
    again, sends the call the full way, which binds it again to what it finds now; and
    ``forget_bound`` forgets them all."""
    from pycollective.collectives import auto as _auto
    comm = MPI.COMM_WORLD.Dup()
    count = 100
    x, expected, out = _float32_sum(comm, count)
    try:
        assert _bound(comm, x, out) is not None
        ctx = _context.find_context(comm)
        ctx.put(_auto.KEY, ctx.peek(_auto.KEY))
        assert _fastpath.find_bound(x, out, "sum", comm, "shm", DEFAULT) is None
        for _ in range(3):
            out[...] = -1
            pycollective.allreduce(x, out, "sum", comm=comm, algorithm="shm")
            assert np.array_equal(out, expected)
        assert _fastpath.find_bound(x, out, "sum", comm, "shm", DEFAULT) is not None
        _fastpath.forget_bound()  # the last bound call too, which find_bound tries first
        assert _fastpath.find_bound(x, out, "sum", comm, "shm", DEFAULT) is None
    finally:
        comm.Free()


@pytest.mark.mpi(min_size=2)
def test_equal_algorithm_names_that_are_different_objects_repeat_one_bound_call():
    """The bound call compares the algorithm's name by value: a loop taking turns between
    two equal names that are different string objects (read from a command line) repeats
    the one bound call instead of binding anew at every call."""
    comm = MPI.COMM_WORLD.Dup()
    x, expected, out = _float32_sum(comm, 100)
    named, other = "shm", "".join(["s", "hm"])
    assert other == named and other is not named  # the point: not one object
    try:
        bound = _bound(comm, x, out)
        assert bound is not None
        for k in range(4):
            out[...] = -1
            pycollective.allreduce(x, out, "sum", comm=comm, algorithm=other if k % 2 else "shm")
            assert np.array_equal(out, expected), k
            assert _fastpath.find_bound(x, out, "sum", comm, other, DEFAULT) is bound, k
    finally:
        comm.Free()
