"""What algorithm="auto" chooses (pycollective.model.choice)."""

import numpy as np
import pytest

import pycollective
from pycollective.runtime import registry as _registry
from pycollective import model
from pycollective.model import choose, predict
from _cases import LECTURE_BYTES

ALGOS = pycollective.algorithms()


@pytest.mark.parametrize("N", [2, 3, 8, 64, 1024])
@pytest.mark.parametrize("M", [0, 1, 7, 1000, 10 ** 6, 10 ** 9])
@pytest.mark.parametrize("dtype", ["float16", "float32", "int64"])
def test_choose_returns_a_registered_algorithm(N, M, dtype):
    assert choose(N, M, dtype, "sum", LECTURE_BYTES) in ALGOS


@pytest.mark.parametrize("N", [3, 4, 8, 64, 1024])
def test_choose_latency_optimal_for_tiny_messages(N):
    # One element: only alpha counts; the choice sends the fewest messages
    # (butterfly's log2 N among the lecture's algorithms).
    chosen = choose(N, 1, "float16", "sum", LECTURE_BYTES)
    fewest = min(model.terms(a, N, 1, 2)[0] for a in ALGOS)
    assert model.terms(chosen, N, 1, 2)[0] == fewest
    assert fewest <= model.terms("butterfly", N, 1, 2)[0]


@pytest.mark.parametrize("N", [3, 4, 8, 64, 1024])
def test_choose_ring_like_for_huge_messages(N):
    # 1.5e9 fp16 elements: the choice sends at most the ring's 2(N-1)/N·M·s
    # bytes along its critical path (less if it overlaps transfers), and far
    # less than butterfly or tree.
    M = 1_500_000_000
    chosen = choose(N, M, "float16", "sum", LECTURE_BYTES)
    sent = model.terms(chosen, N, M, 2)[1]
    assert sent <= model.terms("ring", N, M, 2)[1] * (1 + 1e-9)
    assert sent < model.terms("butterfly", N, M, 2)[1] / 1.3


def test_choose_matches_table_8():
    # M = 1e6, N = 1024: butterfly (0.55 ms) beats ring (10.33 ms); whatever is
    # chosen is at least as fast as butterfly.
    chosen = choose(1024, 10 ** 6, "float16", "sum", LECTURE_BYTES)
    t = {a: predict(a, 1024, 10 ** 6, itemsize=2, **LECTURE_BYTES) for a in ALGOS}
    assert t[chosen] <= t["butterfly"] < t["ring"]
    assert chosen != "ring"


def test_lecture_algorithms_alone_choose_as_the_lecture_says(monkeypatch):
    # Restricted to the lecture's five algorithms, the choices are its own.
    lecture = ("ring", "tree", "butterfly", "ps", "naive")
    everything = _registry._ALGORITHMS["allreduce"]
    monkeypatch.setitem(_registry._ALGORITHMS, "allreduce",
                        {k: v for k, v in everything.items() if k in lecture})
    assert choose(1024, 10 ** 6, "float16", "sum", LECTURE_BYTES) == "butterfly"
    assert choose(8, 1, "float16", "sum", LECTURE_BYTES) == "butterfly"
    assert choose(8, 1_500_000_000, "float16", "sum", LECTURE_BYTES) == "ring"
    assert choose(1024, 1_500_000_000, "float16", "sum", LECTURE_BYTES) == "ring"


def test_terms_are_the_costs_coefficients():
    assert model.terms("ring", 4, 8, 4) == (6, 6 * 2 * 4, 3 * 2 * 4)
    assert model.terms("butterfly", 5, 10, 2) == (4, 4 * 20, 3 * 20)


def test_choose_is_the_minimum_of_predict():
    params = dict(alpha=2e-6, beta=3e-10, gamma=2e-10)
    for N in (2, 3, 5, 8):
        for M in (1, 100, 10 ** 4, 10 ** 6):
            t = {a: predict(a, N, M, itemsize=8, **params) for a in ALGOS}
            assert t[choose(N, M, np.float64, "max", params)] == min(t.values())


def test_choose_uses_the_dtypes_gamma():
    # A slow kernel (float16 here) makes the choice the one that reduces least.
    params = dict(alpha=1e-6, beta=2e-11, gamma=1e-11, gamma_by_dtype={"float16": 1e-7})
    slow = choose(4, 10 ** 4, "float16", "sum", params)
    fast = choose(4, 10 ** 4, "float32", "sum", params)
    assert model.terms(slow, 4, 10 ** 4, 2)[2] == min(
        model.terms(a, 4, 10 ** 4, 2)[2] for a in ALGOS)
    assert model.terms(fast, 4, 10 ** 4, 4)[2] > min(
        model.terms(a, 4, 10 ** 4, 4)[2] for a in ALGOS)


def test_choose_rejects_a_bad_op():
    with pytest.raises(ValueError, match="op"):
        choose(4, 10, "float32", "xor", LECTURE_BYTES)
