"""Allgather algorithms: every rank ends with every rank's block.

``run(ctx, buf, blocks)``: ``buf`` is this rank's receive buffer as bytes,
``blocks[q] = (lo, hi)`` where rank q's block goes in it (byte offsets in
this rank's own layout: the gaps and displacements of ``Allgatherv`` may
differ from rank to rank, the block sizes may not).  This rank's own block
is already in place.  Allgather only moves bytes, so one implementation
serves every element type; nothing is computed, so every rank ends with the
owners' bytes.

"ring" and "ring_pipelined": rank r sends to r+1 and receives from r-1
(mod N); at step k = 0 .. N-2 it sends block ``r-k`` (its own at step 0,
then the one it received the step before) and receives block ``r-k-1``
straight into place.  All receives are posted up front; each received
piece is forwarded (``Isend``) as soon as it arrives, except at the last
step.  "ring" moves a block per message; "ring_pipelined" cuts blocks into
segments of ``set_segment_bytes``, so a block flows on before all of it has
arrived.  A ``skip`` rank (the root of a broadcast, which has every block
already) receives nothing and sends every block from its own buffer; its
left neighbour sends it nothing.
Cost, c = ceil(M/N)·s bytes, g = ceil(c/S): ring (N-1)·(α + c·β);
pipelined (N-1+g-1)·α + (c + (N-2)·c/g)·β.

"shm": one node.  Every rank's block is reachable by the others (copied into
its slot of a shared segment, or, above 4 MiB where the system allows
cross-memory reads, read from the owner's buffer with ``process_vm_readv``);
one sync; each rank copies the other N-1 blocks into place; a last sync
keeps every block in place until all have read it (below 4 MiB the slots
alternate between two regions instead).
Cost, f = (N-1)/N, m = M·s: (1 + [m > 4 MiB])·⌈log2 N⌉·α + (f·m + m/N)·β.
"""

import math

import numpy as np

from .shm.common import node_state
from ._p2p import irecv, isend, wait
from .reduce_scatter import (call_segment_bytes, chunk_bytes, pipeline_overlap,
                             register_ring_family, segments)

__all__ = ["ring_allgather"]

TAG_RING, TAG_RING_PIPELINED = 183, 184


def ring_allgather(ctx, buf, blocks, seg, tag, skip=None):
    """The ring of the essay above with segments of ``seg`` bytes (``skip``: see there)."""
    comm, n, r = ctx.comm, ctx.size, ctx.rank
    right, left = (r + 1) % n, (r - 1) % n
    last = n - 2
    if r == skip:
        sends = [isend(comm, buf[lo:hi], right, tag) for k in range(n - 1)
                 for lo, hi in segments(*blocks[(r - k) % n], seg)]
        wait(sends)
        return
    forward = right != skip
    incoming = [(k, lo, hi) for k in range(n - 1)
                for lo, hi in segments(*blocks[(r - k - 1) % n], seg)]
    recvs = [irecv(comm, buf[lo:hi], left, tag) for _, lo, hi in incoming]
    sends = [isend(comm, buf[lo:hi], right, tag) for lo, hi in segments(*blocks[r], seg)] \
        if forward else []
    for (k, lo, hi), (req, expect) in zip(incoming, recvs):
        wait([req], [expect])
        if forward and k != last:
            sends.append(isend(comm, buf[lo:hi], right, tag))
    wait(sends)


def _widest(blocks):
    return max(1, max(hi - lo for lo, hi in blocks))


def _ring(ctx, buf, blocks):
    ring_allgather(ctx, buf, blocks, _widest(blocks), TAG_RING)


def _ring_pipelined(ctx, buf, blocks):
    ring_allgather(ctx, buf, blocks, max(1, call_segment_bytes()), TAG_RING_PIPELINED)


def _shm(ctx, buf, blocks):
    state = node_state(ctx)
    r = ctx.rank
    lo, hi = blocks[r]
    mine = buf[lo:hi]
    widest = max(b - a for a, b in blocks)
    if state.use_cma(widest * ctx.size):
        cross = state.cross
        cross.publish(mine, mine)
        state.sync()  # the call's first: every header checked before any read
        for q, (a, b) in enumerate(blocks):
            if q != r and b > a:
                cross.read(q, cross.SRC, 0, buf[a:b])
        state.sync()  # nobody returns (and lets its buffer change) while others read it
        return
    slots = state.slots
    offset, trailing = slots.begin(widest)
    views = slots.slots(offset, widest, np.uint8)
    views[r][:hi - lo] = mine
    state.sync()
    for q, (a, b) in enumerate(blocks):
        if q != r and b > a:
            buf[a:b] = views[q][:b - a]
    if trailing:
        state.sync()


def ring_cost(nranks, count, itemsize, alpha, beta, gamma):
    """α-β-γ time of "ring" (see the essay); ``count`` is the whole gathered vector."""
    return (nranks - 1) * (alpha + chunk_bytes(nranks, count, itemsize) * beta)


def ring_pipelined_cost(nranks, count, itemsize, alpha, beta, gamma):
    """α-β-γ time of "ring_pipelined" (see the essay)."""
    chunk = chunk_bytes(nranks, count, itemsize)
    g, hidden = pipeline_overlap(nranks, chunk, itemsize)
    return (nranks - 1 + g - 1) * alpha + ((nranks - 1) - hidden) * chunk * beta


def shm_cost(nranks, count, itemsize, alpha, beta, gamma):
    """α-β-γ time of "shm" (see the essay)."""
    nbytes = count * itemsize
    sync = math.ceil(math.log2(nranks)) * alpha
    return (1 + (nbytes > 1 << 20)) * sync + nbytes * beta


register_ring_family(
    "allgather", (TAG_RING, TAG_RING_PIPELINED),
    ring=(_ring, "N-1 steps around a ring, one block per message", ring_cost),
    ring_pipelined=(_ring_pipelined, "the ring in segments: each piece is forwarded as soon "
                    "as it arrives", ring_pipelined_cost),
    shm=(_shm, "one node: each rank copies the others' blocks from shared memory", shm_cost))
