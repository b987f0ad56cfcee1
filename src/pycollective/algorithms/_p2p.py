"""Small point-to-point helpers shared by the algorithm modules.

Tags: every algorithm declares the tags its messages use when it registers
(:func:`pycollective._registry.register` refuses a tag already taken; the
fold/unfold below reserve theirs here), so even a bug in one algorithm
cannot make its messages match another's.

Data always travel as raw bytes (``MPI.BYTE``): the reduction happens in our
own kernels, so the MPI library never needs to know the element type, and
dtypes it has no datatype for (float16) move like any other.
"""

from mpi4py import MPI

from .._registry import reserve_tags

BYTE = MPI.BYTE


def msg(arr):
    """mpi4py buffer spec for a contiguous array, sent as bytes."""
    return [arr, BYTE]


def sendrecv(comm, sbuf, dest, rbuf, source, tag):
    comm.Sendrecv(msg(sbuf), dest, tag, msg(rbuf), source, tag)


TAG_FOLD, TAG_UNFOLD = reserve_tags("fold/unfold (algorithms/_p2p.py)", (91, 92))


def fold_in(ctx, src, dst, kernel, slot):
    """Fold the ranks beyond the largest power of two ``p`` into the first ones.

    Rank ``r >= p`` sends its ``src`` to ``r - p`` and then waits for the
    final result from it (see :func:`unfold_out`): it returns ``(p, None)``
    with ``dst`` already complete.  Rank ``r < N - p`` receives that vector
    (into scratch ``slot``) and reduces it with its own into ``dst``:
    returns ``(p, dst)``.  Other ranks return ``(p, src)``.  The second value
    is the rank's partial vector for the power-of-two core.
    """
    comm, n, r = ctx.comm, ctx.size, ctx.rank
    p = 1 << (n.bit_length() - 1)
    if r >= p:
        comm.Send(msg(src), r - p, TAG_FOLD)
        comm.Recv(msg(dst), r - p, TAG_UNFOLD)
        return p, None
    if r < n - p:
        tmp = ctx.scratch(slot, dst.size, dst.dtype)
        comm.Recv(msg(tmp), r + p, TAG_FOLD)
        kernel(src, tmp, dst)
        return p, dst
    return p, src


def unfold_out(ctx, dst, p):
    """Send the finished ``dst`` back to the rank folded into this one, if any."""
    if ctx.rank < ctx.size - p:
        ctx.comm.Send(msg(dst), ctx.rank + p, TAG_UNFOLD)
