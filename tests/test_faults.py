"""Fault injection: stalled, dead, absent and disagreeing ranks, misuse, hostile files.

Each test launches a small job (``tests/faults/scenarios.py``) through the
project's launcher with a 3 s collective timeout and checks, from the lines
every rank prints, that every surviving rank raised the documented error
naming the ranks concerned, within a bounded time; and afterwards that no
process of the job remains and nothing the job created is left in /dev/shm
(the files its ranks report, and any other a process of the job held:
``.ci/shm-guard`` watches the launch).
The launcher being stopped from outside is covered by test_run_mpi.py.
docs/troubleshooting.md shows these errors as users see them.
"""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "tests" / "faults" / "scenarios.py"
GUARD = ROOT / ".ci" / "shm-guard"  # fails if files the job created outlive it
P2P = ["ring", "tree", "butterfly", "ps", "naive", "ring_pipelined", "rabenseifner"]
ALL = P2P + ["shm", "hierarchical"]
LINE = re.compile(r"^RESULT (\d+) (\S+) (\S+) ?(.*)$")


def launch(tmp_path, nranks, *args, env=None, limit=120):
    """Run a scenario; return ``(status, {rank: [(label, outcome, text)]}, output, seconds)``."""
    environ = dict(os.environ, PYTHON=sys.executable, PYCOLLECTIVE_TIMEOUT=str(limit),
                   **(env or {}))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(GUARD), "--", str(ROOT / "scripts" / "run_mpi.sh"),
                           str(nranks), str(SCENARIOS), str(tmp_path), *args], env=environ,
                          capture_output=True, text=True, timeout=limit + 60)
    seconds = time.monotonic() - t0
    output = proc.stdout + proc.stderr
    results = {}
    for line in proc.stdout.splitlines():
        found = LINE.match(line.strip())
        if found:
            rank, label, outcome, text = found.groups()
            results.setdefault(int(rank), []).append((label, outcome, text))
    # No process of the job survives the launcher ...
    for pidfile in tmp_path.glob("pid.*"):
        pid = int(pidfile.read_text())
        alive = os.path.exists(f"/proc/{pid}") and "zombie" not in Path(
            f"/proc/{pid}/status").read_text().lower()
        assert not alive, f"rank process {pid} is still alive after the launcher returned"
    # ... and no file the ranks had mapped from /dev/shm is left there (what a
    # concurrent job on a shared machine leaves is not ours to judge).
    mapped = {line.strip() for f in tmp_path.glob("shm.*") for line in f.read_text().split()}
    left = sorted(p for p in mapped if p and os.path.exists(p))
    assert not left, f"left in /dev/shm: {left}"
    # ... nor any other file a process of the job was seen holding (the MPI library's)
    assert "shm-guard" not in proc.stderr, proc.stderr[-3000:]
    return proc.returncode, results, output, seconds


def outcomes(results, label):
    """{rank: (outcome, text)} of one label."""
    return {rank: (o, t) for rank, lines in results.items() for lab, o, t in lines if lab == label}


def seconds_of(results, label):
    return max(float(t) for rank, lines in results.items() for lab, o, t in lines
               if lab == label + ":seconds")


# --- a rank that stops, dies or is elsewhere ---------------------------------------------

def test_a_stopped_rank_is_named_by_every_other_rank(tmp_path):
    algorithms = ["ring", "tree", "shm", "hierarchical", "rabenseifner", "barrier"]
    status, results, output, _ = launch(tmp_path, 4, "stop", ",".join(algorithms))
    assert status == 0, output[-3000:]
    for algo in algorithms:
        got = outcomes(results, f"stop:{algo}")
        assert set(got) == {0, 1, 2, 3}, (algo, output[-3000:])
        for rank, (outcome, text) in got.items():
            assert outcome == "CollectiveTimeout", (algo, rank, text)
            what = "barrier" if algo == "barrier" else "allreduce"
            assert "ranks [2] did not arrive" in text and f"{what} call #2" in text, text
        assert seconds_of(results, f"stop:{algo}") < 3.0 + 5, algo
        # afterwards the communicator is marked broken: later calls raise at once
        again = outcomes(results, f"stop:{algo}:again")
        assert {o for o, _ in again.values()} == {"CommunicatorBroken"}, again


def test_a_rank_stopped_inside_a_call(tmp_path):
    status, results, output, _ = launch(tmp_path, 4, "stop_during", "ring")
    assert status == 0, output[-3000:]
    last = {rank: lines[-1] for rank, lines in results.items()}
    assert set(last) == {0, 1, 2, 3}, output[-3000:]
    for rank, (label, outcome, text) in last.items():
        assert outcome == "CollectiveTimeout" and "ranks [2] did not arrive" in text, text
    assert not any(o == "wrong" for lines in results.values() for _, o, _ in lines)


