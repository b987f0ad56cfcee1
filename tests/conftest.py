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
