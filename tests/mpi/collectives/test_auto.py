"""algorithm="auto" (pycollective.collectives.auto) on several ranks: the same choice everywhere.

Every rank issues the same collectives in the same order; checks that can
fail on one rank only are made after the last collective of a test.
"""

import dataclasses
import functools
import logging
import os
import types
import warnings

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective.collectives import auto as _auto, plans as _fastpath
from pycollective.runtime import registry as _registry
from pycollective import model
from pycollective.collectives.api import DEFAULT
from pycollective.runtime.context import get_context
from pycollective.model import tuning
from pycollective.model.tuning import MAX_TRIALS
from _data import exact_reduce, exact_values, shared_tmp as _shared_tmp


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", ["int64", "float32", "float16"])
def test_auto_is_correct_and_the_same_on_every_rank(layouts, dtype):
    failures = []
    for label, comm in layouts:
        n, r = comm.Get_size(), comm.Get_rank()
        for count in (0, 1, n - 1, n + 1, 1000, 100_003):
            everyone = [exact_values(q, count, dtype, "sum") for q in range(n)]
            expected = exact_reduce(everyone, "sum", dtype)
            out = np.empty_like(everyone[r])
            pycollective.allreduce(everyone[r], out, comm=comm)  # the default is "auto"
            chosen = _auto.auto_for(get_context(comm)).choose(count, np.dtype(dtype), "sum")
            names = comm.allgather(chosen)
            if len(set(names)) != 1:
                failures.append(f"{label} count={count}: ranks chose {names}")
            if not np.array_equal(out.view(np.uint8), expected.view(np.uint8)):
                failures.append(f"{label} count={count}: wrong result with {chosen}")
    assert not failures, failures[:5]


@pytest.mark.mpi(min_size=2)
def test_auto_uses_rank_0_parameters_even_when_ranks_read_different_files(tmp_path_factory,
                                                                        monkeypatch):
    """Rank 0's calibration says messages are expensive; the others' that bytes are."""
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    base = _shared_tmp(world, tmp_path_factory, "")
    path = os.path.join(base, f"rank{rank}.json")
    latency_bound = dict(alpha=1.0, beta=1e-12, gamma=0.0)   # fewest messages wins
    bandwidth_bound = dict(alpha=0.0, beta=1.0, gamma=1.0)   # fewest bytes wins
    model.save_params(latency_bound if rank == 0 else bandwidth_bound, path)
    monkeypatch.setenv("PYCOLLECTIVE_MODEL", path)
    comm = world.Dup()  # a fresh communicator: its first call broadcasts rank 0's model
    try:
        count = 10_000
        x = exact_values(rank, count, "int64", "sum")
        out = np.empty_like(x)
        pycollective.allreduce(x, out, comm=comm, algorithm="auto")
        state = _auto.auto_for(get_context(comm))
        chosen = state.choose(count, np.dtype("int64"), "sum")
        choices = comm.allgather(chosen)
        sources = comm.allgather(state.params["source"])
        expected = exact_reduce([exact_values(q, count, "int64", "sum")
                                 for q in range(comm.Get_size())], "sum", "int64")
    finally:
        comm.Free()
    assert len(set(choices)) == 1, choices
    assert set(sources) == {os.path.join(base, "rank0.json")}
    assert chosen == model.choose(world.Get_size(), count, "int64", "sum", latency_bound)
    assert np.array_equal(out, expected)


@pytest.mark.mpi(min_size=2)
def test_an_unreadable_calibration_falls_back_to_the_defaults(tmp_path_factory, monkeypatch):
    world = MPI.COMM_WORLD
    path = _shared_tmp(world, tmp_path_factory, "broken.json")
    if world.Get_rank() == 0:
        with open(path, "w") as f:
            f.write("{not json")
    world.Barrier()
    monkeypatch.setenv("PYCOLLECTIVE_MODEL", path)
    comm = world.Dup()
    try:
        x = exact_values(world.Get_rank(), 1000, "int32", "sum")
        out = np.empty_like(x)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pycollective.allreduce(x, out, comm=comm)
        sources = comm.allgather(_auto.auto_for(get_context(comm)).params["source"])
        expected = exact_reduce([exact_values(q, 1000, "int32", "sum")
                                 for q in range(comm.Get_size())], "sum", "int32")
    finally:
        comm.Free()
    assert np.array_equal(out, expected)
    assert len(set(sources)) == 1 and sources[0].startswith("defaults")
    if world.Get_rank() == 0:
        assert any("ignoring the calibration" in str(w.message) for w in caught)


