"""The benchmark on several ranks: every algorithm checks out, and broken ones are caught.

Small counts only (the benchmark's speed is not under test here).
"""

import json
import os

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective import bench
from pycollective.bench import _allreduce, _harness

QUICK = ["--iters", "2", "--warmup", "1", "--quiet"]


def _agreed(comm, value):
    """True iff every rank passes the same (picklable) value."""
    return len({repr(v) for v in comm.allgather(value)}) == 1


def _shared_tmp(comm, tmp_path):
    return comm.bcast(str(tmp_path), root=0)


@pytest.mark.mpi(min_size=2)
def test_every_algorithm_right_at_small_sizes():
    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    for dtype, op, count in (("float32", "sum", 1000), ("int16", "prod", n + 1),
                             ("float16", "max", n - 1), ("uint8", "min", 1)):
        rows, _ = bench.main(["all", "--M", str(count), "--dtype", dtype, "--op", op,
                              "--mode", "both"] + QUICK)
        names = [r["name"] for r in rows]
        assert names == (["native"] + pycollective.algorithms()) * 2
        for r in rows:
            assert r["nranks"] == n and r["count"] == count and r["dtype"] == dtype
            assert r["iters"] == 2 and len(r["times"]) == 2 and r["time"] > 0
            assert r["wrong"] == 0 and r["maxerr"] == 0, r
            assert r["identical"] and r["input_intact"], r
        assert bench.failures(rows) == []
        assert _agreed(comm, [(r["name"], r["wrong"], r["times"]) for r in rows])


@pytest.mark.mpi(min_size=2)
def test_shared_buffers_are_checked_and_handed_back():
    """--shared: the buffers are shared allocations (shm reads them in place above 1 MiB),
    every case is checked as usual, and the memory is released after each size."""
    from pycollective.node import arrays as _shared
    from pycollective.runtime.context import get_context
    made = []
    original = _allreduce._memory.shared_empty

    def spy(n, d, comm=None):
        made.append(original(n, d, comm=comm))
        return made[-1]
    _allreduce._memory.shared_empty = spy
    try:
        rows, _ = bench.main(["shm", "ring", "--M", "262147", "--mode", "both", "--shared"]
                             + QUICK)
    finally:
        _allreduce._memory.shared_empty = original
    assert len(made) == 6  # input, ours, expected; out of place and in place
    assert [r["name"] for r in rows] == ["native", "shm", "ring"] * 2
    assert bench.failures(rows) == [] and all(r["wrong"] == 0 for r in rows)
    registry = get_context(MPI.COMM_WORLD).peek(_shared._KEY)
    assert all(registry.locate(a) is None for a in made)


@pytest.mark.mpi(min_size=2)
def test_sweep_on_a_sub_communicator(tmp_path):
    """A count sweep from 0 on an odd-sized Split communicator (when there are 3+ ranks)."""
    world = MPI.COMM_WORLD
    size = world.Get_size()
    k = size - 1 if size >= 3 else size
    sub = world.Split(0 if world.Get_rank() < k else 1, world.Get_rank())
    try:
        rows, report = bench.main(["ring", "butterfly", "--mincount", "0", "--maxcount", "37",
                                   "--stepfactor", "3", "--dtype", "int32", "--op", "max"]
                                  + QUICK, comm=sub)
        counts = sorted({r["count"] for r in rows})
        assert counts == [0, 1, 3, 9, 27, 37]
        assert {r["inplace"] for r in rows} == {False, True}
        assert all(r["nranks"] == sub.Get_size() for r in rows)
        assert bench.failures(rows) == []
        assert report["environment"]["nranks"] == sub.Get_size()
    finally:
        sub.Free()


