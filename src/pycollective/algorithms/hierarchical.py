"""Hierarchical allreduce: shared memory inside each node, a ring between one leader per node.

Nodes.  By default a node is what ``Split_type(COMM_TYPE_SHARED)`` groups:
the ranks that share memory.  ``PYCOLLECTIVE_RANKS_PER_NODE`` overrides it so
tests and benchmarks can act out several nodes on one machine: an integer k
makes nodes of k consecutive ranks (the last one may be smaller), a
comma-separated list such as ``2,4`` gives the sizes of consecutive nodes
(unequal sizes allowed; they must add up to the communicator's size).  The
layout is read when a communicator first runs "hierarchical" and is fixed for
that communicator from then on; all ranks must see the same value (checked
then, once), and every emulated node must lie inside one real shared-memory
node.  Local rank 0 of each node is its leader.

Steps, with the node's n ranks and M elements split by
:func:`~pycollective.partition` into n slices (see ``algorithms/shm/allreduce.py`` and ``node/group.py``
for the window, the sync and the two alternating regions):

1. Copy-in: local rank i copies its input except slice i into its slot; sync.
2. Node reduce-scatter: rank i reduces slice i of the node's n inputs
   (operands in local rank order) into its own slot; sync.
3. Leaders: the leader copies slice q from slot q into its own slot for every
   q != 0, so slot 0 holds the node's sum, then runs an allreduce in place on
   slot 0 among the leaders (the pipelined ring above 64 KiB, the butterfly
   below, both point to point on the leaders' own communicator); sync.
4. Node broadcast: every rank copies slot 0 into ``dst`` (and, for messages
   above 1 MiB, a last sync before the slots can be reused).

A node of one rank skips the shared memory: its rank joins the leaders'
allreduce with its own buffers.  Only leaders send messages between nodes,
one vector-sized ring per call, which is why this is the algorithm to pick on
several hosts.  Each element is computed once in its node and once among the
leaders and then copied, so all ranks hold bitwise-identical results.

Cost.  The node phase costs the largest node's q ranks, f = (q-1)/q,
S = M·s bytes, over the links inside a node (α_i, β_i):
3·⌈log2 q⌉·α_i + (2f·S + S)·β_i + f·S·γ (three syncs, copy-in and copy-out of
the slices, the node's reduction, the leader's gather); the leaders' phase is
the registered cost of the leaders' algorithm for K nodes over the links
between nodes (α_e, β_e).  The model passes both kinds of link in ``topo``
(:class:`~pycollective.model.topology.Topology`); without it the layout is
``PYCOLLECTIVE_RANKS_PER_NODE`` when it is set, else one node, and
every link costs α, β.  Acted-out nodes (the override) sit on one real node,
so their leaders talk over the links inside a node.
"""

import math

import numpy as np
from mpi4py import MPI

from ..runtime import env as _env, hosts as _hosts, watch as _watch
from ..runtime.context import Context, Key
from .._errors import ConfigurationError
from ..data.partition import chunk_bounds
from ..runtime.registry import get, register
from ..node.group import NodeGroup, SharedSlots, copy_in, reduce_own_slice

ENV = _env.RANKS_PER_NODE.name
_STATE = Key("hierarchical")
_INTER_RING_BYTES = 64 << 10


def _parse_layout(text, size):
    """Node sizes for ``size`` ranks from the override ``text``; raises ValueError."""
    try:
        parts = [int(p) for p in text.replace(" ", "").split(",") if p]
    except ValueError:
        raise ConfigurationError(f"{ENV}={text!r}: expected an integer or a comma-separated "
                         "list of node sizes") from None
    if not parts or any(p <= 0 for p in parts):
        raise ConfigurationError(f"{ENV}={text!r}: node sizes must be positive")
    if len(parts) == 1:
        k = parts[0]
        return [min(k, size - b) for b in range(0, size, k)]
    if sum(parts) != size:
        raise ConfigurationError(f"{ENV}={text!r}: node sizes add up to {sum(parts)}, "
                         f"but the communicator has {size} ranks")
    return parts


