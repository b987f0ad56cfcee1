"""Butterfly (recursive-doubling) allreduce with XOR partners.

Let p be the largest power of two not above N and ``extra = N - p``.

Fold: ranks ``p .. N-1`` send their vector to rank ``r - p``, which reduces
it into its own; those ``extra`` ranks then wait for the result.

Exchange, steps k = 0 .. log2(p)-1: rank r (< p) swaps its whole partial
vector with ``r XOR 2**k`` and reduces.  After step k each rank holds the
reduction over its block of ``2**(k+1)`` ranks, so after log2(p) steps every
one of the p ranks holds the total.  Partners combine the same two operands,
the lower rank's first, so both hold the same bits, NaN payloads included.

Unfold: rank ``r < extra`` sends the result to ``r + p``.

Cost: (log2 p + 2·[N != p])·(α + M·s·β) + (log2 p + [N != p])·M·s·γ —
the fewest rounds of all, each carrying the whole vector.
"""

from ..runtime.context import Key
from ..runtime.registry import register
from ._p2p import fold_in, sendrecv, unfold_out

TAG_XCHG = 122
_RECV = Key("butterfly.recv")


def butterfly_allreduce(ctx, src, dst, kernel):
    comm, r = ctx.comm, ctx.rank
    p, cur = fold_in(ctx, src, dst, kernel, _RECV)
    if cur is None:  # folded out: dst already holds the result
        return
    tmp = ctx.scratch(_RECV, dst.size, dst.dtype)
    mask = 1
    while mask < p:
        sendrecv(comm, cur, r ^ mask, tmp, r ^ mask, TAG_XCHG)
        # Both partners combine the lower rank's operand first, so a NaN
        # meeting a NaN of another payload or sign gives the same bits on
        # both sides (IEEE + keeps the first operand's NaN on x86).
        if r & mask:
            kernel(tmp, cur, dst)
        else:
            kernel(cur, tmp, dst)
        cur = dst
        mask <<= 1
    unfold_out(ctx, dst, p)


def butterfly_cost(nranks, count, itemsize, alpha, beta, gamma):
    """α-β-γ time of :func:`butterfly_allreduce`, fold and unfold included.

    A non-power-of-two N pays two extra whole-vector messages (fold, unfold)
    and one extra reduction on top of the log2(p) exchanges of p = 2^floor(log2 N).
    """
    p = 1 << (nranks.bit_length() - 1)
    rounds = p.bit_length() - 1  # log2 p
    folded = 1 if nranks != p else 0
    nbytes = count * itemsize
    return ((rounds + 2 * folded) * (alpha + nbytes * beta)
            + (rounds + folded) * nbytes * gamma)


register("butterfly", butterfly_allreduce,
         "recursive doubling with partner rank XOR 2^k; extra ranks folded in and out",
         cost=butterfly_cost, tags=(TAG_XCHG,))
