"""Serial tests of the benchmark's command line: commands, conventions, paths, JSON schema.

The commands run here on ``MPI.COMM_SELF`` (one rank, tiny sizes); their
multi-rank behaviour is tested in ``tests/mpi/bench/test_bench_commands.py``.
"""

import io
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective.runtime import env as _env
from pycollective import bench
from pycollective.bench import _allreduce, _cli, _report, _schema

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["--iters", "2", "--warmup", "1"]

# One quick invocation of every command (one rank: the shm profiles skip).
TINY = {
    "allreduce": ["ring", "tree", "--mincount", "1", "--maxcount", "10", "-f", "10"] + QUICK,
    "env": [],
    "membw": ["--bytes", "64K", "--reps", "2", "--M", "1000"],
    "latency": ["ring", "shm", "--M", "1", "10", "--inner", "3"] + QUICK,
    "segments": ["--M", "100", "--segments", "64", "1K"] + QUICK,
    "breakdown": ["--M", "2000", "--reps", "2"],
    "compress": ["--M", "1000", "--reps", "2"],
}


def run(argv):
    """bench.main on one rank; returns (rows, report, printed text)."""
    out = io.StringIO()
    rows, report = bench.main(argv, comm=MPI.COMM_SELF, out=out)
    return rows, report, out.getvalue()


# --- commands -----------------------------------------------------------------

def test_every_command_is_tried_here():
    assert set(TINY) == set(bench.COMMANDS)


def test_the_first_argument_picks_the_command():
    assert _cli._split(["ring", "--M", "1e8"]) == ("allreduce", ["ring", "--M", "1e8"])
    assert _cli._split(["all", "--minbytes", "4"]) == ("allreduce", ["all", "--minbytes", "4"])
    assert _cli._split([]) == ("allreduce", [])
    assert _cli._split(["--M", "10"]) == ("allreduce", ["--M", "10"])
    assert _cli._split(["membw", "--reps", "2"]) == ("membw", ["--reps", "2"])
    assert _cli._split(["allreduce", "ring"]) == ("allreduce", ["ring"])


def test_command_names_are_not_algorithm_names():
    """Otherwise `bench NAME` could not say which one it means."""
    assert not set(bench.COMMANDS) & set(pycollective.algorithms() + ["auto", "all"])


def test_a_command_name_is_registered_once():
    with pytest.raises(ValueError, match="already registered"):
        _cli.command("membw", "again", options=lambda p: None)(lambda args, s: [])


@pytest.mark.parametrize("name", sorted(TINY))
def test_help_of_every_command(name, capsys):
    argv = ([] if name == "allreduce" else [name]) + ["--help"]
    with pytest.raises(SystemExit) as info:
        bench.main(argv, comm=MPI.COMM_SELF)
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert "--json" in text and "--progress" in text and "--no-progress" in text
    others = [n for n in bench.COMMANDS if n != name]
    assert all(n in text for n in others)  # every help lists the other commands


@pytest.mark.parametrize("argv", [
    ["membw", "--bytes", "0"], ["membw", "--reps", "0"], ["membw", "--bytes", "lots"],
    ["latency", "--inner", "0"], ["latency", "nosuch"], ["latency", "--M"],
    ["latency", "--agree", "maybe"], ["latency", "--piece-time", "0"],
    ["latency", "--dtype", "float16", "--op", "sum"],        # no exact data at 4096 ranks
    ["segments", "--segments", "0"], ["segments", "--M", "-1"],
    ["breakdown", "--M", "10"],                               # below the sliced paths
    ["breakdown", "--reps", "0"], ["env", "--nosuch"],
    ["ring", "--progress", "--no-progress"],
])
def test_bad_arguments_of_every_command_exit_2(argv):
    name, rest = _cli._split(argv)
    with pytest.raises(SystemExit) as info:
        _cli.parse(name, rest, 4096)
    assert info.value.code == 2


def test_latency_arguments():
    args = _cli.parse("latency", [], 4)
    assert args.algorithms == pycollective.algorithms() and args.M == [1, 1000]
    assert args.inner == 100 and args.agree == "on" and not args.no_pieces
    args = _cli.parse("latency", ["shm", "ring", "--M", "1e3", "--inner", "2e2"], 4)
    assert args.algorithms == ["shm", "ring"] and args.M == [1000] and args.inner == 200


def test_segments_arguments():
    args = _cli.parse("segments", ["--segments", "64K", "1M", "64K"], 4)
    assert args.segments == [65536, 1 << 20] and args.M == [10 ** 7]


# --- files judged before the run --------------------------------------------------

