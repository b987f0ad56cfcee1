"""One node's shared memory for the "shm" reduce-scatter, allgather, bcast and reduce.

What these four algorithms share, built once per communicator (collective
on first use, the same on every rank):

* :class:`NodeState`: the node group of all the communicator's ranks
  (:func:`~pycollective.node.group.whole_node`, the same group the agreement
  step and allreduce's "shm" use, so all their syncs follow one sequence),
  its own :class:`~pycollective.node.group.SharedSlots`, and, where the system
  allows it, a :class:`~pycollective.node.cma.CrossMemory` reader -- or the
  reason they cannot run (the communicator spans nodes).
* :func:`reduce_range`: combine elements ``[lo, hi)`` of every rank's input,
  operands in rank order 0..N-1, into ``out``; the peers' operands come from
  their slots or straight from their published buffers
  (:func:`cross_reduce`, which allreduce's "shm" uses too).

Above ``CMA_BYTES`` (where cross-memory reads are allowed) the algorithms
read the others' buffers where they are (one copy); below, or without them,
data are staged in the slots.  The threshold is the slots' ``DOUBLE_LIMIT``
(4 MiB): below it the slots alternate between two regions and a call needs
no trailing sync; above it the two ways measured about level for these
(docs/results/fastway.md).  Allreduce "shm" has its own, higher one
(``SINGLE_COPY_BYTES``).
"""

import numba
import numpy as np

from ... import timeline as _timeline
from ...data import kernels as _kernels
from ...node import cma as _cma
from ...node.views import as_writable
from ...runtime import env as _env
from ...runtime.context import Key
from ..._errors import ConfigurationError
from ...node.group import BLOCK_BYTES, DOUBLE_LIMIT, SharedSlots, reduce_block, whole_node
from .mid import _fold_native as _fold

__all__ = ["NodeState", "node_state", "on_one_node", "reduce_range", "cross_reduce", "CMA_BYTES",
           "CROSS_BLOCK_BYTES"]

CMA_BYTES = DOUBLE_LIMIT
# cross_reduce: bytes per operand and block; the partial result, two staged
# blocks and the own block (1 MiB) stay in a 2 MiB L2.  256 KiB and 512 KiB
# were 7-18 % faster than the 4 MiB staged at once before (N = 2, 4, 8; 1e7
# float32), 1 MiB 1-8 % (docs/results/waits.md).
CROSS_BLOCK_BYTES = 256 << 10
# The kernels :func:`cross_reduce` folds in compiled code, by their op codes (mid._fold's):
# float16 and bfloat16 keep the loop in Python.
_OP_CODES = {_kernels._NATIVE[op]: code for code, op in enumerate(("sum", "prod", "max", "min"))}
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


