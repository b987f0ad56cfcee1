"""The one registry of algorithms, and of the message tags they use.

Read by :func:`pycollective.allreduce`, :func:`pycollective.algorithms`, the
automatic choice, the benchmark's command-line choices and the test
parametrisation.  Adding an algorithm is one module that calls
:func:`register` plus one import line in ``algorithms/__init__.py``
(docs/algorithms.md has the recipe).

Everything an algorithm declares lives in its registration: the function
that runs it, a one-line summary, its α-β-γ cost, whether it can run on a
given communicator, and the point-to-point message tags it sends with.
Registration refuses a name or a tag that is already taken, so two
algorithms can never exchange messages that match each other's receives.
"""

from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Tuple, Union

__all__ = ["Algorithm", "register", "unregister", "get", "names", "index", "reserve_tags",
           "tag_owners"]

#: Signature of ``usable``: ``usable(ctx) -> None`` when the algorithm can run on
#: the communicator, else a one-line reason why not.
UsableFn = Callable[[object], Optional[str]]


def _always(ctx) -> Optional[str]:
    return None


@dataclass(frozen=True)
class Algorithm:
    """One registered algorithm.

    ``run(ctx, src, dst, kernel)`` reduces the flat arrays ``src`` of every
    rank into ``dst`` on every rank.  ``src`` is read only and may be the
    same array as ``dst`` (in place); ``ctx`` is the private
    :class:`~pycollective.runtime.context.Context` (size > 1 and count > 0 are
    guaranteed by the caller); ``kernel(a, b, out)`` is the reduction.
    ``cost``, where given, is the algorithm's α-β-γ time model
    ``cost(nranks, count, itemsize, alpha, beta, gamma) -> seconds``.
    ``usable(ctx)`` says why the algorithm cannot run on a communicator
    (None: it can); it may be collective on a context's first use, so it is
    asked on every rank at the same point.  ``agreed``, where given, runs
    the algorithm with the agreement step folded in:
    ``agreed(ctx, src, dst, kernel, values, board) -> bool`` reduces the
    agreement vector ``values`` with MAX over the ranks (through ``board``,
    the communicator's agreement board) and, if it came back unchanged on
    every rank, runs the algorithm and returns True; otherwise it returns
    False with ``values`` holding the MAX (the caller raises the verdict).
    ``verifies_arguments``: the algorithm itself compares every rank's call
    (count, dtype, op, ...) before it reads another rank's data, so a call
    with the agreement step turned off can skip it safely; for the others the
    agreement runs whatever the setting, since ranks that disagree could
    otherwise return wrong data.
    ``repeated``, where given with ``agreed``, prepares a repeated call:
    ``repeated(ctx, dst, kernel, board) -> run or None``, where
    ``run(ctx, call, values, src, dst)`` does what ``agreed`` does for
    buffers of ``dst``'s dtype and size, with what ``agreed`` looks up on
    every call resolved once (:mod:`pycollective.collectives.plans` keeps it).  It
    must not be collective to prepare, and must fall back to ``agreed``
    whenever what it resolved no longer holds.  ``run`` may also have a fast
    way, ``run.fast(number, plan, src, dst)``: the call numbered ``number``
    without its record (``collectives.plans.run``), the plan's ``template``
    its agreement vector; it returns None once the call is done, else the
    rest of the call as a ``run``, which the caller runs with the record.
    ``layout_aware``: its speed depends on how the ranks share nodes, cores
    and links (shared memory inside a node), which the model prices least
    well without a calibration; ``algorithm="auto"`` times it among its
    candidates wherever it can run (:func:`pycollective.model.tuning.candidates`).
    A callable ``layout_aware(layout) -> bool`` says on which layouts
    (:class:`pycollective.model.topology.Layout`) that holds: elsewhere it is
    a candidate only where the model ranks it so (:meth:`times_always`).
    ``settling``: ``settling(layout, nbytes) -> calls``, how many calls of one size
    it makes before its calls take the way they keep (an algorithm that times ways of
    its own on a size's first calls); ``auto``'s trials time it from then on.
    """

    name: str
    run: Callable
    summary: str
    cost: Optional[Callable] = None
    usable: UsableFn = _always
    tags: Tuple[int, ...] = ()
    collective: str = "allreduce"
    agreed: Optional[Callable] = None
    verifies_arguments: bool = False
    layout_aware: Union[bool, Callable] = False
    repeated: Optional[Callable] = None
    settling: Optional[Callable] = None

    def settling_calls(self, layout, nbytes: int) -> int:
        """Calls of ``nbytes`` per rank before this algorithm's calls are its steady ones."""
        return 0 if self.settling is None else max(0, int(self.settling(layout, nbytes)))

    def times_always(self, layout) -> bool:
        """Whether ``auto`` times this algorithm whatever the model says, on ``layout``."""
        aware = self.layout_aware
        return bool(aware(layout)) if callable(aware) else aware


