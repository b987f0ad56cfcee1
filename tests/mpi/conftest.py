"""Configuration for tests run on several ranks (``--with-mpi``).

A test that fails on one rank while the others wait in a collective would
hang the job, so the first failure on any rank prints its report and calls
``MPI_Abort``: the job ends at once with a non-zero status, and the serial
launcher (``tests/test_mpi_suites.py``) shows the report.
"""

import os
import shutil
import sys
import tempfile
import time

import pytest
from mpi4py import MPI

import _signatures

if os.environ.get(_signatures.RECORD):
    _signatures.record(os.environ[_signatures.RECORD])

# The tests see the built-in model, not whatever the first-use measurement finds on the
# machine that runs them (nor do they write the user's cache); tests/mpi/test_probe.py
# turns it on where it tests it.
os.environ.setdefault("PYCOLLECTIVE_MEASURE", "0")


_outcomes = {"passed": 0, "skipped": 0}

# A folder where a failing rank also writes its report (rank<R>.failed) before the abort,
# for launchers whose output may lose it (.ci/mpi-suite sets it).
REPORTS = "PYCOLLECTIVE_TEST_REPORTS"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """Each rank its own base folder for ``tmp_path`` (before pytest's own configure reads
    it), removed when the rank's session ends.  The ranks are pytest processes started
    together; in pytest's shared ``/tmp/pytest-of-USER`` each prunes the others' numbered
    folders and the ``pytest-current`` link as it exits, and a rank once failed there
    (FileNotFoundError at the end of a launch whose every test had passed)."""
    if config.option.basetemp is None:
        rank = MPI.COMM_WORLD.Get_rank()
        config.option.basetemp = tempfile.mkdtemp(prefix=f"pycollective-tests-rank{rank}-")
        config.add_cleanup(lambda: shutil.rmtree(config.option.basetemp, ignore_errors=True))


def pytest_sessionstart(session):
    """The numba signatures the suite compiles, split between the ranks (_signatures.py):
    a cold first launch's ranks compile side by side instead of the same code twice."""
    world = MPI.COMM_WORLD
    done, skipped, seconds = _signatures.precompile(world)
    if world.Get_rank() == 0 and done + skipped:
        sys.stdout.write(f"pycollective-precompile: rank 0 compiled {done} signatures "
                         f"({skipped} passed over) in {seconds:.1f} s\n")
        sys.stdout.flush()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.passed:
        _outcomes["passed"] += 1
    elif report.skipped:
        _outcomes["skipped"] += 1
    if report.failed and MPI.COMM_WORLD.Get_size() > 1:
        rank = MPI.COMM_WORLD.Get_rank()
        text = (f"\n[rank {rank}] FAILED {report.nodeid} ({report.when})\n"
                f"{report.longreprtext}\n[rank {rank}] aborting the MPI job\n")
        sys.stderr.write(text)
        sys.stderr.flush()
        folder = os.environ.get(REPORTS)
        if folder:
            with open(os.path.join(folder, f"rank{rank}.failed"), "a") as f:
                f.write(text)
        # Open MPI's launcher can end the job before it has forwarded what the aborting
        # rank wrote (a CI log once showed the abort and no report): give it a moment.
        time.sleep(1.0)
        MPI.COMM_WORLD.Abort(1)


@pytest.fixture(scope="session")
def layouts():
    """Communicators to test on: the world, and Split halves of every size.

    Splitting the world into ``[0, k)`` and ``[k, W)`` gives each rank a
    communicator of size ``k`` or ``W - k``, so one launch of W ranks covers
    every size from 1 to W (with the launches at fewer ranks: see below).
    Each entry is ``(label, comm)``.
    """
    world = MPI.COMM_WORLD
    size, rank = world.Get_size(), world.Get_rank()
    comms = [("world", world)]
    for k in range(1, size // 2 + 1):
        if size >= 4 and 2 * k == size:
            # Equal halves of 4 or more ranks repeat what the launch on size/2
            # ranks tests as its world (the suite runs at 2, 3, 4 and 8), and
            # halves of 2 as sub-communicators are the 8-rank launch's split2.
            # At 8 ranks, oversubscribed 4x, they would cost a fifth of its
            # time, at 4 a quarter.
            continue
        sub = world.Split(0 if rank < k else 1, rank)
        comms.append((f"split{k}", sub))
    yield comms
    for label, comm in comms[1:]:
        comm.Free()


@pytest.fixture(scope="module")
def comms():
    """(label, plain communicator): the world, self, and a Dup of the world."""
    dup = MPI.COMM_WORLD.Dup()
    yield [("world", MPI.COMM_WORLD), ("self", MPI.COMM_SELF), ("dup", dup)]
    dup.Free()


def pytest_sessionfinish(session, exitstatus):
    """One summary line from rank 0, agreed over all ranks (read by test_mpi_suites.py)."""
    world = MPI.COMM_WORLD
    counts = world.gather((_outcomes["passed"], _outcomes["skipped"], int(exitstatus)), root=0)
    if world.Get_rank() == 0:
        passed = {c[0] for c in counts}
        status = max(c[2] for c in counts)
        sys.stdout.write(
            f"\npycollective-mpi-suite: {world.Get_size()} ranks, passed per rank "
            f"{sorted(passed)}, skipped {counts[0][1]}, worst exit status {status}\n")
        sys.stdout.flush()