def test_a_killed_rank_ends_the_job(tmp_path):
    status, results, output, seconds = launch(tmp_path, 4, "kill_during", "ring")
    assert status != 0 and seconds < 30, output[-3000:]
    assert not any(o == "wrong" for lines in results.values() for _, o, _ in lines)


def test_a_rank_that_skips_the_call_is_named(tmp_path):
    status, results, output, _ = launch(tmp_path, 4, "skip", "ring,shm")
    assert status == 0, output[-3000:]
    for algo in ("ring", "shm"):
        got = outcomes(results, f"skip:{algo}")
        assert got[2][0] == "skipped"
        for rank in (0, 1, 3):
            outcome, text = got[rank]
            assert outcome == "CollectiveTimeout" and "ranks [2] did not arrive" in text, text


def test_a_rank_waiting_on_one_still_in_an_earlier_call_names_the_real_culprit(tmp_path):
    status, results, output, _ = launch(tmp_path, 3, "behind")
    assert status == 0, output[-3000:]
    got = outcomes(results, "behind")
    assert set(got) == {0, 1, 2}, output[-3000:]
    outcome, text = got[0]
    assert outcome == "CollectiveTimeout" and "ranks [2] did not arrive" in text, text
    # rank 1 timed out first, in the next call, while rank 0 was late but alive
    outcome, text = got[1]
    assert outcome == "CollectiveTimeout" and "ranks [2] did not arrive" in text, text
    assert "reported by rank 0 in call #2" in text, text
    assert "reported by rank 0" in got[2][1], got[2]  # the victim, back, hears it failed


def test_a_communicators_timeout_reaches_its_nonblocking_calls(tmp_path):
    status, results, output, _ = launch(tmp_path, 3, "comm_timeout_nonblocking")
    assert status == 0, output[-3000:]
    got = outcomes(results, "comm-timeout")
    assert got[1][0] == "skipped", got
    for rank in (0, 2):
        outcome, text = got[rank]
        # (auto may pick shm, whose node barrier cannot tell which of the others is missing)
        assert outcome == "CollectiveTimeout" and re.search(r"after 0\.\d s", text), text
        assert re.search(r"ranks \[[^\]]*\b1\b[^\]]*\] did not arrive", text), text
    # the communicator's 0.5 s, not the process's 3 s
    assert seconds_of(results, "comm-timeout") < 2.5, output[-3000:]


# --- ranks that disagree -------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["count", "dtype", "op"])
def test_disagreement_with_the_check_on_raises_before_data_move(tmp_path, kind):
    status, results, output, _ = launch(tmp_path, 4, "mismatch", kind, "on", "ring,shm,tree")
    assert status == 0, output[-3000:]
    for algo in ("ring", "shm", "tree"):
        got = outcomes(results, f"mismatch-{kind}-on:{algo}")
        assert set(got) == {0, 1, 2, 3}, output[-3000:]
        for outcome, text in got.values():
            assert outcome in ("ValueError", "TypeError") and "disagree" in text, text
        assert seconds_of(results, f"mismatch-{kind}-on:{algo}") < 2.0


@pytest.mark.parametrize("kind", ["count", "dtype", "op"])
def test_disagreement_with_the_check_off_raises_everywhere_never_wrong_data(tmp_path, kind):
    """shm compares every rank's call itself, so the agreement off skips the step there:
    ranks that disagree raise CollectiveMismatch from the headers.  Every other
    algorithm could return wrong data on a rank whose messages happen to fit,
    so for them the agreement runs whatever the setting."""
    status, results, output, _ = launch(tmp_path, 4, "mismatch", kind, "off", ",".join(ALL))
    assert status == 0, output[-3000:]
    for algo in ALL:
        got = outcomes(results, f"mismatch-{kind}-off:{algo}")
        assert set(got) == {0, 1, 2, 3}, (algo, output[-3000:])
        for rank, (outcome, text) in got.items():
            expected = ("CollectiveMismatch", "PeerFailed") if algo == "shm" else (
                "ValueError", "TypeError")
            assert outcome in expected, (algo, rank, outcome, text)
            assert re.search(r"disagree|different", text), (algo, rank, text)
        assert seconds_of(results, f"mismatch-{kind}-off:{algo}") < 2.0, algo


# --- misuse ----------------------------------------------------------------------------------

def test_threads_that_take_turns_on_one_communicator_work(tmp_path):
    status, results, output, _ = launch(tmp_path, 4, "threads_turns", "ring,shm,tree", "on,off")
    assert status == 0, output[-3000:]
    for check in ("on", "off"):
        for algo in ("ring", "shm", "tree"):
            got = outcomes(results, f"threads-turns-{check}:{algo}")
            assert got == {q: ("ok", "0 wrong of 20; []") for q in range(4)}, (algo, got)


