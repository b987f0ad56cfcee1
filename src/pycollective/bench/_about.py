"""What a measurement ran on: machine, MPI library, package versions."""

import os
import platform
import socket
import sys
import time
from importlib import metadata

import numpy as np
from mpi4py import MPI

__all__ = ["environment", "mpi_library"]


def _library_version() -> str:
    # Open MPI 5 counts the string's terminating NUL in its length, and mpi4py
    # passes it through: "...Sep 16, 2026\x00".
    return MPI.Get_library_version().replace("\0", "").strip()


def mpi_library() -> str:
    """First line of the MPI library's version string, whitespace collapsed."""
    return " ".join(_library_version().splitlines()[0].split())


def _version(dist):
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def environment(comm) -> dict:
    """Facts about the machine and software of a run, for reports and calibration files."""
    import mpi4py

    versions = {"python": platform.python_version(), "mpi4py": mpi4py.__version__,
                "numpy": np.__version__, "numba": _version("numba"),
                "pycollective": _version("pycollective")}
    return dict(
        hostname=socket.gethostname(), cpu_count=os.cpu_count(), platform=platform.platform(),
        machine=platform.machine(), nranks=comm.Get_size(),
        mpi_library=mpi_library(),
        mpi_library_version=_library_version(),
        mpi_standard="%d.%d" % MPI.Get_version(),
        versions=versions, argv=list(sys.argv),
        time_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
