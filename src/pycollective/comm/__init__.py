"""The drop-in: ``pycollective.Comm``, an mpi4py communicator whose collectives are pycollective's.

``dropin`` the ``Comm`` class; ``arguments`` what one call's mpi4py arguments
resolve to (pycollective on numpy views, the wrapped communicator's own call,
or an error every rank raises); ``nonblocking`` the nonblocking forms on one
helper thread per communicator, and their ``Request``.

May import: ``collectives``, ``data``, ``runtime``, ``compression``, ``_errors``.
"""

from .dropin import Comm, Request

__all__ = ["Comm", "Request"]
