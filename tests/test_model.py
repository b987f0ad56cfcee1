"""Serial tests of the α-β-γ cost model (pycollective.model): no MPI launch needed."""

import json
import math

import numpy as np
import pytest

import pycollective
from pycollective import _registry, model
from pycollective.model import choose, fit_alpha_beta, lecture_predict, predict

ALGOS = pycollective.algorithms()
LECTURE_PARAMS = dict(alpha=5e-6, w=5e-11)  # tables 7 and 8, w per element as printed
EX1 = dict(alpha=5e-6, w=4 / 12.5e9)        # exercise 1: fp32 at 12.5 GB/s


def quoted(value, digits_after_point, unit=1.0):
    """pytest.approx for a number the lecture printed with a given rounding."""
    return pytest.approx(value * unit, abs=0.5 * 10 ** -digits_after_point * unit)


# --- the lecture's numbers ------------------------------------------------------

@pytest.mark.parametrize("name, N, M, params, expected", [
    # table 7: M = 1.5e9, "ring ~131 ms at N = 8 and ~160 ms at N = 1024, ps 76.8 s"
    ("ring", 8, 1.5e9, LECTURE_PARAMS, quoted(131, 0, 1e-3)),
    ("ring", 1024, 1.5e9, LECTURE_PARAMS, quoted(160, 0, 1e-3)),
    ("ps", 1024, 1.5e9, LECTURE_PARAMS, quoted(76.8, 1)),
    # table 8: M = 1e6, "butterfly 0.55 ms, ring 10.33 ms at N = 1024"
    ("butterfly", 1024, 1e6, LECTURE_PARAMS, quoted(0.55, 2, 1e-3)),
    ("ring", 1024, 1e6, LECTURE_PARAMS, quoted(10.33, 2, 1e-3)),
    # exercise 1: M = 4e6 fp32, 512 ranks: ring 7.7, butterfly 11.6, tree 23.1 ms
    ("ring", 512, 4e6, EX1, quoted(7.7, 1, 1e-3)),
    ("butterfly", 512, 4e6, EX1, quoted(11.6, 1, 1e-3)),
    ("tree", 512, 4e6, EX1, quoted(23.1, 1, 1e-3)),
])
def test_lecture_formulas_reproduce_the_lectures_numbers(name, N, M, params, expected):
    assert lecture_predict(name, N, M, **params) == expected


@pytest.mark.parametrize("name, N, M, params, expected", [
    ("ring", 8, 1.5e9, LECTURE_PARAMS, quoted(131, 0, 1e-3)),
    ("ring", 1024, 1.5e9, LECTURE_PARAMS, quoted(160, 0, 1e-3)),
    ("butterfly", 1024, 1e6, LECTURE_PARAMS, quoted(0.55, 2, 1e-3)),
    ("ring", 1024, 1e6, LECTURE_PARAMS, quoted(10.33, 2, 1e-3)),
    ("ring", 512, 4e6, EX1, quoted(7.7, 1, 1e-3)),  # 4e6/512 is not whole: ceil chunk
    ("butterfly", 512, 4e6, EX1, quoted(11.6, 1, 1e-3)),
    ("tree", 512, 4e6, EX1, quoted(23.1, 1, 1e-3)),
])
def test_implementation_model_agrees_with_lecture_where_the_formulas_coincide(
        name, N, M, params, expected):
    # With gamma = 0, N a power of two and w per element (itemsize 1), ring,
    # tree and butterfly as implemented are the lecture's formulas.
    t = predict(name, N, int(M), alpha=params["alpha"], beta=params["w"], itemsize=1)
    assert t == expected


def test_ps_implementation_counts_both_directions_of_the_server():
    # The lecture's ps is N*M*w + 2a; ours sends N-1 vectors in and N-1 out.
    N, M, w, a = 1024, 1.5e9, 5e-11, 5e-6
    assert lecture_predict("ps", N, M, alpha=a, w=w) == pytest.approx(76.8, abs=0.05)
    assert predict("ps", N, int(M), alpha=a, beta=w, itemsize=1) == pytest.approx(
        2 * (N - 1) * (a + M * w))


