"""Parameter-server allreduce: rank 0 serves, every other rank pushes and pulls.

Push: each worker ``r > 0`` sends its whole vector to rank 0.  Rank 0
receives them in rank order into two alternating buffers (the next receive is
posted before the current one is reduced, so transfer and reduction overlap)
and accumulates ``((x0 op x1) op x2) ...``.

Pull: rank 0 sends the result to every worker (nonblocking sends, then one
wait), and each worker receives it into its output.

Everything crosses rank 0's link: (N-1)·M elements in and (N-1)·M out, so the
time grows linearly with N.  Cost: 2(N-1)·(α + M·s·β) + (N-1)·M·s·γ, all
serialised at the server.
"""

from ..runtime.context import Key
from ..runtime.registry import register
from ._p2p import irecv, isend, recv, send, wait

TAG_PUSH = 131
TAG_PULL = 132
SERVER = 0
_RECV0, _RECV1 = Key("ps.recv0"), Key("ps.recv1")


def ps_allreduce(ctx, src, dst, kernel):
    comm, n, r = ctx.comm, ctx.size, ctx.rank
    if r != SERVER:
        send(comm, src, SERVER, TAG_PUSH)
        recv(comm, dst, SERVER, TAG_PULL)
        return
    bufs = (ctx.scratch(_RECV0, dst.size, dst.dtype), ctx.scratch(_RECV1, dst.size, dst.dtype))
    cur = src
    req, size = irecv(comm, bufs[0], 1, TAG_PUSH)
    for j in range(1, n):
        wait([req], [size])
        if j + 1 < n:
            req, size = irecv(comm, bufs[j % 2], j + 1, TAG_PUSH)
        kernel(cur, bufs[(j - 1) % 2], dst)
        cur = dst
    wait([isend(comm, dst, j, TAG_PULL) for j in range(1, n)])


def ps_cost(nranks, count, itemsize, alpha, beta, gamma):
    """α-β-γ time of :func:`ps_allreduce`: the server's N-1 receives, then N-1 sends.

    Both directions cross the server's link one vector at a time, and the
    pull only starts once the push is reduced, so the server pays 2(N-1)
    whole-vector messages (the lecture's N·M·w counts one direction only).
    """
    workers = nranks - 1
    nbytes = count * itemsize
    return 2 * workers * (alpha + nbytes * beta) + workers * nbytes * gamma


register("ps", ps_allreduce,
         "parameter server: rank 0 gathers every vector, reduces, sends the sum back",
         cost=ps_cost, tags=(TAG_PUSH, TAG_PULL))
