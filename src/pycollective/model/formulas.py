"""The α-β-γ model of each algorithm as implemented: predicted time of one allreduce.

A message of n bytes costs ``α + n·β`` (α: start-up seconds per message, β:
seconds per byte sent), and reducing n bytes into a buffer costs ``n·γ``.
Each algorithm's registry entry carries ``cost(nranks, count, itemsize,
alpha, beta, gamma) -> seconds``, the time along its critical path as the
algorithm is actually implemented: ceil-sized chunks when M is not a
multiple of N, empty chunks that still cost a message when M < N, the fold
and unfold of a non-power-of-two butterfly, the server's two directions in
the parameter server.  This module evaluates those functions; it has no
state and sends no message.
"""

import math

import numpy as np

from ..runtime import registry as _registry

__all__ = ["predict", "predict_all", "terms", "cost_of", "check_args"]


def check_args(nranks, count, alpha, beta, gamma, itemsize):
    if not isinstance(nranks, (int, np.integer)) or nranks < 1:
        raise ValueError(f"nranks must be a positive integer, got {nranks!r}")
    if not isinstance(count, (int, np.integer)) or count < 0:
        raise ValueError(f"count must be a non-negative integer, got {count!r}")
    if not isinstance(itemsize, (int, np.integer)) or itemsize < 1:
        raise ValueError(f"itemsize must be a positive integer, got {itemsize!r}")
    for label, v in (("alpha", alpha), ("beta", beta), ("gamma", gamma)):
        if not (isinstance(v, (int, float, np.floating)) and v >= 0 and math.isfinite(v)):
            raise ValueError(f"{label} must be a finite number >= 0, got {v!r}")


def cost_of(name):
    algo = _registry.get(name)  # ValueError naming the registered ones
    if algo.cost is None:
        raise ValueError(
            f"algorithm {name!r} has no cost model: pass cost=f(nranks, count, "
            f"itemsize, alpha, beta, gamma) to register() in its module")
    return algo.cost


def predict(algorithm, nranks, count, *, alpha, beta, gamma=0.0, itemsize=4):
    """Predicted time of one allreduce of ``count`` elements over ``nranks`` ranks.

    This is the implementation-faithful model (see the module docstring);
    use :func:`lecture_predict` for the lecture's textbook formulas.

    Args:
        algorithm: a registered algorithm name (see
            :func:`pycollective.algorithms`).
        nranks: communicator size N (>= 1).
        count: elements per rank M (>= 0).
        alpha: seconds per message.
        beta: seconds per byte sent.
        gamma: seconds per byte reduced.
        itemsize: bytes per element (pass ``itemsize=1`` and ``beta=w`` to
            work in seconds per element).

    Returns:
        Seconds (float).  0.0 for ``count == 0`` or ``nranks == 1``, which
        ``allreduce`` answers without any message.

    Raises:
        ValueError: for an unregistered algorithm (the message lists the
            registered ones), an algorithm registered without a cost model,
            or invalid numbers.
    """
    cost = cost_of(algorithm)
    check_args(nranks, count, alpha, beta, gamma, itemsize)
    if count == 0 or nranks == 1:
        return 0.0
    return float(cost(int(nranks), int(count), int(itemsize), alpha, beta, gamma))


def terms(algorithm, nranks, count, itemsize=4):
    """The three coefficients of ``algorithm``'s cost: how many α, β and γ it pays.

    Costs are linear in (α, β, γ), so evaluating them at unit vectors gives
    (messages on the critical path, bytes sent along it, bytes reduced along
    it): the model's own description of what an algorithm does.

    Returns:
        ``(messages, bytes_sent, bytes_reduced)`` as floats.

    Raises:
        ValueError: as :func:`predict`.
    """
    kw = dict(itemsize=itemsize)
    return (predict(algorithm, nranks, count, alpha=1.0, beta=0.0, **kw),
            predict(algorithm, nranks, count, alpha=0.0, beta=1.0, **kw),
            predict(algorithm, nranks, count, alpha=0.0, beta=0.0, gamma=1.0, **kw))


def predict_all(nranks, count, *, alpha, beta, gamma=0.0, itemsize=4):
    """Return ``{name: seconds}`` from :func:`predict` for every registered algorithm."""
    return {name: predict(name, nranks, count, alpha=alpha, beta=beta, gamma=gamma,
                          itemsize=itemsize)
            for name in _registry.names()}
