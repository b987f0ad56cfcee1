"""Serial tests of the benchmark: argument parsing, bandwidth arithmetic, exact data, checks."""

import itertools
import random

import numpy as np
import pytest

from pycollective.bench import _exact
from pycollective.runtime import registry as _registry
from pycollective import bench
from pycollective.bench._exact import compare, exact_values
from pycollective.data.kernels import SUPPORTED_DTYPES
from pycollective.bench._table import fmt_num, format_table
from pycollective.bench._units import parse_count, parse_size
from pycollective.bench import _cli, _harness, _report

OPS = ["sum", "prod", "max", "min"]


# --- counts and sizes ---------------------------------------------------------

@pytest.mark.parametrize("text, value", [
    ("1e8", 100_000_000), ("100000000", 100_000_000), ("0", 0), ("1", 1), ("2.5e3", 2500),
    ("1_000", 1000), (" 7 ", 7), ("1E6", 1_000_000), ("123456789012345678", 123456789012345678),
    (42, 42),
])
def test_parse_count(text, value):
    assert parse_count(text) == value
    assert isinstance(parse_count(text), int)


@pytest.mark.parametrize("text", ["-1", "1.5", "abc", "", "inf", "nan", "1e-3", "-1e8", "1e8x"])
def test_parse_count_rejects(text):
    with pytest.raises(ValueError):
        parse_count(text)


@pytest.mark.parametrize("text, value", [
    ("4", 4), ("1e6", 1_000_000), ("64K", 65536), ("1M", 1 << 20), ("1G", 1 << 30),
    ("0.5K", 512), ("8B", 8), ("2kb", 2048),
])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["1.3", "-4", "xK", "1.0001K", "K", ""])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        parse_size(text)


@pytest.mark.parametrize("lo, hi, f, want", [
    (1, 10 ** 8, 10, [10 ** k for k in range(9)]),
    (0, 8, 2, [0, 1, 2, 4, 8]),
    (3, 10, 2, [3, 6, 10]),
    (5, 5, 2, [5]),
    (1, 4, 1.1, [1, 2, 3, 4]),
])
def test_sweep_counts(lo, hi, f, want):
    assert bench.sweep_counts(lo, hi, f) == want


# --- argument parsing ---------------------------------------------------------

def parse(*argv, nranks=4):
    return bench.parse_args(list(argv), nranks)


def test_single_size_defaults():
    args = parse("ring", "--M", "1e8")
    assert args.algorithms == ["ring"] and args.counts == [100_000_000]
    assert args.modes == [False] and not args.sweep
    assert args.dtype == "float32" and args.op == "sum"


def test_all_expands_to_registry_without_duplicates():
    assert parse("all").algorithms == _registry.names()
    assert parse().algorithms == _registry.names()
    assert parse("tree", "all", "tree").algorithms == ["tree"] + [
        n for n in _registry.names() if n != "tree"]


def test_choices_follow_the_registry():
    """A newly registered algorithm is a valid choice without touching the bench."""
    name = "zz_test_only"
    assert name not in _registry.names()
    with pytest.raises(SystemExit):
        parse(name)
    _registry.register(name, lambda ctx, src, dst, kernel: None, "test only")
    try:
        assert parse(name).algorithms == [name]
        assert name in parse("all").algorithms
    finally:
        _registry.unregister(name)
    with pytest.raises(SystemExit):
        parse(name)


def test_inplace_and_modes():
    assert parse("ring", "--inplace").modes == [True]
    assert parse("ring", "--mode", "both").modes == [False, True]
    assert parse("ring", "--mincount", "1", "--maxcount", "8").modes == [False, True]
    assert parse("ring", "--mincount", "1", "--maxcount", "8", "--inplace").modes == [True]


def test_sweep_arguments():
    args = parse("all", "--minbytes", "4", "--maxbytes", "4e8", "--stepfactor", "10")
    assert args.sweep and args.counts == [10 ** k for k in range(9)]
    args = parse("ring", "-b", "8", "-e", "1K", "-f", "2", "--dtype", "float64")
    assert args.counts == [1, 2, 4, 8, 16, 32, 64, 128]
    args = parse("ring", "--mincount", "0", "--maxcount", "1e3", "-f", "10")
    assert args.counts == [0, 1, 10, 100, 1000]


