"""The drop-in: ``pycollective.Comm``, an mpi4py communicator whose collectives are pycollective's.

``dropin`` the ``Comm`` class; ``arguments`` what one call's mpi4py arguments
resolve to (pycollective on numpy views, the wrapped communicator's own call,
or an error every rank raises); ``nonblocking`` the nonblocking forms on one
helper thread per communicator, and their ``Request``; ``device`` device
buffers in the drop-in's methods and training's arrays (host mirrors).

May import: ``collectives``, ``device``, ``data``, ``runtime``, ``compression``,
``timeline``, ``_errors``.
"""

from .dropin import Comm, Request

__all__ = ["Comm", "Request"]
