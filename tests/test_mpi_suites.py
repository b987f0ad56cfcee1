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
# Left out at 8 ranks (four per core on the CI machines): the drop-in's buffer
# forms and other collectives, the bench and its commands, the calibration, the
# training example and helpers.  They test plumbing that does not change with
# the number of ranks beyond what 2, 3 and 4 cover; every algorithm, shared-memory,
# agreement, fault and ZeRO module still runs at 8.  Together they were 39 s of
# the 8-rank suite's 217 s (pytest --durations=0), 40-55 s of the README suite.
# And two tests of test_shm_mid.py, 11 s each at 8: which dtypes, ops and kinds
# of stores the compiled steps get right does not change with the number of
# ranks, 2, 3 and 4 run them on slices that start anywhere, and
# test_exact_matrix runs shm at 8.  And the reduce-scatter-allgather step's tests
# (test_rsag.py, 40 s at 8 on 2026-12-06): the step is for ranks with a core each, which
# 8 ranks on 2 cores are not (its tests force it on); 2, 3 and 4 ranks run them, and
# tests/algorithms/test_rsag.py checks its slices for 2-16 owners without MPI.  And the
# resumption of test_shm_mid's waits handed back to Python (12 s at 8): its phases do not
# change with the number of ranks.  And shm's paths above 1 MiB and ring_pipelined's
# segment sizes (9 and 8 s at 8 on 2026-12-07): 2, 3 and 4 ranks run them (ranks past
# the first two in place among them), the partition arithmetic for 8 is checked without
# MPI, and test_exact_matrix and test_large_count run both algorithms at 8.  (Files are
# ignored, tests deselected.)
NOT_AT_8 = ("bench/test_bench.py", "bench/test_bench_commands.py", "bench/test_calibrate.py",
            "comm/test_comm.py", "comm/test_comm_collectives.py", "device/test_device.py",
            "training/test_example.py", "training/test_training.py",
            "algorithms/test_shm_mid.py::test_every_compiled_dtype_and_op_exact",
            "algorithms/test_shm_mid.py::test_slot_path_above_the_double_limit_right_with_either_kind_of_stores",
            "algorithms/test_shm_mid.py::test_waits_handed_back_to_python_resume_every_phase",
            "algorithms/test_rsag.py",
            "algorithms/test_algorithms.py::test_shm_large_paths",
            "algorithms/test_algorithms.py::test_ring_pipelined_segment_sizes")


def left_out(nranks):
    """pytest options leaving ``NOT_AT_8`` out of the launch at ``nranks``."""
    if nranks != 8:
        return []
    # --deselect takes a node id, relative to the rootdir (the launch's cwd)
    return [f"--deselect=tests/mpi/{name}" if "::" in name
            else f"--ignore={ROOT / 'tests' / 'mpi' / name}" for name in NOT_AT_8]


@pytest.mark.parametrize("nranks", [2, 3, 4, 8])
def test_mpi_suite(nranks):
    env = dict(os.environ, PYTHON=sys.executable, PYCOLLECTIVE_TIMEOUT=str(LIMIT))
    cmd = [str(ROOT / "scripts" / "run_mpi.sh"), str(nranks), "-m", "pytest", "--with-mpi",
           "-q", "-p", "no:cacheprovider", *left_out(nranks), str(ROOT / "tests" / "mpi")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=LIMIT + 60)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{output[-30000:]}"
    # Rank 0 prints one line agreed over all ranks (tests/mpi/conftest.py).
    found = re.search(r"pycollective-mpi-suite: (\d+) ranks, passed per rank \[(\d+)\], "
                      r"skipped \d+, worst exit status 0", output)
    assert found, f"no clean suite summary from all ranks:\n{output[-30000:]}"
    assert int(found.group(1)) == nranks and int(found.group(2)) > 0