def test_w_and_bytes_per_byte_bandwidth_are_not_confused():
    # "fp16 at 10 GB/s" is 2e-10 s per element, four times the tables' w.
    M, N = 1_500_000_000, 1024
    per_element = predict("ring", N, M, alpha=5e-6, beta=5e-11, itemsize=1)
    per_byte = predict("ring", N, M, alpha=5e-6, beta=1 / 10e9, itemsize=2)
    assert per_element == pytest.approx(0.160, abs=5e-4)
    assert per_byte == pytest.approx(2 * (N - 1) * (5e-6 + math.ceil(M / N) * 2e-10))
    assert per_byte > 3.5 * per_element


def test_cli_lecture_report_prints_the_tables(capsys):
    assert model.main(["lecture"]) == 0
    out = capsys.readouterr().out
    for text in ("table 7", "table 8", "exercise 1", "131.32", "160.084", "76800",
                 "0.55", "10.3299", "7.665", "11.565", "23.13"):
        assert text in out


def test_cli_explicit_parameters(capsys):
    assert model.main(["table", "--M", "4e6", "--bytes-per-element", "4", "--bandwidth", "12.5e9",
                       "--alpha", "5e-6", "--N", "512"]) == 0
    out = capsys.readouterr().out
    assert "w = 3.2e-10 s/element" in out and "7.665" in out
    with pytest.raises(SystemExit):
        model.main(["table", "--M", "10", "--w", "1e-9"])  # no alpha


def test_cli_with_calibration_file(tmp_path, capsys):
    path = tmp_path / "m.json"
    model.save_params(dict(alpha=1e-5, beta=1e-9, gamma=1e-10), path)
    assert model.main(["table", "--params", str(path), "--M", "1000", "--N", "2,3"]) == 0
    out = capsys.readouterr().out
    assert str(path) in out and "auto" in out


# --- registry and errors ----------------------------------------------------------

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


# --- choice -------------------------------------------------------------------------

LECTURE_BYTES = dict(alpha=5e-6, beta=5e-11 / 2, gamma=0.0)  # fp16 elements, itemsize 2


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


# --- fitting and parameters ---------------------------------------------------------

def test_fit_recovers_alpha_beta_exactly():
    sizes = 4.0 ** np.arange(12)
    alpha, beta, res = fit_alpha_beta(sizes, 3e-6 + 2.5e-10 * sizes)
    assert alpha == pytest.approx(3e-6, rel=1e-9)
    assert beta == pytest.approx(2.5e-10, rel=1e-9)
    assert res < 1e-9


def test_fit_recovers_alpha_beta_from_noisy_data():
    rng = np.random.default_rng(7)
    sizes = np.repeat(4.0 ** np.arange(13), 3)
    times = (8e-6 + 1e-9 * sizes) * rng.uniform(0.97, 1.03, sizes.size)
    alpha, beta, res = fit_alpha_beta(sizes, times)
    assert alpha == pytest.approx(8e-6, rel=0.03)
    assert beta == pytest.approx(1e-9, rel=0.03)
    assert 0.005 < res < 0.03


def test_fit_keeps_parameters_non_negative():
    sizes = np.array([10.0, 100, 1000, 10000])
    # an exact line with alpha = -5e-9 (the free fit): alpha is pinned at 0
    alpha, beta, _ = fit_alpha_beta(sizes, 1e-9 * sizes - 5e-9)
    assert alpha == 0 and 0 < beta < 1e-9
    # times that fall with size (the free fit: beta < 0): beta is pinned at 0
    alpha, beta, _ = fit_alpha_beta(sizes, np.array([5e-6, 5e-6, 5e-6, 4e-6]))
    assert beta == 0 and alpha == pytest.approx(4.75e-6, rel=0.05)


