"""Every bench command on several ranks: sane rows, the same on every rank, JSON that
follows the schema; algorithms that cannot run are skipped; auto's parameters and
exclusions are the communicator's.

Tiny sizes only (the speed is not under test here).
"""

import dataclasses
import io
import json
import os

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective.collectives import auto as _auto
from pycollective.runtime import registry as _registry
from pycollective import bench
from pycollective.runtime.context import get_context
from pycollective.node.barrier import wait_modes
from pycollective.algorithms import ring_pipelined
from pycollective.model import choose, load_params

QUICK = ["--iters", "2", "--warmup", "1"]
REASON = "not on this communicator (test)"


def _agreed(comm, value):
    """True iff every rank passes the same (picklable) value."""
    return len({repr(v) for v in comm.allgather(value)}) == 1


def _shared_tmp(comm, tmp_path):
    return comm.bcast(str(tmp_path), root=0)


def _run(argv, comm=None):
    """bench.main with rank 0's output captured; (rows, report, text on rank 0)."""
    out = io.StringIO()
    rows, report = bench.main(argv, comm=comm, out=out)
    return rows, report, out.getvalue()


@pytest.fixture
def fresh():
    """A Dup of the world: a context of its own, so usable() is asked again."""
    comm = MPI.COMM_WORLD.Dup()
    yield comm
    comm.Free()


def _unusable(monkeypatch, name):
    algo = _registry.get(name)
    monkeypatch.setitem(_registry._ALGORITHMS["allreduce"], name,
                        dataclasses.replace(algo, usable=lambda ctx: REASON))


@pytest.mark.mpi(min_size=2)
def test_membw():
    comm = MPI.COMM_WORLD
    rows, _, text = _run(["membw", "--bytes", "256K", "--reps", "2", "--M", "1e3"])
    assert [(r["name"], r["copiers"]) for r in rows] == [("together", comm.Get_size()),
                                                         ("alone", 1)]
    for r in rows:
        assert r["time"] > 0 and len(r["times"]) == 2 and r["traffic"] > 0
        assert r["total_traffic"] == pytest.approx(r["traffic"] * r["copiers"])
    assert _agreed(comm, rows)
    if comm.Get_rank() == 0:
        assert "allreduce floor, M=1000" in text
    else:
        assert text == ""  # only rank 0 prints


@pytest.mark.mpi(min_size=2)
def test_latency():
    comm = MPI.COMM_WORLD
    rows, _, text = _run(["latency", "shm", "ring", "--M", "1", "7", "--inner", "3",
                          "--agree", "both", "--piece-time", "0.005"] + QUICK)
    pieces = [r for r in rows if r.get("kind") == "piece"]
    calls = [r for r in rows if r.get("kind") == "call"]
    assert len(pieces) + len(calls) == len(rows)
    names = [p["name"] for p in pieces]
    assert names[:2] == ["native comm.Allreduce", "allreduce(shm), agreement off"]
    assert "flag barrier" in names and "agreement (MAX over ranks)" in names
    for p in pieces:
        assert p["time"] > 0 and p["inner"] >= 1 and p["nranks"] == comm.Get_size()
    assert [(r["name"], r["count"], r["agree"]) for r in calls] == [
        (n, m, a) for a in (True, False) for m in (1, 7) for n in ("native", "shm", "ring")]
    for r in calls:
        assert r["wrong"] == 0 and r["identical"] and r["inner"] == 3 and r["time"] > 0
    assert bench.failures(rows) == []
    assert _agreed(comm, rows)
    assert pycollective.collectives.options.check_enabled()  # the agreement step is on again


@pytest.mark.mpi(min_size=2)
def test_segments():
    comm = MPI.COMM_WORLD
    before = ring_pipelined.get_segment_bytes()
    rows, _, _ = _run(["segments", "--M", "1000", "--segments", "64", "1K"] + QUICK)
    assert [(r["name"], r["segment_bytes"]) for r in rows] == [
        ("native", None), ("ring_pipelined/64B", 64), ("ring_pipelined/1K", 1024)]
    assert all(r["wrong"] == 0 and r["count"] == 1000 for r in rows)
    assert ring_pipelined.get_segment_bytes() == before
    assert _agreed(comm, rows)


@pytest.mark.mpi(min_size=2)
def test_breakdown():
    comm = MPI.COMM_WORLD
    # 8 KB takes the window path; 1.2 MB too where ranks outnumber cores (there the
    # single copy starts above shm.SINGLE_COPY_BYTES), else the way its calls chose by
    # timing both (algorithms/shm/ways.py).  Where the system allows the single copy,
    # it is timed beside.
    _, wakes = wait_modes(comm)  # any rank's waits sleep: ranks outnumber cores
    rows, _, text = _run(["breakdown", "--M", "2000", "300000", "--reps", "2"])
    assert {r["count"] for r in rows} == {2000, 300000}
    for count in (2000, 300000):
        mine = [r for r in rows if r["count"] == count]
        calls = {r["phase"]: r for r in mine if r["path"] == "call"}
        assert set(calls) == {"native", "shm"} and calls["shm"]["wrong"] == 0
        paths = {r["path"] for r in mine} - {"call"}
        assert "window" in paths
        assert len({r["path"] for r in mine if r["path"] != "call" and r["used"]}) == 1
        for path in paths:
            phases = [r for r in mine if r["path"] == path]
            assert len(phases) == 6 and all(r["wrong"] == 0 for r in phases)
            assert sum(r["share"] for r in phases) == pytest.approx(1.0)
    used = {r["count"]: r["path"] for r in rows if r["path"] != "call" and r["used"]}
    assert used[2000] == "window"
    single = any(r["path"] == "single-copy" for r in rows)
    assert used[300000] == "window" if wakes or not single else used[300000] in (
        "window", "single-copy")
    assert _agreed(comm, rows)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("argv", [
    ["ring", "naive", "--mincount", "0", "--maxcount", "9", "-f", "3"] + QUICK,
    ["env"],
    ["membw", "--bytes", "64K", "--reps", "2"],
    ["latency", "ring", "--M", "2", "--inner", "2", "--piece-time", "0.01"] + QUICK,
    ["segments", "--M", "100", "--segments", "16"] + QUICK,
    ["breakdown", "--M", "5000", "--reps", "1"],
])
def test_json_follows_the_schema(tmp_path, argv):
    comm = MPI.COMM_WORLD
    path = os.path.join(_shared_tmp(comm, tmp_path), "out.json")
    rows, report, _ = _run(argv + ["--json", path, "--quiet"])
    comm.Barrier()
    if comm.Get_rank() == 0:
        with open(path) as f:
            data = json.load(f)
        assert bench.validate(data) == []
        assert data["environment"]["nranks"] == comm.Get_size()
        assert len(data["measurements"]) == len(rows) > 0
        assert data["environment"]["mpi_library"] == report["environment"]["mpi_library"]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("option", ["--json", "--plot", "--params"])
