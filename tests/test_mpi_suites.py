"""Run the multi-rank test suite (tests/mpi) under MPI at several rank counts.

Each launch goes through scripts/run_mpi.sh, so it is bounded by a timeout
and aborted as a whole when a test fails on any rank (tests/mpi/conftest.py).
With 2 cores, 3, 4 and 8 ranks run oversubscribed.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT = int(os.environ.get("PYCOLLECTIVE_SUITE_TIMEOUT", "600"))


@pytest.mark.parametrize("nranks", [2, 3, 4, 8])
def test_mpi_suite(nranks):
    env = dict(os.environ, PYTHON=sys.executable, PYCOLLECTIVE_TIMEOUT=str(LIMIT))
    cmd = [str(ROOT / "scripts" / "run_mpi.sh"), str(nranks), "-m", "pytest", "--with-mpi",
           "-q", "-p", "no:cacheprovider", str(ROOT / "tests" / "mpi")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=LIMIT + 60)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{output[-30000:]}"
    # Rank 0 prints one line agreed over all ranks (tests/mpi/conftest.py).
    found = re.search(r"pycollective-mpi-suite: (\d+) ranks, passed per rank \[(\d+)\], "
                      r"skipped \d+, worst exit status 0", output)
    assert found, f"no clean suite summary from all ranks:\n{output[-30000:]}"
    assert int(found.group(1)) == nranks and int(found.group(2)) > 0
