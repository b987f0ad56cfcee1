"""Calibration and algorithm="auto" on several ranks (fast: tiny size ranges).

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
from _data import exact_reduce, exact_values

QUICK = dict(min_bytes=4, max_bytes=4096, factor=8, reps=2, counts=(1, 7, 300))


def _same_everywhere(comm, value):
    return all(v == value for v in comm.allgather(value))


def _shared_tmp(comm, tmp_path_factory, name):
    """A path chosen on rank 0 and used by all ranks (same file system here)."""
    path = str(tmp_path_factory.mktemp("model") / name) if comm.Get_rank() == 0 else None
    return comm.bcast(path, root=0)


@pytest.mark.mpi(min_size=2)
def test_calibrate_gives_the_same_parameters_on_every_rank():
    comm = MPI.COMM_WORLD
    entry = model.calibrate(comm, dtypes=("float32", "float16"), **QUICK)
    assert entry["nranks"] == comm.Get_size()
    for key in ("alpha", "beta", "gamma", "residual"):
        assert np.isfinite(entry[key]) and entry[key] >= 0
        assert _same_everywhere(comm, entry[key]), key
    assert entry["alpha"] > 0  # a message is never free
    assert set(entry["gamma_by_dtype"]) == {"float32", "float16"}
    assert [n for n, _ in entry["exchange"]] == [4, 32, 256, 2048]
    assert entry["overhead"] > 0 and _same_everywhere(comm, entry["overhead"])
    assert set(entry["corrections"]) == set(pycollective.algorithms())
    for name, rows in entry["algorithms"]["times"].items():
        assert [c for c, _ in rows] == [1, 7, 300] and all(t > 0 for _, t in rows), name
        curve = entry["corrections"][name]
        assert [b for b, _ in curve] == [4, 28, 1200] and all(r >= 0 for _, r in curve), name
        assert _same_everywhere(comm, curve)


@pytest.mark.mpi(min_size=2)
def test_calibrate_command_saves_a_file_the_library_reads(tmp_path_factory):
    comm = MPI.COMM_WORLD
    path = _shared_tmp(comm, tmp_path_factory, "model.json")
    status = model.main(["calibrate", "--output", path, "--quiet", "--max-bytes", "4096",
                         "--factor", "8", "--reps", "2", "--counts", "1,100"])
    comm.Barrier()  # rank 0 has written the file
    params = model.load_params(path)
    mine = model.load_params(path, nranks=comm.Get_size())
    assert status == 0
    assert str(comm.Get_size()) in params["by_nranks"]
    assert mine["alpha"] == params["by_nranks"][str(comm.Get_size())]["alpha"]
    names = pycollective.algorithms()
    assert model.choose(comm.Get_size(), 1000, "float32", "sum", params) in names
    t = model.explain(comm.Get_size(), 1000, "float32", params)
    assert model.choose(comm.Get_size(), 1000, "float32", "sum", params) == min(t, key=t.get)


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
def test_check_command_reports_the_choice(capsys):
    status = model.main(["check", "--counts", "1,1000", "--reps", "2"])
    out = capsys.readouterr().out
    assert status == 0
    if MPI.COMM_WORLD.Get_rank() == 0:
        assert "auto within 10% of the fastest at" in out and "/2 sizes" in out


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
