"""One rank does something; every rank gets its result or its error."""

from typing import Callable, TypeVar

T = TypeVar("T")

__all__ = ["bcast_from_root"]


def bcast_from_root(comm, load: Callable[[], T], root: int = 0, what: str = "") -> T:
    """Run ``load()`` on ``root`` only; return its value, or raise its error, on every rank.

    An error on the root alone would leave the other ranks waiting in the
    broadcast, so the root broadcasts the error instead and every rank raises
    ``ValueError`` with the root's message (the root included, so all ranks
    see the same exception type).  Collective over ``comm``.

    Args:
        comm: an mpi4py intracommunicator (one rank: no message).
        load: called on the root only.
        root: the rank that loads.
        what: prefix of the error message (e.g. ``"calibration"``).
    """
    payload = None
    if comm.Get_rank() == root:
        try:
            payload = (load(), None)
        except Exception as exc:  # noqa: BLE001  (any failure must reach every rank)
            payload = (None, f"{type(exc).__name__}: {exc}")
    if comm.Get_size() > 1:
        payload = comm.bcast(payload, root=root)
    value, error = payload
    if error is not None:
        raise ValueError(f"{what}: rank {root} failed: {error}" if what else
                         f"rank {root} failed: {error}")
    return value
