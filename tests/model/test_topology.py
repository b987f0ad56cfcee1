"""The model on a machine: oversubscription, cache, and links inside and between nodes."""

import numpy as np
import pytest

import pycollective
from pycollective.runtime import registry as _registry
from pycollective import model
from pycollective.model import params as P
from pycollective.model.choice import calibrated_times, ranked, rates
from pycollective.model.topology import Layout, Topology, accepts_topo, evaluate

F32 = np.dtype("float32")


def _builtin(layout):
    return P.params_for(model.load_params("/nonexistent/model.json"), layout.nranks, layout)


def test_layout_facts():
    one = Layout((4,), True, (2,), 2 << 20)
    assert not one.spans_nodes and one.ranks_per_core == 2 and one.nranks == 4
    two = Layout((3, 2), False, (4, 4))
    assert two.spans_nodes and two.ranks_per_core == 1  # never below one
    assert "2 nodes of [3, 2] ranks" in two.describe() and "not in node blocks" in two.describe()
    assert Layout((8,)).ranks_per_core == 1  # unknown cores: one per rank


def test_defaults_scale_with_ranks_per_core():
    alone, shared = _builtin(Layout((2,), True, (2,))), _builtin(Layout((8,), True, (2,)))
    b = P.BUILTIN
    assert alone["alpha"] == P.DEFAULTS["alpha"]
    assert shared["alpha"] == pytest.approx(P.DEFAULTS["alpha"] * (1 + 3 * b["alpha_per_rank"]))
    assert shared["beta"] == pytest.approx(P.DEFAULTS["beta"] * 4 ** b["beta_power"])
    assert shared["gamma"] > alone["gamma"]
    # float16 is compute bound: its gamma grows with the share of a core
    assert shared["gamma_by_dtype"]["float16"] == pytest.approx(4 * b["gamma_float16"])
    assert shared["gamma_by_dtype"]["bfloat16"] == pytest.approx(4 * b["gamma_bfloat16"])


def test_defaults_know_cache_from_memory():
    flat = _builtin(Layout((2,), True, (2,), 2 << 20))
    small, large = rates(flat, 1000, F32)[1], rates(flat, 10 ** 8, F32)[1]
    assert small == pytest.approx(P.BUILTIN["gamma_in_cache"])
    assert large == pytest.approx(P.DEFAULTS["gamma"])
    # a larger cache keeps more in it
    big_cache = _builtin(Layout((2,), True, (2,), 64 << 20))
    assert rates(big_cache, 2 ** 22, F32)[1] < rates(flat, 2 ** 22, F32)[1]


def test_a_hand_written_file_is_not_scaled():
    params = dict(alpha=1.0, beta=2.0, gamma=3.0)
    flat = P.params_for(params, 8, Layout((8,), True, (2,)))
    assert (flat["alpha"], flat["beta"], flat["gamma"]) == (1.0, 2.0, 3.0)


def test_costs_without_topo_are_priced_on_the_slower_link():
    ring = _registry.get("ring").cost
    assert not accepts_topo(ring)
    topo = Topology((2, 2), (1e-6, 1e-10), (5e-5, 1e-8))
    assert evaluate(ring, 4, 1000, 4, 1e-6, 1e-10, 0.0, topo) == ring(4, 1000, 4, 5e-5, 1e-8, 0.0)
    one_node = Topology((4,), (1e-6, 1e-10), (5e-5, 1e-8))
    assert evaluate(ring, 4, 1000, 4, 1e-6, 1e-10, 0.0, one_node) == ring(4, 1000, 4, 1e-6, 1e-10,
                                                                          0.0)


def test_hierarchical_composes_its_cost_from_both_links(monkeypatch):
    monkeypatch.delenv("PYCOLLECTIVE_RANKS_PER_NODE", raising=False)
    cost = _registry.get("hierarchical").cost
    assert accepts_topo(cost)
    inside, between = (2e-6, 1e-10), (5e-5, 8e-9)   # shared memory; 1 Gbit/s
    topo = Topology((2, 2), inside, between)
    count, itemsize, gamma = 10 ** 6, 4, 1e-10
    leaders = _registry.get("ring_pipelined").cost(2, count, itemsize, *between, gamma)
    node = (3 * 1 * inside[0] + (2 * 0.5 + 1) * count * itemsize * inside[1]
            + 0.5 * count * itemsize * gamma)
    assert cost(4, count, itemsize, *inside, gamma, topo=topo) == pytest.approx(node + leaders)
    # the leaders run the butterfly below 64 KiB
    small = _registry.get("butterfly").cost(2, 100, itemsize, *between, gamma)
    assert cost(4, 100, itemsize, *inside, gamma, topo=topo) > small
    # without topo: one node of 4 (no leaders' phase), as before
    one_node = (3 * 2 * inside[0] + (2 * 0.75 + 1) * count * itemsize * inside[1]
                + 0.75 * count * itemsize * gamma)
    assert cost(4, count, itemsize, *inside, gamma) == pytest.approx(one_node)
    # unequal nodes: the largest one is the critical path
    assert cost(5, count, itemsize, *inside, gamma, topo=Topology((3, 2), inside, between)) > \
        cost(4, count, itemsize, *inside, gamma, topo=topo)