@pytest.mark.mpi(min_size=2)
def test_auto_leaves_out_shm_when_the_communicator_spans_nodes(monkeypatch):
    # Pretend the communicator spans nodes: auto must never pick "shm".
    shm = _registry.get("shm")
    monkeypatch.setitem(_registry._ALGORITHMS["allreduce"], "shm",
                        dataclasses.replace(shm, usable=lambda ctx: "pretend: several nodes"))
    comm = MPI.COMM_WORLD.Dup()
    try:
        state = _auto.auto_for(get_context(comm))
        everything_on_shm = {"alpha": 1.0, "beta": 1.0, "gamma": 1.0,
                             "corrections": {n: [[4, 100.0]] for n in pycollective.algorithms()
                                             if n != "shm"}}
        state.flat = model.params_for(everything_on_shm, comm.Get_size())
        picks = {state.choose(c, np.dtype("float32"), "sum") for c in (1, 1000, 10 ** 6)}
    finally:
        comm.Free()
    assert state.exclude == ("shm",)
    assert "shm" not in picks


# --- self-tuning ---------------------------------------------------------------------------------

def _settle(comm, count, dtype="float32", op="sum", check=True):
    """Call auto until it decides this shape; every call checked.  Returns (decision, calls)."""
    n, r = comm.Get_size(), comm.Get_rank()
    x = exact_values(r, count, dtype, op)
    expected = exact_reduce([exact_values(q, count, dtype, op) for q in range(n)], op, dtype)
    state = _auto.auto_for(get_context(comm))
    wrong = calls = 0
    for calls in range(1, MAX_TRIALS + 2):
        out = np.empty_like(x)
        pycollective.allreduce(x, out, op, comm=comm)
        wrong += not np.array_equal(out.view(np.uint8), expected.view(np.uint8))
        if state.decision(count, np.dtype(dtype), op) is not None:
            break
    return state.decision(count, np.dtype(dtype), op), calls, wrong


@pytest.mark.mpi(min_size=2)
def test_tuning_decides_the_same_everywhere_within_its_bound_and_every_call_is_right(
        monkeypatch):
    monkeypatch.setenv("PYCOLLECTIVE_AUTO", "tune")
    comm = MPI.COMM_WORLD.Dup()
    try:
        found = []
        for count in (1, 1000, 100_003):
            decision, calls, wrong = _settle(comm, count)
            x, out = np.ones(count, np.float32), np.empty(count, np.float32)
            pycollective.allreduce(x, out, "sum", comm=comm)  # the first call after the decision
            hit = _fastpath.lookup(x, out, "sum", comm, "auto", DEFAULT)
            found.append((count, decision, calls, wrong, hit is not None))
            agreed = comm.allgather((decision.algorithm, decision.times, decision.calls))
            assert len({repr(a) for a in agreed}) == 1, agreed
        state = _auto.auto_for(get_context(comm))
    finally:
        comm.Free()
    for count, decision, calls, wrong, fast in found:
        assert wrong == 0, (count, decision)
        assert decision.how in ("tuned", "model") and calls == decision.calls
        assert calls <= MAX_TRIALS
        assert decision.algorithm not in state.exclude
        assert set(decision.times) <= set(decision.predicted)
        assert fast  # decided: the shape now takes the fast path
    if MPI.COMM_WORLD.Get_size() <= 8:  # one node here: shm can run
        assert "shm" not in state.exclude


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("check", [True, False])
def test_a_trial_times_what_the_decided_call_runs(monkeypatch, check):
    """Each timed trial runs what the plan cache prepares for the decided calls
    (agree.prepared: shm's repeated compiled step, the others' run_checked):
    with the check on, every candidate agrees inside the timed span (shm folds
    it into its data step); with it off, only the algorithms that cannot
    verify the call."""
    seen = []
    real = _auto.prepared

    def recording(ctx, algo, kernel, dst, agreement):
        run = real(ctx, algo, kernel, dst, agreement)

        def recorded(ctx, call, values, src, dst):
            seen.append((algo.name, values is not None, not isinstance(run, functools.partial)))
            return run(ctx, call, values, src, dst)
        return recorded
    monkeypatch.setattr(_auto, "prepared", recording)
    monkeypatch.setenv("PYCOLLECTIVE_AUTO", "tune")
    previous = pycollective.set_check(check)
    comm = MPI.COMM_WORLD.Dup()
    try:
        decision, calls, wrong = _settle(comm, 1000)
    finally:
        comm.Free()
        pycollective.set_check(previous)
    assert wrong == 0 and decision.how == "tuned"
    assert {name for name, _, _ in seen} >= set(decision.times) and len(seen) == calls
    for name, agreed, folded in seen:
        assert agreed == (check or not _registry.get(name).verifies_arguments), (name, check)
    if check and "shm" in decision.times:
        assert ("shm", True, True) in seen


