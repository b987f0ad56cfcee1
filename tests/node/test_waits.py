"""The counters every node synchronisation waits on (pycollective.node.atomics), across processes.

Forked processes share an anonymous mapping, as the ranks of a node share
their control segment.  A lost wake-up would leave a waiter asleep until
its timeout, so the rounds below use sleeps far longer than a round takes
and fail if any round waits that long; the sleeps are bounded, so even a
lost wake-up could not hang the test.
"""

import mmap
import os
import time

import numpy as np
import pytest

from pycollective.node.atomics import CAN_SLEEP, STRIDE, raise_counter, wait_counters

pytestmark = pytest.mark.skipif(not CAN_SLEEP, reason="futex(2) waits are Linux-only")

LONG_NS = 500_000_000     # a sleep no round may need: only a lost wake-up would take it
SLEEPS = 4                # then the wait gives up (a broken protocol fails, never hangs)


def _counters(nprocs):
    """int64 words in a mapping that forked children share (counters, then results)."""
    words = np.frombuffer(mmap.mmap(-1, 4096), np.int64)  # unmapped with the last view
    assert nprocs * STRIDE + nprocs <= words.size
    return words


def _barrier_rounds(words, rank, nprocs, rounds, spins):
    """``rounds`` barriers; the longest in seconds (stops after the first one that slept)."""
    longest = 0.0
    for target in range(1, rounds + 1):
        t0 = time.monotonic()
        raise_counter(words, rank, target, True)
        late = wait_counters(words, rank, nprocs, target, spins, 63, LONG_NS, SLEEPS)
        longest = max(longest, time.monotonic() - t0)
        if late != -1 or longest > LONG_NS / 2e9:
            break
    return longest


def _run_forked(nprocs, body):
    """``body(rank)`` in nprocs - 1 children and here (rank 0); children's exit codes."""
    pids = []
    for rank in range(1, nprocs):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 1
            try:
                code = body(rank)
            finally:
                os._exit(code)
        pids.append(pid)
    try:
        mine = body(0)
    finally:
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    return mine, codes


@pytest.mark.parametrize("nprocs, spins", [(2, 0), (3, 0), (4, 0), (3, 64)])
def test_sleeping_barrier_loses_no_wake_up(nprocs, spins):
    """Thousands of barriers where every wait goes to sleep at once: none waits out its sleep."""
    words = _counters(nprocs)
    results = nprocs * STRIDE
    wait_counters(words, 0, 1, 0, 0, 63, 0, 0)  # compile before forking
    raise_counter(words, 0, 0, True)

    def body(rank):
        longest = _barrier_rounds(words, rank, nprocs, 2000, spins)
        words[results + rank] = int(longest * 1e6)
        return 0

    _, codes = _run_forked(nprocs, body)
    assert codes == [0] * (nprocs - 1)
    longest_us = words[results:results + nprocs]
    assert longest_us.max() < LONG_NS / 2e3, f"a round slept: {longest_us} us"
    # every sleeper took itself off the count again
    assert [int(words[q * STRIDE + 1]) for q in range(nprocs)] == [0] * nprocs


def test_spinners_and_sleepers_mix():
    """One process spins, the other sleeps: the spinner's raise still wakes the sleeper."""
    words = _counters(2)
    wait_counters(words, 0, 1, 0, 0, 63, 0, 0)
    raise_counter(words, 0, 0, True)

    def body(rank):
        spins = 1 << 30 if rank == 0 else 0
        for target in range(1, 1001):
            raise_counter(words, rank, target, True)
            t0 = time.monotonic()
            if wait_counters(words, rank, 2, target, spins, 63, LONG_NS, SLEEPS) != -1:
                return 2
            if time.monotonic() - t0 > LONG_NS / 2e9:
                return 3
        return 0

    mine, codes = _run_forked(2, body)
    assert mine == 0 and codes == [0]


def test_a_wait_nobody_ends_comes_back_after_its_sleeps():
    """Nobody raises: the wait returns the awaited rank after its bounded sleeps."""
    words = _counters(3)
    t0 = time.monotonic()
    assert wait_counters(words, 0, 3, 5, 10, 0, 20_000_000, 3) == 1
    took = time.monotonic() - t0
    assert 0.04 < took < 1.0  # three sleeps of at most 20 ms (the first two may end early)
    assert words[1 * STRIDE + 1] == 0  # no longer counted as asleep


def test_a_spinning_wait_gives_up_after_its_checks():
    words = _counters(2)
    words[1 * STRIDE] = 7
    assert wait_counters(words, 0, 2, 8, 1000, 63, 0, 0) == 1
    assert wait_counters(words, 0, 2, 7, 1000, 63, 0, 0) == -1
    raise_counter(words, 0, 9, True)
    assert words[0] == 9 and words[1] == 0
