"""pycollective: allreduce algorithms on mpi4py point-to-point messages.

>>> import numpy as np, pycollective
>>> from mpi4py import MPI
>>> grad = np.arange(10, dtype=np.float32)
>>> pycollective.allreduce(MPI.IN_PLACE, grad, MPI.SUM, algorithm="ring")
"""

from ._api import algorithms, allgather, allreduce, reduce_scatter, set_check
from ._partition import partition
from .bucketing import GradientBuckets
from .comm import Comm, Request

__all__ = ["allreduce", "reduce_scatter", "allgather", "algorithms", "partition", "set_check",
           "Comm", "Request", "GradientBuckets"]
__version__ = "0.1.0"