def cross_reduce(cross, src, out, lo, hi, kernel, block_bytes=None, direct=None):
    """``out = x_0[lo:hi] op ... op x_{N-1}[lo:hi]``, the peers' operands read where they are.

    Each peer's block is read (``process_vm_readv`` of its published
    ``src``) just before the kernel folds it in, into one of two staging
    buffers, so the kernel reads it back from the core's own cache; the
    partial result, two staged blocks and the own block stay within L2.

    Args:
        cross: the node's :class:`~pycollective.node.cma.CrossMemory`.
        src: this rank's input (its operand is ``src[lo:hi]``, the peers'
            the same element range of theirs).
        out: ``hi - lo`` elements; may alias ``src[lo:hi]`` (in place).
        kernel: the reduction; operands are folded in rank order 0..N-1.
        block_bytes: bytes per operand and block (default ``CROSS_BLOCK_BYTES``).
        direct: per node rank, that rank's ``src`` as a view here where it is a
            shared allocation (:mod:`~pycollective.node.arrays`), read in place; else None.
    """
    n, r = cross.size, cross.rank
    if hi <= lo:
        return
    block = max(1, (block_bytes or CROSS_BLOCK_BYTES) // src.itemsize)
    nbytes = block * src.itemsize
    tmp = cross.scratch(3 * nbytes)
    # In place, the first kernel pass writes out before a rank r >= 2 has
    # read its own operand (operands go in rank order): stage it.
    own_staged = r >= 2 and np.may_share_memory(src[lo:hi], out)
    op = _OP_CODES.get(_timeline.untimed(kernel))
    if op is not None and direct is None and src.flags.c_contiguous and out.flags.c_contiguous:
        # the block loop compiled: each block cost about 3.5 us of Python (the read's
        # ctypes call, the kernel's dispatch), 80 blocks a 1e7-float call at N = 2
        for q in range(n):  # the same range of every peer's buffer: checked once
            if q != r:
                cross.check(q, cross.SRC, lo * src.itemsize, (hi - lo) * src.itemsize)
        srcs = np.ascontiguousarray(cross.headers[:, cross.SRC])  # this call's addresses
        staging = tmp[:3 * nbytes].view(src.dtype)
        if _timeline.ACTIVE is not None:  # timeline hook: the reads and folds (ended after)
            _timeline.ACTIVE.open("read and reduce", "reduce")
        failed = _cross_fold(op, as_writable(src), out, lo, hi, block, staging, r,
                             cross.pid_words, srcs, own_staged, cross.iovecs)
        if _timeline.ACTIVE is not None:
            _timeline.ACTIVE.close()
        if failed >= 0:  # the kernel refused a read: the same read raises with its error
            cross.read(failed, cross.SRC, lo * src.itemsize, staging[:1])
            raise OSError(f"process_vm_readv from node rank {failed} failed")
        return
    buffers = [tmp[i * nbytes:(i + 1) * nbytes].view(src.dtype) for i in range(3)]
    for b in range(lo, hi, block):
        e = min(b + block, hi)
        own = src[b:e]
        if own_staged:
            own = buffers[2][:e - b]
            own[...] = src[b:e]
        target = out[b - lo:e - lo]
        for q in range(n):
            if q == r:
                x = own
            elif direct is not None and direct[q] is not None:
                x = direct[q][b:e]
            else:
                x = buffers[q & 1][:e - b]
                if _timeline.ACTIVE is not None:  # timeline hook: the read (ended after it)
                    _timeline.ACTIVE.open("read", "copy")
                cross.read(q, cross.SRC, b * src.itemsize, x)
                if _timeline.ACTIVE is not None:
                    _timeline.ACTIVE.close()
            if q == 0:
                first = x  # its buffer is reused from q = 2 on, after the first pass
            else:
                kernel(first if q == 1 else target, x, target)


@numba.njit(cache=True, nogil=True)
def _cross_fold(op, src, out, lo, hi, block, staging, rank, pids, srcs, own_staged, iovecs):
    """:func:`cross_reduce`'s loop in compiled code, the same blocks, reads and folds in the
    same order (so the same bits): -1 once done, else the node rank whose read failed."""
    item = src.itemsize
    for b in range(lo, hi, block):
        e = min(b + block, hi)
        own = src[b:e]
        if own_staged:
            own = staging[2 * block:2 * block + e - b]
            own[:] = src[b:e]
        target = out[b - lo:e - lo]
        first = own
        for q in range(pids.shape[0]):
            if q == rank:
                x = own
            else:
                at = (q & 1) * block
                x = staging[at:at + e - b]
                if _cma.read_at(pids[q], srcs[q] + b * item, x.ctypes.data, (e - b) * item,
                                iovecs) < 0:
                    return q
            if q == 0:
                first = x  # its buffer is reused from q = 2 on, after the first pass
            elif q == 1:
                _fold(op, first, x, target)
            else:
                _fold(op, target, x, target)
    return -1


def reduce_range(state, src, out, lo, hi, kernel, peers, copy_to=None):
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
        copy_to: ``hi - lo`` elements that also get each block of the result
            while it is still in cache (slots only), or None.
    """
    if peers == "cma":
        cross_reduce(state.cross, src, out, lo, hi, kernel)
        return
    n, r = state.size, state.rank
    if hi <= lo:
        return
    block = max(1, BLOCK_BYTES // src.itemsize)  # the node steps' block (slots)
    # In place, the first kernel pass writes out before a rank r >= 2 has
    # read its own operand (operands go in rank order): stage it.
    staged = (np.empty(min(block, hi - lo), src.dtype)
              if r >= 2 and np.may_share_memory(src[lo:hi], out) else None)
    for b in range(lo, hi, block):
        e = min(b + block, hi)
        own = src[b:e]
        if staged is not None:
            own = staged[:e - b]
            own[...] = src[b:e]
        operands = [own if q == r else peers[q][b:e] for q in range(n)]
        reduce_block(kernel, operands, out[b - lo:e - lo])
        if copy_to is not None:
            copy_to[b - lo:e - lo] = out[b - lo:e - lo]
