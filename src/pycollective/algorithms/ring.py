"""Ring allreduce: reduce-scatter around a ring, then allgather around it.

The M elements are cut into N chunks by :func:`pycollective.partition`;
chunk ``c`` ends up owned by rank ``c``.  Rank ``r`` sends to ``r+1`` and
receives from ``r-1`` (mod N).

Reduce-scatter, steps k = 0 .. N-2: rank r sends chunk ``r-k-1`` and
receives chunk ``r-k-2``, which it combines with its own input of that chunk.
What it sends at step k > 0 is the partial sum it made at step k-1, so each
chunk travels once around the ring collecting one contribution per hop, and
after N-1 steps rank r holds the full reduction of chunk r.  Partial sums live
in two scratch chunks, not in the output, so the standalone reduce-scatter
leaves the rest of an in-place buffer untouched.

Allgather, steps k = 0 .. N-2: rank r sends chunk ``r-k`` (its own chunk at
k = 0, then the one it received the step before) and receives chunk ``r-k-1``
straight into the output.

Each chunk is reduced in one place and then copied, so all ranks end with
bitwise-identical results.  Cost with c = ceil(M/N) elements of s bytes:
2(N-1)α + 2(N-1)·c·s·β + (N-1)·c·s·γ — about 2M·s bytes sent per rank
whatever N, which is why the ring wins for large messages.
"""

from ..runtime.context import Key
from ..data.partition import chunk_bounds
from ..runtime.registry import register
from ._p2p import sendrecv

TAG_RS = 101
TAG_AG = 102
_RECV, _ACC0, _ACC1 = Key("ring.recv"), Key("ring.acc0"), Key("ring.acc1")


def reduce_scatter_phase(ctx, src, out, kernel, bounds):
    """Leave the reduction of chunk ``ctx.rank`` of every rank's ``src`` in ``out``.

    ``out`` has that chunk's length and may alias the chunk inside ``src``.
    Requires ``ctx.size > 1``.
    """
    comm, n, r = ctx.comm, ctx.size, ctx.rank
    right, left = (r + 1) % n, (r - 1) % n
    width = bounds[1] - bounds[0]  # the largest chunk
    tmp = ctx.scratch(_RECV, width, src.dtype)
    acc = (ctx.scratch(_ACC0, width, src.dtype), ctx.scratch(_ACC1, width, src.dtype))
    sent = None
    for k in range(n - 1):
        s = (r - k - 1) % n
        t = (r - k - 2) % n
        t0, t1 = bounds[t], bounds[t + 1]
        sbuf = src[bounds[s]:bounds[s + 1]] if k == 0 else sent
        rbuf = tmp[:t1 - t0]
        sendrecv(comm, sbuf, right, rbuf, left, TAG_RS)
        target = out if k == n - 2 else acc[k % 2][:t1 - t0]
        kernel(src[t0:t1], rbuf, target)
        sent = target


def allgather_phase(ctx, buf, bounds):
    """Fill every chunk of ``buf`` from its owner; chunk ``ctx.rank`` is already there."""
    comm, n, r = ctx.comm, ctx.size, ctx.rank
    right, left = (r + 1) % n, (r - 1) % n
    for k in range(n - 1):
        s = (r - k) % n
        t = (r - k - 1) % n
        sendrecv(comm, buf[bounds[s]:bounds[s + 1]], right,
                 buf[bounds[t]:bounds[t + 1]], left, TAG_AG)


def ring_allreduce(ctx, src, dst, kernel):
    bounds = chunk_bounds(dst.size, ctx.size)
    mine = slice(bounds[ctx.rank], bounds[ctx.rank + 1])
    reduce_scatter_phase(ctx, src, dst[mine], kernel, bounds)
    allgather_phase(ctx, dst, bounds)


def ring_cost(nranks, count, itemsize, alpha, beta, gamma):
    """α-β-γ time of :func:`ring_allreduce` (see the essay above).

    Every step waits for its largest chunk, ``ceil(M/N)`` elements (the first
    ``M % N`` chunks of :func:`~pycollective.partition`); when M < N the empty
    chunks still cost a message each, so α is paid 2(N-1) times regardless.
    """
    steps = nranks - 1
    chunk = -(-count // nranks) * itemsize
    return 2 * steps * (alpha + chunk * beta) + steps * chunk * gamma


register("ring", ring_allreduce,
         "reduce-scatter then allgather around a ring: 2(N-1) steps of M/N elements",
         cost=ring_cost, tags=(TAG_RS, TAG_AG))
