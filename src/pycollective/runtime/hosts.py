"""Which host each rank of a communicator runs on, for messages about missing ranks.

A rank that times out names the ranks it did not hear from.  When they are
on another node, "did not arrive (stopped, dead, or not calling it)" points
the user at the wrong thing: what happened is usually that the node, or the
link to it, stopped answering.  Every context gathers its ranks' processor
names once, when it is created (:func:`pycollective.runtime.context.get_context`),
so that a timeout can say where the missing ranks are without talking to
anyone.  Nodes are numbered in the order of their lowest rank.
"""

import contextlib
import threading
from typing import List, Sequence

__all__ = ["Hosts", "missing", "waiting_text", "sub_ranks", "call_ranks", "NAME_BYTES"]

NAME_BYTES = 256  # MPI_MAX_PROCESSOR_NAME in MPICH and Open MPI


class Hosts:
    """The processor name of every rank of one communicator, and node indexes."""

    __slots__ = ("names", "node_of", "members")

    def __init__(self, names: Sequence[str]):
        self.names = list(names)
        index = {}
        for name in self.names:
            index.setdefault(name, len(index))
        self.node_of = [index[name] for name in self.names]
        self.members: List[List[int]] = [[] for _ in index]
        for rank, node in enumerate(self.node_of):
            self.members[node].append(rank)

    @classmethod
    def from_bytes(cls, rows) -> "Hosts":
        """From an (N, NAME_BYTES) uint8 array of NUL-padded names."""
        return cls([bytes(row).rstrip(b"\0").decode("utf-8", "replace") for row in rows])

    def node(self, rank: int) -> str:
        k = self.node_of[rank]
        return f"node {k} (host {self.names[self.members[k][0]]!r})"


_local = threading.local()


@contextlib.contextmanager
def sub_ranks(ranks: Sequence[int], label: str):
    """Inside: waits are on a sub-communicator (the node leaders) whose rank i is the call's
    rank ``ranks[i]``; messages then name the call's ranks (:func:`call_ranks`)."""
    before = getattr(_local, "sub", None)
    _local.sub = (list(ranks), label)
    try:
        yield
    finally:
        _local.sub = before


def call_ranks(ranks: Sequence[int]) -> str:
    """``2, 3`` for ranks of the communicator being waited on, as the call's ranks."""
    sub = getattr(_local, "sub", None)
    if sub is None:
        return ", ".join(map(str, ranks))
    table, label = sub
    return ", ".join(f"{table[q]}" for q in ranks) + f" (in {label})"


def missing(hosts, me: int, late: Sequence[int]) -> str:
    """``ranks [2, 3] did not arrive ...``, saying where they are when that is another node."""
    plain = f"ranks {list(late)} did not arrive (stopped, dead, or not calling it)"
    if hosts is None or len(hosts.members) < 2 or not late:
        return plain
    mine = hosts.node_of[me]
    here = [q for q in late if hosts.node_of[q] == mine]
    parts = []
    if here:
        parts.append(f"ranks {here} on this rank's {hosts.node(me)} did not arrive (stopped, "
                     "dead, or not calling it)")
    for k, members in enumerate(hosts.members):
        away = [q for q in late if hosts.node_of[q] == k and k != mine]
        if not away:
            continue
        if away == members:
            parts.append(f"ranks {away}, every rank of {hosts.node(away[0])}, did not arrive: "
                         "that node stopped answering (a lost host, or the link to it cut)")
        else:
            parts.append(f"ranks {away} on {hosts.node(away[0])} did not arrive (stopped, "
                         "dead, or not calling it)")
    return "; ".join(parts) + f"; this rank is on {hosts.node(me)}"


def waiting_text(hosts, me: int, late: Sequence[int], waiting_for) -> str:
    """``waiting_for`` (a text, or an object that formats one), with a note when it is this
    node's ranks that wait for another node's."""
    waiting_for = str(waiting_for)
    if (hosts is None or len(hosts.members) < 2 or "this node" not in waiting_for
            or any(hosts.node_of[q] == hosts.node_of[me] for q in late)):
        return waiting_for
    return f"{waiting_for} (which wait in turn for ranks on other nodes)"