@pytest.mark.mpi(min_size=2)
def test_trial_calls_after_a_shapes_first_run_from_the_plan_cache(monkeypatch):
    """A shape's first trial call goes the full way (checks, agreement, auto's resolve);
    the later ones run from the plan cache (the tuner's next candidate, one agreement),
    as a decided call does, until the decision, after which the decided plan is kept."""
    resolved = []
    real = _auto.AutoState.resolve
    monkeypatch.setattr(_auto.AutoState, "resolve",
                        lambda self, *a: resolved.append(a) or real(self, *a))
    monkeypatch.setenv("PYCOLLECTIVE_AUTO", "tune")
    comm = MPI.COMM_WORLD.Dup()
    try:
        decision, calls, wrong = _settle(comm, 1000)
        during = len(resolved)
        x, out = np.ones(1000, np.float32), np.empty(1000, np.float32)
        pycollective.allreduce(x, out, "sum", comm=comm)  # the decision, on the full way once
        hit = _fastpath.lookup(x, out, "sum", comm, "auto", DEFAULT)
        plan = None if hit is None else hit[1]
    finally:
        comm.Free()
    assert wrong == 0 and decision.how == "tuned" and calls > 1, (decision, calls)
    assert during == 1, resolved  # every trial call after the first came from the plan cache
    assert len(resolved) == 2
    assert plan is not None and not isinstance(plan.algo, _auto.Trial)
    assert plan.algo.name == decision.algorithm


@pytest.mark.mpi(min_size=2)
def test_ranks_that_disagree_in_the_middle_of_a_tuning_raise_and_tune_on_alike(monkeypatch):
    """Mid-tuning, rank 0 calls the shape being tuned (from its plan: the next candidate
    with the agreement folded in) while the others call another count (the full way):
    every rank raises, no tuner moves, and the tuning goes on to the same decision."""
    monkeypatch.setenv("PYCOLLECTIVE_AUTO", "tune")
    comm = MPI.COMM_WORLD.Dup()
    n, r = comm.Get_size(), comm.Get_rank()
    errors = []
    try:
        state = _auto.auto_for(get_context(comm))
        x = exact_values(r, 1000, "float32", "sum")
        for _ in range(3):  # the first trial calls: the plan of the shape is kept
            pycollective.allreduce(x, np.empty_like(x), "sum", comm=comm)
        key = state.key(1000, np.dtype(np.float32), "sum")
        tuner = state.tuners.get(key)
        before = None if tuner is None else (tuner.position, tuner.calls, tuner.round)
        count = 1000 if r == 0 else 1001
        y = exact_values(r, count, "float32", "sum")
        try:
            pycollective.allreduce(y, np.empty_like(y), "sum", comm=comm)
        except ValueError as exc:
            errors.append(str(exc))
        after = None if tuner is None else (tuner.position, tuner.calls, tuner.round)
        decision, calls, wrong = _settle(comm, 1000)
        agreed = comm.allgather((decision.algorithm, decision.times, decision.calls))
    finally:
        comm.Free()
    assert tuner is not None, "decided within three calls: nothing to test"
    assert len(errors) == 1 and "1000" in errors[0] and "1001" in errors[0], errors
    assert before == after
    assert wrong == 0 and len({repr(a) for a in agreed}) == 1, agreed


