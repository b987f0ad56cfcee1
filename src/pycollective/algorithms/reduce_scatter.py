"""Reduce-scatter algorithms: rank r ends with the reduction of block r of every rank's input.

``run(ctx, src, out, kernel, bounds)``: ``src`` holds this rank's M input
elements (never written, except through ``out``), ``bounds`` the N + 1
block boundaries (the library's :func:`~pycollective.partition`, or the
caller's counts: any sizes, empty blocks included), ``out`` block r's
``bounds[r+1] - bounds[r]`` elements, possibly the same memory as
``src[bounds[r]:bounds[r+1]]`` (in place).  Every element is reduced in one
place, operands of the same element combined in a fixed order, so the
result does not depend on timing.

"ring" and "ring_pipelined": the reduce-scatter half of the ring allreduce.
Rank r sends to r+1 and receives from r-1 (mod N).  At step k = 0 .. N-2 it
receives the partial sum of block ``r-k-2`` (the contributions of ranks
``r-k-1 .. r-1``), adds its own input of that block and passes the sum on;
at step 0 it sends its own input of block r-1.  After N-1 steps block r
has collected all N contributions, in rank r's ``out``.  "ring" moves a
block in one message per step; "ring_pipelined" cuts blocks into segments
of ``set_segment_bytes`` (as allreduce's "ring_pipelined"), all sent with
``Isend``: the moment a segment arrives it is reduced and sent on, so the
reduction of one segment overlaps the transfer of the next and a step never
waits for a whole block.  Partial sums live in two block-sized scratch
arrays, used by alternate steps; before step k+2 rewrites a segment, the
send of what step k wrote there is waited for.  Receives land in a pool of
segment buffers posted ahead (2 for "ring", 4 for "ring_pipelined").
Segments match by order: MPI keeps messages between two ranks on one tag in
order, and both ends cut the same segments from the same bounds.
Cost, c = ceil(M/N)·s bytes, g = ceil(c/S) segments of S bytes:
ring (N-1)·(α + c·β) + (N-1)·c·γ; pipelined adds (g-1)·α of extra
messages and hides (N-2)·(g-1)/g·c·min(β, γ) of reduction behind transfers.

"shm": one node.  Every rank's input is reachable by the others (staged in
its slot of a shared segment, or, above 4 MiB where the system allows
cross-memory reads, read where it is with ``process_vm_readv``); one sync;
rank r combines block r of all N inputs, in rank order, straight into
``out``; a last sync keeps every input in place until all have read it
(below 4 MiB the slots alternate between two regions instead).
Cost, f = (N-1)/N, m = M·s: (1 + [m > 4 MiB])·⌈log2 N⌉·α + f·m·β + f·m·γ.
"""

import math

from ..runtime import settings as _settings, watch as _watch
from ..runtime.context import Key
from ..runtime.registry import register
from ..node.group import copy_in
from .shm.common import node_state, on_one_node, reduce_range
from ._p2p import irecv, isend, wait

__all__ = ["segments", "ring_reduce_scatter", "call_segment_bytes", "ring_cost",
           "ring_pipelined_cost", "pipeline_overlap", "chunk_bytes", "register_ring_family"]

TAG_RING, TAG_RING_PIPELINED = 181, 182
_DEPTH = 4  # receive segments in flight ("ring_pipelined"); whole blocks: 2
_ACC = (Key("rs.acc0"), Key("rs.acc1"))
_POOL = tuple(Key(f"rs.recv{i}") for i in range(_DEPTH))


def segments(lo, hi, seg):
    """``[lo, hi)`` cut into pieces of at most ``seg``; an empty range is one empty piece."""
    return [(b, min(b + seg, hi)) for b in range(lo, hi, seg)] or [(lo, lo)]


def call_segment_bytes():
    """The segment size this call agreed on (every rank must cut the same segments)."""
    call = _watch.current()
    return call.settings.segment_bytes if call is not None else _settings.segment_bytes()


def ring_reduce_scatter(ctx, src, out, kernel, bounds, seg, tag):
    """The ring of the essay above with segments of ``seg`` elements (any bounds)."""
    comm, n, r = ctx.comm, ctx.size, ctx.rank
    right, left = (r + 1) % n, (r - 1) % n
    width = max(hi - lo for lo, hi in zip(bounds, bounds[1:]))
    seg = max(1, min(seg, width))
    depth = _DEPTH if seg < width else 2
    acc = [ctx.scratch(key, width, src.dtype) for key in _ACC]
    pool = [ctx.scratch(key, seg, src.dtype) for key in _POOL[:depth]]

    # Every segment this rank receives, in order: (step, block start, lo, hi).
    incoming = []
    for k in range(n - 1):
        t = (r - k - 2) % n
        incoming.extend((k, bounds[t], lo, hi) for lo, hi in segments(bounds[t], bounds[t + 1], seg))
    first = (r - 1) % n
    sends = [isend(comm, src[lo:hi], right, tag)
             for lo, hi in segments(bounds[first], bounds[first + 1], seg)]
    pending = {}  # (scratch, offset in block) -> the send still reading that segment
    recvs = [None] * len(incoming)

    def post(i):
        lo, hi = incoming[i][2:]
        recvs[i] = irecv(comm, pool[i % depth][:hi - lo], left, tag)

    for i in range(min(depth, len(incoming))):
        post(i)
    last = n - 2
    for i, (k, base, lo, hi) in enumerate(incoming):
        wait([recvs[i][0]], [recvs[i][1]])
        got = pool[i % depth][:hi - lo]
        if k == last:  # block r: its last contribution, straight into out
            kernel(src[lo:hi], got, out[lo - base:hi - base])
        else:
            key = (k % 2, lo - base)
            req = pending.pop(key, None)
            if req is not None:
                wait([req])
            target = acc[k % 2][lo - base:hi - base]
            kernel(src[lo:hi], got, target)
            pending[key] = isend(comm, target, right, tag)
        if i + depth < len(incoming):
            post(i + depth)  # its pool buffer is free again
    wait(sends + list(pending.values()))


