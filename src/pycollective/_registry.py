"""The one registry of allreduce algorithms.

Read by :func:`pycollective.allreduce`, :func:`pycollective.algorithms`, the
benchmark's command-line choices and the test parametrisation, so adding an
algorithm is one ``register`` call in its own module.
"""

from dataclasses import dataclass
from typing import Callable, Optional

__all__ = ["Algorithm", "register", "get", "names"]


@dataclass(frozen=True)
class Algorithm:
    """One allreduce algorithm.

    ``run(ctx, src, dst, kernel)`` reduces the flat arrays ``src`` of every
    rank into ``dst`` on every rank.  ``src`` is read only and may be the
    same array as ``dst`` (in place); ``ctx`` is the private
    :class:`~pycollective._context.Context` (size > 1 and count > 0 are
    guaranteed by the caller); ``kernel(a, b, out)`` is the reduction.
    ``cost``, where given, is the algorithm's α-β-γ time model
    ``cost(nranks, count, itemsize, alpha, beta, gamma) -> seconds``.
    """

    name: str
    run: Callable
    summary: str
    cost: Optional[Callable] = None


_ALGORITHMS = {}


def register(name, run, summary, cost=None):
    """Add an algorithm under ``name`` (a name may be registered once)."""
    if name in _ALGORITHMS:
        raise ValueError(f"algorithm {name!r} is already registered")
    _ALGORITHMS[name] = Algorithm(name, run, summary, cost)
    return _ALGORITHMS[name]


def get(name):
    """Return the :class:`Algorithm` called ``name``.

    Raises:
        ValueError: for an unknown name (the message lists the known ones).
    """
    try:
        return _ALGORITHMS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown algorithm {name!r}; registered: {', '.join(_ALGORITHMS)}"
        ) from None


def names():
    """Registered algorithm names, in registration order."""
    return list(_ALGORITHMS)


def index(name):
    """Position of ``name`` in the registry (used to compare choices across ranks)."""
    return names().index(name)