@pytest.mark.mpi(min_size=2)
def test_ranks_with_different_clocks_still_run_and_keep_the_same_candidates(monkeypatch):
    # Each rank's own times are noise of its own; only agreed times may decide.
    rank = MPI.COMM_WORLD.Get_rank()
    rng = np.random.default_rng(rank)
    clock = [0.0]

    def perf_counter():
        clock[0] += float(rng.uniform(1e-6, 1e-3))
        return clock[0]
    monkeypatch.setattr(_auto, "time", types.SimpleNamespace(perf_counter=perf_counter))
    monkeypatch.setenv("PYCOLLECTIVE_AUTO", "tune")
    comm = MPI.COMM_WORLD.Dup()
    try:
        decisions = [_settle(comm, count)[0] for count in (3, 5000)]
        agreed = comm.allgather([(d.algorithm, d.times, d.calls) for d in decisions])
    finally:
        comm.Free()
    assert len({repr(a) for a in agreed}) == 1, agreed


@pytest.mark.mpi(min_size=2)
def test_model_mode_times_nothing(monkeypatch):
    monkeypatch.setenv("PYCOLLECTIVE_AUTO", "model")
    comm = MPI.COMM_WORLD.Dup()
    try:
        decision, calls, wrong = _settle(comm, 1000)
        state = _auto.auto_for(get_context(comm))
    finally:
        comm.Free()
    assert (decision.how, calls, wrong, decision.calls) == ("model", 1, 0, 0)
    assert decision.algorithm == state.ranking(1000, np.dtype("float32"))[0][0]


@pytest.mark.mpi(min_size=2)
def test_decisions_are_kept_in_a_file_and_followed_by_later_runs(tmp_path_factory, monkeypatch):
    world = MPI.COMM_WORLD
    path = _shared_tmp(world, tmp_path_factory, "decisions.json")
    monkeypatch.setenv("PYCOLLECTIVE_AUTO", path)
    comm = world.Dup()
    try:
        first, _, _ = _settle(comm, 2000)
    finally:
        comm.Free()
    world.Barrier()  # rank 0 has written the file
    kept = tuning.load_decisions(path)
    comm = world.Dup()  # a later "run": a fresh communicator reads the file
    try:
        state = _auto.auto_for(get_context(comm))
        again = state.decision(2000, np.dtype("float32"), "sum")
        other_count = state.decision(1500, np.dtype("float32"), "sum")  # same size class
        x = exact_values(world.Get_rank(), 2000, "float32", "sum")
        out = np.empty_like(x)
        pycollective.allreduce(x, out, comm=comm)
    finally:
        comm.Free()
    if first.how == "tuned":
        assert len(kept) == 1 and next(iter(kept.values()))["algorithm"] == first.algorithm
        assert again.how == "file" and again.algorithm == first.algorithm
        assert other_count == again


@pytest.mark.mpi(min_size=2)
def test_a_decision_can_be_pinned_by_hand(tmp_path_factory, monkeypatch):
    world = MPI.COMM_WORLD
    path = _shared_tmp(world, tmp_path_factory, "pinned.json")
    comm = world.Dup()
    try:
        layout = _auto.layout_of(get_context(comm))
        klass = tuning.size_class(4000 * 4)
        if world.Get_rank() == 0:
            tuning.save_decision(path, comm.Get_size(), layout.nodes, klass, "float32", "sum",
                                 tuning.Decision("naive", "tuned"))
        world.Barrier()
        monkeypatch.setenv("PYCOLLECTIVE_AUTO", path)
        decision, calls, wrong = _settle(comm, 4000)
    finally:
        comm.Free()
    assert (decision.algorithm, decision.how, calls, wrong) == ("naive", "file", 1, 0)


@pytest.mark.mpi(min_size=2)
def test_every_decision_is_logged_at_debug_level(caplog, monkeypatch):
    monkeypatch.setenv("PYCOLLECTIVE_AUTO", "tune")
    comm = MPI.COMM_WORLD.Dup()
    try:
        with caplog.at_level(logging.DEBUG, logger="pycollective"):
            decision, _, _ = _settle(comm, 777)
    finally:
        comm.Free()
    lines = [r.getMessage() for r in caplog.records if r.name == "pycollective"]
    assert any(line.startswith("auto: N=") and decision.algorithm in line
               and "B per rank, float32 sum" in line for line in lines), lines