@pytest.mark.parametrize("argv", [
    ["ring", "--M", "-5"], ["ring", "--M", "1.5"], ["ring", "--M", "lots"],
    ["nosuch", "--M", "10"], ["ring", "--dtype", "complex64"], ["ring", "--dtype", "bool"],
    ["ring", "--op", "band"], ["ring", "--iters", "0"], ["ring", "--warmup", "-1"],
    ["ring", "--stepfactor", "1"], ["ring", "--stepfactor", "nan"],
    ["ring", "--minbytes", "6"],                              # not a multiple of 4
    ["ring", "--minbytes", "1K", "--maxbytes", "8"],          # min above max
    ["ring", "--M", "10", "--maxcount", "100"],               # one size and a sweep
    ["ring", "--minbytes", "4", "--maxcount", "100"],         # bytes and counts
    ["ring", "--budget", "0"],
])
def test_bad_arguments_exit_2(argv):
    with pytest.raises(SystemExit) as info:
        parse(*argv)
    assert info.value.code == 2


def test_no_exact_data_is_an_argument_error():
    with pytest.raises(SystemExit) as info:
        parse("ring", "--dtype", "float16", "--op", "sum", nranks=4096)
    assert info.value.code == 2
    parse("ring", "--dtype", "float16", "--op", "max", nranks=4096)  # max is exact at any N


def test_help_explains_every_column(capsys):
    with pytest.raises(SystemExit) as info:
        parse("--help")
    assert info.value.code == 0
    text = capsys.readouterr().out
    table_rows = [{"name": "ring", "nranks": 2, "count": 3, "dtype": "float32", "op": "sum",
                   "inplace": False, "iters": 1, "time": 1e-3, "algbw": 1.0, "busbw": 1.0,
                   "native_time": 1e-3, "native_busbw": 1.0, "ratio": 1.0, "pred": 1e-3,
                   "wrong": 0, "maxerr": 0.0, "identical": True, "input_intact": True}]
    header = _report.single_table(table_rows).splitlines()[0].split()
    for column in header:
        assert column in text, column
    for word in ("tolerance is 0", "max", "median", "2(N-1)/N", "auto score", "exit status"):
        assert word in text


# --- bandwidth arithmetic ----------------------------------------------------

def test_algbw_busbw():
    assert _harness.algbw(4e8, 1.0) == pytest.approx(0.4)
    assert _harness.algbw(1000, 1e-6) == pytest.approx(1.0)
    factor = bench.ALLREDUCE.busbw_factor(8)
    assert factor == pytest.approx(1.75)
    assert _harness.busbw(4e8, 2.0, factor) == pytest.approx(0.2 * 1.75)
    assert bench.ALLREDUCE.busbw_factor(2) == pytest.approx(1.0)
    assert bench.ALLREDUCE.busbw_factor(1) == 0.0
    assert bench.ALLREDUCE.nbytes(10, 4) == 40
    assert np.isnan(_harness.algbw(8, 0.0))


# --- exact data --------------------------------------------------------------

def _reduce_in_order(arrays, op, order):
    """Reduce ``arrays`` in the dtype, left to right in ``order`` (numpy wraps integers)."""
    ufunc = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    acc = arrays[order[0]].copy()
    with np.errstate(over="ignore"):
        for q in order[1:]:
            ufunc(acc, arrays[q], out=acc)
    return acc


def _reduce_tree(arrays, op):
    ufunc = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    level = [a.copy() for a in arrays]
    with np.errstate(over="ignore"):
        while len(level) > 1:
            level = [ufunc(level[i], level[i + 1]) if i + 1 < len(level) else level[i]
                     for i in range(0, len(level), 2)]
    return level[0]


