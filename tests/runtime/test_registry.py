"""The registry: what every algorithm declares, and adding one by the docs' recipe."""

import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective.collectives import auto as _auto
from pycollective.runtime import registry as _registry
from pycollective import bench, model
from pycollective.runtime.context import get_context

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "tests" / "plugins"


def test_required_algorithms_are_registered():
    names = pycollective.algorithms()
    assert {"ring", "tree", "butterfly", "ps", "naive"} <= set(names)
    assert len(names) == len(set(names))
    for name in names:
        entry = _registry.get(name)
        assert entry.name == name and callable(entry.run) and entry.summary


def test_unknown_algorithm_lists_known_ones():
    with pytest.raises(ValueError, match="registered: ring, tree"):
        _registry.get("rin")


def test_register_twice_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        _registry.register("ring", lambda *a: None, "dup")


@pytest.mark.parametrize("name", ["auto", "all"])
def test_reserved_names_are_refused(name):
    with pytest.raises(ValueError, match="reserved"):
        _registry.register(name, lambda *a: None, "no")


def test_repeated_without_agreed_is_refused():
    """``repeated`` prepares ``agreed`` for a repeated call, so it needs one."""
    with pytest.raises(ValueError, match="agreed"):
        _registry.register("zz_prepared", lambda *a: None, "no", repeated=lambda *a: None)
    assert "zz_prepared" not in _registry.names()


def test_every_algorithm_declares_its_tags_and_no_tag_is_shared():
    owners = _registry.tag_owners()
    for name in pycollective.algorithms():
        algo = _registry.get(name)
        for tag in algo.tags:
            assert owners[tag] == f"allreduce:{name}"
    # the point-to-point algorithms all send messages, so all declare tags
    for name in ("ring", "tree", "butterfly", "ps", "naive", "ring_pipelined", "rabenseifner"):
        assert _registry.get(name).tags, name


def test_a_taken_tag_is_refused_and_nothing_is_registered():
    ring_tag = _registry.get("ring").tags[0]
    with pytest.raises(ValueError, match=rf"{ring_tag} \(used by 'allreduce:ring'\)"):
        _registry.register("zz_clash", lambda *a: None, "clash", tags=(ring_tag,))
    assert "zz_clash" not in _registry.names()
    _registry.register("zz_free", lambda *a: None, "free", tags=(9990,))
    try:
        assert _registry.tag_owners()[9990] == "allreduce:zz_free"
    finally:
        _registry.unregister("zz_free")
    assert 9990 not in _registry.tag_owners()


def test_usable_defaults_to_everywhere_and_shm_declares_one_node():
    assert _registry.get("ring").usable(None) is None
    ctx = get_context(MPI.COMM_SELF)
    assert _registry.get("shm").usable(ctx) is None  # one rank is one node
    assert pycollective.unusable_algorithms(MPI.COMM_SELF) == {}


# --- a newcomer's algorithm, added by the recipe ---------------------------------

@pytest.fixture
def toy():
    sys.path.insert(0, str(PLUGINS))
    try:
        module = importlib.import_module("toy_algorithm")
        yield module
    finally:
        _registry.unregister("linear")
        sys.modules.pop("toy_algorithm", None)
        sys.path.remove(str(PLUGINS))


def test_a_new_algorithm_shows_up_everywhere(toy):
    assert "linear" in pycollective.algorithms()
    # the bench: a valid choice, and part of "all"
    assert bench.parse_args(["linear"], 1).algorithms == ["linear"]
    assert "linear" in bench.parse_args(["all"], 1).algorithms
    # auto: a candidate like any other (cheapest when messages cost nothing)
    assert "linear" in model.explain(4, 1000, "float32", dict(alpha=1e-6, beta=1e-9, gamma=0))
    cheap = {"alpha": 1.0, "beta": 1.0, "gamma": 1.0,
             "corrections": {n: [[4, 100.0]] for n in pycollective.algorithms() if n != "linear"}}
    assert model.choose(4, 1000, "float32", params=cheap) == "linear"
    ctx = get_context(MPI.COMM_SELF)
    assert "linear" not in _auto.unusable_reasons(ctx)
    # and it runs (one rank: the trivial path)
    x = np.arange(5.0)
    assert np.array_equal(pycollective.allreduce(x, np.empty(5), comm=MPI.COMM_SELF,
                                                 algorithm="linear"), x)


def test_a_new_algorithm_passes_the_parametrised_correctness_tests():
    """The MPI correctness matrix picks it up (here at 2 ranks) and it passes."""
    env = dict(os.environ, PYTHON=sys.executable, PYCOLLECTIVE_TIMEOUT="300",
               PYTHONPATH=os.pathsep.join([str(PLUGINS), os.environ.get("PYTHONPATH", "")]))
    cmd = [str(ROOT / "scripts" / "run_mpi.sh"), "2", "-m", "pytest", "--with-mpi", "-v",
           "-p", "no:cacheprovider", "-p", "toy_plugin", "-k", "linear",
           str(ROOT / "tests" / "mpi" / "collectives" / "test_allreduce.py")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    ran = {line.split()[0] for line in out.splitlines() if "PASSED" in line and "linear" in line}
    # test_exact_matrix x 5 dtypes, test_random_data_within_bound, ... all with [..linear..]
    assert len(ran) >= 6, out[-3000:]
    assert "FAILED" not in out
