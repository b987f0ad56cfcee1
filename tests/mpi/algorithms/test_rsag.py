""""shm"'s reduce-scatter-allgather step for repeated calls up to DOUBLE_LIMIT (shm/rsag.py).

Here the step is switched on whatever the node (``_rsag_steps.ENABLED``), so
it also runs at 3 and 4 ranks on 2 cores (its sleeping waits) as well as
with a core per rank (its polling waits):

* every compiled dtype and op, in place and out of place, exact data bitwise
  right, the send buffer untouched, the step really taken, at sizes 0, 1,
  N-1, N, N+1, primes, around the 64-byte slice bounds and at the step's
  limits (the small path's 4 KiB, DOUBLE_LIMIT, and one element past it);
* rounding data with NaN, infinities and signed zeros bitwise the same as
  the older steps' results and the same on every rank;
* ranks that disagree (count, op) raise on every rank and the communicator
  stays right; ranks on the older steps and ranks on this one meet;
* every wait handed back to Python at once, a slow rank, a rank later than
  the timeout.
"""

import re
import time
from contextlib import contextmanager

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective.runtime import env as _env_settings
from pycollective.runtime import watch as _watch
from pycollective.node.atomics import STRIDE, set_budget
from pycollective.runtime.context import get_context
from pycollective._errors import CollectiveError, CollectiveTimeout, PeerFailed
from pycollective.node.group import DOUBLE_LIMIT
from pycollective.algorithms.shm import rsag as _rsag
from pycollective.algorithms.shm import rsag_steps as _rsag_steps
from pycollective.algorithms.shm import steps as _shm_steps
from pycollective.algorithms.shm import allreduce as shm
from pycollective.algorithms.shm import stores as _stores
from _data import (Replicas, bitwise_equal, env, exact_expected, exact_reduce, exact_values,
                   random_values)

OPS = ["sum", "prod", "max", "min"]
DTYPES = sorted(str(d) for d in _shm_steps.COMPILED)
CALLS = 3  # the first call of a shape takes the full path; the later ones the step


def _fresh(world=MPI.COMM_WORLD):
    with env(_env_settings.SHM_CMA.name, "0"):
        comm = world.Dup()
        pycollective.allreduce(np.zeros(1), np.empty(1), comm=comm, algorithm="shm")
    return comm


def _free(comm):
    comm.Barrier()
    private, status = get_context(comm).comm, MPI.Status()
    while private.Iprobe(MPI.ANY_SOURCE, _watch.TAG_NOTICE, status):
        private.recv(source=status.Get_source(), tag=_watch.TAG_NOTICE)
    comm.Barrier()
    comm.Free()


@contextmanager
def _counted():
    """Count the compiled step's calls (both kinds, entered from Python or through the
    entries that book the call themselves); plans made inside take the counter."""
    hits = [0]
    names = ("step", "step_half", "enter", "enter_half")
    originals = [getattr(_rsag, name) for name in names]

    def wrap(fn):
        def counted(*args):
            hits[0] += 1
            return fn(*args)
        return counted
    for name, fn in zip(names, originals):
        setattr(_rsag, name, wrap(fn))
    try:
        yield hits
    finally:
        for name, fn in zip(names, originals):
            setattr(_rsag, name, fn)


@pytest.fixture
def on(monkeypatch):
    monkeypatch.setattr(_rsag_steps, "ENABLED", True)


