"""The error of device memory that cannot be staged (layer 0: no MPI call)."""

from ._common import BufferSpecError


class DeviceMemoryError(BufferSpecError):
    """Device memory that pycollective cannot stage through host memory.

    Raised before any data moves, on every rank (the other ranks get the
    agreement step's error naming this rank and this message).  A
    ``ValueError`` (and a ``BufferError``, as mpi4py's buffer errors), so the
    agreement step carries it like any other argument error.
    """
