"""``algorithm="auto"`` for reduce-scatter, allgather, bcast and reduce: a simple rule.

The rule: of the algorithms registered for the collective that can run on
the communicator (their ``usable(ctx)`` gives no reason), the one whose
registered α-β-γ cost is smallest for (N, M, element size), with rank 0's
calibrated α, β and γ (the allreduce calibration, shared through
:func:`pycollective.collectives.auto.auto_for`, so every rank holds the same numbers
and makes the same choice).  Ties go to the earlier registered algorithm.
Unlike allreduce's choice it applies no measured/model corrections (the
calibration measures allreduce only), so it is as good as the cost
formulas are.

:func:`choose` is the whole interface; the self-tuning ``auto`` of
allreduce can replace it without touching the collectives.  Choices and
the algorithms' usability are cached per communicator.
"""

from typing import Dict

from . import auto as _auto
from ..runtime import registry as _registry
from ..runtime.context import Context, Key
from ..data.kernels import as_dtype
from ..model.choice import rates

__all__ = ["choose", "unusable"]

_KEY = Key("choose")
_LIMIT = 4096  # cached choices per communicator (programs that sweep many sizes)


class _State:
    __slots__ = ("unusable", "choices")

    def __init__(self, ctx):
        self.unusable: Dict[str, Dict[str, str]] = {}
        self.choices: Dict[tuple, str] = {}


def unusable(ctx: Context, collective: str) -> Dict[str, str]:
    """``{name: reason}`` of ``collective``'s algorithms that cannot run on ``ctx``.

    Collective on first use per collective (``usable`` may build shared
    state), the same answer on every rank.
    """
    state = ctx.cached(_KEY, _State)
    reasons = state.unusable.get(collective)
    if reasons is None:
        reasons = {}
        for name in _registry.names(collective):
            why = _registry.get(name, collective).usable(ctx) if ctx.size > 1 else None
            if why:
                reasons[name] = why
        state.unusable[collective] = reasons
    return reasons


def choose(ctx: Context, collective: str, count: int, dtype) -> _registry.Algorithm:
    """The algorithm ``auto`` runs for ``count`` elements of ``dtype`` (same on every rank).

    Args:
        ctx: the communicator's context (size > 1).
        collective: "reduce_scatter", "allgather", "bcast" or "reduce".
        count: M, the elements of the whole vector (for bcast and
            allgather: the bytes, with ``dtype`` uint8).
        dtype: the element type (its size, and γ for the reductions).

    Raises:
        ValueError: no registered algorithm of ``collective`` can run here.
    """
    dtype = as_dtype(dtype)
    state = ctx.cached(_KEY, _State)
    key = (collective, count, dtype.num)
    name = state.choices.get(key)
    if name is None:
        flat = _auto.auto_for(ctx).flat
        excluded = unusable(ctx, collective)
        beta, gamma = rates(flat, count, dtype)
        best = None
        for candidate in _registry.names(collective):
            algo = _registry.get(candidate, collective)
            if candidate in excluded or algo.cost is None:
                continue
            t = algo.cost(ctx.size, count, dtype.itemsize, flat["alpha"], beta, gamma)
            if best is None or t < best[0]:
                best = (t, candidate)
        if best is None:
            raise ValueError(f"no {collective} algorithm can run on {ctx.label}: "
                             + "; ".join(f"{k}: {v}" for k, v in excluded.items()))
        if len(state.choices) >= _LIMIT:
            state.choices.clear()
        name = state.choices[key] = best[1]
    return _registry.get(name, collective)