class _HierState:
    """Per communicator: the node group and its slots, the leaders' context."""

    def __init__(self, ctx):
        comm, rank = ctx.comm, ctx.rank
        text = _env.RANKS_PER_NODE.get()
        _watch.arrive(comm, "its first hierarchical allreduce")
        # The layout must be the same everywhere: compare once, before any
        # rank acts on it, and fail identically if not.
        texts = comm.allgather(text)
        if len(set(texts)) != 1:
            raise ConfigurationError(f"{ENV} differs across ranks: {sorted(set(texts))}")
        self.node = self.inter = None
        if text:
            sizes = _parse_layout(text, ctx.size)
            starts = np.cumsum([0] + sizes)
            color = int(np.searchsorted(starts, rank, side="right")) - 1
            node = comm.Split(color, rank)
        else:
            node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        shared = node.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        inside = shared.Get_size() == node.Get_size()
        shared.Free()
        if not comm.allreduce(inside, op=MPI.LAND):
            node.Free()
            raise ConfigurationError(f"{ENV}={text!r} puts ranks that do not share memory "
                             "in one node")
        self.leader = node.Get_rank() == 0
        leaders = comm.Split(0 if self.leader else MPI.UNDEFINED, rank)
        try:
            self.node = SharedSlots(NodeGroup(node, progress=comm))
        finally:
            node.Free()  # the group keeps shared memory, not the communicator
        self.inter = Context(leaders, f"the node leaders of {ctx.label}") if self.leader else None
        # The leaders' ranks as the call's, for messages (no communication).
        self.leader_ranks = None if self.inter is None else _call_ranks(leaders, comm)
        self.nodes = self.inter.size if self.inter is not None else None

    def free(self):
        if self.node is not None:
            self.node.free()
            self.node = None
        if self.inter is not None:
            self.inter.free()
            self.inter = None


def _call_ranks(sub, comm):
    """``comm``'s rank of each rank of ``sub`` (local: no communication)."""
    mine, theirs = sub.Get_group(), comm.Get_group()
    try:
        return MPI.Group.Translate_ranks(mine, list(range(sub.Get_size())), theirs)
    finally:
        mine.Free()
        theirs.Free()


def _state(ctx):
    return ctx.cached(_STATE, _HierState)


def _leaders_algorithm(nbytes):
    """What the leaders run among themselves: a pipelined ring for large vectors."""
    return "ring_pipelined" if nbytes >= _INTER_RING_BYTES else "butterfly"


def _inter_allreduce(inter, src, dst, kernel):
    if inter.size == 1:
        if src is not dst:
            dst[...] = src
        return
    get(_leaders_algorithm(dst.nbytes)).run(inter, src, dst, kernel)


def hierarchical_allreduce(ctx, src, dst, kernel):
    state = _state(ctx)
    node = state.node
    if node.size == 1:
        with _hosts.sub_ranks(state.leader_ranks, "the node leaders' exchange"):
            _inter_allreduce(state.inter, src, dst, kernel)
        return
    offset, trailing = node.begin(dst.nbytes)
    slots = node.slots(offset, dst.nbytes, dst.dtype)
    i = node.rank
    bounds = chunk_bounds(dst.size, node.size)
    copy_in(src, slots[i], i, bounds)
    node.sync()
    reduce_own_slice(kernel, src, slots, i, bounds)
    node.sync()
    if state.leader:
        total = slots[0]
        for q in range(1, node.size):
            lo, hi = bounds[q], bounds[q + 1]
            if hi > lo:
                total[lo:hi] = slots[q][lo:hi]
        with _hosts.sub_ranks(state.leader_ranks, "the node leaders' exchange"):
            _inter_allreduce(state.inter, total, total, kernel)
    node.sync()
    dst[...] = slots[0]
    if trailing:
        node.sync()


def _cost_layout(nranks, topo):
    """(node sizes, whether the nodes are real) for the cost: override, topology, or one node."""
    text = _env.RANKS_PER_NODE.get()
    if text:
        try:
            return _parse_layout(text, nranks), False
        except ConfigurationError:
            pass  # the run raises it; the model prices one node meanwhile
    if topo is not None:
        return list(topo.nodes), True
    return [nranks], False


def hierarchical_cost(nranks, count, itemsize, alpha, beta, gamma, topo=None):
    """α-β-γ time of :func:`hierarchical_allreduce` (see the essay above).

    ``alpha``, ``beta`` are the links inside a node; ``topo`` (optional)
    gives the node sizes and the links between nodes.
    """
    sizes, real = _cost_layout(nranks, topo)
    alpha_e, beta_e = topo.inter if (real and topo.spans_nodes) else (alpha, beta)
    q, nodes = max(sizes), len(sizes)
    nbytes = count * itemsize
    t = 0.0
    if q > 1:
        f = (q - 1) / q
        t += 3 * math.ceil(math.log2(q)) * alpha + (2 * f + 1) * nbytes * beta + f * nbytes * gamma
    if nodes > 1:
        t += get(_leaders_algorithm(nbytes)).cost(nodes, count, itemsize, alpha_e, beta_e, gamma)
    return t


def _spans_nodes(layout):
    """Where auto times "hierarchical" whatever the model says: across nodes.

    On one node it has one leader, so it is shm's node steps plus a gather of
    the whole vector into the leader's slot and a copy of it by every rank:
    more traffic than "shm" for the same result, and timing it against "shm"
    in every class let noise keep the slower one (docs/results/entry.md).
    Where the model ranks it among its best it is still timed.
    """
    return layout.spans_nodes


register("hierarchical", hierarchical_allreduce,
         "shared-memory reduce inside each node, ring among one leader per node, "
         "shared-memory broadcast",
         cost=hierarchical_cost, layout_aware=_spans_nodes)
