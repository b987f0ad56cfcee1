"""Calibration (pycollective.bench._calibration) and the model's MPI commands, on several ranks.

Every rank issues the same collectives in the same order; checks that can
fail on one rank only are made after the last collective of a test.
"""

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective import model
from _data import shared_tmp as _shared_tmp

QUICK = dict(min_bytes=4, max_bytes=4096, factor=8, reps=2, counts=(1, 7, 300))


def _same_everywhere(comm, value):
    return all(v == value for v in comm.allgather(value))


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
    # one host here: the links inside a node only
    assert entry["nodes"] == 1 and entry["layout"] == [comm.Get_size()] and "inter" not in entry
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
def test_check_command_reports_the_choice(capsys):
    status = model.main(["check", "--counts", "1,1000", "--reps", "2"])
    out = capsys.readouterr().out
    assert status == 0
    if MPI.COMM_WORLD.Get_rank() == 0:
        assert "auto within 10% of the fastest at" in out and "/2 sizes" in out
