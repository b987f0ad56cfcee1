"""ZeRO stages 0-3 around an element-wise numpy optimizer, in mixed precision.

What each rank holds (M parameters, N ranks, working precision w bytes: 2
for fp16/bf16, 4 for fp32; the lecture's figure 6 and table 3):

=====  ======================  ======================  ===========================
stage  working parameters      gradients               float32 optimizer state
=====  ======================  ======================  ===========================
0      M (w B)                 M (w B)                 M: master, grads, m, v
1      M                       M                       M/N
2      M                       M/N (wire dtype)        M/N
3      M/N                     M/N (wire dtype)        M/N
=====  ======================  ======================  ===========================

Sharding.  Each layer's parameters are split over the ranks by
:func:`pycollective.partition` on their own, so every layer is one
collective call and a layer can be gathered alone (stage 3).  Rank r's
shard is its chunk of every layer, concatenated.

One step (the lecture's figure 7):

* stage 0, baseline data parallelism: after backward, each layer's
  gradients are allreduced (ring); every rank updates all of the float32
  state and rounds all master weights to the working copy;
* stage 1: after backward, each layer's gradients are reduce-scattered; each
  rank updates its 1/N of the float32 state, rounds its chunk of master
  weights to the working precision, and the updated working parameters are
  allgathered.  (The lecture animates step 3 as an allreduce; its
  allgather half is not needed, since only a chunk's owner updates it, and
  with it stage 1 would send 3M instead of the 2M of its table 3.)
* stage 2: as stage 1, but each layer's gradients are reduce-scattered as
  soon as that layer's backward is done (:meth:`ZeroOptimizer.grads_ready`),
  out of a bucket the size of the layer, into the M/N shard.  The
  reduce-scatter is started there and completed later (nonblocking, see
  :meth:`Comms.start_reduce_scatter`), so it runs while the backward of the
  layers below is computed; at most ``buckets_in_flight`` buckets are alive
  at once (the oldest is waited for before a new one is made), and all are
  completed before the update;
* stage 3: as stage 2, and the working parameters are sharded too: a
  layer's parameters are allgathered just before its forward and again just
  before its backward (:meth:`ZeroOptimizer.params`) and dropped after use
  (:meth:`ZeroOptimizer.release`).

Then, in every stage: the reduced gradients are turned into float32 and
divided by the loss scale; whether any of them is infinite or NaN is agreed
over the ranks (one one-element MAX), and if so the step is skipped on every
rank and the scale lowered; otherwise the inner optimizer (Adam) updates
the float32 master weights of this rank's partition.  Because Adam is
element-wise and every element's gradient is reduced in the same order in
every stage (the ring's chunks of each layer), float32 training gives
bitwise the same weights in all four stages; every rank's copy of a
parameter comes from one owner, so replicas are bitwise identical.
"""

from collections import deque
from typing import List, Sequence

import numpy as np

from ..data.partition import partition
from ._comms import Comms
from ._precision import scaler_for, working_dtype

__all__ = ["ZeroOptimizer", "Adam", "state_arrays"]

_F32 = np.dtype(np.float32)


class Adam:
    """Adam (Kingma and Ba) on lists of numpy arrays; element-wise, so sharding does not change it."""

    STATE = ("m", "v")          # arrays per parameter (checkpointed, counted as optimizer state)
    SCALARS = ("t",)            # numbers (checkpointed)

    def __init__(self, params, lr, beta1=0.9, beta2=0.999, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps, self.t = lr, beta1, beta2, eps, 0
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]

    def step(self, params, grads):
        self.t += 1
        c1, c2 = 1 - self.b1 ** self.t, 1 - self.b2 ** self.t
        for p, g, m, v in zip(params, grads, self.m, self.v):
            m *= self.b1
            m += (1 - self.b1) * g
            v *= self.b2
            v += (1 - self.b2) * g * g
            p -= (self.lr / c1) * m / (np.sqrt(v / c2) + self.eps)


