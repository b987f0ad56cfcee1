"""scripts/run_mpi.sh: bounded launches, abort on error, stopping on signals, clean-up.

Every job here runs RANK: each rank records its pid, its parent's and its
grandparent's (with Hydra: the proxy and mpiexec), with their start times, and
the files in /dev/shm and Hydra's /tmp/hydra_hwloc_xmlfile_* that they hold
(the MPI library's segments, Hydra's topology file and, when asked, a segment
of the test's own). After the launcher returns, every test checks that none of
those processes is left (not even as a zombie) and none of those files. Other MPI jobs may run
on the machine at the same time: nothing here depends on /dev/shm holding only
this test's files.
"""

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parents[1] / "scripts" / "run_mpi.sh"
GUARD = RUN.parents[1] / ".ci" / "shm-guard"  # fails if a command's files outlive it


def _open_mpi():
    """Whether the launcher will use Open MPI's mpiexec (the one beside this Python, as it picks)."""
    beside = Path(sys.executable).parent / "mpiexec"
    try:
        version = subprocess.run([str(beside) if beside.exists() else "mpiexec", "--version"],
                                 capture_output=True, text=True, timeout=60).stdout
    except OSError:
        return False
    return "open mpi" in version.lower()


OPEN_MPI = _open_mpi()
GRACE = 3  # run_mpi.sh: seconds from SIGTERM to SIGKILL
PR_SET_CHILD_SUBREAPER = 36

# argv: RECORD_DIR ACTIONS (comma-separated, see the end of the program)
RANK = r'''
import json, os, signal, sys, time
from mpi4py import MPI

record, actions = sys.argv[1], sys.argv[2].split(",")
comm = MPI.COMM_WORLD

def stat(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()

def held(pid):
    paths = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            paths.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    with open(f"/proc/{pid}/maps") as maps:
        paths.update(fields[5].strip() for fields in (line.split(None, 5) for line in maps)
                     if len(fields) == 6)
    return [p for p in paths if p.startswith(("/dev/shm/", "/tmp/hydra_hwloc_xmlfile_"))
            and not p.endswith(" (deleted)")]

if "stubborn" in actions:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
if "segment" in actions:  # created, kept open as MPI libraries keep theirs mapped, never removed
    segment = open(f"/dev/shm/mpich_shm_test_{os.getpid()}", "wb")
    segment.write(b"x")
    segment.flush()
comm.Barrier()
pids, files, pid = [], [], os.getpid()
for _ in range(3):  # this rank, its parent (Hydra's proxy), its grandparent (mpiexec)
    pids.append([pid, stat(pid)[19]])
    files += held(pid)
    pid = int(stat(pid)[1])
with open(os.path.join(record, f".{comm.rank}"), "w") as f:
    json.dump({"pids": pids, "files": sorted(set(files))}, f)
os.replace(os.path.join(record, f".{comm.rank}"), os.path.join(record, f"{comm.rank}.json"))
comm.Barrier()

# Jobs that end on their own, by MPI_Abort or normally, do not warn the launcher: it removes the
# files it has seen them hold, looking when inotify reports a new file and once a second.
# "hold" keeps them for longer than that, so that no test depends on how fast the launcher
# reacts to inotify on a loaded machine.
if "hold" in actions:
    time.sleep(1.5)
if "exit3" in actions:
    sys.exit(3)
if "hello" in actions:
    os.write(1, f"rank {comm.rank} of {comm.size}\n".encode())  # one write: a whole line
if "raise" in actions:
    if comm.rank == 1:
        raise RuntimeError("boom")
    comm.Barrier()  # never completes: rank 1 is gone
if "await" in actions:  # until the test says go
    while not os.path.exists(os.path.join(record, "go")):
        time.sleep(0.05)
if "die" in actions and comm.rank == 1:  # as the OOM killer would: the others are left waiting
    os.kill(os.getpid(), signal.SIGKILL)
if "sleep" in actions:
    time.sleep(300)
if "spin" in actions:
    while True:
        pass
'''


def environment(limit, **env):
    environ = dict(os.environ, PYTHON=sys.executable, PYCOLLECTIVE_TIMEOUT=str(limit))
    environ.update(env)  # may override os.environ's PYTHONUNBUFFERED
    return environ


def run(args, limit=60, command=(), **env):
    start = time.monotonic()
    proc = subprocess.run([*command, str(RUN), *args], env=environment(limit, **env),
                          capture_output=True, text=True, timeout=limit + 60)
    return proc, time.monotonic() - start


def job(tmp_path, actions):
    """Arguments for run_mpi.sh after NP that run RANK, and the folder it records into."""
    program = tmp_path / "rank.py"
    program.write_text(RANK)
    record = tmp_path / "record"
    record.mkdir()
    return [str(program), str(record), actions], record


