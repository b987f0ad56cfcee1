"""Pipelined ring allreduce: the ring, streamed in segments with nonblocking messages.

Same data movement as "ring" (chunk c of :func:`~pycollective.partition`
ends up owned by rank c; rank r sends to r+1 and receives from r-1), but each
chunk is cut into segments of at most S bytes and the steps are not
separated by a whole-chunk wait:

Reduce-scatter, steps k = 0 .. N-2, rank r receives chunk ``t_k = r-k-2``
and sends chunk ``s_k = r-k-1`` (so ``s_{k+1} = t_k``).  Step 0 sends its
own input of chunk r-1, all segments posted at once with ``Isend``.  For
every received segment j of step k (in order), the rank combines it with its
input of that segment into an accumulator and immediately ``Isend``s the
result as segment j of step k+1; at the last step it combines straight into
``dst``.  So the partial sum of segment j moves on while segment j+1 is still
arriving: transfers of one segment overlap the reduction of the next, and a
step never waits for a whole chunk.  Receives use a small pool of segment
buffers (``_DEPTH`` in flight, posted ahead), so a segment lands in memory
that is still in cache when it is reduced.  The accumulators alternate
between two chunk-sized buffers by step; before step k+2 rewrites a segment
of one, the send of that segment from step k+1 is waited for.

Allgather, steps k = 0 .. N-2: all receives are posted up front, each
straight into its place in ``dst``; each received segment is forwarded
(``Isend``) as soon as it arrives, except at the last step.

Segments are matched by order: both ends derive the same segment list from
the same chunk bounds and S, and MPI keeps messages between two ranks on one
tag in order.  S must therefore be the same on all ranks: it comes from
:func:`set_segment_bytes` if called, else ``PYCOLLECTIVE_SEGMENT_BYTES``
(read at each call, so a bad value raises there, not at import).
The default was chosen by measurement (benchmarks/speed/RESULTS.md).

Each element is reduced by one rank and then copied, so all ranks end with
bitwise-identical results.  Cost, c = ceil(M/N)·s bytes, g = ceil(c/S)
segments per chunk: with full overlap the pipeline takes
(2(N-1) + g - 1)·(α + S·β) for the transfers, plus the reductions that do
not hide behind them; this module reports the ring's
2(N-1)·α + 2(N-1)·c·β + (N-1)·c·γ plus (g-1)·2α for the extra messages,
minus the overlap (N-2)·(g-1)/g·c·β that streaming buys over whole-chunk
steps — a conservative figure; the benchmark has the real ones.
"""

from ..runtime import settings as _settings, watch as _watch
from ..runtime.context import Key
from ..data.partition import chunk_bounds
from ..runtime.registry import register
from ._p2p import irecv, isend, wait

TAG_RS = 161
TAG_AG = 162

_DEPTH = 4  # receive segments in flight during the reduce-scatter
# The default, 1 MiB, was the best of 64 KiB..4 MiB at N = 2, 4, 8 (docs/results).
_ACC0, _ACC1 = Key("ringp.acc0"), Key("ringp.acc1")
_POOL = tuple(Key(f"ringp.recv{i}") for i in range(_DEPTH))


def set_segment_bytes(nbytes):
    """Set the segment size of "ring_pipelined" (must be the same on all ranks).

    Args:
        nbytes: positive segment size in bytes (rounded down to whole elements,
            at least one element).

    Returns:
        The previous setting.

    Raises:
        ValueError: if ``nbytes`` is not a positive integer.
    """
    return _settings.set_segment_bytes(nbytes)


def get_segment_bytes():
    """The current segment size in bytes.

    Raises:
        ValueError: ``PYCOLLECTIVE_SEGMENT_BYTES`` is not a positive integer
            (only when :func:`set_segment_bytes` was not called).
    """
    return _settings.segment_bytes()


def _call_segment_bytes():
    """The segment size this call agreed on (every rank must cut the same segments)."""
    call = _watch.current()
    return call.settings.segment_bytes if call is not None else get_segment_bytes()


def _segments(lo, hi, seg):
    return [(b, min(b + seg, hi)) for b in range(lo, hi, seg)] or [(lo, lo)]