def state_arrays(inner):
    """The arrays of an optimizer's state, by name: ``{"m": [...], "v": [...]}``."""
    return {name: list(getattr(inner, name)) for name in getattr(inner, "STATE", ())}


class _Layer:
    """Where one layer lives: its tensors, its flat range, this rank's chunk of it."""

    def __init__(self, index, tensors, shapes, start, nranks, rank, shard_start):
        self.index, self.tensors = index, list(tensors)
        self.sizes = [int(np.prod(shapes[t], dtype=np.int64)) for t in self.tensors]
        self.shapes = [tuple(shapes[t]) for t in self.tensors]
        self.start = start
        self.size = sum(self.sizes)
        self.chunk_offset, self.chunk_len = partition(self.size, nranks, rank)
        self.shard_start = shard_start  # where the chunk sits in this rank's shard

    @property
    def flat(self):
        return slice(self.start, self.start + self.size)

    @property
    def chunk(self):
        """This rank's chunk, within the layer."""
        return slice(self.chunk_offset, self.chunk_offset + self.chunk_len)

    @property
    def in_shard(self):
        return slice(self.shard_start, self.shard_start + self.chunk_len)

    def views(self, flat):
        """The layer's tensors as views of its flat buffer."""
        out, offset = [], 0
        for size, shape in zip(self.sizes, self.shapes):
            out.append(flat[offset:offset + size].reshape(shape))
            offset += size
        return out


