"""The first-use measurement (pycollective.collectives.probe) on several ranks.

Bounded, agreed across ranks, kept per machine (a second communicator, as a
second job, reads it and measures nothing), and not used when a calibration
file is given or the setting turns it off.
"""

import os

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective import model
from pycollective.collectives import auto as _auto, probe as _probe
from pycollective.runtime.context import get_context
from _data import shared_tmp

# The bound the docs state is 0.5 s on 16 dedicated ranks; here ranks may share cores
# with each other and with other jobs, so the test allows for that and catches a probe
# whose cost grows (e.g. with N, or by a repeated loop) rather than timing it.
BOUND_S = 0.5


def _fresh(monkeypatch, tmp_path_factory, name):
    world = MPI.COMM_WORLD
    base = shared_tmp(world, tmp_path_factory, name)
    monkeypatch.setenv("XDG_CACHE_HOME", base)
    monkeypatch.setenv("PYCOLLECTIVE_MODEL", os.path.join(base, "no-calibration.json"))
    monkeypatch.setenv("PYCOLLECTIVE_MEASURE", "1")
    return base


def _counting(monkeypatch):
    calls = []
    real = _probe.measure

    def counted(*args):
        entry, seconds = real(*args)
        calls.append(seconds)
        return entry, seconds
    monkeypatch.setattr(_probe, "measure", counted)
    return calls


def _first_auto(comm):
    x = np.arange(1000, dtype=np.float32)
    out = np.empty_like(x)
    pycollective.allreduce(x, out, comm=comm)  # the default is "auto"
    assert np.array_equal(out, x * comm.Get_size())
    return _auto.auto_for(get_context(comm))


@pytest.mark.mpi(min_size=2)
def test_first_use_measures_once_agrees_and_keeps_it(monkeypatch, tmp_path_factory):
    base = _fresh(monkeypatch, tmp_path_factory, "probe")
    calls = _counting(monkeypatch)
    comm = MPI.COMM_WORLD.Dup()
    try:
        state = _first_auto(comm)
        flat = {k: state.flat[k] for k in ("alpha", "beta", "gamma", "overhead")}
        everyone = comm.allgather((flat, state.flat["corrections"], state.params["source"]))
        rpc = state.layout.ranks_per_core
    finally:
        comm.Free()
    assert len(calls) == 1, "the first automatic choice measures once"
    assert all(e == everyone[0] for e in everyone), "every rank holds the same parameters"
    assert "measured on first use" in everyone[0][2]
    assert all(v > 0 for v in flat.values()), flat
    assert "shm" in everyone[0][1], "shm is priced from its own calls, timed"
    # Cores shared by ranks (and by other jobs here) slow every step down.
    assert calls[0] < 4 * BOUND_S * max(1.0, rpc), f"the probe took {calls[0]:.3f} s"
    kept = os.listdir(os.path.join(base, "pycollective", "machines"))
    assert len(kept) == 1 and kept[0].endswith(".json")

    # A second job on this machine (a new communicator, as a new process would be): no probe.
    comm = MPI.COMM_WORLD.Dup()
    try:
        again = _first_auto(comm)
        source = again.params["source"]
        alpha = again.flat["alpha"]
    finally:
        comm.Free()
    assert len(calls) == 1, "the kept measurement serves the next job"
    assert source.endswith(kept[0]) and alpha == pytest.approx(flat["alpha"])


@pytest.mark.mpi(min_size=2)
def test_a_calibration_file_wins_and_the_setting_turns_it_off(monkeypatch, tmp_path_factory):
    base = _fresh(monkeypatch, tmp_path_factory, "probe-off")
    calls = _counting(monkeypatch)
    path = os.path.join(base, "model.json")
    if MPI.COMM_WORLD.Get_rank() == 0:
        model.save_params(dict(alpha=3e-6, beta=1e-10, gamma=2e-10), path)
    MPI.COMM_WORLD.Barrier()
    monkeypatch.setenv("PYCOLLECTIVE_MODEL", path)
    comm = MPI.COMM_WORLD.Dup()
    try:
        given = _first_auto(comm).params["source"]
    finally:
        comm.Free()
    monkeypatch.setenv("PYCOLLECTIVE_MODEL", os.path.join(base, "none.json"))
    monkeypatch.setenv("PYCOLLECTIVE_MEASURE", "0")
    comm = MPI.COMM_WORLD.Dup()
    try:
        off = _first_auto(comm).params
    finally:
        comm.Free()
    assert calls == [], "neither a calibration file nor PYCOLLECTIVE_MEASURE=0 measures"
    assert given == path
    assert off.get("builtin")
    assert not os.path.exists(os.path.join(base, "pycollective", "machines"))


@pytest.mark.mpi(min_size=2)
def test_the_probe_entry_is_a_valid_calibration(monkeypatch, tmp_path_factory):
    _fresh(monkeypatch, tmp_path_factory, "probe-entry")
    comm = MPI.COMM_WORLD.Dup()
    try:
        layout = _auto.layout_of(get_context(comm))
        entry, seconds = _probe.measure(comm, layout, shm=True)
        same = comm.allgather(entry["alpha"])
        shm = comm.allgather(entry["corrections"]["shm"])
    finally:
        comm.Free()
    assert len(set(same)) == 1
    # shm timed itself at every size, and every rank holds the same ratios
    assert all(entry["measured"][f"shm_{n}"] > 0 for n in _probe.SHM_SIZES), entry["measured"]
    assert all(curve == shm[0] for curve in shm)
    assert [n for n, _ in shm[0]] == [float(n) for n in _probe.SHM_SIZES]
    # where ranks have cores of their own, β holds from the large ring's message to the
    # near copy's blocks, then rises to where calls run out of the caches (the far copy's
    # region per rank): never below it; where they share cores it ends at the large ring's
    measured = entry["measured"]
    assert measured["copy"] > 0
    assert (measured["copy_far"] > 0) == (layout.ranks_per_core <= 1)
    if layout.ranks_per_core <= 1:
        assert measured["far_region"] == _probe.far_bytes(max(layout.nodes))
        far_at = float(measured["far_region"])
        (large, b0), (near, b1), (far, b2) = entry["beta_curve"][-3:]
        assert (large, near, far) == (_probe.LARGE, _probe.KERNEL_OUT, far_at)
        assert b0 == b1 == entry["beta"] <= b2 <= 4 * b1
    else:
        assert entry["beta_curve"][-1] == [float(_probe.LARGE), entry["beta"]]
    params = model.params_for(_probe.load_params_from({"by_nranks": {str(entry["nranks"]): entry},
                                                      **{k: entry[k] for k in ("alpha", "beta",
                                                                               "gamma")}}),
                              entry["nranks"], layout)
    assert params["alpha"] == entry["alpha"] and params["gamma_curves"]["float32"]
    assert seconds == entry["probe_seconds"] > 0