_ALGORITHMS: Dict[str, Dict[str, Algorithm]] = {}
_TAGS: Dict[int, str] = {}


def reserve_tags(owner: str, tags: Iterable[int]) -> Tuple[int, ...]:
    """Claim message ``tags`` for ``owner``; refuse any tag another owner holds.

    Returns:
        The tags, as a tuple.

    Raises:
        ValueError: naming the tags in use and their owners.
    """
    tags = tuple(int(t) for t in tags)
    taken = {t: _TAGS[t] for t in tags if t in _TAGS and _TAGS[t] != owner}
    if taken:
        raise ValueError(f"cannot reserve tags for {owner!r}: "
                         + ", ".join(f"{t} (used by {o!r})" for t, o in sorted(taken.items())))
    if len(set(tags)) != len(tags):
        raise ValueError(f"{owner!r} lists a tag twice: {tags}")
    for t in tags:
        _TAGS[t] = owner
    return tags


def tag_owners() -> Dict[int, str]:
    """Every reserved tag and who holds it."""
    return dict(sorted(_TAGS.items()))


def register(name: str, run: Callable, summary: str, *, cost: Optional[Callable] = None,
             usable: Optional[UsableFn] = None, tags: Iterable[int] = (),
             collective: str = "allreduce", agreed: Optional[Callable] = None,
             verifies_arguments: bool = False,
             layout_aware: Union[bool, Callable] = False,
             repeated: Optional[Callable] = None,
             settling: Optional[Callable] = None) -> Algorithm:
    """Add an algorithm; refuse a name or a message tag already in use.

    Args:
        name: the name users pass as ``algorithm=``.
        run: ``run(ctx, src, dst, kernel)``.
        summary: one line for tables and ``--help``.
        cost: ``cost(nranks, count, itemsize, alpha, beta, gamma) -> seconds``.
        usable: ``usable(ctx) -> None or reason``; default: usable everywhere.
        tags: the point-to-point tags the algorithm's messages use.
        collective: which collective it implements.
        agreed: the algorithm with the agreement folded in (see :class:`Algorithm`).
        verifies_arguments: see :class:`Algorithm`.
        layout_aware: see :class:`Algorithm`.
        repeated: a repeated call's prepared ``agreed`` (see :class:`Algorithm`).
        settling: see :class:`Algorithm`.

    Raises:
        ValueError: the name is registered already, a tag is taken, or
            ``repeated`` is given without ``agreed``.
    """
    if repeated is not None and agreed is None:
        raise ValueError(f"cannot register {name!r}: repeated prepares agreed, which is not given")
    table = _ALGORITHMS.setdefault(collective, {})
    if name in table or name in ("auto", "all"):
        raise ValueError(f"cannot register {name!r}: the {collective} algorithm {name!r} "
                         "is already registered" if name in table else
                         f"cannot register {name!r}: the name is reserved")
    algo = Algorithm(name, run, summary, cost, usable or _always,
                     reserve_tags(f"{collective}:{name}", tags), collective, agreed,
                     bool(verifies_arguments),
                     layout_aware if callable(layout_aware) else bool(layout_aware), repeated,
                     settling)
    table[name] = algo
    return algo


def unregister(name: str, collective: str = "allreduce") -> None:
    """Remove an algorithm and free its tags (for tests and plug-ins)."""
    algo = _ALGORITHMS.get(collective, {}).pop(name, None)
    if algo is not None:
        for t in algo.tags:
            _TAGS.pop(t, None)


def get(name: str, collective: str = "allreduce") -> Algorithm:
    """Return the :class:`Algorithm` called ``name``.

    Raises:
        ValueError: for an unknown name (the message lists the known ones).
    """
    table = _ALGORITHMS.get(collective, {})
    try:
        return table[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown algorithm {name!r}; registered: {', '.join(table)}") from None


def names(collective: str = "allreduce") -> List[str]:
    """Registered algorithm names, in registration order."""
    return list(_ALGORITHMS.get(collective, {}))


def index(name: str, collective: str = "allreduce") -> int:
    """Position of ``name`` in the registry (used to compare choices across ranks)."""
    return names(collective).index(name)
