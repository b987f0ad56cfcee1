"""Binomial-tree allreduce: reduce to rank 0, then broadcast back down.

Reduce, steps k = 0 .. ceil(log2 N)-1 with ``mask = 2**k``: a rank whose
lowest set bit is ``mask`` sends its whole partial vector to its parent
``r - mask`` and is done; a rank with no bit at or below ``mask`` set receives
from ``r + mask`` (if that rank exists) and reduces into its output.  Rank 0
then holds ``((x0+x1)+(x2+x3))+...`` in a fixed order.

Broadcast, the same tree in reverse: a rank receives the result from its
parent ``r - lowbit(r)`` and forwards it to ``r + mask`` for every smaller
power of two ``mask``, largest first.

One whole-vector message per step, 2·ceil(log2 N) steps (the lecture's
count); the result is computed once and copied, so every rank holds the same
bits.  Cost: 2·ceil(log2 N)·(α + M·s·β) + ceil(log2 N)·M·s·γ: few messages,
but the whole vector on every step, so it suits small messages.
"""

from ..runtime.context import Key
from ..runtime.registry import register
from ._p2p import recv, send

TAG_UP = 111
TAG_DOWN = 112
_RECV = Key("tree.recv")


def tree_allreduce(ctx, src, dst, kernel):
    comm, n, r = ctx.comm, ctx.size, ctx.rank
    tmp = None
    cur = src  # the partial result so far; becomes dst after the first reduction
    mask = 1
    while mask < n:
        if r & mask:
            send(comm, cur, r - mask, TAG_UP)
            break
        if r + mask < n:
            if tmp is None:
                tmp = ctx.scratch(_RECV, dst.size, dst.dtype)
            recv(comm, tmp, r + mask, TAG_UP)
            kernel(cur, tmp, dst)
            cur = dst
        mask <<= 1

    if r == 0:
        top = 1
        while top < n:
            top <<= 1
    else:
        top = r & -r
        recv(comm, dst, r - top, TAG_DOWN)
    mask = top >> 1
    while mask:
        if r + mask < n:
            send(comm, dst, r + mask, TAG_DOWN)
        mask >>= 1


def tree_cost(nranks, count, itemsize, alpha, beta, gamma):
    """α-β-γ time of :func:`tree_allreduce`: 2·ceil(log2 N) whole-vector steps.

    Rank 0 receives from ceil(log2 N) children one after the other, reducing
    each, and sends to as many in the broadcast; any N, power of two or not.
    """
    depth = (nranks - 1).bit_length()  # ceil(log2 N)
    nbytes = count * itemsize
    return 2 * depth * (alpha + nbytes * beta) + depth * nbytes * gamma


register("tree", tree_allreduce,
         "binomial tree: reduce to rank 0 then broadcast, 2*ceil(log2 N) whole-vector steps",
         cost=tree_cost, tags=(TAG_UP, TAG_DOWN))
