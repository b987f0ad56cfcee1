""""shm" from 4 KiB to DOUBLE_LIMIT: the sliced two-region path as compiled code (algorithms/_mid.py).

* every compiled dtype and op, in place and out of place, at sizes just
  above the small path, primes, multiples of N (-1, 0, +1) near 1 MiB and the limit:
  per-rank per-index exact data bitwise right, the send buffer untouched,
  and the compiled path really taken;
* rounding data bitwise the same as the Python path and MPI's result within
  its rounding bound;
* ranks with different counts: with the agreement off every rank raises
  before any rank writes its ``dst``; with it on a ValueError everywhere and
  the communicator still right afterwards (the slots' parity agreed);
* every compiled wait handed back to Python at once (a zero wait budget),
  so the steps resume from phases 1 and 2, and a rank later than the timeout;
* the same for the agreement folded into the first step (``_shm_steps.mid_agreed``,
  what "shm"'s ``agreed`` runs for these sizes; set aside to test the board's
  agreement followed by the compiled steps).
"""

import re
import time
from contextlib import contextmanager, nullcontext

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective.runtime import env as _env_settings
from pycollective.collectives import plans as _fastpath
from pycollective.runtime import watch as _watch
from pycollective.collectives.api import DEFAULT
from pycollective.node.atomics import set_budget
from pycollective.runtime.context import get_context
from pycollective._errors import (CollectiveError, CollectiveMismatch, CollectiveTimeout,
                                  CommunicatorBroken, PeerFailed)
from pycollective.node.group import DOUBLE_LIMIT
from pycollective.algorithms.shm import mid as _mid, rsag_steps as _rsag_steps, steps as _shm_steps, allreduce as shm
from pycollective.algorithms.shm import stores as _stores
from _data import (MPI_OPS, bitwise_equal, check_allreduce, env, exact_reduce, exact_values,
                   random_values, rounding_bound)

@pytest.fixture(autouse=True)
def _older_steps(monkeypatch):
    """These tests are the older compiled steps': the reduce-scatter-allgather step, which
    repeated calls take where ranks have cores, stands aside (tests/mpi/test_rsag.py)."""
    monkeypatch.setattr(_rsag_steps, "ENABLED", False)


OPS = ["sum", "prod", "max", "min"]
DTYPES = sorted(str(d) for d in _shm_steps.COMPILED)
SMALL = 4 << 10  # the small path's limit (shm.REPLICATE_BYTES)


