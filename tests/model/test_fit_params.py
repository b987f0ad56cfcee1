"""Fitting (pycollective.model.fit) and calibration files (pycollective.model.params)."""

import json
import math

import numpy as np
import pytest

import pycollective
from pycollective import model
from pycollective.model import choose, fit_alpha_beta, predict

ALGOS = pycollective.algorithms()


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


def test_an_algorithm_that_folds_the_agreement_in_is_priced_without_the_overhead(tmp_path):
    # shm folds the agreement into its first sync: its measured time holds it, so its
    # ratio is time / model and its price ratio x model, never the overhead plus that.
    # Its small calls take less than the agreement step alone (3.2 us against 4.8 at
    # N = 2): priced with the overhead they could never come out below it.
    a, b, g, o, N = 5e-6, 1e-10, 1e-10, 4.8e-6, 2
    counts = [1, 1024, 1 << 18]
    shm_times = [[c, 3.2e-6 + 2e-10 * 4 * c] for c in counts]
    ring_times = [[c, o + 2 * predict("ring", N, c, alpha=a, beta=b, gamma=g)] for c in counts]
    fitted = model.fit_corrections(N, {"overhead": o, "times": {"shm": shm_times,
                                                                "ring": ring_times}},
                                   dict(alpha=a, beta=b, gamma=g), smooth=0)
    assert not model.pays_overhead("shm") and model.pays_overhead("ring")
    assert [y for _, y in fitted["ring"]] == pytest.approx([2.0] * 3)  # the overhead taken off
    for (c, t), (_, ratio) in zip(shm_times, fitted["shm"]):
        assert ratio == pytest.approx(t / predict("shm", N, c, alpha=a, beta=b, gamma=g))
    entry = dict(nranks=N, alpha=a, beta=b, gamma=g, overhead=o, corrections=fitted)
    params = model.load_params(model.save_params(model.merge_calibration(None, entry),
                                                 tmp_path / "c.json"))
    for c, t in shm_times:  # at the measured sizes the price is the measured time
        assert model.explain(N, c, "float32", params)["shm"] == pytest.approx(t)
    for c, t in ring_times:
        assert model.explain(N, c, "float32", params)["ring"] == pytest.approx(t)


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
    assert mid == pytest.approx(2.5e-10)  # halfway in log(bytes) between 1 and 4 MiB


@pytest.mark.parametrize("alpha, beta, gamma", [(2e-5, 1e-9, 1e-10), (5e-6, 1e-10, 1e-10),
                                                (5e-5, 5e-10, 2e-10)])
def test_between_measured_sizes_near_each_other_the_price_follows_the_measured_times(
        alpha, beta, gamma):
    """shm measured at 4 KiB and 64 KiB at 8 ranks (55.7 and 87.9 us, a first-use
    measurement of the 2-core VM): between them its price rises from one time to the
    other, whatever the α-β-γ cost's shape there (its steps change above 4 KiB, and the
    4 KiB point's ratio times the cost just above came out above the 64 KiB time)."""
    from pycollective.model.choice import calibrated_times, measured_ratio
    from pycollective.model.params import _clean
    f32 = np.dtype(np.float32)
    flat = model.params_for(_clean({"by_nranks": {"8": dict(nranks=8, alpha=alpha, beta=beta,
                                                            gamma=gamma, overhead=0.0)},
                                    "alpha": alpha, "beta": beta, "gamma": gamma}, "test"), 8)
    t0, t1 = 55.7e-6, 87.9e-6
    curve = [[4096.0, measured_ratio("shm", t0, 8, 1024, f32, flat, 0.0)],
             [65536.0, measured_ratio("shm", t1, 8, 16384, f32, flat, 0.0)]]
    flat = dict(flat, corrections={"shm": curve})
    prices = [calibrated_times(8, c, f32, flat)["shm"] for c in (1024, 1100, 4000, 10000, 16383,
                                                               16384)]
    assert prices[0] == pytest.approx(t0) and prices[-1] == pytest.approx(t1)
    assert all(a <= b for a, b in zip(prices, prices[1:])), prices
    # log-log between the two: 16 KB is half way in log
    assert calibrated_times(8, 2048 * 2, f32, flat)["shm"] == pytest.approx(
        t0 * (t1 / t0) ** 0.5, rel=1e-6)