def _exact_python(arrays, op, dtype):
    """The mathematically exact reduction, computed with Python integers."""
    cols = zip(*[a.astype(object) if a.dtype.kind != "f" else a.astype(np.int64).astype(object)
                 for a in arrays])
    if op == "sum":
        vals = [sum(c) for c in cols]
    elif op == "prod":
        vals = [np.prod(c) for c in cols]
    else:
        vals = [(max if op == "max" else min)(c) for c in cols]
    if dtype.kind in "iu":
        bits = 8 * dtype.itemsize
        vals = [int(v) % (1 << bits) for v in vals]
        if dtype.kind == "i":
            vals = [v - (1 << bits) if v >= 1 << (bits - 1) else v for v in vals]
    return np.array(vals, dtype=np.float64 if dtype.kind == "f" else object)


@pytest.mark.parametrize("dtype", [d.name for d in SUPPORTED_DTYPES])
@pytest.mark.parametrize("op", OPS)
def test_exact_data_reduce_exactly_in_any_order(dtype, op):
    """For N = 1..8, every reduction order gives the same bits, equal to the exact value."""
    dtype = np.dtype(dtype)
    rng = random.Random(1)
    start, stop = 98_765, 98_765 + 1500
    for n in range(1, 9):
        arrays = [exact_values(start, stop, r, n, dtype, op) for r in range(n)]
        assert all(a.dtype == dtype and a.size == stop - start for a in arrays)
        exact = _exact_python(arrays, op, dtype)
        orders = [list(range(n)), list(range(n))[::-1]]
        orders += [rng.sample(range(n), n) for _ in range(3)]
        results = [_reduce_in_order(arrays, op, o) for o in orders] + [_reduce_tree(arrays, op)]
        for res in results:
            assert np.array_equal(_exact._bits(res), _exact._bits(results[0])), (n, op, dtype)
        if dtype.kind == "f":
            assert np.all(np.isfinite(results[0]))
            assert np.array_equal(results[0].astype(np.float64), exact), (n, op, dtype)
        else:
            assert [int(x) for x in results[0]] == list(exact), (n, op, dtype)


@pytest.mark.parametrize("dtype", [d.name for d in SUPPORTED_DTYPES])
@pytest.mark.parametrize("op", OPS)
def test_exact_data_depend_on_rank_and_index(dtype, op):
    """Never all ones: values vary along the vector and between ranks, with no short period."""
    n = 8
    arrays = [exact_values(0, 4096, r, n, dtype, op) for r in range(n)]
    for a in arrays:
        assert len(np.unique(a)) >= 3
    for a, b in itertools.combinations(arrays, 2):
        assert not np.array_equal(a, b)
    a = arrays[3]
    for shift in (1, 5, 7, 64, 513, 1000):  # a chunk misplaced by `shift` would show
        assert not np.array_equal(a[shift:], a[:-shift])


def test_exact_data_blocks_agree(monkeypatch):
    full = exact_values(0, 1000, 2, 4, "float32", "sum")
    monkeypatch.setattr(_exact, "BLOCK", 64)
    buf = np.empty(1000, np.float32)
    _exact.fill_exact(buf, 2, 4, "sum")
    assert np.array_equal(buf, full)
    assert np.array_equal(exact_values(500, 1000, 2, 4, "float32", "sum"), full[500:])


def test_exact_data_impossible():
    with pytest.raises(ValueError, match="float16"):
        exact_values(0, 10, 0, 4096, "float16", "sum")


# --- checking ---------------------------------------------------------------

def test_compare_counts_bitwise_differences():
    want = np.arange(10, dtype=np.float32)
    got = want.copy()
    assert compare(got, want) == (0, 0.0)
    got[3] += 2
    got[7] = np.nan
    wrong, err = compare(got, want)
    assert wrong == 2 and err == np.inf
    z = np.zeros(3, np.float64)
    assert compare(-z, z)[0] == 3  # -0.0 is not bit-for-bit 0.0
    i = np.array([1, 2, 3], np.int64)
    assert compare(i + np.array([0, 0, -5]), i) == (1, 5.0)


def test_compare_in_blocks(monkeypatch):
    monkeypatch.setattr(_exact, "BLOCK", 7)
    want = np.arange(100, dtype=np.int32)
    got = want.copy()
    got[[0, 6, 7, 99]] = -1
    assert compare(got, want) == (4, 100.0)


