"""algorithm="auto" (pycollective._auto) on several ranks: the same choice everywhere.

Every rank issues the same collectives in the same order; checks that can
fail on one rank only are made after the last collective of a test.
"""

import dataclasses
import os
import warnings

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective import _auto, _registry, model
from pycollective._context import get_context
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
