"""Which stores the repeated sliced calls of ``shm`` copy their input in with: plain or
non-temporal, chosen while they run (:class:`Stores`)."""

import time

__all__ = ["Stores", "FORCE_STORES"]

# 0 or 1: every repeated sliced call copies in with that kind of stores (see Stores);
# None: each chooses while running.  For benchmarks and tests.
FORCE_STORES = None

# {family: kind}: the kind a Stores of the family found clearly faster last (see Stores).
_SETTLED = {}


class Stores:
    """Which stores a node's repeated sliced call copies its input in with, chosen
    while it runs: plain ones (0) or non-temporal ones (1, past this core's cache).

    A machine can be in a state where a core reading lines from another
    core's cache is several times slower than usual (docs/results/entry.md).
    Then stores that go to memory make the readers faster; otherwise they are
    slower (docs/results/stores.md).  No fixed choice fits both, and the
    state changes from launch to launch, so the calls of one shape are timed
    while they run.  The kinds go in *turns* of ``TURN`` calls, and only a
    turn's last call is timed: the first calls after a change of kind find
    the slots in the other kind's cache state, and a single call of the other
    kind measured that change, not the kind (one rank of a launch chose
    non-temporal stores from such calls, and its calls took 1.3x as long).
    The first ``PROBE`` calls alternate turns of the two kinds, the first turn
    untimed, so that each kind has three timed calls whose median decides:
    a shape's first calls carry its one-off costs (loading, the slots'
    pages), and with two samples a kind counts the larger, so one slow call
    decided (at N = 2 on the AMD VM a first turn's 83 us against 19 us, and
    a stalled 40 us against 15 us, settled a family on plain stores, 2x
    slower there at 256 KiB-4 MiB: docs/results/double-limit.md).  Then one call
    in ``every`` is timed, and one turn in ``SAMPLE`` calls (``RARELY``
    where the other kind is clearly slower) takes the kind not in use.  Each
    kind's time is the median of its last three timed calls (the larger of
    two), and the kind in use changes when the other's is below ``SWITCH`` of
    its own, from two samples of the other at least.

    **One choice per node.**  A call's time depends on every rank's kind (each
    reads the others' slots), and ranks choosing apart can settle in a mixed
    state that none leaves alone: each rank's tries of the other kind then
    meet the others' kinds unchanged.  So only the node's first rank times
    and chooses (``shared``: it *leads*); it publishes the kind of each call
    in a word of the node's control segment, and the other ranks take the
    kind from there (they see a change by their next call, hence the turns).
    The bytes in the slot are the same either way, so ranks whose kinds
    differ for a call still compute the same result.

    The state is the launch's, not the shape's: where one shape's calls have
    found one kind clearly faster, a new shape of the same ``family`` starts
    with that kind and samples the other as a settled one does, instead of
    alternating the two (whose slower half would cost its first calls, and
    ``auto``'s trials of them, several times over: docs/results/stores.md).

    ``shm``'s slot path above 4 MiB keeps one per size for its
    copy-in and the writes of its slice into the slot (``allreduce.py``), and
    its repeated calls below keep one per shape: the older sliced step for its
    copy-in (``steps.py``), the reduce-scatter-allgather step from
    ``rsag_steps.CHOOSE_BYTES`` for its copy-in and its slice of the result.

    A call takes its kind from :meth:`next` and reports a timed one to
    :meth:`took`.
    """

    PROBE, SAMPLE, SWITCH, TURN = 21, 32, 0.85, 3
    # Where the kind not in use took 1.25x as long or more, it is tried 4x less
    # often: each try costs that much (docs/results/stores.md).
    CLEAR, RARELY = 1.25, 128
    __slots__ = ("calls", "mask", "using", "recent", "median", "sample", "every", "family",
                 "words", "index", "leads")

    def __init__(self, chooses=True, fixed=0, every=8, family=None, shared=None):
        """``chooses``: False where this rank's waits sleep (its node's ranks outnumber
        their cores, or ``PYCOLLECTIVE_SHM_WAIT=sleep``; the same on every rank of the
        node): there a call's time is mostly which rank the scheduler ran when, too
        noisy to choose from, and the calls keep the ``fixed`` kind.  ``every``: once
        probed, one call in this many is timed (a power of two; 1 where a call is long
        beside a clock read).  ``family``: a name shared by the Stores whose calls meet
        the same machine state (None: this one learns alone).  ``shared``: ``(words,
        index, leads)`` from :meth:`~pycollective.node.group.NodeGroup.stores_word`, the
        node's word for this shape and whether this rank chooses (None: it chooses
        alone)."""
        self.calls, self.using, self.sample = 0, 0 if chooses else fixed, self.SAMPLE
        self.every, self.family = every, family
        self.mask = 0 if chooses else -1  # -1: no call is timed
        self.recent, self.median = ([], []), [0.0, 0.0]
        self.words, self.index, self.leads = shared if chooses and shared else (None, 0, True)
        known = _SETTLED.get(family) if chooses and family is not None else None
        if known is not None:  # settled from the start: no alternating probe
            self.calls, self.mask, self.using = self.PROBE, every - 1, known

    def next(self):
        """Count a call; (its kind, its start time if it is timed, else 0.0).  A timed
        call reports with :meth:`took`."""
        if FORCE_STORES is not None:
            return FORCE_STORES, 0.0
        if not self.leads:  # the node's first rank chooses
            self.using = self.words[self.index]
            return self.using, 0.0
        self.calls += 1
        if self.mask < 0:
            return self.using, 0.0
        kind, timed = self.kind()
        # the word read, not a copy of what this Stores wrote: Stores of other shapes
        # may share it (stores_word)
        if self.words is not None and self.words[self.index] != kind:
            self.words[self.index] = kind
        return kind, (time.perf_counter() if timed else 0.0)

    def kind(self):
        """The kind for the ``calls``-th call, and whether it is timed."""
        calls, turn = self.calls, self.TURN
        if calls <= self.PROBE:  # turns of each kind, non-temporal first; the first untimed
            return ((calls - 1) // turn + 1) & 1, calls % turn == 0 and calls > turn
        # counted from the probe's end: the first turn of the other kind comes a whole
        # ``sample`` after it, not inside the calls the first-use measurement and auto's
        # trials time right after the probe (shm_settling)
        at = (calls - self.PROBE) % self.sample
        if at == 0 or at > self.sample - turn:  # the turn of the other kind
            return self.using ^ 1, at == 0
        # every ``every``-th call, but not the first of a turn back
        return self.using, not (calls & self.mask) and at >= turn

    def took(self, kind, seconds):
        """Record a timed call; switch kinds where the other is clearly faster.  The
        median of the last three: a first call that compiled, or one the machine
        stalled, does not count, and a change of state shows after two samples."""
        recent = self.recent[kind]
        recent.append(seconds)
        if len(recent) > 3:
            del recent[0]
        if len(recent) == 3:
            a, b, c = recent
            self.median[kind] = a + b + c - max(a, b, c) - min(a, b, c)
        else:  # one or two: the larger (a first call that compiled is one)
            self.median[kind] = max(recent)
        if self.calls < self.PROBE:
            return
        self.mask = self.every - 1
        using = self.using
        mine, other = self.median[using], self.median[1 - using]
        # Two samples of the other kind at least: one turn of it can meet the slots in
        # the state the kind in use left (at N = 2 on the AMD VM one such sample moved a
        # 400 KB call from non-temporal stores at 33-45 us to plain ones at 65-78).
        if 0.0 < other < self.SWITCH * mine and len(self.recent[1 - using]) >= 2:
            self.using, mine, other = 1 - using, other, mine
        clear = other >= self.CLEAR * mine
        self.sample = self.RARELY if clear else self.SAMPLE
        if clear and self.family is not None:
            _SETTLED[self.family] = self.using
