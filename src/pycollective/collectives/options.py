"""What a caller sets and asks before calling a collective.

The process's and a communicator's settings that every rank must share
(:func:`set_check`, :func:`set_timeout`; their values live in
:mod:`~pycollective.runtime.settings`), and which algorithms each collective has and which of
them can run on a communicator (:func:`algorithms`,
:func:`usable_algorithms`, :func:`unusable_algorithms`).  The collectives
themselves are :mod:`~pycollective.collectives.api`.
"""

from typing import List

from . import auto as _auto, choose as _choose
from ..runtime import registry as _registry, settings as _settings
from .. import algorithms as _algorithms  # noqa: F401  (the names algorithms() lists register here)
from .call import resolve_comm
from ..runtime.context import get_context, set_comm_setting

__all__ = ["COLLECTIVES", "algorithms", "usable_algorithms", "unusable_algorithms",
           "set_check", "set_timeout", "check_enabled"]

#: The collectives with algorithms of their own, as ``collective=`` of
#: :func:`algorithms` and :func:`pycollective.runtime.registry.register` name them.
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "bcast", "reduce")


check_enabled = _settings.check_enabled


def set_check(enabled: bool) -> bool:
    """Turn the cross-rank agreement step on or off; returns the previous setting.

    The step costs one small MAX reduction per call (a shared-memory
    exchange on one node, else an ``MPI_Allreduce``).  It turns a bad
    argument on one rank, or ranks that disagree on count, dtype, op or
    algorithm, into the same exception on every rank before any data move.
    Without it, ranks that disagree still raise everywhere -- from the
    shared-memory headers, the message sizes and tags, or the side channel
    once a wait runs long -- but after data started to move, and the
    communicator is then unusable.  The setting must be the same on every
    rank (a rank that differs makes the call raise).  The environment
    variable ``PYCOLLECTIVE_CHECK=0`` sets the default off.
    """
    return _settings.set_check(enabled)


def set_timeout(seconds, comm=None):
    """Set the longest wait without progress before a collective raises ``CollectiveTimeout``.

    Args:
        seconds: positive seconds; ``None`` or 0 for no limit.
        comm: set it for this communicator only (a local setting, not a
            collective call); None: for the whole process (the default is
            ``PYCOLLECTIVE_TIMEOUT_S``, 300 s).  A call's own ``timeout=``
            argument overrides both.  It must be the same on every rank.

    Returns:
        The previous setting (for ``comm``: None if it had none).
    """
    if comm is None:
        return _settings.set_timeout(seconds)
    previous = set_comm_setting(resolve_comm(comm), "timeout", _settings.parse_timeout(seconds))
    _settings.set_segment_bytes(_settings.segment_bytes())  # bump the epoch: plans re-resolve
    return previous


def _collective_name(collective):
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; one of {', '.join(COLLECTIVES)}")
    return collective


def algorithms(collective: str = "allreduce") -> List[str]:
    """Return the names of the registered algorithms of ``collective`` (default: allreduce).

    Raises:
        ValueError: ``collective`` is not one of :data:`COLLECTIVES`.
    """
    return _registry.names(_collective_name(collective))


def usable_algorithms(comm=None, collective: str = "allreduce") -> List[str]:
    """The registered algorithms of ``collective`` that can run on ``comm`` (collective on first use).

    See :func:`unusable_algorithms` for the others and why.
    """
    reasons = unusable_algorithms(comm, collective)
    return [n for n in _registry.names(collective) if n not in reasons]


def unusable_algorithms(comm=None, collective: str = "allreduce") -> dict:
    """``{name: reason}`` for each algorithm of ``collective`` that cannot run on ``comm``."""
    ctx = get_context(resolve_comm(comm))
    if _collective_name(collective) == "allreduce":
        return _auto.unusable_reasons(ctx)
    return _choose.unusable(ctx, collective)
