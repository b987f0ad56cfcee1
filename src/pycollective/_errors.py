"""The exceptions a collective raises when something goes wrong beyond its arguments.

Bad arguments raise ``TypeError``/``ValueError`` on every rank before any
data move (the agreement step).  What can go wrong after that -- a peer that
stalls, dies, skips the call, calls something else, or fails -- raises one
of these, on every surviving rank, naming the collective, its call number on
the communicator, the communicator and the ranks concerned.
"""

from typing import Optional, Sequence

__all__ = ["ConfigurationError", "CollectiveError", "CollectiveTimeout", "CollectiveMismatch", "PeerFailed",
           "CommunicatorBroken", "StallWarning", "ReplicaMismatch"]


class ConfigurationError(ValueError):
    """A setting the ranks found wrong together, the same on every rank.

    Raised while an algorithm sets itself up (e.g. an emulated node layout
    that differs across ranks); every rank raises it at the same point, so
    the communicator stays usable.
    """


class CollectiveError(RuntimeError):
    """A collective could not complete; the communicator is left broken.

    Attributes:
        collective: e.g. ``"allreduce"``.
        call: the call's number on its communicator (1 for the first call).
        comm: a description of the communicator.
        ranks: the ranks the message is about (missing, mismatched, failed).
    """

    def __init__(self, message: str, *, collective: Optional[str] = None,
                 call: Optional[int] = None, comm: Optional[str] = None,
                 ranks: Sequence[int] = ()):
        super().__init__(message)
        self.collective, self.call, self.comm = collective, call, comm
        self.ranks = tuple(ranks)


class CollectiveTimeout(CollectiveError):
    """No progress for the timeout: ``ranks`` did not arrive (stopped, dead or elsewhere)."""


class CollectiveMismatch(CollectiveError, ValueError):
    """Ranks called different collectives, or the same one with different arguments."""


class PeerFailed(CollectiveError):
    """Another rank failed in this collective (its error is in the message)."""


class CommunicatorBroken(CollectiveError):
    """An earlier collective on this communicator failed; it cannot be used again."""


class StallWarning(RuntimeWarning):
    """A collective has waited longer than ``PYCOLLECTIVE_STALL_WARN_S``; it is still waiting."""


class ReplicaMismatch(RuntimeError):
    """Replicas that should be bitwise identical are not (:func:`pycollective.check_replicas`).

    Raised on every rank; the communicator stays usable.

    Attributes:
        ranks: the ranks whose arrays differ from the most common replica.
        arrays: ``{rank: [names or indices of its differing arrays]}``.
    """

    def __init__(self, message: str, *, ranks: Sequence[int] = (), arrays=None):
        super().__init__(message)
        self.ranks = tuple(ranks)
        self.arrays = dict(arrays or {})
