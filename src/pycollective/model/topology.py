"""Where the ranks are, and what the links between them cost: the model's view of a machine.

Two records, both plain data (this module sends no message and reads no file):

* :class:`Layout` -- facts about a communicator that the library finds once
  with MPI (``collectives.auto`` builds it from ``Split_type(COMM_TYPE_SHARED)``): how
  many ranks each node holds, whether a node's ranks are consecutive, how
  many cores each node lets them use, and the cache of one core.  It gives
  the oversubscription (ranks per core) that the model's defaults scale by.
* :class:`Topology` -- what a cost function needs to price messages on that
  layout: the node sizes and one (α, β) pair for links inside a node and one
  for links between nodes.  An algorithm whose registered cost accepts a
  ``topo`` keyword gets it (``hierarchical`` does: it composes its cost from
  both kinds of link); the others get the slower link's α and β when the
  communicator spans nodes, because every one of their steps waits for the
  slowest transfer of the step and a step that crosses nodes always exists.
"""

import inspect
from typing import Callable, Dict, NamedTuple, Optional, Tuple

__all__ = ["Layout", "Topology", "one_node", "accepts_topo", "evaluate"]


class Layout(NamedTuple):
    """Where a communicator's ranks run (the same on every rank).

    Attributes:
        nodes: ranks on each node, nodes in the order of their lowest rank.
        blocks: True when every node's ranks are consecutive ranks.
        cores: cores the ranks of each node may use (same order as
            ``nodes``); empty when unknown (one core per rank assumed).
        cache_bytes: the private cache of one core (L2), 0 when unknown.
    """

    nodes: Tuple[int, ...]
    blocks: bool = True
    cores: Tuple[int, ...] = ()
    cache_bytes: int = 0

    @property
    def nranks(self) -> int:
        return sum(self.nodes)

    @property
    def spans_nodes(self) -> bool:
        return len(self.nodes) > 1

    @property
    def ranks_per_core(self) -> float:
        """Ranks per usable core on the busiest node; at least 1.

        Above 1 the ranks take turns on the cores, so every step that needs
        the peer to run waits for the scheduler as well.
        """
        if not self.cores:
            return 1.0
        return max(1.0, max(n / max(c, 1) for n, c in zip(self.nodes, self.cores)))

    def describe(self) -> str:
        """``2 nodes x [2, 2] ranks, 2 cores each, 2.0 ranks per core``."""
        if self.spans_nodes:
            where = f"{len(self.nodes)} nodes of {list(self.nodes)} ranks"
            if not self.blocks:
                where += " (ranks not in node blocks)"
        else:
            where = f"1 node of {self.nodes[0]} ranks"
        if self.cores:
            cores = sorted(set(self.cores))
            where += f", {cores[0] if len(cores) == 1 else cores} usable cores per node"
            rpc = self.ranks_per_core
            where += f", {rpc:.3g} rank{'' if rpc == 1 else 's'} per core"
        return where


def one_node(nranks: int) -> Layout:
    """The layout assumed without facts: one node, one core per rank."""
    return Layout((int(nranks),))


class Topology(NamedTuple):
    """What a cost function needs to price messages on a layout.

    Attributes:
        nodes: ranks on each node.
        intra: (α, β) between two ranks of one node.
        inter: (α, β) between ranks of different nodes.
    """

    nodes: Tuple[int, ...]
    intra: Tuple[float, float]
    inter: Tuple[float, float]

    @property
    def spans_nodes(self) -> bool:
        return len(self.nodes) > 1


_ACCEPTS: Dict[Callable, bool] = {}


def accepts_topo(cost: Callable) -> bool:
    """Whether a registered cost takes the optional ``topo`` keyword (asked once per function)."""
    known = _ACCEPTS.get(cost)
    if known is None:
        try:
            known = "topo" in inspect.signature(cost).parameters
        except (TypeError, ValueError):  # a builtin or an odd callable: the old signature
            known = False
        _ACCEPTS[cost] = known
    return known


def evaluate(cost: Callable, nranks: int, count: int, itemsize: int, alpha: float, beta: float,
             gamma: float, topo: Optional[Topology] = None) -> float:
    """``cost``'s time for one allreduce on ``topo`` (None: one node with ``alpha``, ``beta``).

    ``alpha`` and ``beta`` are the links inside a node; a cost without the
    ``topo`` keyword gets the links between nodes when ``topo`` spans nodes.
    """
    if topo is not None and accepts_topo(cost):
        return cost(nranks, count, itemsize, alpha, beta, gamma, topo=topo)
    if topo is not None and topo.spans_nodes:
        alpha, beta = topo.inter
    return cost(nranks, count, itemsize, alpha, beta, gamma)