def _reduce_scatter(ctx, src, out, kernel, bounds, seg):
    comm, n, r = ctx.comm, ctx.size, ctx.rank
    right, left = (r + 1) % n, (r - 1) % n
    width = bounds[1] - bounds[0]
    acc = (ctx.scratch(_ACC0, width, src.dtype), ctx.scratch(_ACC1, width, src.dtype))
    pool = [ctx.scratch(slot, seg, src.dtype) for slot in _POOL]

    # Every segment this rank receives, in order: (step, chunk start, lo, hi).
    incoming = []
    for k in range(n - 1):
        t = (r - k - 2) % n
        incoming.extend((k, bounds[t], lo, hi)
                        for lo, hi in _segments(bounds[t], bounds[t + 1], seg))

    first = (r - 1) % n
    sends = [isend(comm, src[lo:hi], right, TAG_RS)
             for lo, hi in _segments(bounds[first], bounds[first + 1], seg)]
    pending = {}  # (acc index, offset in chunk) -> send request reading that segment
    recvs = [None] * len(incoming)

    def post(i):
        _, _, lo, hi = incoming[i]
        recvs[i] = irecv(comm, pool[i % _DEPTH][:hi - lo], left, TAG_RS)

    for i in range(min(_DEPTH, len(incoming))):
        post(i)
    last = n - 2
    for i, (k, base, lo, hi) in enumerate(incoming):
        wait([recvs[i][0]], [recvs[i][1]])
        got = pool[i % _DEPTH][:hi - lo]
        if k == last:
            kernel(src[lo:hi], got, out[lo - base:hi - base])
        else:
            key = (k % 2, lo - base)
            req = pending.pop(key, None)
            if req is not None:
                wait([req])  # sent at step k-1 from what step k-2 wrote here
            target = acc[k % 2][lo - base:hi - base]
            kernel(src[lo:hi], got, target)
            pending[key] = isend(comm, target, right, TAG_RS)
        if i + _DEPTH < len(incoming):
            post(i + _DEPTH)  # this pool buffer is free again
    wait(sends + list(pending.values()))


def _allgather(ctx, buf, bounds, seg):
    comm, n, r = ctx.comm, ctx.size, ctx.rank
    right, left = (r + 1) % n, (r - 1) % n
    incoming = []
    for k in range(n - 1):
        t = (r - k - 1) % n
        incoming.extend((k, lo, hi) for lo, hi in _segments(bounds[t], bounds[t + 1], seg))
    recvs = [irecv(comm, buf[lo:hi], left, TAG_AG) for _, lo, hi in incoming]
    sends = [isend(comm, buf[lo:hi], right, TAG_AG)
             for lo, hi in _segments(bounds[r], bounds[r + 1], seg)]
    last = n - 2
    for i, (k, lo, hi) in enumerate(incoming):
        wait([recvs[i][0]], [recvs[i][1]])
        if k != last:
            sends.append(isend(comm, buf[lo:hi], right, TAG_AG))
    wait(sends)


def ring_pipelined_allreduce(ctx, src, dst, kernel):
    bounds = chunk_bounds(dst.size, ctx.size)
    seg = max(1, _call_segment_bytes() // dst.itemsize)
    mine = slice(bounds[ctx.rank], bounds[ctx.rank + 1])
    # All reduce-scatter sends complete before the allgather writes into dst,
    # which in place is also src.
    _reduce_scatter(ctx, src, dst[mine], kernel, bounds, seg)
    _allgather(ctx, dst, bounds, seg)


def ring_pipelined_cost(nranks, count, itemsize, alpha, beta, gamma):
    """α-β-γ time of :func:`ring_pipelined_allreduce` (see the essay above)."""
    steps = nranks - 1
    chunk = -(-count // nranks) * itemsize
    seg = max(itemsize, get_segment_bytes() // itemsize * itemsize)
    g = max(1, -(-chunk // seg))
    ring = 2 * steps * (alpha + chunk * beta) + steps * chunk * gamma
    overlap = (nranks - 2) * (g - 1) / g * chunk * beta
    return ring + 2 * (g - 1) * alpha - overlap


register("ring_pipelined", ring_pipelined_allreduce,
         "ring streamed in segments with Isend/Irecv: reduction of one segment overlaps "
         "the transfer of the next",
         cost=ring_pipelined_cost, tags=(TAG_RS, TAG_AG))