def start(args, limit=60):
    """The launcher in a session of its own, as a terminal's job would be."""
    return subprocess.Popen([str(RUN), *args], env=environment(limit), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_ready(proc, record, nranks, timeout=30):
    deadline = time.monotonic() + timeout
    while len(list(record.glob("*.json"))) < nranks:
        if proc.poll() is not None or time.monotonic() > deadline:
            out, err = proc.communicate(timeout=60) if proc.poll() is not None else ("", "")
            pytest.fail(f"job not ready (exit {proc.returncode}):\n{out}\n{err}")
        time.sleep(0.05)


def finish(proc):
    """Don't let a failed test leave the launcher running (SIGKILL takes the job down too)."""
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def recorded(record, nranks):
    """[(pid, start time)] of the job's processes and [path] of its files, as its ranks saw them."""
    pids, files = [], []
    for rank in range(nranks):
        seen = json.loads((record / f"{rank}.json").read_text())
        pids += [tuple(pid) for pid in seen["pids"]]
        files += seen["files"]
    return sorted(set(pids)), sorted(set(files))


def exists(pid, start_time):
    """Whether that process (not a later one with its pid) is there, even as a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19] == start_time
    except OSError:
        return False


def assert_job_gone(record, nranks):
    """No process of the job is left, not even unreaped, and none of its files."""
    pids, files = recorded(record, nranks)
    alive = [pid for pid, start_time in pids if exists(pid, start_time)]
    assert not alive, f"processes of the job still there: {alive}"
    left = [path for path in files if os.path.exists(path)]
    assert not left, f"files of the job left behind: {left}"


@pytest.mark.parametrize("args", [[], ["x"], ["0"], ["-2", "-c", "pass"]])
def test_usage_errors(args):
    proc, _ = run(args)
    assert proc.returncode == 2 and "usage" in proc.stderr


def test_bad_limit_is_a_usage_error():
    proc, _ = run(["2", "-c", "pass"], PYCOLLECTIVE_TIMEOUT="ten")
    assert proc.returncode == 2 and "PYCOLLECTIVE_TIMEOUT" in proc.stderr


@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_runs_on_several_ranks(tmp_path, unbuffered):
    args, record = job(tmp_path, "hello")
    proc, _ = run(["3", *args], PYTHONUNBUFFERED=unbuffered)
    assert proc.returncode == 0, proc.stderr
    assert sorted(re.findall(r"rank \d+ of \d+", proc.stdout)) == [
        "rank 0 of 3", "rank 1 of 3", "rank 2 of 3"]
    assert_job_gone(record, 3)


def test_exit_status_of_the_job_is_passed_through(tmp_path):
    args, record = job(tmp_path, "hold,exit3")  # sys.exit(3) on all ranks: MPI_Abort(3)
    proc, _ = run(["2", *args])
    assert proc.returncode == 3, proc.stderr
    assert_job_gone(record, 2)


def test_exception_on_one_rank_ends_the_job(tmp_path):
    args, record = job(tmp_path, "segment,hold,raise")
    proc, elapsed = run(["3", *args], limit=120)
    assert proc.returncode != 0
    assert "boom" in proc.stderr
    assert elapsed < 60  # aborted, not waited out
    assert_job_gone(record, 3)


def test_hanging_job_is_stopped_by_the_limit(tmp_path):
    args, record = job(tmp_path, "segment,sleep")
    proc, elapsed = run(["2", *args], limit=3)
    assert proc.returncode == 124
    assert "limit" in proc.stderr
    assert elapsed < 3 + GRACE + 10
    assert_job_gone(record, 2)


@pytest.mark.parametrize("signum, to_group", [(signal.SIGTERM, False), (signal.SIGHUP, False),
                                              (signal.SIGINT, True)],
                         ids=["TERM", "HUP", "INT-to-group"])
def test_signal_stops_the_job(tmp_path, signum, to_group):
    if signal.getsignal(signum) is signal.SIG_IGN:
        # Under nohup (SIGHUP) or a shell's background job (SIGINT) the launcher
        # inherits the signal ignored and keeps it so, as programs should.
        pytest.skip(f"{signal.Signals(signum).name} is ignored in this process, and so "
                    "in the launcher it starts")
    args, record = job(tmp_path, "segment,sleep")
    proc = start(["2", *args])
    try:
        wait_ready(proc, record, 2)
        (os.killpg if to_group else os.kill)(proc.pid, signum)
        sent = time.monotonic()
        proc.communicate(timeout=GRACE + 20)
        assert time.monotonic() - sent < GRACE + 5
        assert proc.returncode == -signum  # it dies of the signal: a shell says 128 + signum
    finally:
        finish(proc)
    assert_job_gone(record, 2)


@pytest.mark.parametrize("signals", [1, 2])
def test_job_ignoring_the_signal_is_killed(tmp_path, signals):
    """Ranks that ignore SIGTERM and spin: SIGKILL after the grace, or at once on a second signal."""
    args, record = job(tmp_path, "stubborn,spin")
    proc = start(["2", *args])
    try:
        wait_ready(proc, record, 2)
        for _ in range(signals):
            os.kill(proc.pid, signal.SIGTERM)
            time.sleep(0.2)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=GRACE + 20)
        took = time.monotonic() - sent
        assert proc.returncode == -signal.SIGTERM
        if not OPEN_MPI:  # Open MPI's mpiexec escalates to SIGKILL itself, within the grace
            assert "killing it" in err
        assert took < (GRACE + 5 if signals == 1 else 2), took
    finally:
        finish(proc)
    assert_job_gone(record, 2)


def test_outer_timeout_stops_the_job(tmp_path):
    args, record = job(tmp_path, "segment,sleep")
    proc, elapsed = run(["2", *args], command=["timeout", "-k", "5", "3"])
    assert proc.returncode == 124  # 137 would mean timeout had to SIGKILL the launcher
    assert elapsed < 3 + 5
    assert_job_gone(record, 2)


@pytest.mark.parametrize("ending", ["exit", "killed"])
def test_only_the_jobs_own_files_are_removed(tmp_path, ending):
    """Files in /dev/shm that the job did not create survive, even with no process holding
    them: one from before the launch, one held open by this process, and one created during
    the job by "another job" (this process, which the job's launcher must not mistake for
    one of its own). The files the job created and left behind are removed.

    run_mpi.sh treats every file in /dev/shm alike, whatever its name. These names do not
    start with mpich_shm_ only because other jobs on a shared machine may still run an older
    launcher that removes every such file nobody holds."""
    tag = f"{os.getpid()}_{ending}"
    old, live, new = (Path(f"/dev/shm/pycollective_test_foreign_{kind}_{tag}")
                      for kind in ("old", "live", "new"))
    args, record = job(tmp_path, "segment," + ("hold,await" if ending == "exit" else "sleep"))
    try:
        old.write_bytes(b"x")
        live.write_bytes(b"x")
        with open(live, "rb"):
            proc = start(["2", *args])
            try:
                wait_ready(proc, record, 2)
                new.write_bytes(b"x")
                if ending == "exit":
                    (record / "go").touch()
                else:
                    os.kill(proc.pid, signal.SIGTERM)
                _, err = proc.communicate(timeout=GRACE + 30)
                assert proc.returncode == (0 if ending == "exit" else -signal.SIGTERM), err
            finally:
                finish(proc)
            assert old.exists() and live.exists() and new.exists()
        assert_job_gone(record, 2)
    finally:
        for path in (old, live, new):
            path.unlink(missing_ok=True)


def test_launcher_killed_outright_still_takes_the_job_down(tmp_path):
    """SIGKILL cannot be caught: mpiexec dies with the launcher (PR_SET_PDEATHSIG) and Hydra's
    proxy then kills the ranks. Nobody is left to remove the job's files: this test does.
    This process is the subreaper of the orphans meanwhile, so that it can reap them (init
    may never do so)."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    args, record = job(tmp_path, "sleep")
    proc = start(["2", *args])
    try:
        wait_ready(proc, record, 2)
        proc.kill()
        proc.communicate(timeout=10)
        pids, _ = recorded(record, 2)
        deadline = time.monotonic() + 10
        while True:
            for pid, _ in pids:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:  # not (or no longer) our child
                    pass
            alive = [pid for pid, start_time in pids if exists(pid, start_time)]
            if not alive or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert not alive, f"processes of the job still there: {alive}"
    finally:
        finish(proc)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        for seen in record.glob("*.json"):
            for path in json.loads(seen.read_text())["files"]:
                Path(path).unlink(missing_ok=True)


def test_the_guard_names_a_file_its_command_left(tmp_path):
    """.ci/shm-guard, which CI and the test below rely on, can fail: a file the command
    created and held is reported (and removed with --remove); one that another process
    (this test) created meanwhile is not the command's."""
    left = f"/dev/shm/pycollective_test_guard_{os.getpid()}"
    foreign = Path(f"/dev/shm/pycollective_test_guard_foreign_{os.getpid()}")
    hold = (f"import time; f = open({left!r}, 'wb'); f.write(b'x'); f.flush(); "
            f"time.sleep(1.5)")
    try:
        for remove in ([], ["--remove"]):
            proc = subprocess.Popen([sys.executable, str(GUARD), *remove, "--", sys.executable,
                                     "-c", hold], stderr=subprocess.PIPE, text=True)
            time.sleep(0.5)
            foreign.write_bytes(b"x")
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 1 and f"{left}" in err, err
            assert str(foreign) not in err and foreign.exists()
            assert os.path.exists(left) == (not remove), err
            Path(left).unlink(missing_ok=True)
            foreign.unlink()
    finally:
        Path(left).unlink(missing_ok=True)
        foreign.unlink(missing_ok=True)


@pytest.mark.parametrize("actions, limit", [("die,sleep", 60), ("segment,hold,raise", 60),
                                            ("segment,sleep", 3)],
                         ids=["rank-killed", "exception", "limit"])
def test_a_stopped_job_leaves_nothing_in_dev_shm(tmp_path, actions, limit):
    """Whatever the MPI library (and the job) created in /dev/shm at any time, not only
    what the ranks held when they recorded it, is gone when the launcher returns."""
    args, record = job(tmp_path, actions)
    proc, _ = run(["2", *args], limit=limit, command=[sys.executable, str(GUARD), "--"])
    assert proc.returncode != 0 and "shm-guard" not in proc.stderr, proc.stderr
    assert_job_gone(record, 2)
