"""A ReLU MLP trained layer by layer through a :class:`ZeroOptimizer`.

The forward and backward passes ask the optimizer for each layer's
parameters just before using them and hand it each layer's gradients as
soon as they are written -- the hooks stage 3 needs to gather a layer and
stage 2 to reduce-scatter it during backward.

Two-byte precisions are stored in two bytes and multiplied in float32, as
tensor cores do: every matrix product takes float16/bfloat16 operands,
accumulates in float32 (numpy has no fast two-byte matmul) and rounds its
result once to the working precision.  The loss and its gradient with
respect to the logits are computed in float32, then multiplied by the loss
scale and rounded to the working precision for backward.
"""

import numpy as np

__all__ = ["MLP"]

_F32 = np.float32


def _linear(h, w, b, dtype):
    """``h @ w + b`` with float32 accumulation, rounded once to ``dtype``."""
    return (h.astype(_F32) @ w.astype(_F32) + b.astype(_F32)).astype(dtype)


class MLP:
    """Layers ``sizes[0] -> sizes[1] -> ... -> sizes[-1]``, ReLU between, softmax cross-entropy.

    Tensors are ``[W1, b1, W2, b2, ...]`` (W: fan_in x fan_out); layer l is
    tensors ``[2l, 2l+1]`` (:attr:`layers`).
    """

    def __init__(self, sizes):
        self.sizes = [int(s) for s in sizes]
        if len(self.sizes) < 2:
            raise ValueError(f"an MLP needs at least two sizes, got {sizes}")
        self.shapes = []
        for fan_in, fan_out in zip(self.sizes[:-1], self.sizes[1:]):
            self.shapes += [(fan_in, fan_out), (fan_out,)]
        self.layers = [[2 * i, 2 * i + 1] for i in range(len(self.sizes) - 1)]

    @property
    def layer_sizes(self):
        """Parameters of each layer (its W and b)."""
        return [fan_in * fan_out + fan_out
                for fan_in, fan_out in zip(self.sizes[:-1], self.sizes[1:])]

    @property
    def count(self):
        """M, the number of parameters."""
        return sum(int(np.prod(s)) for s in self.shapes)

    def init(self, seed, dtype=_F32):
        """[W1, b1, ...] with He initialisation, identical for identical seeds."""
        rng = np.random.default_rng(seed)
        params = []
        for fan_in, fan_out in zip(self.sizes[:-1], self.sizes[1:]):
            w = rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)
            params += [w.astype(dtype), np.zeros(fan_out, dtype)]
        return params

    def train_step(self, opt, x, y, batch_size):
        """Forward, backward and ``opt.step()`` on this rank's samples ``x, y``.

        The loss is the sum over this rank's samples divided by the global
        ``batch_size``, so the sum over ranks is the mean over the global batch.

        Returns:
            ``(sum of this rank's losses, whether the step was applied)``.
        """
        # Overflow is expected now and then in two-byte precisions: the
        # optimizer finds it in the gradients and skips the step everywhere.
        with np.errstate(over="ignore", invalid="ignore"):
            return self._train_step(opt, x, y, batch_size)

    def _train_step(self, opt, x, y, batch_size):
        dtype = opt.dtype
        h = x.astype(dtype)
        acts, pres = [], []
        nlayers = len(self.layers)
        for i in range(nlayers):
            w, b = opt.params(i)
            acts.append(h)
            z = _linear(h, w, b, dtype)
            opt.release(i)
            pres.append(z)
            h = np.maximum(z, 0) if i < nlayers - 1 else z
        logits = h.astype(_F32)
        shifted = logits - logits.max(axis=1, keepdims=True)
        expz = np.exp(shifted)
        total = expz.sum(axis=1, keepdims=True)
        rows = np.arange(len(y))
        loss = float(-(shifted[rows, y] - np.log(total[:, 0])).sum())
        delta = expz / total
        delta[rows, y] -= 1
        delta = (delta * _F32(opt.scale / batch_size)).astype(dtype)
        for i in reversed(range(nlayers)):
            w, _ = opt.params(i)
            gw, gb = opt.grads(i)
            d32 = delta.astype(_F32)
            gb[...] = d32.sum(axis=0)
            gw[...] = acts[i].astype(_F32).T @ d32
            if i:
                delta = ((d32 @ w.astype(_F32).T) * (pres[i - 1] > 0)).astype(dtype)
            opt.release(i)
            opt.grads_ready(i)
        return loss, opt.step()

    def predict(self, params, x):
        """Class predictions of float32 copies of ``params`` for ``x``."""
        h = x.astype(_F32)
        for i in range(len(self.layers)):
            w, b = params[2 * i].astype(_F32), params[2 * i + 1].astype(_F32)
            h = h @ w + b
            if i < len(self.layers) - 1:
                h = np.maximum(h, 0)
        return h.argmax(axis=1)