def _sizes(n, itemsize):
    line = 64 // itemsize
    top = DOUBLE_LIMIT // itemsize
    return sorted({0, 1, n - 1, n, n + 1, 13, 101, 997, line - 1, line, line + 1,
                   line * n - 1, line * n, line * n + 1, line * (n + 1) + 1,
                   (4 << 10) // itemsize, (4 << 10) // itemsize + 1, 10007, top - 1, top})


def _check(comm, dtype, op, count, failures, hits=None):
    """CALLS exact calls out of place and in place, rank data shifted call by call."""
    n, r = comm.Get_size(), comm.Get_rank()
    before = None if hits is None else hits[0]
    expected = exact_expected(n, count, np.dtype(dtype), op)  # the same for every shift
    for i in range(CALLS):
        send = exact_values((r + i) % n, count, dtype, op)
        send.flags.writeable = i != 1  # a read-only send buffer too
        original = send.copy()
        out = np.full_like(send, 99)
        pycollective.allreduce(send, out, op, comm=comm, algorithm="shm")
        inplace = send.copy()
        pycollective.allreduce(MPI.IN_PLACE, inplace, op, comm=comm, algorithm="shm")
        label = f"{dtype} {op} count={count} call {i}"
        if not bitwise_equal(out, expected):
            failures.append(f"{label}: {int(np.count_nonzero(out != expected))} wrong")
        if not bitwise_equal(inplace, expected):
            failures.append(f"{label} in place: wrong")
        if not bitwise_equal(send, original):
            failures.append(f"{label}: sendbuf modified")
    if hits is not None and count and hits[0] == before:
        failures.append(f"{dtype} {op} count={count}: the step was not taken")


@pytest.mark.mpi(min_size=2)
def test_every_dtype_and_op_exact(on):
    comm = _fresh()
    n = comm.Get_size()
    failures = []
    try:
        with _counted() as hits:
            for dtype in DTYPES:
                line = 64 // np.dtype(dtype).itemsize
                for op in OPS:
                    for count in (1, n + 1, line * n + 1, 1009):
                        _check(comm, dtype, op, count, failures, hits)
        assert not failures, f"{len(failures)} failures: " + "; ".join(failures[:5])
    finally:
        _free(comm)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype,op", [("float32", "sum"), ("float16", "sum"), ("int8", "max"),
                                      ("float64", "min"), ("uint16", "prod")])
