"""Serial test configuration.

``python -m pytest`` runs the serial tests here and, through
``test_mpi_suites.py``, launches ``tests/mpi`` under ``scripts/run_mpi.sh``
at several rank counts.  The files in ``tests/mpi`` are only collected by
those launches (``--with-mpi``), never by the serial process itself.
"""

import os
from pathlib import Path

MPI_DIR = Path(__file__).parent / "mpi"
SRC = Path(__file__).resolve().parents[1] / "src"

# Every process of the suite runs the checkout's library: this one (pyproject's
# ``pythonpath``) and every launch it makes (PYTHONPATH, which the launches inherit).
# numba keeps its compiled code beside each source file, so a suite that ran the
# installed copy in some processes and src/ in others compiled everything twice (the
# tests of the benchmark scripts, the emulated hosts and the timeline run src/).
# tests/test_packaging.py checks that the installed copy carries the same files.
_paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
if str(SRC) not in _paths:
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC)] + _paths))


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
