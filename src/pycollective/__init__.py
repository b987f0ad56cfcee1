"""pycollective: collective algorithms on mpi4py point-to-point messages and shared memory.

>>> import numpy as np, pycollective
>>> from mpi4py import MPI
>>> grad = np.arange(10, dtype=np.float32)
>>> pycollective.allreduce(MPI.IN_PLACE, grad, MPI.SUM, algorithm="ring")

The public names are re-exported here; everything else is private.  The
package's layers, each importing only those below it, are described in
``docs/architecture.md``.
"""

import logging

from .collectives.api import (allgather, allgatherv, allreduce, bcast, broadcast, reduce,
                              reduce_scatter)
from .collectives.barrier import barrier
from .collectives.options import (algorithms, set_check, set_timeout, unusable_algorithms,
                                  usable_algorithms)
from .collectives.allocate import release, shared_empty
from ._errors import (CollectiveError, CollectiveMismatch, CollectiveTimeout, CommunicatorBroken,
                      ConfigurationError, PeerFailed, ReplicaMismatch, StallWarning)
from .data.partition import partition
from .data.buffers._device_error import DeviceMemoryError
from .training.bucketing import GradientBuckets
from .comm.dropin import Comm, Request
from .training.optimizer import DistributedOptimizer, broadcast_parameters, check_replicas

__all__ = ["allreduce", "reduce_scatter", "allgather", "allgatherv", "reduce", "bcast",
           "broadcast", "barrier", "algorithms", "usable_algorithms", "unusable_algorithms", "partition",
           "set_check", "set_timeout", "shared_empty", "release", "Comm", "Request", "GradientBuckets",
           "broadcast_parameters", "check_replicas", "DistributedOptimizer", "CollectiveError",
           "CollectiveTimeout", "CollectiveMismatch", "PeerFailed", "CommunicatorBroken",
           "ConfigurationError", "ReplicaMismatch", "StallWarning", "DeviceMemoryError", "__version__"]


def __getattr__(name):
    """``__version__``, read from the installed package's metadata when first asked for:
    importlib.metadata's lookup was a tenth of the import's time (docs/results/startup.md)."""
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import metadata
    try:
        version = metadata.version("pycollective")
    except metadata.PackageNotFoundError:  # running from a source tree that is not installed
        version = "0+unknown"
    globals()["__version__"] = version
    return version


# A library logs; the application decides where that goes.
logging.getLogger("pycollective").addHandler(logging.NullHandler())

# The timeline (every collective, rank by rank) reads its settings from runtime.env and,
# with PYCOLLECTIVE_TIMELINE set, records the whole job from here on.
from .runtime import env as _env  # noqa: E402
from . import timeline  # noqa: E402
timeline.settings = _env
if _env.TIMELINE.get():
    timeline.start(_env.TIMELINE.get())
