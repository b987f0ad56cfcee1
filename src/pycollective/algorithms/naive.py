"""Naive allreduce: every rank sends its whole vector to every other rank.

Each rank posts nonblocking sends of its input to all N-1 others, then
reduces the N vectors itself in rank order ``((x0 op x1) op x2) ...``.  The
order is the same on every rank, so all ranks get the same bits.  Rank 0's
vector is received straight into the output; later ones arrive in two
alternating scratch buffers, the next receive posted before the current
reduction.  In place, the input is first copied aside because the output is
overwritten while the sends may still be reading.

Each rank sends and receives (N-1)·M elements: N²·M in all, the lecture's
baseline.  Cost: (N-1)·(α + M·s·β) + (N-1)·M·s·γ per rank, with all links
busy at once.
"""

import numpy as np

from ..runtime.context import Key
from ..runtime.registry import register
from ._p2p import irecv, isend, recv, wait

TAG = 141
_OWN, _RECV0, _RECV1 = Key("naive.own"), Key("naive.recv0"), Key("naive.recv1")


def naive_allreduce(ctx, src, dst, kernel):
    comm, n, r = ctx.comm, ctx.size, ctx.rank
    own = src
    if src is dst or np.may_share_memory(src, dst):
        own = ctx.scratch(_OWN, src.size, src.dtype)
        own[...] = src
    sends = [isend(comm, own, j, TAG) for j in range(n) if j != r]

    # Operands in rank order; x0 lands in dst when it comes from another rank.
    bufs = (ctx.scratch(_RECV0, dst.size, dst.dtype), ctx.scratch(_RECV1, dst.size, dst.dtype))
    later = [j for j in range(1, n) if j != r]  # remote sources after rank 0
    slot = {j: bufs[i % 2] for i, j in enumerate(later)}

    def post(i):
        return irecv(comm, slot[later[i]], later[i], TAG) if i < len(later) else None

    if r == 0:
        acc = own
    else:
        recv(comm, dst, 0, TAG)
        acc = dst
    nxt = 0
    req = post(nxt)
    for j in range(1, n):
        if j == r:
            operand = own
        else:
            wait([req[0]], [req[1]])
            operand = slot[j]
            nxt += 1
            # The other buffer was consumed by the previous reduction.
            req = post(nxt)
        kernel(acc, operand, dst)
        acc = dst
    wait(sends)


def naive_cost(nranks, count, itemsize, alpha, beta, gamma):
    """α-β-γ time of :func:`naive_allreduce` on a full-duplex link per rank.

    Each rank sends and receives N-1 whole vectors and reduces N-1 times; the
    model assumes links that do not slow each other down, which shared memory
    does not honour (all N(N-1) messages share the memory bus).
    """
    others = nranks - 1
    nbytes = count * itemsize
    return others * (alpha + nbytes * beta) + others * nbytes * gamma


register("naive", naive_allreduce,
         "every rank sends its whole vector to every other rank and reduces all N",
         cost=naive_cost, tags=(TAG,))
