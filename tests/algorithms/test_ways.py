"""``shm``'s choice between the slots and the single copy above 1 MiB (``shm.ways.Way``).

On several ranks: tests/mpi/algorithms/test_shm_ways.py.
"""

import pytest

from pycollective.algorithms.shm import ways as _ways
from pycollective.algorithms.shm.ways import SINGLE, SLOTS, Way


def _run(way, times, calls):
    """The ways of ``calls`` calls, each taking ``times[way]``; when the last trial asks for
    the decision, this rank's times stand for the slowest rank's."""
    taken = []
    for _ in range(calls):
        kind, started = way.next()
        if started and way.took(kind, times[kind]):
            way.decide(way.times())
        taken.append(kind)
    return taken


@pytest.mark.parametrize("fixed", [SLOTS, SINGLE])
@pytest.mark.parametrize("faster", [SLOTS, SINGLE])
def test_first_calls_try_both_ways_then_the_faster_one_stays(fixed, faster):
    times = {faster: 1e-3, 1 - faster: 2e-3}
    way = Way(fixed, chooses=True)
    taken = _run(way, times, 20)
    trials = taken[2:way.LAST_TRIAL]
    # the first call takes the fixed way, the second the other; then they alternate
    assert taken[:2] == [fixed, 1 - fixed]
    assert trials.count(SLOTS) == trials.count(SINGLE) == Way.TRIALS
    assert way.decided == faster
    assert taken[way.LAST_TRIAL:] == [faster] * (20 - way.LAST_TRIAL)
    assert way.calls == way.LAST_TRIAL  # decided calls are not counted or timed


def test_the_slowest_ranks_times_decide_and_a_tie_keeps_the_fixed_way():
    way = Way(SLOTS, chooses=True)
    assert way.decide([5_000, 4_000]) == SINGLE
    way = Way(SINGLE, chooses=True)
    assert way.decide([4_000, 5_000]) == SLOTS
    assert Way(SINGLE, chooses=True).decide([4_000, 4_000]) == SINGLE
    assert Way(SLOTS, chooses=True).decide([4_000, 4_000]) == SLOTS


def test_the_fastest_call_of_each_way_counts():
    """One slow call (a page fault, a preempted rank) does not decide."""
    way = Way(SLOTS, chooses=True)
    seconds = iter([1e-3, 9e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3])
    for _ in range(way.LAST_TRIAL):
        kind, started = way.next()
        if started:
            way.took(kind, next(seconds) * (1 if kind == SINGLE else 1.5))
    assert way.times() == [1_500_000, 1_000_000]


@pytest.mark.parametrize("fixed", [SLOTS, SINGLE])
def test_without_cores_of_their_own_the_fixed_way_and_no_clock(fixed):
    way = Way(fixed, chooses=False)
    for _ in range(30):
        assert way.next() == (fixed, 0.0)


def test_force_way_pins_every_call(monkeypatch):
    monkeypatch.setattr(_ways, "FORCE_WAY", SINGLE)
    way = Way(SLOTS, chooses=True)
    assert [way.next() for _ in range(12)] == [(SINGLE, 0.0)] * 12
    assert way.calls == 0 and way.decided is None


def test_the_first_use_measurement_times_shm_after_its_trials():
    """The probe's untimed calls of shm above 1 MiB cover the ways' trials, so the times
    the model takes are those of the way the calls settle on."""
    from pycollective.collectives import probe
    from pycollective.model.topology import Layout
    own = Layout((2,), True, (2,), 2 << 20)  # a core per rank: the ways are timed
    assert probe.shm_warm(own, 4 << 20) >= Way.LAST_TRIAL


def test_the_first_use_measurement_s_largest_shm_call_takes_the_large_calls_way():
    """Where ranks outnumber cores the probe's largest shm call must take the way of every
    larger call (the single copy), or the model prices large calls by the slots."""
    from pycollective.collectives import probe
    from pycollective.algorithms.shm import allreduce as shm
    assert shm.SINGLE_COPY_BYTES < probe.SHM_SIZES[-1] <= shm.CHOOSE_BYTES
