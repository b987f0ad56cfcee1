"""pycollective.timeline from the outside: PYCOLLECTIVE_TIMELINE, jobs that end with an
exception, the summary CLI, and what the recorder costs on the repeated-call fast path."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 120

JOB = """
import sys
import numpy as np
from mpi4py import MPI
import pycollective
comm = MPI.COMM_WORLD
x = np.ones(1000, np.float32)
how = sys.argv[1]
for step in range(5):
    if how == "one" and comm.rank == 1 and step == 4:  # rank 0 waits in call 5 meanwhile
        raise RuntimeError("the job ends here")
    pycollective.allreduce(MPI.IN_PLACE, x, algorithm="ring")
if how == "all":
    raise RuntimeError("the job ends here")
"""


def _launch(tmp_path, nranks, how, extra_env=None):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    trace = tmp_path / "trace.json"
    env = dict(os.environ, PYTHON=sys.executable, PYCOLLECTIVE_TIMEOUT=str(LIMIT),
               PYCOLLECTIVE_TIMELINE=str(trace), PYTHONPATH=str(ROOT / "src"))
    env.update(extra_env or {})
    proc = subprocess.run([str(ROOT / "scripts" / "run_mpi.sh"), str(nranks), str(script), how],
                          cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=LIMIT + 30)
    return proc, trace


def _calls(doc):
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "call"]


def test_environment_variable_records_a_whole_job(tmp_path):
    proc, trace = _launch(tmp_path, 3, "none")
    assert proc.returncode == 0, proc.stderr[-5000:]
    doc = json.loads(trace.read_text())
    calls = _calls(doc)
    assert sorted({e["pid"] for e in calls}) == [0, 1, 2]
    assert all(sum(e["pid"] == r for e in calls) == 5 for r in range(3))
    assert not list(tmp_path.glob("trace.json.rank*"))


def test_a_job_ending_with_an_exception_on_every_rank_keeps_its_last_calls(tmp_path):
    proc, trace = _launch(tmp_path, 3, "all")
    assert proc.returncode != 0 and "the job ends here" in proc.stderr
    if not trace.exists():  # the gather at exit lost the race with MPI_Abort: the parts
        subprocess.run([sys.executable, "-m", "pycollective.timeline", "merge", str(trace)],
                       env=dict(os.environ, PYTHONPATH=str(ROOT / "src")), check=True,
                       capture_output=True, timeout=LIMIT)
    calls = _calls(json.loads(trace.read_text()))
    for r in range(3):
        assert max(e["args"]["number"] for e in calls if e["pid"] == r) == 5


def test_a_job_ending_with_an_exception_on_one_rank_keeps_that_ranks_calls(tmp_path):
    proc, trace = _launch(tmp_path, 2, "one")
    assert proc.returncode != 0
    part = Path(f"{trace}.rank1.json")  # rank 0, waiting in a collective, wrote nothing
    assert part.exists() and not trace.exists(), proc.stderr[-5000:]
    calls = _calls(json.loads(part.read_text()))
    assert [e["args"]["number"] for e in calls] == [1, 2, 3, 4]
    out = subprocess.run([sys.executable, "-m", "pycollective.timeline", "merge", str(trace)],
                         env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
                         capture_output=True, text=True, timeout=LIMIT)
    assert out.returncode == 0, out.stderr
    # (the job's PYCOLLECTIVE_TIMELINE still set: the summary must not write over the trace)
    before = trace.read_bytes()
    summary = subprocess.run([sys.executable, "-m", "pycollective.timeline", "summary",
                              str(trace)], env=dict(os.environ, PYTHONPATH=str(ROOT / "src"),
                                                    PYCOLLECTIVE_TIMELINE=str(trace)),
                             capture_output=True, text=True, timeout=LIMIT)
    assert summary.returncode == 0, summary.stderr
    assert trace.read_bytes() == before
    assert any(line.split()[:3] == ["allreduce", "ring", "4"]
               for line in summary.stdout.splitlines()), summary.stdout


def test_the_recorder_is_free_when_off_on_the_fast_path(tmp_path):
    """The benchmark (``python -m pycollective.timeline.overhead``) times the fast path's
    calls with the recorder off and on, interleaved, and what its off test costs."""
    out = tmp_path / "overhead.json"
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(ROOT / "src"),
               PYCOLLECTIVE_TIMEOUT=str(LIMIT))
    env.pop("PYCOLLECTIVE_TIMELINE", None)
    proc = subprocess.run([str(ROOT / "scripts" / "run_mpi.sh"), "2", "-m",
                           "pycollective.timeline.overhead", "--rounds", "5", "--calls", "200",
                           "--json", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=LIMIT + 30)
    assert proc.returncode == 0, proc.stderr[-5000:]
    rows = json.loads(out.read_text())
    assert {r["algorithm"] for r in rows} == {"shm", "ring"}
    for r in rows:
        # What the off recorder adds to a call (its tests of ACTIVE) is below the
        # call's own round-to-round spread: within noise.
        assert r["off_check_us"] < r["spread_us"], r
        assert r["on_us"] > 0 and r["off_us"] > 0


@pytest.mark.parametrize("argv", [["summary"], ["nothing"]])
def test_cli_usage_errors(argv):
    proc = subprocess.run([sys.executable, "-m", "pycollective.timeline", *argv],
                          env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
                          capture_output=True, text=True, timeout=LIMIT)
    assert proc.returncode == 2 and "usage" in proc.stderr


def test_the_ring_buffer_keeps_the_last_calls_and_counts_the_rest():
    from pycollective.timeline._recorder import MAX_PHASES, Recorder
    recorder = Recorder(3)

    def call(i, fail=False):
        recorder.about(number=i)
        recorder.open("agreement")
        recorder.open("wait")
        if fail:
            raise RuntimeError("broken off")  # both phases still open
        recorder.close()
        recorder.close()

    for i in range(1, 6):
        recorder.traced(call, "allreduce", (i,))
    with pytest.raises(RuntimeError):
        recorder.traced(call, "allreduce", (6, True))
    (_, _, calls, _, recorded), = recorder.snapshot()
    assert recorded == 6 and [c[3]["number"] for c in calls] == [4, 5, 6]
    t0, t1, _, info, phases, _, _ = calls[-1]
    assert info["error"] == "RuntimeError: broken off"
    # the phases an exception went through end with the call, nested as opened
    assert sorted((p[2], p[4]) for p in phases) == [("agreement", 1), ("wait", 2)]
    assert all(t0 <= p[0] <= p[1] <= t1 for p in phases)
    # A call's phases are bounded too: the rest are counted (none join: a gap between)
    many = Recorder(1)

    def busy():
        for i in range(MAX_PHASES + 10):
            many.open(f"step {i}")
            many.close()

    many.traced(busy, "allreduce", ())
    (_, _, [(_, _, _, _, phases, _, dropped)], _, _), = many.snapshot()
    assert len(phases) == MAX_PHASES and dropped == 10
    # outside a recorded call, hooks do nothing
    many.open("wait")
    many.close()
    assert len(many.snapshot()[0][2]) == 1
