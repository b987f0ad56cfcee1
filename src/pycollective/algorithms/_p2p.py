"""Small point-to-point helpers shared by the algorithm modules.

Data always travel as raw bytes (``MPI.BYTE``): the reduction happens in our
own kernels, so the MPI library never needs to know the element type, and
dtypes it has no datatype for (float16) move like any other.
"""

from mpi4py import MPI

BYTE = MPI.BYTE


def msg(arr):
    """mpi4py buffer spec for a contiguous array, sent as bytes."""
    return [arr, BYTE]


def sendrecv(comm, sbuf, dest, rbuf, source, tag):
    comm.Sendrecv(msg(sbuf), dest, tag, msg(rbuf), source, tag)