def _ring(ctx, src, out, kernel, bounds):
    ring_reduce_scatter(ctx, src, out, kernel, bounds, src.size or 1, TAG_RING)


def _ring_pipelined(ctx, src, out, kernel, bounds):
    seg = max(1, call_segment_bytes() // src.itemsize)
    ring_reduce_scatter(ctx, src, out, kernel, bounds, seg, TAG_RING_PIPELINED)


def _shm(ctx, src, out, kernel, bounds):
    state = node_state(ctx)
    lo, hi = bounds[ctx.rank], bounds[ctx.rank + 1]
    if state.use_cma(src.nbytes):
        state.cross.publish(src, src)
        state.sync()  # the call's first: every header checked before any read
        reduce_range(state, src, out, lo, hi, kernel, "cma")
        state.sync()  # nobody returns (and lets its input change) while others read it
        return
    slots = state.slots
    offset, trailing = slots.begin(src.nbytes)
    views = slots.slots(offset, src.nbytes, src.dtype)
    copy_in(src, views[ctx.rank], ctx.rank, bounds)
    state.sync()
    reduce_range(state, src, out, lo, hi, kernel, views)
    if trailing:
        state.sync()


def chunk_bytes(nranks, count, itemsize):
    """c = ⌈M/N⌉·s: the bytes of one block in the costs of the ring families."""
    return -(-count // nranks) * itemsize


def ring_cost(nranks, count, itemsize, alpha, beta, gamma):
    """α-β-γ time of "ring" (see the essay): N-1 steps of one block each."""
    steps, chunk = nranks - 1, chunk_bytes(nranks, count, itemsize)
    return steps * (alpha + chunk * beta) + steps * chunk * gamma


def pipeline_overlap(nranks, chunk, itemsize):
    """``(g, hidden fraction)``: segments per block and the share (N-2)(g-1)/g a pipeline hides."""
    seg = max(itemsize, _settings.segment_bytes() // itemsize * itemsize)
    g = max(1, -(-chunk // seg))
    return g, max(nranks - 2, 0) * (g - 1) / g


def ring_pipelined_cost(nranks, count, itemsize, alpha, beta, gamma):
    """α-β-γ time of "ring_pipelined" (see the essay): the ring, in g segments per block."""
    chunk = chunk_bytes(nranks, count, itemsize)
    g, hidden = pipeline_overlap(nranks, chunk, itemsize)
    return (ring_cost(nranks, count, itemsize, alpha, beta, gamma) + (g - 1) * alpha
            - hidden * chunk * min(beta, gamma))


def shm_cost(nranks, count, itemsize, alpha, beta, gamma):
    """α-β-γ time of "shm" (see the essay)."""
    nbytes = count * itemsize
    sync = math.ceil(math.log2(nranks)) * alpha
    moved = (nranks - 1) / nranks * nbytes
    return (1 + (nbytes > 1 << 20)) * sync + moved * beta + moved * gamma


def register_ring_family(collective, tags, ring, ring_pipelined, shm):
    """Register ``collective``'s "ring", "ring_pipelined" (message ``tags``) and "shm".

    Each of the three is ``(run, summary, cost)``; "shm" runs on one node only.
    Reduce-scatter's and allgather's families are registered this way, in this order.
    """
    tag_ring, tag_pipelined = tags
    for name, (run, summary, cost), more in (
            ("ring", ring, {"tags": (tag_ring,)}),
            ("ring_pipelined", ring_pipelined, {"tags": (tag_pipelined,)}),
            ("shm", shm, {"usable": on_one_node})):
        register(name, run, summary, cost=cost, collective=collective, **more)


register_ring_family(
    "reduce_scatter", (TAG_RING, TAG_RING_PIPELINED),
    ring=(_ring, "N-1 steps around a ring, one block per message", ring_cost),
    ring_pipelined=(_ring_pipelined, "the ring in segments with Isend/Irecv: reducing one "
                    "segment overlaps the next's transfer", ring_pipelined_cost),
    shm=(_shm, "one node: each rank reduces its block straight from the others' memory",
         shm_cost))