@pytest.mark.parametrize("check", ["on", "off"])
def test_two_threads_with_different_calls_raise_never_wrong_data(tmp_path, check):
    status, results, output, _ = launch(tmp_path, 4, "threads", "ring,shm", "20", "differ",
                                        check)
    assert status == 0, output[-3000:]
    for algo in ("ring", "shm"):
        got = outcomes(results, f"threads:{algo}")
        assert set(got) == {0, 1, 2, 3}
        for outcome, text in got.values():
            assert outcome != "wrong" and text.startswith("0 wrong"), text


def test_one_threads_barrier_against_anothers_allreduce_names_the_threads(tmp_path):
    """A barrier pairs with no allreduce: every rank raises, and where the allreduce's
    agreement step finds a rank missing (no facts to compare but the call numbers), the
    error still names this process's threads and comm.Dup()."""
    status, results, output, _ = launch(tmp_path, 4, "threads", "ring,shm", "20", "barrier")
    assert status == 0, output[-3000:]
    for algo in ("ring", "shm"):
        got = _right_or_refused_naming_the_threads(results, algo, output)
        assert any(outcome == "CollectiveMismatch" for outcome, _ in got.values()), got


def _right_or_refused_naming_the_threads(results, algo, output):
    """The threads scenario's outcome on every rank for ``algo``: no wrong sum, and each
    refusal a mismatch that names the threads and comm.Dup() (or the broken communicator
    after it)."""
    got = outcomes(results, f"threads:{algo}")
    assert set(got) == {0, 1, 2, 3}, output[-3000:]
    for outcome, text in got.values():
        assert outcome in ("ok", "CollectiveMismatch", "CommunicatorBroken"), (algo, text)
        assert text.startswith("0 wrong"), (algo, text)
        if outcome == "CollectiveMismatch":
            assert "thread" in text and "Dup()" in text, (algo, text)
    return got


@pytest.mark.parametrize("check,first", [("on", "none"), ("off", "main")])
def test_two_threads_with_their_own_values_never_get_wrong_sums(tmp_path, check, first):
    """Same shape, different values per thread (issue 34): a call of thread A on one rank
    must never be combined with thread B's on another (55-58 of 60 sums were wrong, no
    error).  Every pairing is either right or refused on every rank with an error that
    names the threads and comm.Dup().  With the agreement on and off, with and without a
    first call on the main thread."""
    status, results, output, _ = launch(tmp_path, 4, "threads", "ring,shm,tree", "30",
                                        "values", check, first)
    assert status == 0, output[-3000:]
    for algo in ("ring", "shm", "tree"):
        _right_or_refused_naming_the_threads(results, algo, output)


def test_exit_with_requests_in_flight_is_clean(tmp_path):
    for _ in range(3):
        status, results, output, _ = launch(tmp_path, 4, "inflight")
        assert status == 0 and len(outcomes(results, "inflight")) == 4, output[-3000:]
        assert not re.search(r"segmentation|signal 11|core dumped", output, re.I)


def test_hundreds_of_live_communicators(tmp_path):
    status, results, output, _ = launch(tmp_path, 2, "many_comms", "500")
    assert status == 0, output[-3000:]
    assert {o for o, _ in outcomes(results, "many-comms").values()} == {"ok"}, output[-3000:]


# --- a calibration file that cannot hurt ------------------------------------------------------

def _hostile(kind, folder):
    path = folder / f"model-{kind}.json"
    if kind == "nested":
        path.write_text("[" * 200_000 + "]" * 200_000)
    elif kind == "wrong-type":
        path.write_text('{"alpha": 1e-6, "beta": 1e-9, "gamma": 0, '
                        '"gamma_by_dtype": {"float32": "fast"}}')
    elif kind == "huge":
        with open(path, "wb") as f:
            f.truncate(150 << 20)  # sparse: 150 MB that cost no disk
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        return "/dev/zero"
    return str(path)


@pytest.mark.parametrize("kind", ["nested", "wrong-type", "huge", "fifo", "device"])
def test_a_hostile_calibration_file_gives_defaults_and_one_warning(tmp_path, kind):
    data = tmp_path / "data"
    data.mkdir()
    model = _hostile(kind, data)
    status, results, output, seconds = launch(tmp_path, 2, "calibration", kind, "auto",
                                              env={"PYCOLLECTIVE_MODEL": model})
    assert status == 0 and seconds < 30, output[-3000:]
    assert {o for o, _ in outcomes(results, f"calibration-{kind}:auto").values()} == {"ok"}
    warned = outcomes(results, f"calibration-{kind}:auto:warnings")
    assert warned[0][1].startswith("1 ") and warned[1][1].startswith("0 "), warned


def test_a_named_algorithm_never_reads_the_calibration(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    status, results, output, _ = launch(tmp_path, 2, "calibration", "fifo", "ring",
                                        env={"PYCOLLECTIVE_MODEL": _hostile("fifo", data)})
    assert status == 0, output[-3000:]
    assert {o for o, _ in outcomes(results, "calibration-fifo:ring").values()} == {"ok"}
    assert {t for _, t in outcomes(results, "calibration-fifo:ring:warnings").values()} == {"0 []"}
