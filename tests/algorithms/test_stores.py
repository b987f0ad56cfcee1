"""The sliced path's copy-in past the caches, and each rank's choice of stores.

``_mid._stream`` copies with non-temporal stores where the destination is
32-byte aligned and plain ones at the ragged ends; ``shm.stores.Stores``
chooses between it and the plain copy from the times of a rank's calls
(or keeps a fixed kind).  On several ranks: tests/mpi/algorithms/test_shm_mid.py
(``FORCE_STORES``).
"""

import numpy as np
import pytest

from pycollective.algorithms.shm import mid as _mid, stores as _stores
from pycollective.algorithms.shm.stores import Stores


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32, np.float64])
def test_the_streaming_copy_writes_exactly_the_destination(dtype):
    """Every destination offset modulo 32 bytes, every source offset modulo 8, lengths
    around whole blocks: the copied bytes equal the source, the bytes around stay."""
    item = np.dtype(dtype).itemsize
    rng = np.random.default_rng(7)
    for length in (0, 1, 3, 31 // item or 1, 32 // item, 33 // item + 1, 64 // item + 3, 4099):
        for d_off in range(0, 40, item):
            for s_off in range(0, 16, item):
                src_buf = rng.integers(0, 256, (length + 64) * item, dtype=np.uint8)
                dst_buf = rng.integers(0, 256, (length + 80) * item, dtype=np.uint8)
                before = dst_buf.copy()
                src = src_buf[s_off:s_off + length * item].view(dtype)
                dst = dst_buf[d_off:d_off + length * item].view(dtype)
                _mid._stream(dst, src)
                end = d_off + length * item
                assert np.array_equal(dst_buf[d_off:end], src_buf[s_off:s_off + length * item])
                assert np.array_equal(dst_buf[:d_off], before[:d_off])
                assert np.array_equal(dst_buf[end:], before[end:])


def _run(stores, times, calls):
    """What a call does with ``stores`` (``next``, then ``took`` if timed), for ``calls``
    calls, each taking ``times[kind]``; the kinds used, and which calls were timed."""
    kinds, timed = [], []
    for _ in range(calls):
        kind, started = stores.next()
        if started:
            stores.took(kind, times[kind])
            timed.append(stores.calls)
        kinds.append(kind)
    return kinds, timed


def _probe_kinds():
    """The probe's kinds: turns of TURN calls, non-temporal first."""
    return [(c // Stores.TURN + 1) & 1 for c in range(Stores.PROBE)]


def _turns(every, last, start=Stores.PROBE + 1):
    """The other kind's calls after the probe, one turn ending at each multiple of
    ``every`` up to ``last``."""
    return [c for c in range(start, last + 1)
            if (c - Stores.PROBE) % every == 0 or (c - Stores.PROBE) % every > every - Stores.TURN]


def test_the_first_calls_try_both_kinds_in_turns_then_plain_stays_where_it_is_faster():
    stores = Stores()
    kinds, timed = _run(stores, {0: 10e-6, 1: 25e-6}, 200)
    assert kinds[:Stores.PROBE] == _probe_kinds() == [1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0,
                                                      1, 1, 1, 0, 0, 0, 1, 1, 1]
    # a turn's last call is timed (the first after a change meet the other kind's
    # caches), but not the first turn's: a shape's first calls carry one-off costs;
    # three of each kind
    assert timed[:6] == [6, 9, 12, 15, 18, 21]
    assert stores.using == 0
    # after the probe one call in 8 is timed, and one turn in RARELY tries the other
    # kind, clearly slower here (2.5x), counted from the probe's end, its last call timed
    assert timed[6:] == sorted(list(range(24, 201, 8)) + [Stores.PROBE + Stores.RARELY])
    assert [i + 1 for i, k in enumerate(kinds) if k and i >= Stores.PROBE] == \
        _turns(Stores.RARELY, 200)


def test_a_close_other_kind_is_tried_more_often():
    stores = Stores()
    kinds, _ = _run(stores, {0: 10e-6, 1: 11e-6}, 200)
    assert stores.using == 0
    assert [i + 1 for i, k in enumerate(kinds) if k and i >= Stores.PROBE] == \
        _turns(Stores.SAMPLE, 200)


def test_a_rank_moves_to_the_other_kind_when_it_becomes_faster_and_back():
    """A launch's state changes: plain stores become 3x slower than non-temporal ones,
    later faster again; each change is followed within three samples of a kind."""
    stores = Stores()
    _run(stores, {0: 10e-6, 1: 25e-6}, 100)
    assert stores.using == 0
    _run(stores, {0: 90e-6, 1: 30e-6}, 16)  # the stale 25 us beat plain's new 90
    assert stores.using == 1
    _run(stores, {0: 10e-6, 1: 25e-6}, 3 * Stores.RARELY)  # tried rarely: plain was 90
    assert stores.using == 0


def test_a_compiling_first_call_does_not_count():
    """The first call (which compiles: seconds) is outvoted by the next two of its kind."""
    stores = Stores()
    kind, _ = stores.next()
    stores.took(kind, 3.0)  # call 1, non-temporal, compiling
    _run(stores, {0: 10e-6, 1: 3e-6}, Stores.PROBE + 8)
    assert stores.using == 1


def test_a_small_difference_does_not_make_it_switch():
    """Below the margin (``SWITCH``) the kind in use stays: no flapping on noise."""
    stores = Stores()
    _run(stores, {0: 10e-6, 1: 9e-6}, 300)
    assert stores.using == 0


def test_a_rank_whose_waits_sleep_keeps_plain_stores_and_times_nothing():
    stores = Stores(chooses=False)
    kinds, timed = _run(stores, {0: 90e-6, 1: 10e-6}, 300)
    assert set(kinds) == {0} and timed == []


def test_a_rank_whose_waits_sleep_keeps_the_fixed_kind():
    """Where ranks outnumber cores the slot path above 1 MiB fixes non-temporal stores
    from ``shm.STREAM_BYTES``: nothing is timed, so nothing moves it."""
    stores = Stores(chooses=False, fixed=1, every=1)
    kinds, timed = _run(stores, {0: 10e-6, 1: 90e-6}, 300)
    assert set(kinds) == {1} and timed == []


def test_timing_every_call_after_the_probe():
    """``every=1`` (calls above 1 MiB, long beside a clock read): every call is timed
    but the first ones of a turn, the other kind still only one turn in ``SAMPLE``
    calls, and a change is followed."""
    stores = Stores(every=1)
    kinds, timed = _run(stores, {0: 10e-6, 1: 11e-6}, 100)
    other = _turns(Stores.SAMPLE, 100)
    firsts = [c for c in range(Stores.PROBE + 1, 101)
              if 0 < (c - Stores.PROBE) % Stores.SAMPLE < Stores.TURN]
    assert timed == [6, 9, 12, 15, 18, 21] + [c for c in range(Stores.PROBE + 1, 101)
                                     if c not in firsts and (c not in other
                                                             or (c - Stores.PROBE) % Stores.SAMPLE
                                                             == 0)]
    assert stores.using == 0
    assert [i + 1 for i, k in enumerate(kinds) if k and i >= Stores.PROBE] == other
    _run(stores, {0: 50e-6, 1: 11e-6}, 2 * Stores.SAMPLE)
    assert stores.using == 1


def test_a_forced_kind_is_used_and_not_timed(monkeypatch):
    monkeypatch.setattr(_stores, "FORCE_STORES", 1)
    stores = Stores(every=1)
    kinds, timed = _run(stores, {0: 10e-6, 1: 90e-6}, 50)
    assert set(kinds) == {1} and timed == []


def test_a_family_starts_new_shapes_with_the_kind_one_shape_found_clearly_faster(monkeypatch):
    """The machine's state is the launch's: once one Stores of a family has found a kind
    clearly faster, a new one of the family starts with it, without the alternating
    probe, and still samples the other kind (and switches if that turns faster); a
    Stores of no family, or of another, probes as before."""
    monkeypatch.setattr(_stores, "_SETTLED", {})
    slow_plain = {0: 40e-6, 1: 10e-6}  # the slow state: non-temporal clearly faster
    first = Stores(family="f")
    kinds, _ = _run(first, slow_plain, 40)
    assert kinds[:Stores.PROBE] == _probe_kinds() and first.using == 1
    second = Stores(family="f")
    kinds, timed = _run(second, slow_plain, 200)
    # (the probe would have taken plain stores from its fourth call)
    assert kinds[:2 * Stores.TURN] == [1] * (2 * Stores.TURN), "a new shape of the family probed"
    assert 0 in kinds, "the other kind is never sampled"
    assert second.using == 1 and timed and timed[0] == 24  # the first 8th call
    # no family, another family, and a Stores that does not choose: as before
    for other in (Stores(), Stores(family="g")):
        kinds, _ = _run(other, slow_plain, Stores.PROBE)
        assert kinds == _probe_kinds()
    assert Stores(chooses=False, family="f").using == 0
    # the state turns: the family's shape that sees plain clearly faster switches, and
    # new shapes follow it
    fast_plain = {0: 10e-6, 1: 30e-6}
    _run(second, fast_plain, 2000)
    assert second.using == 0
    third = Stores(family="f")
    assert _run(third, fast_plain, 2 * Stores.TURN)[0] == [0] * (2 * Stores.TURN)


def test_the_node_s_first_rank_chooses_and_the_others_take_its_kind():
    """One choice per node: the leading Stores publishes each call's kind in the node's
    word (only when it changes) and is the only one timed; a following one returns that
    word and times nothing, whatever its own calls would say."""
    words = memoryview(np.zeros(16, np.int64))
    leader = Stores(shared=(words, 5, True))
    follower = Stores(shared=(words, 5, False))
    writes = []
    lead, follow, timed = [], [], 0
    for _ in range(300):
        before = words[5]
        kind, started = leader.next()
        writes.append(words[5] != before)
        if started:
            leader.took(kind, {0: 10e-6, 1: 30e-6}[kind])
        f_kind, f_started = follower.next()
        timed += bool(f_started)
        lead.append(kind)
        follow.append(f_kind)
    assert follow == lead and timed == 0 and follower.calls == 0
    assert words[5] == leader.using == 0
    # a write only where the kind changed: the probe's seven turns and the way back (8),
    # and two for each sampled turn (calls 126-128 and 254-256)
    changes = sum(lead[i] != lead[i - 1] for i in range(1, 300)) + (lead[0] != 0)
    assert sum(writes) == changes <= 12, (sum(writes), changes)
    assert all(w == 0 for i, w in enumerate(words) if i != 5), "another word written"
    # a leader that does not choose (its waits sleep) keeps its kind and writes nothing
    quiet = Stores(chooses=False, fixed=1, shared=(words, 6, True))
    assert [quiet.next()[0] for _ in range(20)] == [1] * 20 and words[6] == 0


def test_one_fast_sample_of_the_other_kind_does_not_make_it_switch(monkeypatch):
    """After the probe, a switch needs two samples of the other kind: its first turn
    after the kind in use can meet the slots as that kind left them and come out fast
    (a shape of a settled family has no probed samples of the other kind at all)."""
    monkeypatch.setattr(_stores, "_SETTLED", {"f": 1})
    stores = Stores(family="f")
    samples = iter([3e-6] + [60e-6] * 100)  # plain: one fast sample, then its real time

    def time_of(kind):
        return next(samples) if kind == 0 else 30e-6
    used = set()
    for _ in range(3 * Stores.RARELY):
        kind, started = stores.next()
        if started:
            stores.took(kind, time_of(kind))
        used.add(stores.using)
    assert used == {1}, "one fast sample switched the kind"
    # two fast samples do
    again = Stores(family="f")
    _run(again, {0: 3e-6, 1: 30e-6}, 3 * Stores.RARELY)
    assert again.using == 0