def test_a_bad_path_exits_2_on_every_rank_before_the_run(tmp_path, option):
    where = os.path.join(_shared_tmp(MPI.COMM_WORLD, tmp_path), "missing", "x.json")
    with pytest.raises(SystemExit) as info:
        _run(["ring", "--M", "10", option, where] + QUICK)
    assert info.value.code == 2
    assert not os.path.exists(os.path.dirname(where))


@pytest.mark.mpi(min_size=2)
def test_all_skips_an_algorithm_that_cannot_run(monkeypatch, fresh):
    _unusable(monkeypatch, "shm")
    assert pycollective.unusable_algorithms(fresh) == {"shm": REASON}
    rows, report, text = _run(["all", "--M", "64", "--explain"] + QUICK, comm=fresh)
    names = [r["name"] for r in rows]
    assert "shm" not in names
    assert names == ["native"] + [n for n in pycollective.algorithms() if n != "shm"]
    assert report["skipped"] == {"shm": REASON}
    assert bench.failures(rows) == []
    if fresh.Get_rank() == 0:
        assert f"# skipped shm: {REASON}" in text
        assert f"(cannot run here: {REASON})" in text
    # Named explicitly, it is skipped the same way.
    rows, report, _ = _run(["shm", "ring", "--M", "8", "--quiet"] + QUICK, comm=fresh)
    assert [r["name"] for r in rows] == ["native", "ring"]
    assert report["skipped"] == {"shm": REASON}


def _params_favouring(path, best, second):
    """A calibration in which ``best`` is by far the cheapest, then ``second``."""
    def ratio(name):
        factor = {best: 0.1, second: 0.2}.get(name, 100.0)
        return [[1, factor], [1 << 30, factor]]
    corrections = {name: ratio(name) for name in pycollective.algorithms()}
    with open(path, "w") as f:
        json.dump(dict(alpha=1e-6, beta=1e-10, gamma=1e-10, corrections=corrections), f)


@pytest.mark.mpi(min_size=2)
def test_auto_runs_on_the_params_installed_on_the_communicator(monkeypatch, fresh, tmp_path):
    """--params reaches algorithm='auto' through the communicator, with auto's exclusions."""
    monkeypatch.setenv("PYCOLLECTIVE_AUTO", "model")  # the model alone decides: no trials
    path = os.path.join(_shared_tmp(fresh, tmp_path), "model.json")
    if fresh.Get_rank() == 0:
        _params_favouring(path, "shm", "tree")
    fresh.Barrier()
    n = fresh.Get_size()
    assert choose(n, 100, "float32", params=load_params(path)) == "shm"  # without exclusions
    _unusable(monkeypatch, "shm")
    tree = _registry.get("tree")
    ran = []

    def counted(ctx, src, dst, kernel):
        ran.append(src.size)
        return tree.run(ctx, src, dst, kernel)

    monkeypatch.setitem(_registry._ALGORITHMS["allreduce"], "tree",
                        dataclasses.replace(tree, run=counted))
    ctx = get_context(fresh)
    before = _auto.auto_for(ctx)  # the communicator's own state
    rows, report, text = _run(["ring", "auto", "--M", "100", "--params", path, "--explain"]
                              + QUICK, comm=fresh)
    auto_rows = [r for r in rows if r["name"] == "auto"]
    assert [r["auto"] for r in rows] == ["tree"] * 3
    assert ran and set(ran) == {100}  # auto ran tree; nobody asked for it by name
    assert auto_rows[0]["wrong"] == 0
    # The prediction shown for auto is tree's, as auto weighs it.
    flat = report["calibration"]
    assert flat["source"] == path and auto_rows[0]["pred"] is not None
    assert ctx.peek(_auto.KEY) is before  # the communicator's state is back
    if fresh.Get_rank() == 0:
        assert "tree  " in text and "<- auto's decision" in text


@pytest.mark.mpi(min_size=2)
def test_every_rank_gets_the_same_rows_on_a_split(layouts):
    """The allreduce command on each split layout (sizes 1 .. N): rows agreed within it."""
    for label, comm in layouts:
        rows, report, _ = _run(["ring", "shm", "--M", "5", "--quiet"] + QUICK, comm=comm)
        assert [r["name"] for r in rows] == ["native", "ring", "shm"], label
        assert all(r["wrong"] == 0 and r["nranks"] == comm.Get_size() for r in rows)
        assert _agreed(comm, rows), label
        assert np.isfinite([r["time"] for r in rows]).all()