def test_failures_and_auto_score():
    def row(name, t, count=10, **kw):
        r = dict(name=name, nranks=4, count=count, dtype="float32", op="sum", inplace=False,
                 time=t, wrong=0, identical=True, input_intact=True, auto="ring")
        r.update(kw)
        return r

    rows = [row("native", 1.0), row("ring", 1.05), row("tree", 1.0),
            row("ring", 2.0, count=20), row("tree", 1.0, count=20)]
    score = bench.auto_score(rows, ["ring", "tree"])
    assert score["scored"] == 2 and score["hits"] == 1 and score["score"] == 0.5
    hit = {p["count"]: p["hit"] for p in score["points"]}
    assert hit == {10: True, 20: False}
    assert bench.failures(rows) == []
    assert bench.failures([row("ring", 1.0, wrong=3)])
    assert bench.failures([row("ring", 1.0, identical=False)])
    assert bench.failures([row("ring", 1.0, input_intact=False)])


def test_format_helpers():
    assert fmt_num(0.123456) == "0.123"
    assert fmt_num(12345.6) == "12346"
    assert fmt_num(float("inf")) == "inf"
    assert fmt_num(0) == "0"
    table = format_table([("a", str), ("bb", lambda x: str(x * 10))], [1, 22])
    assert table.splitlines() == [" a   bb", " 1   10", "22  220"]


def test_sweep_report(tmp_path):
    """benchmarks/report.py renders the auto score and marks fastest, choice and failures."""
    import importlib.util
    import json
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "report", Path(__file__).parents[2] / "benchmarks" / "report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)

    def row(name, count, t, inplace=False, wrong=0):
        return dict(name=name, nranks=4, count=count, bytes=4 * count, dtype="float32", op="sum",
                    inplace=inplace, time=t, wrong=wrong, identical=True, input_intact=True,
                    auto="tree")
    rows = [row("native", 10, 1e-5), row("ring", 10, 3e-5), row("tree", 10, 2e-5),
            row("native", 1000, 1e-4), row("ring", 1000, 2e-4, wrong=5), row("tree", 1000, 3e-4)]
    env = dict(time_utc="2026-01-01T00:00:00Z", hostname="h", cpu_count=2, platform="p",
               mpi_library="MPICH Version: 5", mpi_standard="5.0", versions={})
    score = bench.auto_score(rows, ["ring", "tree"])
    (tmp_path / "sweep_N4.json").write_text(json.dumps(dict(
        environment=env, calibration=None, auto_score=score, measurements=rows)))
    text = Path(report.build(str(tmp_path))).read_text()
    assert "**Overall: 1/2 = 50 %.**" in text
    assert "| 10 | 40 | 10.0 | 30.0 | **20.0** † | tree | tree ✓ |" in text
    assert "| 1000 | 4000 | 100 | **200** ✗ | 300 † | ring | tree (1.50×) |" in text
    assert "5 wrong elements" in text


def test_params_file_must_exist(tmp_path):
    with pytest.raises(SystemExit) as info:
        parse("ring", "--params", str(tmp_path / "missing.json"))
    assert info.value.code == 2


class _Stream:
    def __init__(self, tty):
        self.tty, self.text = tty, ""

    def isatty(self):
        return self.tty

    def write(self, s):
        self.text += s

    def flush(self):
        pass


@pytest.mark.parametrize("tty", [True, False])
def test_progress_bar_only_on_a_terminal(monkeypatch, tty):
    stream = _Stream(tty)
    monkeypatch.setattr(_cli.sys, "stderr", stream)
    bar = _cli.Progress(2, enabled=True)
    bar.step("first")
    bar.step("second")
    if tty:
        assert "1/2 first" in stream.text and "2/2 second" in stream.text
        assert "#" * 30 in stream.text and stream.text.endswith("\n")
    else:
        assert stream.text == ""
    before = stream.text
    quiet = _cli.Progress(2, enabled=False)  # ranks other than 0
    quiet.step("x")
    assert stream.text == before