@pytest.mark.parametrize("sizes, times", [([1, 1, 1], [1, 2, 3]), ([1, 2], [1, 0]),
                                          ([1, 2, 3], [1, 2])])
def test_fit_rejects_bad_data(sizes, times):
    with pytest.raises(ValueError):
        fit_alpha_beta(sizes, times)


def test_missing_calibration_gives_documented_defaults(tmp_path):
    p = model.load_params(tmp_path / "none.json")
    assert {k: p[k] for k in ("alpha", "beta", "gamma")} == model.DEFAULTS
    assert "defaults" in p["source"]


def test_default_path_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PYCOLLECTIVE_MODEL", str(tmp_path / "x.json"))
    assert model.default_path() == str(tmp_path / "x.json")
    monkeypatch.delenv("PYCOLLECTIVE_MODEL")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert model.default_path() == str(tmp_path / "pycollective" / "model.json")


def test_save_load_round_trip(tmp_path):
    entry2 = dict(nranks=2, alpha=1.0, beta=10.0, gamma=100.0, gamma_by_dtype={"float32": 100.0})
    entry8 = dict(nranks=8, alpha=7.0, beta=70.0, gamma=700.0, gamma_by_dtype={"float32": 700.0})
    data = model.merge_calibration(model.merge_calibration(None, entry8), entry2)
    assert data["alpha"] == 1.0  # top level = smallest N
    path = model.save_params(data, tmp_path / "sub" / "m.json")
    p = model.load_params(path)
    assert p["source"] == str(path) and set(p["by_nranks"]) == {"2", "8"}
    at = model.load_params(path, nranks=4)
    assert (at["alpha"], at["beta"], at["gamma"]) == pytest.approx((3.0, 30.0, 300.0))
    assert at["gamma_by_dtype"]["float32"] == pytest.approx(300.0)
    assert model.params_for(p, 1)["alpha"] == 1.0   # clamped below
    assert model.params_for(p, 64)["alpha"] == 7.0  # clamped above
    assert model.params_for(p, 8)["beta"] == 70.0


@pytest.mark.parametrize("content", ["{not json", json.dumps({"alpha": 1.0}),
                                     json.dumps({"alpha": -1, "beta": 1, "gamma": 1}),
                                     json.dumps({"alpha": 1, "beta": 1, "gamma": 1,
                                                 "by_nranks": {"x": {}}}),
                                     json.dumps({"alpha": 1, "beta": 1, "gamma": 1,
                                                 "corrections": {"ring": {"latency": 1}}}),
                                     json.dumps({"alpha": 1, "beta": 1, "gamma": 1, "by_nranks": {
                                         "2": {"alpha": 1, "beta": 1, "gamma": 1,
                                               "beta_curve": [[8, 1], [4, 1]]}}})])
def test_invalid_calibration_file_is_a_clear_error(tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="bad.json"):
        model.load_params(path)


def test_two_regime_fit_takes_beta_from_large_messages():
    # In cache (< 1 MiB) bytes move at 1e-10 s/B, beyond at 3e-10 s/B.
    sizes = 4.0 ** np.arange(1, 13)
    times = 5e-6 + np.where(sizes < 2 ** 20, 1e-10, 3e-10) * sizes
    alpha, beta, res = model.fit_two_regimes(sizes, times)
    assert alpha == pytest.approx(5e-6, rel=0.01)
    assert beta == pytest.approx(3e-10, rel=0.01)
    one_line = fit_alpha_beta(sizes, times)[1]
    assert one_line < 2.5e-10  # what a single line would have said
    # without enough large sizes: one line
    assert model.fit_two_regimes(sizes[:6], times[:6]) == fit_alpha_beta(sizes[:6], times[:6])


