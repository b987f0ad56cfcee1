"""Reduce algorithms: the root ends with the element-wise reduction of every rank's input.

``run(ctx, src, dst, kernel, root)``: ``src`` holds this rank's M input
elements (never written, except through ``dst`` in place), ``dst`` the
root's result (None on the other ranks; ``src`` itself at a root reducing
in place).  Ranks are numbered relative to the root where a tree needs it,
``v = (r - root) mod N``.  Each element is combined in one fixed order, so
the result does not depend on timing.

"tree": binomial tree.  At the step with ``mask = 2**k``, a rank whose
lowest set bit (of v) is ``mask`` sends its partial vector to ``v - mask``
and is done; a rank with no bit at or below ``mask`` receives from
``v + mask`` (if it exists) and combines.  ⌈log2 N⌉ steps of the whole
vector: cost ⌈log2 N⌉·(α + m·β + m·γ); small messages.

"ring": the ring reduce-scatter (module ``reduce_scatter``: N-1 steps of one
block, rank q ends with block q reduced), then every rank sends its block
to the root, which receives them all at once into place.  Each rank sends
and reduces only (N-1)/N of the vector: cost (N-1)·(α + c·β) + (N-1)·c·γ
for the reduce-scatter plus (N-1)·(α + c·β) at the root, c = ceil(M/N)·s.

"shm": one node.  Every rank's input is reachable by the others (staged in
its slot of a shared segment, or above 4 MiB where the system allows
cross-memory reads, read where it is); one sync; rank q combines block q
of all N inputs, in rank order, into its slot (or its scratch, published);
one sync; the root copies the N-1 other blocks into ``dst``; a last sync
keeps everything in place until the root has read it (below 4 MiB the slots
alternate between two regions instead).
Cost, f = (N-1)/N, m = M·s: (2 + [m > 4 MiB])·⌈log2 N⌉·α + 2·f·m·β + f·m·γ.
"""

import math

from ..runtime.context import Key
from ..data.partition import chunk_bounds
from ..runtime.registry import register
from ..node.group import DOUBLE_LIMIT, copy_in
from .shm.common import node_state, on_one_node, reduce_range
from ._p2p import irecv, recv, send, wait
from .reduce_scatter import ring_reduce_scatter

__all__ = []

TAG_TREE, TAG_RING, TAG_GATHER = 201, 202, 203
_ACC, _RECV, _RESULT = Key("reduce.acc"), Key("reduce.recv"), Key("reduce.result")


def _tree(ctx, src, dst, kernel, root):
    comm, n = ctx.comm, ctx.size
    v = (ctx.rank - root) % n
    tmp = acc = None
    cur = src  # the partial result so far
    mask = 1
    while mask < n:
        if v & mask:
            send(comm, cur, (v - mask + root) % n, TAG_TREE)
            return
        if v + mask < n:
            if tmp is None:
                tmp = ctx.scratch(_RECV, src.size, src.dtype)
                acc = dst if v == 0 else ctx.scratch(_ACC, src.size, src.dtype)
            recv(comm, tmp, (v + mask + root) % n, TAG_TREE)
            kernel(cur, tmp, acc)
            cur = acc
        mask <<= 1


def _ring(ctx, src, dst, kernel, root):
    comm, n, r = ctx.comm, ctx.size, ctx.rank
    bounds = chunk_bounds(src.size, n)
    lo, hi = bounds[r], bounds[r + 1]
    mine = dst[lo:hi] if r == root else ctx.scratch(_RESULT, hi - lo, src.dtype)
    ring_reduce_scatter(ctx, src, mine, kernel, bounds, src.size, TAG_RING)
    if r != root:
        send(comm, mine, root, TAG_GATHER)
        return
    recvs = [irecv(comm, dst[bounds[q]:bounds[q + 1]], q, TAG_GATHER)
             for q in range(n) if q != root]
    wait([req for req, _ in recvs], [expect for _, expect in recvs])


def _shm(ctx, src, dst, kernel, root):
    state = node_state(ctx)
    n, r = ctx.size, ctx.rank
    bounds = chunk_bounds(src.size, n)
    lo, hi = bounds[r], bounds[r + 1]
    if state.use_cma(src.nbytes):
        cross = state.cross
        # Each rank's reduced block lies at its offset in a vector of M,
        # published as the "dst" buffer (the root's is dst itself).
        result = dst if r == root else ctx.scratch(_RESULT, src.size, src.dtype)
        cross.publish(src, result)
        state.sync()  # the call's first: every header checked before any read
        reduce_range(state, src, result[lo:hi], lo, hi, kernel, "cma")
        state.sync()
        if r == root:
            for q in range(n):
                if q != r and bounds[q + 1] > bounds[q]:
                    cross.read(q, cross.DST, bounds[q] * src.itemsize,
                               dst[bounds[q]:bounds[q + 1]])
        state.sync()  # nobody returns (and lets its buffers change) while the root reads
        return
    slots = state.slots
    offset, trailing = slots.begin(src.nbytes)
    views = slots.slots(offset, src.nbytes, src.dtype)
    copy_in(src, views[r], r, bounds)
    state.sync()
    # Block r of this rank's slot held nothing (copy_in skips it): the result goes there.
    reduce_range(state, src, views[r][lo:hi], lo, hi, kernel, views)
    state.sync()
    if r == root:
        for q in range(n):
            dst[bounds[q]:bounds[q + 1]] = views[q][bounds[q]:bounds[q + 1]]
    if trailing:
        state.sync()


def tree_cost(nranks, count, itemsize, alpha, beta, gamma):
    """α-β-γ time of "tree" (see the essay)."""
    nbytes = count * itemsize
    return (nranks - 1).bit_length() * (alpha + nbytes * beta + nbytes * gamma)


def ring_cost(nranks, count, itemsize, alpha, beta, gamma):
    """α-β-γ time of "ring" (see the essay)."""
    steps, chunk = nranks - 1, -(-count // nranks) * itemsize
    return 2 * steps * (alpha + chunk * beta) + steps * chunk * gamma


def shm_cost(nranks, count, itemsize, alpha, beta, gamma):
    """α-β-γ time of "shm" (see the essay)."""
    nbytes = count * itemsize
    sync = math.ceil(math.log2(nranks)) * alpha
    moved = (nranks - 1) / nranks * nbytes
    return (2 + (nbytes > DOUBLE_LIMIT)) * sync + 2 * moved * beta + moved * gamma


register("tree", _tree, "binomial tree to the root: ceil(log2 N) steps of the whole vector",
         cost=tree_cost, tags=(TAG_TREE,), collective="reduce")
register("ring", _ring, "ring reduce-scatter, then every block to the root",
         cost=ring_cost, tags=(TAG_RING, TAG_GATHER), collective="reduce")
register("shm", _shm, "one node: each rank reduces its block from the others' memory, "
         "the root collects the blocks", cost=shm_cost, usable=on_one_node, collective="reduce")
