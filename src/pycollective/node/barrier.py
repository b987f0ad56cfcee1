"""A barrier through counters in shared memory (:class:`FlagBarrier`), and how ranks wait on it.

The counters live in a node's control segment (see :mod:`~pycollective.node.group`); raising
one and waiting for the others is :mod:`~pycollective.node.atomics`' work, from Python and
from compiled steps.  :func:`wait_modes` decides, once per node, whether
waiting ranks spin or sleep.
"""

import os

import numba

from ..runtime import env as _env, watch as _watch
from .atomics import (CALL_WORD, CAN_SLEEP, STRIDE, call_word, fence, poll_counters,
                      raise_counter_at, raise_own, set_budget, wait_counters, wait_own)
from .._errors import ConfigurationError

__all__ = ["FlagBarrier", "wait_modes", "opening_sync", "ARRIVED", "WORDS_DIFFER", "SLEEP_SPINS",
           "FIRST_SLEEP_NS", "LONGEST_SLEEP_NS"]

# Waiting where ranks outnumber cores (FlagBarrier): checks of a counter before
# sleeping on it, the first sleep's bound and the longest (measured: see
# docs/results/waits.md).
SLEEP_SPINS = 256
FIRST_SLEEP_NS = 200_000
LONGEST_SLEEP_NS = 10_000_000

# opening_sync's verdicts (a rank number >= 0: that rank had not arrived yet), and its
# polling passes before it hands a wait back to Python (as shm's compiled step).
ARRIVED, WORDS_DIFFER = -1, -2
POLL_PASSES = 1 << 16


class FlagBarrier:
    """A barrier through counters in shared memory, one cache line per rank.

    ``sync(target)`` stores this rank's data (a full fence first), raises its
    counter to ``target`` (:func:`~pycollective.node.atomics.raise_counter`,
    which also wakes ranks asleep on it), waits until every other counter
    has reached it, and fences again before the caller loads what the others
    stored.  A few cache-line transfers instead of an MPI_Barrier's
    messages, which is most of a small allreduce.  Targets only grow.
    Without a target the barrier counts its own syncs.

    How a rank waits depends on ``sleep``.  With a core of its own it spins
    and yields the core now and then; where the node's ranks outnumber the
    cores, the rank it waits for is often not running at all, so it yields
    the core at every check, and after a few hundred checks it sleeps in the
    kernel until that rank's counter moves
    (:func:`~pycollective.node.atomics.wait_counters`), and the core goes to a
    rank with work to do.  Sleeps are bounded (:data:`FIRST_SLEEP_NS`,
    doubling up to :data:`LONGEST_SLEEP_NS`), and between them the rank
    acts on its deadline and side channel (:class:`_watch.Waiter`: a stalled
    peer raises a timeout naming it) and calls into MPI (``Iprobe`` on
    ``progress``, which matches nothing we would take): a rank that has
    finished an algorithm on point-to-point messages may still owe its
    partner the last step of a transfer (MPICH completes a large send only
    when the receiver's progress engine acknowledges it), and a rank waiting
    here without entering MPI would leave that partner waiting for ever
    while the partner is what this rank waits for.

    Args:
        flags: int64 array with ``size * STRIDE`` words in shared memory (zeroed).
        rank, size: this rank and the number of ranks.
        progress: an MPI communicator to ``Iprobe`` on (or None).
        sleep: sleep while waiting (ranks outnumber cores) instead of spinning.
        wakes: some rank of the node may sleep, so raising a counter must
            look for sleepers (default: ``sleep``); the same on every rank.

    Attributes:
        budget: ``(spins, yield_mask, sleep_ns, sleeps)``: how long
            ``wait_counters`` waits before it hands the wait back to
            Python; kept beside this rank's counter for compiled steps
            (``node.atomics.set_budget``), with ``wakes``.
    """

    def __init__(self, flags, rank, size, progress=None, sleep=False, wakes=None):
        self.rank, self.size, self.progress = rank, size, progress
        self.words = flags  # every counter, for compiled code: rank q's at q * STRIDE
        self._counter = flags.ctypes.data + 8 * STRIDE * rank  # this rank's, by address
        self._flags = [flags[q * STRIDE:q * STRIDE + 1] for q in range(size)]
        self._others = [f for q, f in enumerate(self._flags) if q != rank]
        self._seq = 0
        self.set_sleep(sleep, wakes)

    def set_sleep(self, sleep, wakes=None):
        """Sleep while waiting (where the system can), or spin; returns the previous choice.

        ``wakes`` (default: ``sleep``) must be true on every rank where any
        rank may sleep: a rank whose raises do not look for sleepers leaves
        them asleep until their sleep's bound.  So every rank switches
        together, at a point where no rank waits (``bench latency``'s pieces
        and ``bench breakdown --waits`` switch right after the Barrier that
        starts a sample); ranks that mix the two modes pass ``wakes=True``.
        """
        previous = getattr(self, "sleep", False)
        self.sleep = bool(sleep) and CAN_SLEEP
        self.wakes = CAN_SLEEP and bool(self.sleep if wakes is None else wakes)
        # Compiled waits, before Python takes over: spinning, 2^14 checks
        # with a yield every 64 (about a millisecond); sleeping, a yield at
        # every check (the rank awaited is most often waiting for this core)
        # for SLEEP_SPINS checks, then one bounded sleep per rank still
        # awaited, and two more.
        self.budget = ((SLEEP_SPINS, 0, FIRST_SLEEP_NS, self.size + 2) if self.sleep
                       else (1 << 14, 63, 0, 0))
        set_budget(self.words, self.rank, *self.budget, self.wakes)
        return previous

    def sync(self, target=None):
        if target is None:
            target = self._seq = self._seq + 1
        raise_counter_at(self._counter, target, self.wakes)  # an address: cheapest from Python
        self.wait(target)

    def wait(self, target):
        """Wait (bounded) until every other counter has reached ``target``; fence after."""
        if self.sleep:
            self._sleep_until(target)
            return
        spins, waiter = 0, None
        for flag in self._others:
            while flag[0] < target:
                spins += 1
                if spins & 15 == 0:
                    if self.progress is not None:
                        self.progress.Iprobe()  # MPI progress for sends still in flight
                    if spins > 64:
                        if waiter is None:
                            waiter = _watch.Waiter("the other ranks of this node")
                        waiter.pause()
        fence()

    def _sleep_until(self, target):
        words, rank, size = self.words, self.rank, self.size
        spins, every, sleep_ns, sleeps = self.budget
        if wait_counters(words, rank, size, target, spins, every, sleep_ns, sleeps) < 0:
            return
        waiter = _watch.Waiter("the other ranks of this node")
        while True:
            if self.progress is not None:
                self.progress.Iprobe()  # MPI progress for sends still in flight
            waiter.pause()
            sleep_ns = min(2 * sleep_ns, LONGEST_SLEEP_NS)
            if wait_counters(words, rank, size, target, spins, every, sleep_ns, 1) < 0:
                return

    def withdraw(self, target):
        """Take back this rank's arrival at ``target`` after its wait failed.

        A rank that arrives after the others gave up would otherwise find every
        counter raised and pass, as if the call had worked.  Any value below the
        target will do: the others never wait on this rank for less than the
        targets of the call before.
        """
        self.words[self.rank * STRIDE] = target - 1
        fence()

    def late(self, target):
        """Ranks whose counter is below ``target`` (for messages)."""
        return [q for q, f in enumerate(self._flags) if f[0] < target]