def test_the_emulated_layout_prices_hierarchical_on_links_inside_a_node(monkeypatch):
    cost = _registry.get("hierarchical").cost
    monkeypatch.setenv("PYCOLLECTIVE_RANKS_PER_NODE", "2,2")
    inside = (2e-6, 1e-10)
    with_topo = cost(4, 10 ** 6, 4, *inside, 0.0, topo=Topology((4,), inside, (5e-5, 8e-9)))
    assert with_topo == cost(4, 10 ** 6, 4, *inside, 0.0)
    leaders = _registry.get("ring_pipelined").cost(2, 10 ** 6, 4, *inside, 0.0)
    assert with_topo > leaders


@pytest.mark.parametrize("count", [1, 1000, 10 ** 5, 10 ** 7])
def test_across_slow_links_the_model_ranks_hierarchical_first(count):
    # 2 nodes of 4 ranks, 1 Gbit/s between them: only one rank per node should
    # cross, once (shm cannot run across nodes and is left out by the caller).
    layout = Layout((4, 4), True, (4, 4))
    params = dict(model.load_params("/nonexistent/model.json"))
    flat = P.params_for(params, 8, layout)
    flat["inter"] = (50e-6, 8e-9)
    best = ranked(8, count, F32, flat, exclude=("shm",))[0][0]
    assert best == "hierarchical", calibrated_times(8, count, F32, flat)


def test_choose_and_explain_take_a_layout():
    layout = Layout((2, 2), True, (2, 2))
    params = model.load_params("/nonexistent/model.json")
    t = model.explain(4, 10 ** 6, "float32", params, layout=layout)
    assert set(t) == set(pycollective.algorithms())
    assert model.choose(4, 10 ** 6, "float32", "sum", params, layout=layout) == min(t, key=t.get)


def test_corrections_apply_only_to_as_many_nodes_as_were_measured():
    params = dict(alpha=1e-6, beta=1e-10, gamma=1e-10, nodes=1,
                  corrections={"ring": [[4, 100.0], [1 << 30, 100.0]]})
    one = P.params_for(params, 4, Layout((4,)))
    two = P.params_for(params, 4, Layout((2, 2)))
    base_one = calibrated_times(4, 1000, F32, P.params_for(dict(params, corrections={}), 4))
    assert calibrated_times(4, 1000, F32, one)["ring"] == pytest.approx(100 * base_one["ring"])
    base_two = calibrated_times(4, 1000, F32, P.params_for(dict(params, corrections={}), 4,
                                                           Layout((2, 2))))
    assert calibrated_times(4, 1000, F32, two)["ring"] == pytest.approx(base_two["ring"])


def test_a_calibration_across_nodes_carries_its_links(tmp_path):
    entry = dict(nranks=4, alpha=1e-6, beta=1e-10, gamma=1e-10, nodes=2,
                 inter={"alpha": 3e-5, "beta": 2e-9}, layout=[2, 2])
    path = P.save_params(P.merge_calibration(None, entry), tmp_path / "m.json")
    loaded = model.load_params(path)
    flat = P.params_for(loaded, 4, Layout((2, 2)))
    assert flat["inter"] == (3e-5, 2e-9) and flat["nodes"] == 2
    assert P.params_for(loaded, 8, Layout((4, 4)))["inter"] == (3e-5, 2e-9)  # nearest N
    for bad in ({"inter": {"alpha": -1, "beta": 1}}, {"inter": 3}, {"nodes": 0}):
        (tmp_path / "bad.json").write_text(__import__("json").dumps(dict(entry, **bad)))
        with pytest.raises(ValueError, match="bad.json"):
            model.load_params(tmp_path / "bad.json")