def _broken_cases():
    def stale(comm, sendbuf, recvbuf, op):
        pass  # never writes the result

    def drifting(comm, sendbuf, recvbuf, op):
        pycollective.allreduce(sendbuf, recvbuf, op, comm=comm, algorithm="ring")
        if comm.Get_rank() == comm.Get_size() - 1:
            recvbuf[recvbuf.size // 2] += 1  # one replica drifts

    def swapped(comm, sendbuf, recvbuf, op):
        pycollective.allreduce(sendbuf, recvbuf, op, comm=comm, algorithm="ring")
        half = recvbuf.size // 2
        recvbuf[:half], recvbuf[half:2 * half] = recvbuf[half:2 * half].copy(), recvbuf[:half].copy()

    def scribbler(comm, sendbuf, recvbuf, op):
        if sendbuf is not MPI.IN_PLACE:
            sendbuf[0] = 0  # writes into the caller's input
        comm.Allreduce(MPI.IN_PLACE if sendbuf is MPI.IN_PLACE else sendbuf, recvbuf,
                       op=MPI.SUM)

    calls = []

    def first_call(comm, sendbuf, recvbuf, op):
        pycollective.allreduce(sendbuf, recvbuf, op, comm=comm, algorithm="ring")
        calls.append(1)
        if len(calls) == 1:  # wrong once, in the warm-up (lazily built state)
            recvbuf[0] += 1

    return [_harness.Case(f.__name__, f)
            for f in (stale, drifting, swapped, scribbler, first_call)]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("inplace", [False, True])
def test_harness_catches_broken_algorithms(inplace):
    comm = MPI.COMM_WORLD
    n, count = comm.Get_size(), 1000
    good = bench.algorithm_case("ring")
    rows = _harness.measure(comm, bench.ALLREDUCE, _broken_cases() + [good], count,
                            np.float32, "sum", inplace=inplace, iters=2, warmup=1)
    by = {r["name"]: r for r in rows}
    assert by["stale"]["wrong"] > 0 and by["stale"]["maxerr"] > 0
    if not inplace:  # a poisoned buffer left alone is wrong everywhere
        assert by["stale"]["wrong"] == n * count
    assert by["drifting"]["wrong"] == 1 and not by["drifting"]["identical"]
    assert by["swapped"]["wrong"] > 0 and by["swapped"]["identical"]
    assert by["scribbler"]["input_intact"] == inplace  # only out of place has an input to spoil
    assert by["first_call"]["wrong"] == n  # element 0 on every rank, first call only
    # The good algorithm after them is unaffected: inputs are restored, outputs poisoned.
    for name in ("native", "ring"):
        r = by[name]
        assert r["wrong"] == 0 and r["identical"] and r["input_intact"], r
    assert {r["name"] for r in bench.failures(rows)} == (
        {"stale", "drifting", "swapped", "first_call"} | (set() if inplace else {"scribbler"}))


@pytest.mark.mpi(min_size=2)
def test_main_reports_an_injected_wrong_algorithm(monkeypatch):
    """bench.main itself flags a wrong algorithm (what makes the command exit 1)."""
    real = _allreduce.algorithm_case

    def patched(name):
        if name != "tree":
            return real(name)

        def off_by_one(comm, sendbuf, recvbuf, op):
            pycollective.allreduce(sendbuf, recvbuf, op, comm=comm, algorithm="tree")
            recvbuf[-1] += 1
        return _harness.Case(name, off_by_one)

    monkeypatch.setattr(_allreduce, "algorithm_case", patched)
    rows, _ = bench.main(["ring", "tree", "--M", "100", "--dtype", "int32"] + QUICK)
    by = {r["name"]: r for r in rows}
    assert by["tree"]["wrong"] == comm_size() and by["ring"]["wrong"] == 0
    assert [r["name"] for r in bench.failures(rows)] == ["tree"]


def comm_size():
    return MPI.COMM_WORLD.Get_size()


@pytest.mark.mpi(min_size=2)
def test_json_and_plot(tmp_path):
    comm = MPI.COMM_WORLD
    where = _shared_tmp(comm, tmp_path)
    path = os.path.join(where, "bench.json")
    argv = ["ring", "naive", "--mincount", "1", "--maxcount", "64", "-f", "8",
            "--json", path] + QUICK
    try:
        import matplotlib  # noqa: F401
        png = os.path.join(where, "bench.png")
        argv += ["--plot", png]
    except ImportError:
        png = None
    rows, _ = bench.main(argv)
    comm.Barrier()
    if comm.Get_rank() == 0:
        with open(path) as f:
            data = json.load(f)
        env = data["environment"]
        assert env["nranks"] == comm.Get_size() and env["cpu_count"] >= 1 and env["hostname"]
        # The library that ran, whichever it is (MPICH, Open MPI, Intel MPI...), without the
        # NUL that Open MPI leaves at the end of its version string.
        version = MPI.Get_library_version().replace("\0", "").strip()
        assert env["mpi_library_version"] == version and "\0" not in env["mpi_library"]
        assert env["mpi_library"] == " ".join(version.splitlines()[0].split())
        assert {"mpi4py", "numpy", "numba"} <= set(env["versions"])
        assert "calibration" in data and "auto_score" in data
        assert len(data["measurements"]) == len(rows)
        assert {m["count"] for m in data["measurements"]} == {1, 8, 64}
        if png is not None:
            assert os.path.getsize(png) > 1000