class ZeroOptimizer:
    """Sharded mixed-precision optimizer: ZeRO stages 0 (plain data parallelism) to 3.

    Args:
        params: the initial parameters, float32 arrays, identical on every rank.
        layers: tensor indices of each layer, in forward order, each layer a
            run of consecutive tensors covering them all (e.g. ``[[0, 1],
            [2, 3]]`` for two (W, b) layers).
        comm: an mpi4py intracommunicator.
        stage: 0, 1, 2 or 3.
        precision: "fp32", "fp16" or "bf16": dtype of the working parameters
            and gradients.
        compress: None, "fp16", "bf16" or an element-wise compressor: the
            dtype gradients travel as (:mod:`pycollective.compression`).
        optimizer: ``optimizer(list_of_float32_arrays) -> object`` with
            ``step(params, grads)``, element-wise (Adam, SGD), and optionally
            ``STATE``/``SCALARS`` naming what a checkpoint keeps; default:
            :class:`Adam` with ``lr``.
        lr: learning rate of the default Adam.
        scaler: a :class:`~pycollective.zero.LossScaler`; default: dynamic
            for fp16, fixed at 1 otherwise.
        buckets_in_flight: stages 2 and 3: how many layers' gradient buckets
            may be alive at once (being written or being reduced); 1 waits
            for each reduce-scatter before the next layer's backward.

    Raises:
        ValueError: bad stage, precision, compression, layers or
            buckets_in_flight.
    """

    def __init__(self, params: Sequence[np.ndarray], layers: Sequence[Sequence[int]], comm, *,
                 stage=0, precision="fp32", compress=None, optimizer=None, lr=1e-3,
                 scaler=None, buckets_in_flight=2):
        if stage not in (0, 1, 2, 3):
            raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage!r}")
        if isinstance(buckets_in_flight, bool) or not isinstance(buckets_in_flight, int) \
                or buckets_in_flight < 1:
            raise ValueError(f"buckets_in_flight must be a whole number >= 1, "
                             f"got {buckets_in_flight!r}")
        self.buckets_in_flight = buckets_in_flight
        flat_order = [t for layer in layers for t in layer]
        if flat_order != list(range(len(params))):
            raise ValueError(f"layers must cover tensors 0..{len(params) - 1} in order, "
                             f"got {layers}")
        self.stage, self.precision = stage, precision
        self.dtype = working_dtype(precision)
        self.comms = Comms(comm, compress)
        self.nranks, self.rank = self.comms.nranks, self.comms.rank
        self.wire = self.comms.wire_dtype(self.dtype)
        self.scaler = scaler if scaler is not None else scaler_for(precision)
        shapes = [np.shape(p) for p in params]
        self.layers: List[_Layer] = []
        start = shard = 0
        for i, tensors in enumerate(layers):
            layer = _Layer(i, tensors, shapes, start, self.nranks, self.rank, shard)
            self.layers.append(layer)
            start += layer.size
            shard += layer.chunk_len
        self.count, self.shard_count = start, shard
        full = np.concatenate([np.asarray(p, _F32).reshape(-1) for p in params]) if params \
            else np.zeros(0, _F32)
        # float32 optimizer state: the whole vector (stage 0) or this rank's shard.
        self.master = full if stage == 0 else self._shard_of(full)
        self.grad32 = np.zeros_like(self.master)
        make = optimizer or (lambda ps: Adam(ps, lr))
        self.inner = make([self.master])
        # Working copy: all of it (stages 0-2) or this rank's shard (3).
        if stage < 3:
            self.work = full.astype(self.dtype)
        else:
            self.work = self.master.astype(self.dtype)
        # Gradients: the whole vector in the working dtype (0, 1), or the
        # reduced shard in the wire dtype (2, 3).
        if stage < 2:
            self.grad = np.zeros(self.count, self.dtype)
        else:
            self.grad = np.zeros(self.shard_count, self.wire)
        self._ctx = self.comms.to_wire(np.zeros(0, self.dtype))[1]  # the compressor's context
        self._gathered = {}      # stage 3: layer index -> gathered working parameters
        self._buckets = {}       # stage 2, 3: layer index -> gradients being written
        self._pending = deque()  # stage 2, 3: (started reduce-scatter, bytes it holds)
        self._transient = 0      # bytes of gathered layers and buckets alive now
        self.peak_transient = 0  # and their largest total since the last reset

    # --- layout ----------------------------------------------------------------

    def _shard_of(self, full):
        """This rank's chunk of every layer of a full flat vector, concatenated."""
        out = np.empty(self.shard_count, full.dtype)
        for layer in self.layers:
            out[layer.in_shard] = full[layer.flat][layer.chunk]
        return out

    def _hold(self, nbytes):
        self._transient += nbytes
        self.peak_transient = max(self.peak_transient, self._transient)

    # --- what forward and backward use -------------------------------------------

    @property
    def scale(self):
        """The loss scale S: multiply the loss (its gradient) by it before backward."""
        return self.scaler.scale

    def params(self, index):
        """Layer ``index``'s working parameters (views), gathered first in stage 3.

        Stage 3 allgathers the layer each time it is asked (before forward,
        again before backward); call :meth:`release` when done with it.
        """
        layer = self.layers[index]
        if self.stage < 3:
            return layer.views(self.work[layer.flat])
        buf = np.empty(layer.size, self.dtype)
        self._hold(buf.nbytes)
        buf[layer.chunk] = self.work[layer.in_shard]
        self.comms.allgather(buf)
        self._gathered[index] = buf
        return layer.views(buf)

    def release(self, index):
        """Drop layer ``index``'s gathered parameters (stage 3; otherwise nothing)."""
        buf = self._gathered.pop(index, None)
        if buf is not None:
            self._transient -= buf.nbytes

    def grads(self, index):
        """Arrays to write layer ``index``'s gradients into (working dtype)."""
        layer = self.layers[index]
        if self.stage < 2:
            return layer.views(self.grad[layer.flat])
        while len(self._pending) + len(self._buckets) >= self.buckets_in_flight:
            self._complete_oldest()  # its memory is needed now
        bucket = np.empty(layer.size, self.dtype)
        self._hold(bucket.nbytes)
        self._buckets[index] = bucket
        return layer.views(bucket)

    def grads_ready(self, index):
        """Layer ``index``'s gradients are written: stages 2 and 3 start reduce-scattering them.

        The reduction lands in this rank's shard of the gradients; it is
        completed before :meth:`step` updates (or earlier, when its bucket's
        memory is needed).
        """
        if self.stage < 2:
            return
        layer = self.layers[index]
        bucket = self._buckets.pop(index)
        wire, _ = self.comms.to_wire(bucket)
        if wire is not bucket:  # the compressed copy travels; the bucket can go now
            self._hold(wire.nbytes)
            self._transient -= bucket.nbytes
        pending = self.comms.start_reduce_scatter(wire, self.grad[layer.in_shard])
        self._pending.append((pending, wire.nbytes))

    def _complete_oldest(self):
        pending, nbytes = self._pending.popleft()
        self.comms.wait(pending)
        self._transient -= nbytes

    def finish_reductions(self):
        """Complete every started gradient reduce-scatter (:meth:`step` does it first)."""
        while self._pending:
            self._complete_oldest()

    # --- the step ----------------------------------------------------------------

    def _reduce(self):
        """Stages 0 and 1: reduce the whole gradient now; fill ``grad32``."""
        scale = self.scaler.scale
        wire, ctx = self.comms.to_wire(self.grad)
        if wire is not self.grad:
            self._hold(wire.nbytes)
        for layer in self.layers:
            part = wire[layer.flat]
            if self.stage == 0:
                self.comms.allreduce(part)
                self.comms.from_wire(part, ctx, self.grad32[layer.flat], scale)
            else:
                mine = self.comms.reduce_scatter(part)
                self.comms.from_wire(mine, ctx, self.grad32[layer.in_shard], scale)
        if wire is not self.grad:
            self._transient -= wire.nbytes

    def step(self):
        """Reduce (stages 0, 1), check for overflow on every rank, update, share.

        Returns:
            True if the update was applied, False if it was skipped because
            some rank had an infinite or NaN gradient (the same on every rank).
        """
        if self.stage < 2:
            self._reduce()
        else:
            self.finish_reductions()
            self.comms.from_wire(self.grad, self._ctx, self.grad32, self.scaler.scale)
        overflow = self.comms.any_rank(not np.isfinite(self.grad32).all())
        self.scaler.update(overflow)
        if overflow:
            return False
        self.inner.step([self.master], [self.grad32])
        self.rebuild_working()
        return True

    def rebuild_working(self, counted=True):
        """Round the master weights to the working copy (and allgather it at stages 1, 2)."""
        if self.stage in (0, 3):  # the working copy is as large as the master copy
            self.work[...] = self.master
            return
        for layer in self.layers:
            part = self.work[layer.flat]
            part[layer.chunk] = self.master[layer.in_shard]
            self.comms.allgather(part, counted=counted)

    # --- inspection -----------------------------------------------------------------

    def full_params(self):
        """Every layer's working parameters, as one list of tensors (gathered, not counted)."""
        if self.stage < 3:
            flat = self.work
        else:
            flat = self._gather_full(self.work)
        return [v for layer in self.layers for v in layer.views(flat[layer.flat])]

    def master_params(self):
        """The float32 master weights, whole, as one flat vector (gathered, not counted)."""
        return self.master.copy() if self.stage == 0 else self._gather_full(self.master)

    def _gather_full(self, shard):
        full = np.empty(self.count, shard.dtype)
        for layer in self.layers:
            part = full[layer.flat]
            part[layer.chunk] = shard[layer.in_shard]
            self.comms.allgather(part, counted=False)
        return full

    def memory(self):
        """Bytes this rank holds: ``params``, ``grads``, ``optimizer`` (+ ``total``).

        ``optimizer`` is the float32 master weights, float32 gradients and
        the inner optimizer's state arrays; ``transient`` is the largest
        total of gathered layers, gradient buckets and compressed copies
        alive at once since the last :meth:`reset_peak`.
        """
        state = sum(a.nbytes for arrays in state_arrays(self.inner).values() for a in arrays)
        out = {"params": self.work.nbytes, "grads": self.grad.nbytes,
               "optimizer": self.master.nbytes + self.grad32.nbytes + state}
        out["total"] = out["params"] + out["grads"] + out["optimizer"]
        out["transient"] = self.peak_transient
        return out

    def reset_peak(self):
        self.peak_transient = self._transient