@numba.njit(cache=True, nogil=True)
def opening_sync(words, rank, size, target, headers, number, fingerprint, dedicated):
    """The first sync of a call numbered ``number``, with its header, in one compiled call.

    Writes this rank's header (``number``, then the ``fingerprint`` words) into
    ``headers`` and its call word beside its counter (``node.atomics.call_word``),
    raises the counter to ``target`` and waits: polling with a pause where every
    rank has a core (``dedicated``), else within the budget kept beside the
    counter (``node.atomics.wait_own``).  Returns :data:`ARRIVED` when every rank
    arrived with the same call word (one line per peer read),
    :data:`WORDS_DIFFER` when they arrived with different ones (the caller
    compares the headers: a rank on a path that writes no call word, or another
    call), else the rank still awaited: the caller waits on with the deadline
    (:meth:`FlagBarrier.wait`), then compares the headers itself.
    """
    headers[rank, 0] = number
    for j in range(fingerprint.shape[0]):
        headers[rank, 1 + j] = fingerprint[j]
    words[rank * STRIDE + CALL_WORD] = call_word(number, fingerprint[:0], fingerprint)
    raise_own(words, rank, target)
    if dedicated:
        late = poll_counters(words, rank, size, target, POLL_PASSES)
    else:
        late = wait_own(words, rank, size, target)
    if late >= 0:
        return late
    mine = words[rank * STRIDE + CALL_WORD]
    for q in range(size):
        if words[q * STRIDE + CALL_WORD] != mine:
            return WORDS_DIFFER
    return ARRIVED


def wait_modes(comm):
    """``(sleep, wakes)``: whether this rank's node waits sleep, and whether any rank's do.

    Collective over the node's ``comm``.  ``PYCOLLECTIVE_SHM_WAIT``:
    ``sleep``, ``spin``, or ``auto``: sleep where the node's ranks outnumber
    the CPUs they may run on together (the union of their affinity masks, so
    ranks bound one to a core still spin).  Ranks may choose differently
    (then ``wakes`` is true on all); a bad value on any rank raises the same
    ConfigurationError on every rank.
    """
    try:
        mode, error = _env.SHM_WAIT.get(), None
    except ValueError as exc:
        mode, error = None, str(exc)
    try:
        cpus = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = set(range(os.cpu_count() or 1))
    seen = comm.allgather((cpus, mode, error))
    for q, (_, _, bad) in enumerate(seen):
        if bad is not None:
            raise ConfigurationError(f"node rank {q}: {bad}")
    crowded = comm.Get_size() > len(set().union(*(c for c, _, _ in seen)))
    sleeps = [m == "sleep" or (m == "auto" and crowded) for _, m, _ in seen]
    return sleeps[comm.Get_rank()], any(sleeps)
