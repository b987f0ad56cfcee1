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


def test_the_first_calls_try_both_kinds_then_plain_stays_where_it_is_faster():
    stores = Stores()
    kinds, timed = _run(stores, {0: 10e-6, 1: 25e-6}, 200)
    assert kinds[:Stores.PROBE] == [1, 0] * (Stores.PROBE // 2)
    assert timed[:Stores.PROBE] == list(range(1, Stores.PROBE + 1))
    assert stores.using == 0
    # after the probe one call in 8 is timed, and one in RARELY tries the other kind,
    # clearly slower here (2.5x)
    assert timed[Stores.PROBE:] == list(range(16, 201, 8))
    assert [i + 1 for i, k in enumerate(kinds) if k and i >= Stores.PROBE] == \
        list(range(Stores.RARELY, 201, Stores.RARELY))


def test_a_close_other_kind_is_tried_more_often():
    stores = Stores()
    kinds, _ = _run(stores, {0: 10e-6, 1: 11e-6}, 200)
    assert stores.using == 0
    assert [i + 1 for i, k in enumerate(kinds) if k and i >= Stores.PROBE] == \
        list(range(Stores.SAMPLE, 201, Stores.SAMPLE))


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
    """``every=1`` (calls above 1 MiB, long beside a clock read): every call is timed,
    the other kind still only one call in ``SAMPLE``, and a change is followed."""
    stores = Stores(every=1)
    kinds, timed = _run(stores, {0: 10e-6, 1: 11e-6}, 100)
    assert timed == list(range(1, 101)) and stores.using == 0
    assert [i + 1 for i, k in enumerate(kinds) if k and i >= Stores.PROBE] == \
        list(range(Stores.SAMPLE, 101, Stores.SAMPLE))
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
    assert kinds[:Stores.PROBE] == [1, 0] * (Stores.PROBE // 2) and first.using == 1
    second = Stores(family="f")
    kinds, timed = _run(second, slow_plain, 200)
    assert kinds[:Stores.PROBE] == [1] * Stores.PROBE, "a new shape of the family probed"
    assert 0 in kinds, "the other kind is never sampled"
    assert second.using == 1 and timed and timed[0] == Stores.PROBE + 8
    # no family, another family, and a Stores that does not choose: as before
    for other in (Stores(), Stores(family="g")):
        kinds, _ = _run(other, slow_plain, Stores.PROBE)
        assert kinds == [1, 0] * (Stores.PROBE // 2)
    assert Stores(chooses=False, family="f").using == 0
    # the state turns: the family's shape that sees plain clearly faster switches, and
    # new shapes follow it
    fast_plain = {0: 10e-6, 1: 30e-6}
    _run(second, fast_plain, 2000)
    assert second.using == 0
    third = Stores(family="f")
    assert _run(third, fast_plain, Stores.PROBE)[0] == [0] * Stores.PROBE
