"""``algorithm="auto"``: the per-communicator state behind the default choice.

The choice itself is pure (:mod:`pycollective.model.choice`): the algorithm
with the smallest calibrated prediction for (N, M, dtype).  What this module
adds is what makes every rank choose the same way:

* the parameters are rank 0's: on a communicator's first automatic call,
  rank 0 alone reads the calibration file and broadcasts it, so ranks with
  different files (or none) still agree;
* algorithms that cannot run on the communicator (their registration's
  ``usable(ctx)`` gives a reason, e.g. "shm" across nodes) are left out,
  asked once, on every rank at the same point;
* choices are cached per (M, dtype, op) in the communicator's context.

A calibration file that cannot be read gives the defaults, with a warning
on rank 0: a broken file must not break every allreduce.
"""

import logging
import warnings
from typing import Dict, Optional

import numpy as np

from . import _registry, _watch
from ._context import Context, Key
from ._root import bcast_from_root
from .model.choice import fastest
from .model.params import DEFAULTS, load_params, params_for

__all__ = ["AutoState", "auto_for", "unusable_reasons", "KEY"]

logger = logging.getLogger("pycollective")

KEY = Key("auto")
_USABLE = Key("usable")


def unusable_reasons(ctx: Context) -> Dict[str, str]:
    """``{name: reason}`` of the registered algorithms that cannot run on ``ctx``.

    Collective on a context's first use (an algorithm's ``usable`` may build
    state, e.g. shm's node window), the same answer on every rank.
    """
    def ask(ctx):
        reasons = {}
        for name in _registry.names():
            why = _registry.get(name).usable(ctx) if ctx.size > 1 else None
            if why:
                reasons[name] = why
        return reasons
    return ctx.cached(_USABLE, ask)


class AutoState:
    """Rank 0's parameters for this communicator, its unusable algorithms, cached choices."""

    __slots__ = ("params", "size", "flat", "choices", "exclude")
    _LIMIT = 4096  # bound the cache for programs that sweep many sizes

    def __init__(self, params: dict, size: int, exclude=()):
        self.params = params
        self.size = size
        self.flat = params_for(params, size)
        self.choices: Dict[tuple, str] = {}
        self.exclude = tuple(exclude)

    def choose(self, count: int, dtype: np.dtype, opname: str) -> str:
        """The registered name ``auto`` runs for this call shape (cached)."""
        key = (count, dtype.num, opname)
        name = self.choices.get(key)
        if name is None:
            if len(self.choices) >= self._LIMIT:
                self.choices.clear()
            name = self.choices[key] = fastest(self.size, count, dtype, self.flat, self.exclude)
            logger.debug("auto: N=%d M=%d %s %s -> %s (parameters: %s)", self.size, count,
                         dtype, opname, name, self.params.get("source"))
        return name


def _load() -> dict:
    try:
        return load_params()
    except ValueError as exc:
        warnings.warn(f"pycollective: ignoring the calibration: {exc}")
        return dict(DEFAULTS, source=f"defaults ({exc})")


def auto_for(ctx: Context, params: Optional[dict] = None) -> AutoState:
    """The :class:`AutoState` of ``ctx``; collective on its first use.

    Args:
        ctx: the communicator's context.
        params: use these parameters instead of rank 0's file (they must be
            the same on every rank); replaces any existing state.
    """
    state = ctx.peek(KEY)
    if state is None or params is not None:
        if params is None:
            # With the agreement off this may run before any rank has checked
            # that the others make the same call: wait for them with a deadline
            # first, so the blocking broadcast cannot wait for ever.
            _watch.arrive(ctx.comm, "its first automatic choice")
            params = bcast_from_root(ctx.comm, _load, what="algorithm='auto': loading the "
                                     "cost model")
        state = ctx.put(KEY, AutoState(params, ctx.size, unusable_reasons(ctx)))
    return state
