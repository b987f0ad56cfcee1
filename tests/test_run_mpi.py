"""scripts/run_mpi.sh: bounded launches, abort on error, /dev/shm clean-up."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parents[1] / "scripts" / "run_mpi.sh"


def run(args, limit=60, **env):
    environ = dict(os.environ, PYTHON=sys.executable, PYCOLLECTIVE_TIMEOUT=str(limit))
    environ.update(env)  # may override os.environ's PYTHONUNBUFFERED
    start = time.monotonic()
    proc = subprocess.run([str(RUN), *args], env=environ, capture_output=True, text=True,
                          timeout=limit + 60)
    return proc, time.monotonic() - start


@pytest.mark.parametrize("args", [[], ["x"], ["0"], ["-2", "-c", "pass"]])
def test_usage_errors(args):
    proc, _ = run(args)
    assert proc.returncode == 2 and "usage" in proc.stderr


@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_runs_on_several_ranks(unbuffered):
    # With PYTHONUNBUFFERED=1 a print() is several writes, which mpiexec may interleave
    # with other ranks' output: each rank writes its line at once, and the test looks for
    # the lines anywhere in the output.
    code = ("from mpi4py import MPI; import os; c = MPI.COMM_WORLD; "
            "os.write(1, f'rank {c.rank} of {c.size}\\n'.encode())")
    proc, _ = run(["3", "-c", code], PYTHONUNBUFFERED=unbuffered)
    assert proc.returncode == 0, proc.stderr
    assert sorted(re.findall(r"rank \d+ of \d+", proc.stdout)) == [
        "rank 0 of 3", "rank 1 of 3", "rank 2 of 3"]


def test_exception_on_one_rank_ends_the_job():
    code = ("from mpi4py import MPI; import time; c = MPI.COMM_WORLD\n"
            "if c.rank == 1: raise RuntimeError('boom')\n"
            "c.Barrier()")
    proc, elapsed = run(["3", "-c", code], limit=120)
    assert proc.returncode != 0
    assert "boom" in proc.stderr
    assert elapsed < 60  # aborted, not waited out


def test_hanging_job_is_stopped_by_the_limit():
    proc, elapsed = run(["2", "-c", "import time; time.sleep(120)"], limit=3)
    assert proc.returncode == 124
    assert "limit" in proc.stderr
    assert elapsed < 30


def test_stale_shared_memory_is_removed_but_live_segments_kept(tmp_path):
    stale = Path(f"/dev/shm/mpich_shm_pycollective_test_stale_{os.getpid()}")
    live = Path(f"/dev/shm/mpich_shm_pycollective_test_live_{os.getpid()}")
    stale.write_bytes(b"x")
    live.write_bytes(b"x")
    with open(live, "rb"):  # held open by this live process
        proc, _ = run(["2", "-c", "pass"])
        assert proc.returncode == 0, proc.stderr
        assert not stale.exists()
        assert live.exists()
    live.unlink()