def test_sizes_around_slices_and_limits(on, dtype, op):
    comm = _fresh()
    n = comm.Get_size()
    failures = []
    try:
        with _counted() as hits:
            for count in _sizes(n, np.dtype(dtype).itemsize):
                _check(comm, dtype, op, count, failures, hits)
            # one element past the step's limit: the older path, still right
            _check(comm, dtype, op, DOUBLE_LIMIT // np.dtype(dtype).itemsize + 1, failures)
        assert not failures, f"{len(failures)} failures: " + "; ".join(failures[:5])
    finally:
        _free(comm)


def _quarters_written(comm, count, calls):
    """The first and last quarter of this rank's slot each of ``calls`` repeated calls
    wrote into (its slot filled with a sentinel before each, every rank out of the last
    call), with each call's data new and its result checked exactly."""
    n, r = comm.Get_size(), comm.Get_rank()
    node = shm._state(get_context(comm)).node
    quarters, failures = [], []
    for i in range(CALLS + calls):
        everyone = [exact_values((q + 3 * i) % n + i, count, "float32", "sum") for q in range(n)]
        out = np.empty_like(everyone[r])
        if i >= CALLS:
            capacity = node.capacity
            slot = node.flat(np.uint8)[r * capacity:(r + 1) * capacity]
            comm.Barrier()
            slot[:] = 0xAB
            comm.Barrier()
        pycollective.allreduce(everyone[r], out, "sum", comm=comm, algorithm="shm")
        if not bitwise_equal(out, exact_reduce(everyone, "sum", "float32")):
            failures.append(f"call {i}: wrong")
        if i >= CALLS:
            comm.Barrier()
            written = np.flatnonzero(slot != 0xAB) // (capacity // 4)
            quarters.append((int(written[0]), int(written[-1])) if written.size else None)
    return quarters, failures


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("banks", [True, False])
def test_small_calls_take_four_regions_in_turn(on, monkeypatch, banks):
    """Up to ``BANKS_BYTES`` a repeated call comes back to its region every fourth call
    (two regions in each half of the slot); consecutive calls always write different
    halves, so none writes where a slow rank may still read the last.  Above it, and
    with the setting off, the two halves in turn."""
    monkeypatch.setattr(_rsag_steps, "BANKS_BYTES", _rsag_steps.BANKS_BYTES if banks else 0)
    comm = _fresh()
    try:
        count = 2500 * comm.Get_size()  # 10 KB of every other rank's data in each slot
        spans, failures = _quarters_written(comm, count, 8)
        assert not failures, "; ".join(failures)
        assert None not in spans and all(a == b for a, b in spans), spans
        quarters = [a for a, _ in spans]
        halves = [q // 2 for q in quarters]
        assert all(a != b for a, b in zip(halves, halves[1:])), quarters
        assert len(set(quarters)) == (4 if banks else 2), quarters
        if banks:
            assert all(len(set(quarters[k:k + 4])) == 4 for k in range(len(quarters) - 3)), \
                quarters
            # a call larger than a quarter of the slot: each half from its start, in turn
            quarter = shm._state(get_context(comm)).node.capacity // 4
            spans, failures = _quarters_written(comm, quarter // 4 + 16, 4)
            assert not failures, "; ".join(failures)
            firsts = [a for a, _ in spans]
            assert all(a % 2 == 0 and b == a + 1 for a, b in spans), spans
            assert all(a != b for a, b in zip(firsts, firsts[1:])), spans
    finally:
        _free(comm)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kinds", ["plain", "non-temporal", "mixed"])
def test_non_temporal_stores_exact_in_place_and_out(on, monkeypatch, kinds):
    """From ``CHOOSE_BYTES`` the step's copy-in and its own slice of the result may go
    past the cache (``STREAM``; ``stores.FORCE_STORES`` pins the kind, "mixed": ranks
    differ).  Out of place, and in place on ranks 0 and 1, the fold then runs into
    ``dst``; in place on the others into the slot, as the own operand is ``dst``."""
    comm = _fresh()
    n, r = comm.Get_size(), comm.Get_rank()
    kind = {"plain": 0, "non-temporal": 1, "mixed": r % 2}[kinds]
    monkeypatch.setattr(_stores, "FORCE_STORES", kind)
    seen = set()
    original = _rsag.step, _rsag.step_half, _rsag.enter, _rsag.enter_half

    def wrap(fn):
        def recorded(ctl, src, dst, target, number, sides, phase):
            seen.add(bool(sides & _rsag.STREAM))
            return fn(ctl, src, dst, target, number, sides, phase)
        return recorded

    def wrap_entry(fn):
        def recorded(ctl, src, dst, kind):
            seen.add(bool(kind))
            return fn(ctl, src, dst, kind)
        return recorded
    failures = []
    try:
        _rsag.step, _rsag.step_half = wrap(original[0]), wrap(original[1])
        _rsag.enter, _rsag.enter_half = wrap_entry(original[2]), wrap_entry(original[3])
        for dtype, op in (("float32", "sum"), ("float16", "sum"), ("float64", "min"),
                          ("int8", "max")):
            itemsize = np.dtype(dtype).itemsize
            first = _rsag_steps.CHOOSE_BYTES // itemsize
            for count in (first - 1, first, first + 1, 10007, 65537,
                          DOUBLE_LIMIT // itemsize):
                _check(comm, dtype, op, count, failures)
        assert not failures, f"{len(failures)} failures: " + "; ".join(failures[:5])
        assert seen == ({False, True} if kind else {False}), seen
    finally:
        _rsag.step, _rsag.step_half, _rsag.enter, _rsag.enter_half = original
        _free(comm)


@pytest.mark.mpi(min_size=2)
def test_the_node_takes_the_kind_of_stores_its_first_rank_chose(on, monkeypatch):
    """Only the node's first rank times calls and chooses the kind of stores; the others
    take each call's kind from the word it publishes, one call late at most: wherever rank
    0's kind did not change from one call to the next, every rank's is the same (two ranks
    choosing apart settled in a mixed state once, 1.3x slower, docs/results/stores.md).
    Choosing is switched on here at every rank count (it is off where waits sleep)."""
    monkeypatch.setattr(_rsag_steps, "Stores",
                        lambda chooses, **kw: _stores.Stores(chooses=True, **kw))
    comm = _fresh()
    n, r = comm.Get_size(), comm.Get_rank()
    calls = []  # (kind, timed) of every call of the shape on this rank
    original = _stores.Stores.next

    def recorded(stores):
        kind, started = original(stores)
        calls.append((kind, bool(started)))
        return kind, started
    monkeypatch.setattr(_stores.Stores, "next", recorded)
    count = 10007  # 40 KB of float32: above CHOOSE_BYTES, below DOUBLE_LIMIT
    send = exact_values(r, count, "float32", "sum")
    expected = exact_expected(n, count, np.dtype("float32"), "sum")
    out = np.empty_like(send)
    wrong = 0
    try:
        for _ in range(150):
            pycollective.allreduce(send, out, "sum", comm=comm, algorithm="shm")
            wrong += not bitwise_equal(out, expected)
        monkeypatch.setattr(_stores.Stores, "next", original)
        everyone = comm.allgather(calls)
        wrong = comm.allreduce(wrong)
    finally:
        _free(comm)
    assert wrong == 0, f"{wrong} wrong results"
    lead = [k for k, _ in everyone[0]]
    assert len(lead) >= 140 and set(lead) == {0, 1}, "the first rank did not try both kinds"
    assert any(t for _, t in everyone[0]), "the first rank timed nothing"
    for q in range(1, n):
        assert len(everyone[q]) == len(lead), (q, len(everyone[q]), len(lead))
        assert not any(t for _, t in everyone[q]), f"rank {q} timed calls"
        apart = [i for i in range(1, len(lead))
                 if lead[i] == lead[i - 1] and everyone[q][i][0] != lead[i]]
        assert not apart, f"rank {q} took another kind than rank 0 at calls {apart[:10]}"


def _awkward(rank, count, dtype, op, seed):
    x = random_values(rank, count, dtype, op, seed)
    rng = np.random.default_rng([seed, rank, count, 7])
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], dtype)
    at = rng.integers(0, count, max(1, count // 50))
    x[at] = specials[rng.integers(0, specials.size, at.size)]
    return x


@pytest.mark.mpi(min_size=2)
def test_rounding_nan_and_zeros_bitwise_as_the_older_steps(monkeypatch):
    """The same calls on a communicator whose plans take the older steps and on one whose
    plans take this one: the same bits (the same left fold by the same kernels), on every
    rank."""
    old, new = _fresh(), _fresh()
    n, r = new.Get_size(), new.Get_rank()
    failures, replicas = [], Replicas()
    try:
        with _counted() as hits:
            for dtype in ("float16", "float32", "float64"):
                for op in OPS:
                    for count in (7, 1000, 4097, 30011):
                        results = []
                        for comm, enabled in ((old, False), (new, True)):
                            monkeypatch.setattr(_rsag_steps, "ENABLED", enabled)
                            for i in range(CALLS):
                                send = _awkward((r + i) % n, count, dtype, op, 1)
                                out = np.empty_like(send)
                                pycollective.allreduce(send, out, op, comm=comm,
                                                       algorithm="shm")
                            results.append(out)
                        where = f"{dtype} {op} count={count}"
                        if not bitwise_equal(*results):
                            failures.append(f"{where}: differs from the older step")
                        replicas.add(where, results[1])
        failures += [f"{w}: ranks differ" for w in replicas.differ(new)]
        assert hits[0] > 0
        assert not failures, f"{len(failures)} failures: " + "; ".join(failures[:5])
    finally:
        _free(old)
        _free(new)


def _everyone_raised(comm, raised):
    kinds = comm.allgather(None if raised is None else type(raised).__name__)
    assert all(k is not None for k in kinds), kinds


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("count", [300, 3001])
def test_ranks_that_disagree_raise_everywhere_and_the_comm_stays_right(on, count):
    """Plans for both shapes on every rank, then rank 0 calls the other shape (a count,
    an op): every rank raises, and the next calls are right."""
    comm = _fresh()
    r = comm.Get_rank()
    failures = []
    try:
        with _counted() as hits:  # around the plans' making: they take the counter
            for dtype, op in (("float32", "sum"), ("float32", "max")):
                _check(comm, dtype, op, count, failures)
                _check(comm, dtype, op, count + 1, failures)
            for mine in (dict(count=count + (r == 0), op="sum"),
                         dict(count=count, op="max" if r == 0 else "sum")):
                send = exact_values(r, mine["count"], "float32", mine["op"])
                raised = None
                try:
                    pycollective.allreduce(send, np.empty_like(send), mine["op"], comm=comm,
                                           algorithm="shm")
                except (ValueError, CollectiveError) as exc:
                    raised = exc
                _everyone_raised(comm, raised)
                _check(comm, "float32", "sum", count, failures, hits)
        assert not failures, "; ".join(failures[:5])
    finally:
        _free(comm)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("count", [300, 3001, 20011])
def test_the_entry_numbers_and_books_each_call_as_python_would(on, monkeypatch, count):
    """A repeated call entered in compiled code (``rsag.enter``) numbers itself and books
    its steps, board and region in the words Python's own bookkeeping uses (two steps,
    whether it waited once or twice): after each,
    the communicator's call count, the node group's step words and the board's and the
    region's sides are where ``Context.next_call``, ``NodeGroup.opening_steps`` and the
    flips leave them, and calls on other paths in between (another algorithm, a shape's
    first call) meet the entered ones, bitwise right."""
    from pycollective.node import group as _group
    from pycollective.collectives import plans as _plans
    comm = _fresh()
    ctx, r, n = get_context(comm), comm.Get_rank(), comm.Get_size()
    entered = [0]
    original = _rsag.enter

    def counted(*args):
        entered[0] += 1
        return original(*args)
    monkeypatch.setattr(_rsag, "enter", counted)
    failures = []
    try:
        send = exact_values(r, count, "float32", "sum")
        expected = exact_expected(n, count, np.dtype("float32"), "sum")
        out = np.empty_like(send)
        for _ in range(CALLS):
            pycollective.allreduce(send, out, comm=comm, algorithm="shm")
        bound = [b for b in _plans._BOUND.values() if b.recv() is out]
        assert len(bound) == 1 and bound[0].plan.entered is not None
        prepared = bound[0].plan.run
        group, board, region = prepared.node.group, prepared.board, prepared.node
        for i in range(6):
            calls, steps = ctx.calls, list(group.words)
            sides = board.words[0], region.words[_group.PARITY]
            before = entered[0]
            out[:] = -1
            pycollective.allreduce(send, out, comm=comm, algorithm="shm")
            if not bitwise_equal(out, expected):
                failures.append(f"call {i}: wrong result")
            number = calls + 1
            assert entered[0] == before + 1
            assert ctx.calls == number
            assert group.words[_group.NUMBER] == number and group.words[_group.STEP] == 2
            assert group.words[_group.LAST] == (number << 24) + 2
            # two ranks fold the whole vector up to WHOLE_BYTES: one wait, the counter at
            # the call's first target; else the second target after the fold
            whole = n == 2 and send.nbytes <= _rsag_steps.WHOLE_BYTES
            assert group.barrier.words[r * STRIDE] == (number << 24) + (1 if whole else 2)
            assert group.words[_group.PUBLISHED] == steps[_group.PUBLISHED] + 1
            assert group.words[_group.UNCHECKED] == -1
            assert board.words[0] == sides[0] ^ 1
            assert region.words[_group.PARITY] == sides[1] ^ 1 and region.dirty
            if i % 2:  # other paths between entered calls
                other = np.empty_like(send)
                pycollective.allreduce(send, other, comm=comm, algorithm="ring")
                odd = exact_values(r, count + i, "float32", "sum")
                pycollective.allreduce(odd, np.empty_like(odd), comm=comm, algorithm="shm")
                if not bitwise_equal(other, expected):
                    failures.append(f"ring after call {i}: wrong result")
        assert not failures, "; ".join(failures)
    finally:
        _free(comm)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("count", [300, 3001, 100003])
def test_ranks_on_the_older_steps_and_on_this_one_meet(monkeypatch, count):
    """Rank 0's plans take the older prepared steps, the others' this one: each call
    falls back to the older data step on every rank, bitwise right."""
    monkeypatch.setattr(_rsag_steps, "ENABLED", MPI.COMM_WORLD.Get_rank() != 0)
    comm = _fresh()
    failures, data_steps = [], [0]
    for name in ("small_data", "mid_data"):
        original = getattr(_shm_steps, name)

        def counted(*args, _original=original):
            data_steps[0] += 1
            return _original(*args)
        monkeypatch.setattr(_shm_steps, name, counted)
    try:
        for op in ("sum", "min"):
            _check(comm, "float32", op, count, failures)
            _check(comm, "float16", op, count, failures)
        assert not failures, "; ".join(failures[:5])
        # on this step's ranks the repeated calls (two of each three, both ways) went on
        # with the older data step (rank 0's older sliced step goes on inside its own)
        if comm.Get_rank() != 0:
            assert data_steps[0] >= 4 * 2 * (CALLS - 1), data_steps[0]
    finally:
        _free(comm)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("count", [300, 3001])
def test_waits_handed_back_slow_ranks_and_the_timeout(on, monkeypatch, count):
    """Every wait handed back to Python at once (one polling pass, a zero budget), a
    rank late in every call: bitwise right; a rank later than the timeout is named."""
    monkeypatch.setattr(_rsag, "SPINS", 0)
    comm = _fresh()
    n, r = comm.Get_size(), comm.Get_rank()
    failures = []
    try:
        _check(comm, "float32", "sum", count, failures)  # the plan, made with SPINS = 0
        group = shm._state(get_context(comm)).node.group
        barrier = group.barrier
        set_budget(barrier.words, group.rank, 0, 0, 0, 0, barrier.wakes)
        try:
            with _counted():
                for i in range(2 * n):
                    send = exact_values((r + i) % n, count, "float32", "sum")
                    out = np.empty_like(send)
                    if r == i % n:
                        time.sleep(2e-3)
                    pycollective.allreduce(send, out, "sum", comm=comm, algorithm="shm")
                    expected = exact_expected(n, count, np.dtype("float32"), "sum")
                    if not bitwise_equal(out, expected):
                        failures.append(f"call {i} wrong")
        finally:
            barrier.set_sleep(barrier.sleep, barrier.wakes)  # the budget back
        assert not failures, "; ".join(failures)
        pycollective.set_timeout(0.5, comm=comm)
        _check(comm, "float32", "sum", count, failures)  # a new plan for the new timeout
        comm.Barrier()
        if r == n - 1:
            time.sleep(1.5)
        send = exact_values(r, count, "float32", "sum")
        with pytest.raises((CollectiveTimeout, PeerFailed)) as info:
            pycollective.allreduce(send, np.empty_like(send), "sum", comm=comm, algorithm="shm")
        if r != n - 1:
            assert isinstance(info.value, CollectiveTimeout)
            named = re.search(r"ranks \[([\d, ]+)\] did not arrive", str(info.value))
            assert named and n - 1 in {int(q) for q in named[1].split(",")}, str(info.value)
    finally:
        _free(comm)
