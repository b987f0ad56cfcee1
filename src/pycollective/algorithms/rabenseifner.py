"""Rabenseifner allreduce: reduce-scatter by recursive halving, allgather by recursive doubling.

Let p be the largest power of two not above N and ``extra = N - p``.

Fold (as MPICH and Open MPI do for N != p, here with the same pairing as
"butterfly"): rank ``p + i`` sends its whole vector to rank ``i`` (i < extra),
which reduces it into its own (``x_i op x_{p+i}``) and stands for both; the
extra ranks then wait for the result.

Reduce-scatter by recursive halving among ranks 0..p-1: the M elements are
cut into p chunks by :func:`~pycollective.partition`.  Each rank starts
owning chunks [0, p).  At the step with ``mask`` = p/2, p/4, .., 1, rank r
splits its owned chunk range in two halves, keeps the lower half if
``r & mask == 0`` and the upper one otherwise, sends the other half to
``r XOR mask`` and receives that partner's partial sums of its kept half,
which it reduces into its own.  After log2(p) steps rank r owns chunk r, fully
reduced over all N inputs (a step halves both the data and the ranks that
hold a given element, so each element's running sum is held by one rank
only; each element is combined in one place, then copied).

Allgather by recursive doubling, the mirror image: for ``mask`` = 1, 2, ..,
p/2, rank r swaps its owned chunk range with ``r XOR mask`` (received
straight into place in ``dst``); the owned range doubles each step.

Unfold: rank i < extra sends the whole result to rank p + i.

Both partners of a halving step combine disjoint halves, so no element is
computed twice and all ranks hold bitwise-identical results.  M < p works:
empty chunks travel as empty messages.

Cost with f = (p-1)/p and F = [N != p]:
2·log2(p)·α + 2·f·M·s·β + f·M·s·γ  +  F·(2α + 2·M·s·β + M·s·γ):
the ring's bandwidth term with only 2·log2(p) start-ups, which is why MPI
libraries use it for mid-sized and large messages.
"""

from ..runtime.context import Key
from ..data.partition import chunk_bounds
from ..runtime.registry import register
from ._p2p import fold_in, sendrecv, unfold_out

TAG_HALVE = 152
TAG_DOUBLE = 153
_FOLD, _RECV = Key("rab.fold"), Key("rab.recv")


def rabenseifner_allreduce(ctx, src, dst, kernel):
    comm, r = ctx.comm, ctx.rank
    # cur: this rank's partial vector (dst from the first reduction on)
    p, cur = fold_in(ctx, src, dst, kernel, _FOLD)
    if cur is None:  # folded out: dst already holds the result
        return
    bounds = chunk_bounds(dst.size, p)
    lo, hi = 0, p  # owned chunk range
    tmp = ctx.scratch(_RECV, bounds[p // 2] if p > 1 else 0, dst.dtype)
    mask = p >> 1
    while mask:
        mid = (lo + hi) // 2
        if r & mask:
            keep, give = (mid, hi), (lo, mid)
        else:
            keep, give = (lo, mid), (mid, hi)
        k0, k1 = bounds[keep[0]], bounds[keep[1]]
        g0, g1 = bounds[give[0]], bounds[give[1]]
        got = tmp[:k1 - k0]
        sendrecv(comm, cur[g0:g1], r ^ mask, got, r ^ mask, TAG_HALVE)
        kernel(cur[k0:k1], got, dst[k0:k1])
        cur = dst
        lo, hi = keep
        mask >>= 1
    if cur is not dst:  # p == 1: nothing was exchanged
        dst[...] = cur
    mask = 1
    while mask < p:
        width = hi - lo
        plo = lo ^ mask  # the sibling block of the same width
        sendrecv(comm, dst[bounds[lo]:bounds[hi]], r ^ mask,
                 dst[bounds[plo]:bounds[plo + width]], r ^ mask, TAG_DOUBLE)
        lo, hi = min(lo, plo), max(hi, plo + width)
        mask <<= 1
    unfold_out(ctx, dst, p)


def rabenseifner_cost(nranks, count, itemsize, alpha, beta, gamma):
    """α-β-γ time of :func:`rabenseifner_allreduce` (see the essay above).

    Chunk sizes are the ceil of :func:`~pycollective.partition`'s: a halving
    step with h chunks moves at most ``h·ceil(M/p)`` elements.
    """
    p = 1 << (nranks.bit_length() - 1)
    steps = p.bit_length() - 1
    nbytes = count * itemsize
    chunk = -(-count // p) * itemsize
    moved = (p - 1) * chunk  # p/2 + p/4 + .. + 1 chunks each way
    t = 2 * steps * alpha + 2 * moved * beta + moved * gamma
    if nranks != p:
        t += 2 * alpha + 2 * nbytes * beta + nbytes * gamma
    return t


register("rabenseifner", rabenseifner_allreduce,
         "reduce-scatter by recursive halving, allgather by recursive doubling; "
         "extra ranks folded in and out",
         cost=rabenseifner_cost, tags=(TAG_HALVE, TAG_DOUBLE))
