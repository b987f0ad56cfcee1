"""The lecture's formulas and numbers (pycollective.model.lecture) and the model's CLI."""

import math

import pytest

from pycollective import model
from pycollective.model import lecture_predict, predict
from _cases import EX1, LECTURE_PARAMS, quoted


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
