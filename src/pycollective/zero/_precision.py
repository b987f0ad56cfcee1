"""Working precisions and dynamic loss scaling (the lecture's mixed-precision ledger, section 2.4).

Mixed precision keeps two copies of the model: the working parameters and
gradients in a two-byte float, used by forward and backward, and float32
master weights with Adam's moments, which the update is applied to (an
update of 1e-4 relative to a weight is below float16's resolution, so
adding it to a float16 weight would lose it).  After each update the master
weights are rounded to the working precision again.

float16 gradients underflow (below 2^-24) long before float32 ones do, so
the loss is multiplied by a scale S before backward and the gradients are
divided by S in float32, after the reduction.  The scale is dynamic: an
infinite or NaN gradient on any rank skips the step on every rank and
halves S; ``interval`` good steps in a row double it.  bfloat16 has
float32's range and needs no scaling (S = 1, but an overflow still skips the
step everywhere).
"""

import numpy as np

from ..data.kernels import bfloat16

__all__ = ["PRECISIONS", "working_dtype", "LossScaler", "scaler_for"]

#: --precision name -> working dtype of parameters and gradients.
PRECISIONS = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16), "bf16": bfloat16()}


def working_dtype(precision):
    """The dtype of ``precision`` ("fp32", "fp16", "bf16").

    Raises:
        ValueError: any other name.
    """
    try:
        return PRECISIONS[precision]
    except KeyError:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, "
                         f"got {precision!r}") from None


class LossScaler:
    """Dynamic loss scale: halve on overflow, double after ``interval`` good steps.

    Args:
        scale: the initial scale S.
        dynamic: False keeps S fixed (overflows still skip steps).
        growth, backoff: factors applied after good runs / on overflow.
        interval: good steps in a row before growing.
        minimum: S never goes below this.

    Every rank must see the same sequence of overflow verdicts (the optimizer
    agrees them across ranks), so every rank holds the same S.
    """

    def __init__(self, scale=2.0 ** 15, *, dynamic=True, growth=2.0, backoff=0.5,
                 interval=200, minimum=1.0):
        if not scale > 0:
            raise ValueError(f"loss scale must be positive, got {scale}")
        self.scale, self.dynamic = float(scale), bool(dynamic)
        self.growth, self.backoff, self.interval = float(growth), float(backoff), int(interval)
        self.minimum = float(minimum)
        self.good = 0        # good steps since the last change
        self.skipped = 0     # steps skipped for overflow, in total

    def update(self, overflow):
        """Record one step's agreed verdict and adjust the scale."""
        if overflow:
            self.skipped += 1
            self.good = 0
            if self.dynamic:
                self.scale = max(self.minimum, self.scale * self.backoff)
            return
        self.good += 1
        if self.dynamic and self.good >= self.interval:
            self.scale *= self.growth
            self.good = 0

    def state(self):
        """What a checkpoint keeps."""
        return {"scale": self.scale, "good": self.good, "skipped": self.skipped}

    def load(self, state):
        self.scale = float(state["scale"])
        self.good, self.skipped = int(state["good"]), int(state["skipped"])


def scaler_for(precision, **kwargs):
    """The default scaler of a precision: dynamic 2^15 for fp16, fixed 1 otherwise."""
    if working_dtype(precision) == np.float16:
        return LossScaler(**kwargs)
    kwargs.setdefault("scale", 1.0)
    kwargs.setdefault("dynamic", False)
    return LossScaler(**kwargs)