def test_fit_corrections_gives_measured_over_model_ratios():
    a, b, g, o, N = 3e-6, 2e-10, 1e-10, 20e-6, 4
    counts = [4 ** k for k in range(11)]
    ratio = {"ring": lambda c: 2.0, "butterfly": lambda c: 1.0 + math.log(c + 1)}
    times = {name: [[c, o + r(c) * predict(name, N, c, alpha=a, beta=b, gamma=g)]
                    for c in counts] for name, r in ratio.items()}
    fitted = model.fit_corrections(N, {"overhead": o, "times": times},
                                   dict(alpha=a, beta=b, gamma=g), smooth=0)
    assert set(fitted) == set(ratio)
    for name, r in ratio.items():
        assert [x for x, _ in fitted[name]] == [4 * c for c in counts]  # bytes of float32
        assert [y for _, y in fitted[name]] == pytest.approx([r(c) for c in counts])
    # smoothed: below 16 KiB (counts 1..1024 here) each ratio is the mean over
    # itself and one neighbour each side below 16 KiB; above, as measured
    smooth = model.fit_corrections(N, {"overhead": o, "times": times},
                                   dict(alpha=a, beta=b, gamma=g))
    want = [r(c) for c in counts]
    small = want[:6]
    assert [y for _, y in smooth["butterfly"]] == pytest.approx(
        [np.mean(small[max(0, i - 1):i + 2]) for i in range(6)] + want[6:])
    assert [y for _, y in smooth["ring"]] == pytest.approx([2.0] * len(counts))


def test_explain_and_choose_use_the_measured_ratios(tmp_path):
    # Measured: ring 10x slower than the model at every size; butterfly 10x
    # slower from 4 MB on, exact below 4 KB, log-linear between.
    entry = dict(nranks=4, alpha=5e-6, beta=1e-10, gamma=1e-10, overhead=3e-5,
                 corrections={"ring": [[4, 10.0], [1 << 24, 10.0]],
                              "butterfly": [[4096, 1.0], [1 << 22, 10.0]]})
    params = model.load_params(model.save_params(model.merge_calibration(None, entry),
                                                 tmp_path / "c.json"))
    kw = dict(alpha=5e-6, beta=1e-10, gamma=1e-10)
    for M in (1, 1000, 10 ** 6, 10 ** 8):
        t = model.explain(4, M, "float32", params)
        assert t["ring"] == pytest.approx(3e-5 + 10 * predict("ring", 4, M, **kw))
        assert t["tree"] == pytest.approx(3e-5 + predict("tree", 4, M, **kw))
        assert choose(4, M, "float32", "sum", params) == min(t, key=t.get)
        assert list(t) == ALGOS
    mid = model.explain(4, 1 << 15, "float32", params)["butterfly"]  # 128 KiB: halfway in log
    assert mid == pytest.approx(3e-5 + 5.5 * predict("butterfly", 4, 1 << 15, **kw))
    assert model.explain(4, 1, "float32", params)["butterfly"] == pytest.approx(
        3e-5 + predict("butterfly", 4, 1, **kw))


def test_per_size_curves_set_beta_and_gamma_by_vector_size():
    # In cache (<= 1 MiB) 1e-10 s/B, out of cache 4e-10 s/B: a 4 MiB vector
    # pays the out-of-cache rate, a 64 KiB one the in-cache rate.
    curve = [[1 << 14, 1e-10], [1 << 20, 1e-10], [1 << 22, 4e-10], [1 << 24, 4e-10]]
    params = dict(alpha=1e-6, beta=1e-10, gamma=0.0, beta_curve=curve)
    small, big = 1 << 14, 1 << 20  # float32 counts: 64 KiB and 4 MiB
    t_small = model.explain(2, small, "float32", params)["ring"]
    t_big = model.explain(2, big, "float32", params)["ring"]
    assert t_small == pytest.approx(predict("ring", 2, small, alpha=1e-6, beta=1e-10))
    assert t_big == pytest.approx(predict("ring", 2, big, alpha=1e-6, beta=4e-10))
    # in between: log-linear
    mid = model.params.value_at(curve, 1 << 21, None)
    assert 1e-10 < mid < 4e-10 and mid == pytest.approx(2.5e-10)
