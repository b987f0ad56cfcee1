"""Which way ``shm``'s calls above ``DOUBLE_LIMIT`` (4 MiB) per rank go: through the slots
or by single copy, chosen by timing both where every rank has a core (:class:`Way`)."""

import time

__all__ = ["Way", "SLOTS", "SINGLE", "FORCE_WAY"]

SLOTS, SINGLE = 0, 1

# SLOTS or SINGLE: every call above DOUBLE_LIMIT that may take the single copy takes that way
# (see Way); None: as Way says.  For benchmarks and tests.
FORCE_WAY = None


class Way:
    """The way a size's calls take: staged through the node's slots (copy-in, reduce,
    copy-out) or single copy (``process_vm_readv`` of the peers' buffers).

    Which is faster depends on the machine, not only on the size: the single
    copy pins the peer's pages one by one, which a machine pays at its own
    price, and staging crosses memory three times, which a large shared cache
    hides (docs/results/single-copy.md).  Where every rank of the node has a
    core of its own, a size's calls choose by timing both: its first call
    takes the ``fixed`` way, its second the other (each way's first call
    builds what it needs: slots, the peer's pages), the next ``2 * TRIALS``
    alternate the two and are timed, and after the last of them every rank
    takes the way whose fastest call was faster on its slowest rank (one
    element-wise max over the node, :meth:`decide`), so every rank takes the
    same way from then on.  The two ways compute each element with the same
    operations in the same order, so the result is the same bits either way.
    Where ranks outnumber cores a call's time is mostly which rank the
    scheduler ran when: the calls keep the ``fixed`` way, chosen by size.
    """

    TRIALS = 4
    LAST_TRIAL = 2 + 2 * TRIALS  # the size's call after which the ranks decide
    __slots__ = ("calls", "fixed", "decided", "best")

    def __init__(self, fixed, chooses):
        self.calls, self.fixed = 0, fixed
        self.decided = None if chooses else fixed
        self.best = [float("inf"), float("inf")]

    def next(self):
        """The way of this call, and its start time if it is timed (else 0.0); a timed
        call reports with :meth:`took`."""
        if FORCE_WAY is not None:
            return FORCE_WAY, 0.0
        if self.decided is not None:
            return self.decided, 0.0
        self.calls += 1
        if self.calls <= 2:
            return self.fixed ^ (self.calls == 2), 0.0
        return self.calls & 1, time.perf_counter()

    def took(self, way, seconds):
        """Record a timed call; True after the last trial: the caller then runs
        :meth:`decide` (collective)."""
        self.best[way] = min(self.best[way], seconds)
        return self.calls >= self.LAST_TRIAL

    def times(self):
        """This rank's fastest call of each way, in nanoseconds (what :meth:`decide` takes
        the maximum of over the ranks)."""
        return [int(min(t, 1e3) * 1e9) for t in self.best]

    def decide(self, slowest):
        """Settle on the way faster on the slowest rank (``slowest``: :meth:`times`' element-wise
        max over the ranks, the same on every rank); a tie keeps the fixed way."""
        slots, single = slowest
        self.decided = (SINGLE if single < slots else SLOTS) if single != slots else self.fixed
        return self.decided
