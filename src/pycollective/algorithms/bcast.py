"""Broadcast algorithms: every rank ends with the root's buffer.

``run(ctx, buf, root)``: ``buf`` is this rank's buffer as bytes (the
root's is read, the others' written).  Nothing is computed: every rank ends
with the root's bytes.  Ranks are numbered relative to the root,
``v = (r - root) mod N``, so any root works like rank 0.

"tree": binomial tree.  Rank v > 0 receives the whole buffer from
``v - lowbit(v)``, then every rank sends it on to ``v + mask`` for each
power of two ``mask`` below its lowest set bit (the root: below N), largest
first, all at once.  ⌈log2 N⌉ steps: cost ⌈log2 N⌉·(α + m·β).  Few
messages, the whole buffer each: small messages.

"chain": a pipeline.  The buffer is cut into segments of
``set_segment_bytes``; rank v receives each from v-1 and passes it to v+1
as soon as it arrives (``Isend``), so all links carry segments at once.
Cost with g segments of S bytes: (N-2+g)·(α + S·β) ≈ m·β for g ≫ N: every
byte crosses each link once, which suits large buffers.

"scatter_allgather" (van de Geijn): the root sends block q of the buffer
(bytes cut by :func:`~pycollective.partition`) to rank q, then a ring
allgather completes every buffer; the root, which has every block, only
sends in it.  Cost: 2(N-1)·α + 2·(N-1)/N·m·β -- the root sends each byte
about once instead of ⌈log2 N⌉ times.

"shm": one node.  Above 4 MiB, where the system allows cross-memory reads,
the root publishes its buffer's address and every other rank reads it with
``process_vm_readv`` (one copy, all at once), then a sync keeps it in place
until all have read.  Otherwise the buffer goes through the root's slot of a
shared segment, in pieces of at most 4 MiB: the root copies a piece in, one
sync, the others copy it out; pieces alternate between two regions, so the
root fills the next while the others still read the last.
Cost: (1 + [m > 4 MiB])·⌈log2 N⌉·α + m·β (the reads run in parallel).
"""

import math

import numpy as np

from ..data.partition import chunk_bounds
from ..runtime.registry import register
from ..node.group import DOUBLE_LIMIT
from .shm.common import node_state, on_one_node
from ._p2p import irecv, isend, recv, wait
from .allgather import ring_allgather
from .reduce_scatter import call_segment_bytes, segments

__all__ = []

TAG_TREE, TAG_CHAIN, TAG_SCATTER, TAG_ALLGATHER = 191, 192, 193, 194


def _tree(ctx, buf, root):
    comm, n = ctx.comm, ctx.size
    v = (ctx.rank - root) % n
    if v == 0:
        top = 1 << (n - 1).bit_length()
    else:
        top = v & -v
        recv(comm, buf, (v - top + root) % n, TAG_TREE)
    sends, mask = [], top >> 1
    while mask:
        if v + mask < n:
            sends.append(isend(comm, buf, (v + mask + root) % n, TAG_TREE))
        mask >>= 1
    wait(sends)


def _chain(ctx, buf, root):
    comm, n, r = ctx.comm, ctx.size, ctx.rank
    v = (r - root) % n
    pieces = segments(0, buf.size, max(1, call_segment_bytes()))
    nxt, prev = (r + 1) % n, (r - 1) % n
    if v == 0:
        wait([isend(comm, buf[lo:hi], nxt, TAG_CHAIN) for lo, hi in pieces])
        return
    recvs = [irecv(comm, buf[lo:hi], prev, TAG_CHAIN) for lo, hi in pieces]
    sends = []
    for (lo, hi), (req, expect) in zip(pieces, recvs):
        wait([req], [expect])
        if v != n - 1:
            sends.append(isend(comm, buf[lo:hi], nxt, TAG_CHAIN))
    wait(sends)


def _scatter_allgather(ctx, buf, root):
    comm, n, r = ctx.comm, ctx.size, ctx.rank
    bounds = chunk_bounds(buf.size, n)
    blocks = list(zip(bounds, bounds[1:]))
    sends = []
    if r == root:
        sends = [isend(comm, buf[lo:hi], q, TAG_SCATTER)
                 for q, (lo, hi) in enumerate(blocks) if q != root]
    else:
        recv(comm, buf[slice(*blocks[r])], root, TAG_SCATTER)
    ring_allgather(ctx, buf, blocks, max(1, bounds[1] - bounds[0]), TAG_ALLGATHER, skip=root)
    wait(sends)


def _shm(ctx, buf, root):
    state = node_state(ctx)
    r = ctx.rank
    if state.use_cma(buf.nbytes):
        cross = state.cross
        cross.publish(buf, buf)
        state.sync()  # the call's first: every header checked before any read
        if r != root:
            cross.read(root, cross.SRC, 0, buf)
        state.sync()  # the root does not return (and change its buffer) while others read
        return
    slots = state.slots
    for lo, hi in segments(0, buf.size, DOUBLE_LIMIT):
        offset, _ = slots.begin(hi - lo)  # at most DOUBLE_LIMIT: alternate regions, no trailing
        piece = slots.slots(offset, hi - lo, np.uint8)[root]
        if r == root:
            piece[...] = buf[lo:hi]
        state.sync()
        if r != root:
            buf[lo:hi] = piece


def tree_cost(nranks, count, itemsize, alpha, beta, gamma):
    """α-β-γ time of "tree" (see the essay)."""
    return (nranks - 1).bit_length() * (alpha + count * itemsize * beta)


def chain_cost(nranks, count, itemsize, alpha, beta, gamma):
    """α-β-γ time of "chain" (see the essay)."""
    nbytes = count * itemsize
    seg = max(1, min(nbytes, call_segment_bytes()))
    g = max(1, -(-nbytes // seg))
    return (nranks - 2 + g) * (alpha + seg * beta)


def scatter_allgather_cost(nranks, count, itemsize, alpha, beta, gamma):
    """α-β-γ time of "scatter_allgather" (see the essay)."""
    return 2 * (nranks - 1) * (alpha + -(-count * itemsize // nranks) * beta)


def shm_cost(nranks, count, itemsize, alpha, beta, gamma):
    """α-β-γ time of "shm" (see the essay)."""
    nbytes = count * itemsize
    sync = math.ceil(math.log2(nranks)) * alpha
    return (1 + (nbytes > DOUBLE_LIMIT)) * sync + nbytes * beta


register("tree", _tree, "binomial tree: ceil(log2 N) steps, the whole buffer each",
         cost=tree_cost, tags=(TAG_TREE,), collective="bcast")
register("chain", _chain, "a pipeline of segments from rank to rank: each byte crosses each link once",
         cost=chain_cost, tags=(TAG_CHAIN,), collective="bcast")
register("scatter_allgather", _scatter_allgather,
         "the root scatters N blocks, then a ring allgather completes every buffer",
         cost=scatter_allgather_cost, tags=(TAG_SCATTER, TAG_ALLGATHER), collective="bcast")
register("shm", _shm, "one node: the others copy the root's buffer from shared memory",
         cost=shm_cost, usable=on_one_node, collective="bcast")
