"""A throwaway algorithm written by the recipe in docs/algorithms.md: one module, one import.

"linear": every rank sends its vector to rank 0, which reduces them in rank
order and sends the result back.  Slow (everything crosses rank 0), but
short and correct: each element is reduced once, in one place, so every rank
gets the same bits.  Cost: 2(N-1)(α + M·s·β) + (N-1)·M·s·γ.
"""

from pycollective.runtime.context import Key
from pycollective.runtime.registry import register
from pycollective.algorithms._p2p import msg

TAG_IN, TAG_OUT = 971, 972
_RECV = Key("linear.recv")


def linear_allreduce(ctx, src, dst, kernel):
    comm, n, r = ctx.comm, ctx.size, ctx.rank
    if r != 0:
        comm.Send(msg(src), 0, TAG_IN)
        comm.Recv(msg(dst), 0, TAG_OUT)
        return
    tmp = ctx.scratch(_RECV, dst.size, dst.dtype)
    cur = src
    for q in range(1, n):
        comm.Recv(msg(tmp), q, TAG_IN)
        kernel(cur, tmp, dst)
        cur = dst
    for q in range(1, n):
        comm.Send(msg(dst), q, TAG_OUT)


def linear_cost(nranks, count, itemsize, alpha, beta, gamma):
    nbytes = count * itemsize
    return 2 * (nranks - 1) * (alpha + nbytes * beta) + (nranks - 1) * nbytes * gamma


register("linear", linear_allreduce, "toy: reduce at rank 0 in rank order, send back",
         cost=linear_cost, tags=(TAG_IN, TAG_OUT))