def _counts(nranks, itemsize):
    """Just above the small path, a prime, multiples of N (-1, 0, +1) near 1 MiB (slices
    that end anywhere; larger ones only cost the test time), and the step's last size."""
    top = DOUBLE_LIMIT // itemsize
    m = min(top, (1 << 20) // itemsize) // nranks - 1
    return [SMALL // itemsize + 1, 20011, m * nranks - 1, m * nranks, m * nranks + 1, top]


@contextmanager
def _counting(name, module=_shm_steps):
    """Count the calls of ``module.<name>`` (and still make them)."""
    hits = [0]
    original = getattr(module, name)

    def counted(*args):
        hits[0] += 1
        return original(*args)
    setattr(module, name, counted)
    try:
        yield hits
    finally:
        setattr(module, name, original)


@contextmanager
def _python_path():
    """Every mid-size "shm" call through the Python steps."""
    original = _shm_steps.mid_compiled
    _shm_steps.mid_compiled = lambda node, call, dst: False
    try:
        yield
    finally:
        _shm_steps.mid_compiled = original


@contextmanager
def _python_agreement():
    """"shm"'s agreement for the mid sizes through the board, then the compiled steps
    (:func:`_shm_steps.mid_agreed` and the repeated call's prepared one stand aside: their
    one gate says no), as for a call whose slots must grow first."""
    original = _shm_steps._mid_agreed_runs
    _shm_steps._mid_agreed_runs = lambda *args: False
    try:
        yield
    finally:
        _shm_steps._mid_agreed_runs = original


def _fresh(world=MPI.COMM_WORLD):
    """A new communicator with the single-copy path off (nothing here is above DOUBLE_LIMIT)."""
    with env(_env_settings.SHM_CMA.name, "0"):
        comm = world.Dup()
        pycollective.allreduce(np.zeros(1), np.empty(1), comm=comm, algorithm="shm")
    return comm


def _free(comm):
    """Free ``comm`` after reading the notices a failed call left on its side channel: MPI
    may hand a freed communicator's unread messages to the next one made (same context id)."""
    comm.Barrier()
    private, status = get_context(comm).comm, MPI.Status()
    while private.Iprobe(MPI.ANY_SOURCE, _watch.TAG_NOTICE, status):
        private.recv(source=status.Get_source(), tag=_watch.TAG_NOTICE)
    comm.Barrier()
    comm.Free()


def _grow(comm):
    """Slots big enough for every mid size (growing is the Python path's)."""
    x = np.zeros(DOUBLE_LIMIT // 8, np.float64)
    pycollective.allreduce(x, np.empty_like(x), comm=comm, algorithm="shm")


@pytest.mark.mpi(min_size=2)
def test_every_compiled_dtype_and_op_exact(layouts):
    failures, taken, expected_calls = [], 0, 0
    for label, world_comm in layouts:
        if world_comm.Get_size() == 1:
            continue
        comm = _fresh(world_comm)
        try:
            _grow(comm)
            # a shape's first call takes the full path (the board's agreement, then
            # the compiled steps), a repeated one the agreed step
            with _counting("mid_data") as hits, _counting("agreed_step", _mid) as agreed, \
                    _counting("prepared_step", _mid) as prepared:
                for dtype in DTYPES:
                    counts = _counts(comm.Get_size(), np.dtype(dtype).itemsize)
                    if label != "world":
                        counts = counts[:2]  # the large ones once per launch: they cost the most
                    for i, count in enumerate(counts):
                        # every op at the first two counts, one op each at the large ones
                        for op in (OPS if i < 2 else [OPS[i % 4]]):
                            check_allreduce(comm, "shm", dtype, op, count, failures, label)
                            expected_calls += 2  # out of place and in place
            taken += hits[0] + agreed[0] + prepared[0]
        finally:
            _free(comm)
    assert not failures, f"{len(failures)} failures: " + "; ".join(failures[:5])
    assert taken == expected_calls, (taken, expected_calls)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("op", OPS)
def test_rounding_same_bits_as_the_python_path(dtype, op):
    comm = _fresh()
    n, r = comm.Get_size(), comm.Get_rank()
    try:
        _grow(comm)
        for count in (SMALL // np.dtype(dtype).itemsize + 1, 30_011, 131_071):
            send = random_values(r, count, dtype, op)
            original = send.copy()
            compiled, python = np.empty_like(send), np.empty_like(send)
            with _counting("mid_data") as hits:
                pycollective.allreduce(send, compiled, op, comm=comm, algorithm="shm")
            assert hits[0] == 1
            with _python_path():
                pycollective.allreduce(send, python, op, comm=comm, algorithm="shm")
            assert bitwise_equal(compiled, python), (count, np.count_nonzero(compiled != python))
            assert bitwise_equal(send, original)
            native = np.empty_like(send)
            if dtype != "float16":  # MPI has no float16 sum: the bound below covers ours
                comm.Allreduce(send, native, MPI_OPS[op])
            everyone = [random_values(q, count, dtype, op) for q in range(n)]
            if op in ("max", "min"):  # exact in any order: MPI's bits too
                assert bitwise_equal(compiled, getattr(np, op)(np.stack(everyone), axis=0))
                if dtype != "float16":
                    assert bitwise_equal(compiled, native)
                continue
            exact, bound = rounding_bound(everyone, op, dtype)
            # each result, ours and MPI's, within the bound of the exact one
            assert np.all(np.abs(compiled.astype(np.float64) - exact) <= bound)
            if dtype != "float16":
                assert np.all(np.abs(native.astype(np.float64) - exact) <= bound)
    finally:
        _free(comm)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("others", [10_001, 1000], ids=["mid", "small"])
def test_different_counts_without_agreement_raise_before_dst_is_written(others):
    """Rank 0 in a mid-size call, the others in another mid-size or a small one."""
    comm = _fresh()
    previous = pycollective.set_check(False)
    try:
        _grow(comm)
        count = 10_000 if comm.Get_rank() == 0 else others
        send = exact_values(comm.Get_rank(), count, "float32", "sum")
        out = np.full_like(send, 99)
        with pytest.raises((CollectiveMismatch, PeerFailed), match="disagree|failed"):
            pycollective.allreduce(send, out, comm=comm, algorithm="shm")
        assert np.all(out == 99)
    finally:
        pycollective.set_check(previous)
        _free(comm)


def _disagree_then_agree(comm, shapes):
    """Remember both shapes on every rank, make ranks call different ones, then the same."""
    n, r = comm.Get_size(), comm.Get_rank()

    def call(count, step):
        send = exact_values((r + step) % n, count, "int32", "sum")
        out = np.empty_like(send)
        pycollective.allreduce(send, out, comm=comm, algorithm="shm")
        expected = exact_reduce([exact_values((q + step) % n, count, "int32", "sum")
                                 for q in range(n)], "sum", "int32")
        assert bitwise_equal(out, expected), (count, step)

    for count in shapes:
        call(count, 0)
        call(count, 1)
    for step in range(3):
        mine = shapes[0] if r == 0 else shapes[1]
        send = np.zeros(mine, np.int32)
        with pytest.raises(ValueError, match="ranks disagree on count") as info:
            pycollective.allreduce(send, np.empty_like(send), comm=comm, algorithm="shm")
        assert not isinstance(info.value, CollectiveError)
        # still usable, every rank on the same region: calls of each shape, in turns
        for i in range(5):
            call(shapes[(i + step) % 2], i)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("agreed", [False, True], ids=["python-agreement", "agreed-step"])
@pytest.mark.parametrize("shapes", [(10_000, 10_001), (20_000, 700)], ids=["mid", "mid-small"])
def test_different_counts_with_agreement_raise_and_the_comm_goes_on(agreed, shapes):
    with nullcontext() if agreed else _python_agreement():
        comm = _fresh()
        try:
            _grow(comm)
            with _counting("agreed_step", _mid) as hits, \
                    _counting("prepared_step", _mid) as prepared:
                _disagree_then_agree(comm, shapes)
            folded = hits[0] + prepared[0]  # the first call of a shape, and repeated ones
            assert folded > 0 if agreed else folded == 0
        finally:
            _free(comm)


@contextmanager
def _no_wait_budget(comm):
    """Every compiled wait hands back to Python at once; yields the (step, phase) of each LATE."""
    group = shm._state(get_context(comm)).node.group
    barrier = group.barrier
    late = set()
    # the prepared step is the agreed step by address: its LATEs count as the agreed step's
    steps = {"step": "step", "agreed_step": "agreed_step", "prepared_step": "agreed_step"}
    originals = {name: getattr(_mid, name) for name in steps}

    def watching(name):
        def run(*args):
            verdict, phase = originals[name](*args)
            if verdict == _mid.LATE:
                late.add((steps[name], phase))
            return verdict, phase
        return run
    set_budget(barrier.words, group.rank, 0, 0, 0, 0, barrier.wakes)
    for name in originals:
        setattr(_mid, name, watching(name))
    try:
        yield late
    finally:
        for name, fn in originals.items():
            setattr(_mid, name, fn)
        barrier.set_sleep(barrier.sleep, barrier.wakes)  # the budget back


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("agreed", [False, True], ids=["steps", "agreed-step"])
def test_waits_handed_back_to_python_resume_every_phase(agreed):
    """Ranks come late now and then; with no wait budget, every compiled wait that
    does not find the others there goes on in Python, and the step resumes."""
    previous = pycollective.set_check(agreed)  # off: every call is the compiled steps alone
    comm = _fresh()
    n, r = comm.Get_size(), comm.Get_rank()
    rng = np.random.default_rng(r)
    try:
        _grow(comm)
        with _no_wait_budget(comm) as late:
            for i in range(120):
                count = (5_000, 30_011, 200_003)[i % 3]
                dtype = ("float32", "int64", "float16")[i % 3]
                send = exact_values((r + i) % n, count, dtype, "sum")
                out = np.empty_like(send)
                if rng.random() < 0.2:
                    time.sleep(rng.random() * 2e-3)
                pycollective.allreduce(send, out, comm=comm, algorithm="shm")
                expected = exact_reduce([exact_values((q + i) % n, count, dtype, "sum")
                                         for q in range(n)], "sum", dtype)
                assert bitwise_equal(out, expected), i
        seen = set().union(*comm.allgather(late))
        first = "agreed_step" if agreed else "step"
        # resumed before phase 1 (from the first step) and before phase 2
        assert (first, 1) in seen and seen & {(first, 2), ("step", 2)}, seen
    finally:
        pycollective.set_check(previous)
        _free(comm)


@pytest.mark.mpi(min_size=2)
def test_a_rank_later_than_the_timeout_is_named():
    """The agreement off: the call's first wait is the compiled step's, handed to Python."""
    comm = _fresh()
    n, r = comm.Get_size(), comm.Get_rank()
    late = n - 1
    previous = pycollective.set_check(False)
    try:
        _grow(comm)
        pycollective.set_timeout(0.5, comm=comm)
        send = exact_values(r, 50_000, "float32", "sum")
        out = np.empty_like(send)
        pycollective.allreduce(send, out, comm=comm, algorithm="shm")  # the shape is known
        comm.Barrier()
        if r == late:
            time.sleep(1.5)
        with pytest.raises((CollectiveTimeout, PeerFailed)) as info:
            pycollective.allreduce(send, out, comm=comm, algorithm="shm")
        if r != late:
            assert isinstance(info.value, CollectiveTimeout)
            # named; before the roll call (ROLL_AFTER_S) a rank may not have heard the others
            named = re.search(r"ranks \[([\d, ]+)\] did not arrive", str(info.value))
            assert named and late in {int(q) for q in named[1].split(",")}, str(info.value)
    finally:
        pycollective.set_check(previous)
        _free(comm)


# --- the repeated call's fast way (collectives.plans.run, shm's ``fast``) ----------------------

def _known(comm, count):
    """A shape whose plan and prepared call exist on every rank; returns the plan."""
    r = comm.Get_rank()
    send = exact_values(r, count, "float32", "sum")
    out = np.empty_like(send)
    for _ in range(3):
        pycollective.allreduce(send, out, "sum", comm=comm, algorithm="shm")
    hit = _fastpath.lookup(send, out, "sum", comm, "shm", DEFAULT)
    assert hit is not None and hit[1].fast is not None
    return hit[1]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("count", [300, 3001])  # the small path, the sliced one
def test_the_fast_way_makes_a_record_only_for_a_call_it_hands_back(count, monkeypatch):
    """A repeated call runs without a call record; a wait that runs out of its
    budget hands the call back, which then gets its record and waits on in
    Python; a rank later than the timeout is named; results bitwise right."""
    comm = _fresh()
    n, r = comm.Get_size(), comm.Get_rank()
    records = []
    begin = _watch.begin
    monkeypatch.setattr(_watch, "begin", lambda *a, **k: records.append(a[1]) or begin(*a, **k))
    try:
        _known(comm, count)
        group = shm._state(get_context(comm)).node.group
        barrier = group.barrier

        def calls(k, late=None, sync=False):
            for i in range(k):
                send = exact_values((r + i) % n, count, "float32", "sum")
                out = np.empty_like(send)
                if sync:
                    comm.Barrier()
                if late is not None and r == late(i):
                    time.sleep(2e-3)
                pycollective.allreduce(send, out, "sum", comm=comm, algorithm="shm")
                expected = exact_reduce([exact_values((q + i) % n, count, "float32", "sum")
                                         for q in range(n)], "sum", "float32")
                assert bitwise_equal(out, expected), i

        del records[:]
        calls(10, sync=True)
        # The full way makes a record in every call; the fast way only when a wait
        # ran out of its budget (a rank descheduled on a shared machine).
        assert len(records) <= 5, records
        set_budget(barrier.words, group.rank, 0, 0, 0, 0, barrier.wakes)
        try:
            calls(2 * n, late=lambda i: i % n)
        finally:
            barrier.set_sleep(barrier.sleep, barrier.wakes)  # the budget back
        handed = comm.allreduce(len(records))
        assert handed >= n - 1, handed  # in each call the ranks not late waited in Python
        pycollective.set_timeout(0.5, comm=comm)
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


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("count", [300, 3001])
def test_a_failure_in_the_fast_way_reaches_every_rank(count, monkeypatch):
    """An exception raised in rank 0's fast way (its compiled step here) breaks the
    communicator: rank 0 raises a CollectiveError naming itself, the others hear
    it while waiting for rank 0 (PeerFailed), and every later call is refused."""
    comm = _fresh()
    r = comm.Get_rank()
    try:
        plan = _known(comm, count)
        pycollective.set_timeout(30, comm=comm)
        plan = _known(comm, count)  # a new timeout, a new plan

        def broken(*args):
            raise RuntimeError("injected")
        if r == 0:
            if count * 4 <= SMALL:
                monkeypatch.setattr(plan.run, "prepared", broken)
            else:
                monkeypatch.setattr(_mid, "prepared_step", broken)
        send = exact_values(r, count, "float32", "sum")
        out = np.empty_like(send)
        with pytest.raises(CollectiveError) as info:
            pycollective.allreduce(send, out, "sum", comm=comm, algorithm="shm")
        if r == 0:
            assert "failed on rank 0" in str(info.value) and "injected" in str(info.value)
            assert isinstance(info.value.__cause__, RuntimeError)
        else:
            assert isinstance(info.value, PeerFailed), repr(info.value)
        monkeypatch.undo()
        with pytest.raises(CommunicatorBroken):
            pycollective.allreduce(send, out, "sum", comm=comm, algorithm="shm")
    finally:
        _free(comm)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind", [0, 1])
def test_slot_path_above_the_double_limit_right_with_either_kind_of_stores(monkeypatch, kind):
    """Above ``DOUBLE_LIMIT`` (below the single copy) the slot path writes the slot with the kind of
    stores its ``Stores`` says (``FORCE_STORES`` pins it): the copy-in, and the own slice
    reduced into ``dst`` and streamed into the slot (out of place; in place the slot
    takes the partial results).  Item sizes 1, 2, 8, counts whose slices start anywhere
    in a 32-byte block, calls in a row (the same slot each time), bitwise right, the
    send buffer untouched; the streamed copy runs only with kind 1."""
    monkeypatch.setattr(_stores, "FORCE_STORES", kind)
    comm = _fresh()
    failures = []
    try:
        with _counting("stream_copy", _mid) as streamed:
            for dtype in ("int8", "float16", "uint64"):
                item = np.dtype(dtype).itemsize
                for count in (DOUBLE_LIMIT // item + 1, (DOUBLE_LIMIT + (1 << 20)) // item + 7):
                    for i in range(3):
                        check_allreduce(comm, "shm", dtype, "sum", count, failures,
                                        f"call {i}", shift=i)
        assert not failures, f"{len(failures)} failures: " + "; ".join(failures[:5])
        # per call: the copy-in's one or two pieces, and one per block of the own slice
        assert (streamed[0] > 0) == bool(kind), streamed[0]
    finally:
        _free(comm)


@pytest.mark.mpi(min_size=2)
def test_repeated_calls_right_with_non_temporal_stores(monkeypatch):
    """The repeated call's copy-in with non-temporal stores on every call
    (``shm.stores.FORCE_STORES``; ``shm.stores.Stores`` chooses while running, and its
    first calls alternate both kinds, so at 2 ranks the other tests take both too): item
    sizes 1, 2, 8, slices that start anywhere in a 32-byte block, six calls in a row (the
    slot regions alternate), in place and out of place, bitwise right, the send buffer
    untouched, through the prepared step."""
    monkeypatch.setattr(_stores, "FORCE_STORES", 1)
    comm = _fresh()
    n = comm.Get_size()
    failures = []
    try:
        _grow(comm)
        with _counting("prepared_step", _mid) as prepared:
            for dtype in ("int8", "float16", "uint64"):
                item = np.dtype(dtype).itemsize
                for count in (SMALL // item + 1, 20011, 65536 // item * n + 3):
                    for i in range(6):
                        check_allreduce(comm, "shm", dtype, "sum", count, failures,
                                        f"call {i}", shift=i)
        assert not failures, f"{len(failures)} failures: " + "; ".join(failures[:5])
        # from each shape's third call on (two shapes per count: out of and in place)
        assert prepared[0] >= 3 * 3 * 2 * 3, prepared[0]
    finally:
        _free(comm)