@pytest.mark.parametrize("where", ["missing/dir/out.json", "a_directory", "a_file/out.json"])
@pytest.mark.parametrize("option", ["--json", "--plot"])
def test_an_unwritable_output_is_refused_before_the_run(tmp_path, where, option, capsys):
    (tmp_path / "a_directory").mkdir()
    (tmp_path / "a_file").write_text("x")
    path = str(tmp_path / where)
    with pytest.raises(SystemExit) as info:
        bench.main(["ring", "--M", "10", option, path] + QUICK, comm=MPI.COMM_SELF)
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert option in captured.err and captured.out == ""  # refused before the header
    assert sorted(os.listdir(tmp_path)) == ["a_directory", "a_file"]


def test_an_output_on_a_filesystem_that_refuses_it():
    # /proc refuses new files even to root, so this holds wherever the tests run.
    assert "cannot write" in _cli.output_problem("/proc/self/pycollective-bench.json")


def test_a_good_output_is_left_as_it_was(tmp_path):
    fresh, kept = tmp_path / "new.json", tmp_path / "old.json"
    kept.write_text("keep me")
    assert _cli.output_problem(fresh) is None and not fresh.exists()
    assert _cli.output_problem(kept) is None and kept.read_text() == "keep me"


def test_params_must_be_a_calibration(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for path in (bad, tmp_path / "missing.json"):
        with pytest.raises(SystemExit) as info:
            _allreduce.parse_args(["ring", "--params", str(path)], 4)
        assert info.value.code == 2


def test_files_are_judged_by_rank_0_and_the_verdict_broadcast(monkeypatch, tmp_path):
    """With a communicator, only rank 0 looks at the files; every rank gets its verdict."""
    seen = []

    class Comm:  # rank 1 of 2: must not judge, must take rank 0's word
        def Get_rank(self):
            return 1

        def Get_size(self):
            return 2

        def bcast(self, value, root):
            seen.append((value, root))
            return "--json: directory /somewhere does not exist"

    with pytest.raises(SystemExit) as info:
        _cli.parse("membw", ["--json", str(tmp_path / "fine.json")], 2, comm=Comm())
    assert info.value.code == 2
    assert seen == [(None, 0)]


# --- output conventions ---------------------------------------------------------

def _lines_follow_the_convention(text):
    """Every line is a comment (``#``), a table's data line (indented) or empty."""
    bad = [ln for ln in text.splitlines() if ln and not ln.startswith(("#", "  "))]
    assert not bad, bad


@pytest.mark.parametrize("name", sorted(TINY))
def test_every_command_prints_comments_and_tables(name):
    rows, report, text = run([name] + TINY[name])
    lines = text.splitlines()
    assert lines[0] == "# python -m pycollective.bench " + " ".join([name] + TINY[name])
    assert MPI.Get_library_version().split()[0] in lines[1]  # the MPI library, named
    assert report["environment"]["mpi_library"] in lines[1]
    _lines_follow_the_convention(text)
    starts = [i for i in range(1, len(lines)) if lines[i].startswith("  ")
              and not lines[i - 1].startswith("  ")]
    assert starts or name == "breakdown"  # on one rank there is nothing to break down
    for i in starts:
        assert lines[i - 1].startswith("# "), lines[i - 1]  # a table's header is a comment


def test_quick_start_command_is_the_allreduce_command():
    """The README's `bench ring --M 1e8` is the allreduce command (here at 1e3)."""
    rows, report, text = run(["ring", "--M", "1e3"] + QUICK)
    assert report["command"] == "allreduce"
    assert [r["name"] for r in rows] == ["native", "ring"] and rows[1]["count"] == 1000
    assert "\n  " in text and "ring" in text


def test_quiet_prints_nothing():
    assert run(["ring", "--M", "10", "--quiet"] + QUICK)[2] == ""


def test_tables_have_comment_headers():
    row = {"name": "ring", "nranks": 2, "count": 3, "dtype": "float32", "op": "sum",
           "inplace": False, "iters": 1, "time": 1e-3, "algbw": 1.0, "busbw": 1.0,
           "native_time": 1e-3, "native_busbw": 1.0, "ratio": 1.0, "wrong": 0, "maxerr": 0.0,
           "identical": True, "input_intact": True, "bytes": 12}
    head, data = _report.single_table([row]).splitlines()
    assert head.startswith("# algorithm") and data.startswith("  ")
    text = _report.sweep_tables([dict(row, name="native"), row], ["ring"], [False])
    _lines_follow_the_convention(text)


@pytest.mark.parametrize("forced, tty, shown", [
    (True, False, True), (None, True, True), (None, False, False), (False, True, False)])
def test_progress_rule(monkeypatch, forced, tty, shown):
    """--progress forces the bar, --no-progress removes it, else: is stderr a terminal?"""
    class Stream(io.StringIO):
        def isatty(self):
            return tty

    stream = Stream()
    monkeypatch.setattr(_cli.sys, "stderr", stream)
    args = _cli.parse("membw", {True: ["--progress"], False: ["--no-progress"],
                                None: []}[forced], 2)
    session = _cli.Session(MPI.COMM_SELF, args, io.StringIO(), verbose=True)
    bar = session.progress(3)
    for k in range(3):
        bar.step(str(k))
    assert bool(stream.getvalue()) == shown


def test_a_closed_stdout_ends_the_run_quietly():
    """`| head` that has gone: no BrokenPipeError traceback, the death of a Unix filter."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.Popen([sys.executable, "-m", "pycollective.bench", "ring", "--M", "10",
                             "--iters", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, cwd=ROOT)
    proc.stdout.close()  # before the first line is written
    err = proc.stderr.read().decode()
    status = proc.wait(timeout=120)
    # Started without mpiexec, MPICH names its segment after the pid; the
    # bench finalizes MPI before it dies, so nothing may be left behind.
    left = list(Path("/dev/shm").glob(f"mpich_shm_{proc.pid:x}_*"))
    for path in left:
        path.unlink(missing_ok=True)
    assert not left, f"left in /dev/shm: {left}"
    assert status == -signal.SIGPIPE, err
    assert "Traceback" not in err and "BrokenPipeError" not in err


# --- JSON ---------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(TINY))
def test_json_of_every_command_follows_the_schema(name, tmp_path):
    path = tmp_path / "out.json"
    rows, report, _ = run([name] + TINY[name] + ["--json", str(path)])
    data = json.loads(path.read_text())  # strict JSON: no NaN or Infinity
    assert data["schema_version"] == bench.SCHEMA_VERSION and data["command"] == name
    assert len(data["measurements"]) == len(rows)
    assert bench.validate(data) == []
    assert set(report) == set(data) - {"measurements"}


def test_schema_names_every_command_and_this_version():
    schema = bench.load_schema()
    assert sorted(schema["properties"]["command"]["enum"]) == sorted(bench.COMMANDS)
    assert schema["properties"]["schema_version"]["const"] == bench.SCHEMA_VERSION
    consts = sorted(b["properties"]["command"]["const"] for b in schema["oneOf"])
    assert consts == sorted(bench.COMMANDS)


def _document():
    rows, report, _ = run(["latency", "ring", "--M", "1", "--inner", "2"] + QUICK)
    return json.loads(json.dumps(_cli._jsonable(dict(report, measurements=rows))))


def test_validator_finds_what_is_wrong():
    doc = _document()
    assert bench.validate(doc) == []
    broken = json.loads(json.dumps(doc))
    del broken["environment"]["mpi_library"]
    broken["schema_version"] = 2
    broken["measurements"][0]["wrong"] = -1
    broken["measurements"][1]["inner"] = "3"
    problems = bench.validate(broken)
    assert any("missing 'mpi_library'" in p for p in problems)
    assert any("$.schema_version" in p for p in problems)
    assert any("measurements[0]" in p for p in problems)
    assert any("measurements[1]" in p for p in problems)
    other = json.loads(json.dumps(doc))
    other["command"] = "membw"  # latency rows are not membw rows
    assert any("oneOf" in p for p in bench.validate(other))


def test_validator_refuses_keywords_it_does_not_know():
    with pytest.raises(ValueError, match="patternProperties"):
        bench.validate({}, {"type": "object", "patternProperties": {}})
    # every keyword of the shipped schema is one it knows
    def keywords(node):
        if isinstance(node, dict):
            yield from (k for k in node if k not in ("properties", "$defs"))
            for k, v in node.items():
                if k in ("properties", "$defs"):
                    for sub in v.values():
                        yield from keywords(sub)
                elif isinstance(v, (dict, list)):
                    yield from keywords(v)
        elif isinstance(node, list):
            for v in node:
                yield from keywords(v)
    assert set(keywords(bench.load_schema())) <= _schema.KEYWORDS


def test_json_values_are_plain():
    got = _cli._jsonable({"a": np.float32(1.5), "b": float("nan"), "c": [np.int64(3), math.inf],
                          "d": np.dtype("float32"), 4: None})
    assert got == {"a": 1.5, "b": None, "c": [3, None], "d": "float32", "4": None}


def test_env_lists_every_setting():
    rows, _, text = run(["env"])
    assert [r["name"] for r in rows] == list(_env.SETTINGS)
    for name in _env.SETTINGS:
        assert name in text


def test_membw_rows():
    rows, report, text = run(["membw"] + TINY["membw"])
    assert [r["name"] for r in rows] == ["together", "alone"]
    for r in rows:
        assert r["time"] > 0 and r["traffic"] == pytest.approx(2 * 65536 / r["time"] / 1e9)
    assert "allreduce floor, M=1000" in text


def test_sweep_report_refuses_a_newer_schema(tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("report", ROOT / "benchmarks" / "report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    (tmp_path / "sweep_N2.json").write_text(json.dumps(
        {"schema_version": report.SCHEMA_VERSION + 1, "command": "allreduce"}))
    with pytest.raises(SystemExit, match="schema version"):
        report.build(str(tmp_path))
    assert report.SCHEMA_VERSION == bench.SCHEMA_VERSION
