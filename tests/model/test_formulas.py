"""Each algorithm's registered α-β-γ cost as evaluated by pycollective.model.formulas."""

import math

import pytest

import pycollective
from pycollective.runtime import registry as _registry
from pycollective.model import choose, lecture_predict, predict

ALGOS = pycollective.algorithms()


def test_every_registered_algorithm_has_a_cost_model():
    for name in ALGOS:
        assert _registry.get(name).cost is not None, f"{name} registered without cost="


@pytest.mark.parametrize("name", ALGOS)
@pytest.mark.parametrize("N", [2, 3, 4, 5, 7, 8, 9])
@pytest.mark.parametrize("M", [1, 2, 6, 7, 8, 9, 10007])
def test_predictions_are_positive_and_finite(name, N, M):
    t = predict(name, N, M, alpha=1e-6, beta=1e-9, gamma=1e-10)
    assert 0 < t < math.inf


def test_unknown_algorithm_names_the_registered_ones():
    with pytest.raises(ValueError, match="ring"):
        predict("nope", 4, 10, alpha=1e-6, beta=1e-9)


def test_algorithm_without_cost_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(_registry._ALGORITHMS["allreduce"], "nocost",
                        _registry.Algorithm("nocost", lambda *a: None, "test only"))
    with pytest.raises(ValueError, match="no cost model"):
        predict("nocost", 4, 10, alpha=1e-6, beta=1e-9)
    assert choose(4, 10, "float32", params=dict(alpha=1e-6, beta=1e-9, gamma=0.0)) in ALGOS


@pytest.mark.parametrize("kwargs", [dict(alpha=-1, beta=1e-9), dict(alpha=1e-6, beta=math.nan),
                                    dict(alpha=1e-6, beta=1e-9, itemsize=0)])
def test_bad_numbers_are_rejected(kwargs):
    with pytest.raises(ValueError):
        predict("ring", 4, 10, **kwargs)


@pytest.mark.parametrize("N, M", [(4, -1), (0, 10), (2.5, 10)])
def test_bad_sizes_are_rejected(N, M):
    with pytest.raises(ValueError):
        predict("ring", N, M, alpha=1e-6, beta=1e-9)


def test_lecture_predict_unknown_name():
    with pytest.raises(ValueError, match="butterfly"):
        lecture_predict("nope", 4, 10, alpha=1e-6, w=1e-9)


# --- shape of the model -------------------------------------------------------------

@pytest.mark.parametrize("name", ALGOS)
def test_nothing_to_do_costs_nothing(name):
    assert predict(name, 1, 1000, alpha=1, beta=1, gamma=1) == 0.0
    assert predict(name, 8, 0, alpha=1, beta=1, gamma=1) == 0.0


@pytest.mark.parametrize("N", [2, 3, 5, 8, 13])
@pytest.mark.parametrize("s", [1, 2, 4, 8])
def test_ring_bandwidth_term(N, s):
    M = 1000 * N  # divisible: the textbook 2(N-1)/N * M * s bytes per rank
    t = predict("ring", N, M, alpha=0, beta=1, gamma=0, itemsize=s)
    assert t == pytest.approx(2 * (N - 1) / N * M * s)
    # not divisible: every step waits for a ceil-sized chunk
    t = predict("ring", N, M + 1, alpha=0, beta=1, gamma=0, itemsize=s)
    assert t == pytest.approx(2 * (N - 1) * (1000 + 1) * s)


def test_ring_pays_every_message_even_when_m_below_n():
    # M < N: N - M chunks are empty but their messages still go around.
    assert predict("ring", 8, 3, alpha=1, beta=0, gamma=0) == 14
    assert predict("ring", 8, 3, alpha=0, beta=1, gamma=0, itemsize=1) == 14  # 1-element chunks


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_non_power_of_two_fold_costs_more_than_the_power_below(k):
    p = 2 ** k
    kw = dict(alpha=1e-6, beta=1e-9, gamma=1e-10, itemsize=4)
    base = predict("butterfly", p, 1000, **kw)
    for n in range(p + 1, 2 * p):
        t = predict("butterfly", n, 1000, **kw)
        # exactly two more whole-vector messages (fold, unfold) and one more reduction
        assert t == pytest.approx(base + 2 * (1e-6 + 4000 * 1e-9) + 4000 * 1e-10)
        assert t > base
    assert predict("butterfly", 2 * p, 1000, **kw) > base


def test_tree_steps_are_ceil_log2():
    kw = dict(alpha=1.0, beta=0.0, gamma=0.0)
    assert [predict("tree", n, 10, **kw) for n in (2, 3, 4, 5, 8, 9)] == [2, 4, 4, 6, 6, 8]


@pytest.mark.parametrize("name", ALGOS)
def test_time_grows_with_message_size(name):
    kw = dict(alpha=3e-6, beta=2e-10, gamma=1e-10)
    times = [predict(name, 6, m, **kw) for m in (1, 5, 6, 7, 100, 10 ** 4, 10 ** 7)]
    assert times == sorted(times)


def test_ps_and_naive_grow_linearly_with_n():
    kw = dict(alpha=0, beta=1e-9, gamma=0)
    for name in ("ps", "naive"):
        t = [predict(name, n, 10 ** 6, **kw) for n in (2, 3, 5, 9)]
        assert t[1] / t[0] == pytest.approx(2) and t[3] / t[0] == pytest.approx(8)
