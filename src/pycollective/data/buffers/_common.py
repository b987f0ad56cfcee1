"""What every part of buffer reading shares: its errors, the unreadable argument, raw bytes."""

import numpy as np
from mpi4py import MPI

RAW = np.dtype("V1")  # bytes of an element type numpy cannot name (bfloat16, vectors): MPI.BYTE


class BufferSpecError(BufferError, ValueError):
    """Memory that cannot be used as asked: not contiguous, or read-only for a receive buffer.

    A ``BufferError`` like mpi4py's, and a ``ValueError`` like pycollective's
    other argument errors (the agreement step carries those to every rank).
    """


class Fallback(Exception):
    """Not an error: this call goes to the MPI library's own collective; ``reason`` says why."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


class DeviceMemory(Fallback):
    """The buffer is device memory; ``reason`` says which kind."""


class Invalid:
    """Stands for a buffer argument that could not be read; using it raises ``error``."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


def is_in_place(obj) -> bool:
    """``MPI.IN_PLACE`` or ``None``, as mpi4py reads a send buffer."""
    return obj is None or obj is MPI.IN_PLACE
