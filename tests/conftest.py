"""Serial test configuration.

``python -m pytest`` runs the serial tests here and, through
``test_mpi_suites.py``, launches ``tests/mpi`` under ``scripts/run_mpi.sh``
at several rank counts.  The files in ``tests/mpi`` are only collected by
those launches (``--with-mpi``), never by the serial process itself.
"""

from pathlib import Path

MPI_DIR = Path(__file__).parent / "mpi"


def pytest_ignore_collect(collection_path, config):
    if config.getoption("--with-mpi", default=False):
        return None
    path = Path(collection_path)
    if path == MPI_DIR or MPI_DIR in path.parents:
        return True
    return None


def pytest_collection_modifyitems(session, config, items):
    """Launch ``tests/mpi`` at 2 ranks before anything else.

    numba compiles each kernel the first time a process needs it and keeps it
    in its cache; on a fresh install that is 130-150 s of compiling on 2 cores
    (that launch: 154-173 s with an empty cache, 26 s with a full one).
    Whichever launch comes first pays for it: at 2 ranks the two processes
    compile side by side on their own cores, while at 3 or 4 ranks (mpi4py's
    suites, the fault tests) they share the cores (mpi4py's 3-rank launch
    took 90 s first in CI, 30 s with the cache filled)."""
    first = [item for item in items if item.nodeid.endswith("test_mpi_suite[2]")]
    if first:
        items[:] = first + [item for item in items if item not in first]
