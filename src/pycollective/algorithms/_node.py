"""One node's shared memory for the "shm" reduce-scatter, allgather, bcast and reduce.

What these four algorithms share, built once per communicator (collective
on first use, the same on every rank):

* :class:`NodeState`: the node group of all the communicator's ranks
  (:func:`~pycollective._shmem.whole_node`, the same group the agreement
  step and allreduce's "shm" use, so all their syncs follow one sequence),
  its own :class:`~pycollective._shmem.SharedSlots`, and, where the system
  allows it, a :class:`~pycollective._cma.CrossMemory` reader -- or the
  reason they cannot run (the communicator spans nodes).
* :func:`reduce_range`: combine elements ``[lo, hi)`` of every rank's input,
  operands in rank order 0..N-1, into ``out``; the peers' operands come from
  their slots or straight from their published buffers.

Above ``CMA_BYTES`` (where cross-memory reads are allowed) the algorithms
read the others' buffers where they are (one copy); below, or without them,
data are staged in the slots.  The threshold is allreduce "shm"'s
(``DOUBLE_LIMIT``, 1 MiB): below it the slots alternate between two regions
and a call needs no trailing sync.
"""

import numpy as np

from .. import _cma, _env
from .._context import Key
from .._errors import ConfigurationError
from .._shmem import DOUBLE_LIMIT, SharedSlots, reduce_block, whole_node

__all__ = ["NodeState", "node_state", "on_one_node", "reduce_range", "CMA_BYTES", "STAGE_BYTES"]

CMA_BYTES = DOUBLE_LIMIT
STAGE_BYTES = 4 << 20   # cross-memory reads staged per block, all peers together (as "shm")
_BLOCK_BYTES = 128 << 10  # slot reductions: N operands + output of a block stay in cache
_STATE = Key("node.collectives")


class NodeState:
    """The node's slots and cross-memory reader for the non-allreduce "shm" algorithms."""

    def __init__(self, ctx):
        group = whole_node(ctx)
        self.slots = self.cross = None
        self.error = None
        if group is None:
            # Every rank sees its node smaller than the communicator: the same everywhere.
            self.error = (f"algorithm 'shm' needs all {ctx.size} ranks of the communicator on "
                          "one shared-memory node, but the communicator spans several nodes")
            return
        self.group = group
        self.rank, self.size = group.rank, group.size
        self.slots = SharedSlots(group)
        if group.all_ok(_cma.available() and _env.SHM_CMA.get()):  # the wish is agreed
            cross = _cma.CrossMemory(group)
            if cross.probe():
                self.cross = cross
            else:
                cross.free()

    def use_cma(self, nbytes) -> bool:
        """Read peers' buffers in place for a message of ``nbytes`` (the same on every rank)."""
        return self.cross is not None and nbytes > CMA_BYTES

    def sync(self):
        self.group.sync()

    def free(self):
        if self.cross is not None:
            self.cross.free()
            self.cross = None
        if self.slots is not None:
            self.slots.free()
            self.slots = None


def node_state(ctx) -> NodeState:
    """The :class:`NodeState` of ``ctx``; raises :class:`ConfigurationError` if it spans nodes."""
    state = ctx.cached(_STATE, NodeState)
    if state.error is not None:
        raise ConfigurationError(state.error)
    return state


def on_one_node(ctx):
    """None if the "shm" algorithms can run on ``ctx``, else why not (collective on first use)."""
    return ctx.cached(_STATE, NodeState).error


def reduce_range(state, src, out, lo, hi, kernel, peers):
    """``out = x_0[lo:hi] op x_1[lo:hi] op ... op x_{N-1}[lo:hi]``, in rank order.

    Args:
        state: the :class:`NodeState`.
        src: this rank's input (its own operand is ``src[lo:hi]``).
        out: ``hi - lo`` elements; may alias ``src[lo:hi]`` (in place).
        kernel: the reduction.
        peers: ``"cma"`` to read the others' published ``src`` (the
            ``CrossMemory.SRC`` buffer, same element offsets), or the typed
            slot views, where every rank's slot holds its input at the same
            element offsets.
    """
    n, r = state.size, state.rank
    if hi <= lo:
        return
    itemsize = src.itemsize
    # In place, the first kernel pass writes out before a rank r >= 2 has
    # read its own operand (operands go in rank order): stage it.
    own_staged = r >= 2 and np.may_share_memory(src[lo:hi], out)
    if peers == "cma":
        cross = state.cross
        # Fewer, larger reads cost less pinning per byte; the N-1 staged
        # blocks together stay around STAGE_BYTES, still in cache when reduced.
        block = max(1, max(16 << 10, STAGE_BYTES // max(n - 1, 1)) // itemsize)
        tmp = cross.scratch(n * block * itemsize)
        staged = [tmp[i * block * itemsize:(i + 1) * block * itemsize].view(src.dtype)
                  for i in range(n)]
    else:
        block = max(1, _BLOCK_BYTES // itemsize)
        staged = [None] * (n - 1) + [np.empty(min(block, hi - lo), src.dtype)
                                     if own_staged else None]
    for b in range(lo, hi, block):
        e = min(b + block, hi)
        operands, i = [], 0
        for q in range(n):
            if q == r:
                own = src[b:e]
                if own_staged:
                    own = staged[n - 1][:e - b]
                    own[...] = src[b:e]
                operands.append(own)
            elif peers == "cma":
                part = staged[i][:e - b]
                i += 1
                cross.read(q, cross.SRC, b * itemsize, part)
                operands.append(part)
            else:
                operands.append(peers[q][b:e])
        reduce_block(kernel, operands, out[b - lo:e - lo])
