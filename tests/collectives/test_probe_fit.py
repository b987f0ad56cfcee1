"""The first-use measurement's fit (``collectives.probe._fit``) on measurements of one run.

The measured values are those of a score run at 8 ranks on 2 cores (``benchmarks/auto``,
2026-12-07), where every 64 KiB ``shm`` call of the measurement met a busy scheduler.
"""

import numpy as np

from pycollective.collectives import probe as _probe
from pycollective.model.choice import measured_ratio
from pycollective.model.params import params_for
from pycollective.model.topology import Layout

EIGHT_ON_TWO = {
    "t_small": 2.719e-05, "t_mid": 7.151e-05, "t_large": 0.002877, "g32_in": 3.34e-11,
    "g32_out": 1.96e-10, "g64_in": 3.34e-11, "g64_out": 1.96e-10, "copy": 1.56e-10,
    "copy_far": 0.0, "far_region": 0.0, "barrier": 5.529e-05, "agree": 9.294e-05,
    "inter_small": 0.0, "inter_large": 0.0, "ring_8": 0.0009925, "ring_mid": 0.002489,
    "ring_large": 0.01249, "shm_8": 8.267e-05, "shm_4096": 0.0001032, "shm_65536": 0.001251,
    "shm_262144": 0.0008578, "shm_1048576": 0.001868, "shm_4194304": 0.007317,
    "shm_9437184": 0.01364, "agree_library": 6.584e-05}
LAYOUT = Layout((8,), cores=(2,))


def _priced_times(entry, nranks, layout):
    """shm's time at each measured size as the fitted entry prices it (ratio x cost)."""
    flat = params_for(_probe.load_params_from({"by_nranks": {str(nranks): entry},
                                        **{k: entry[k] for k in ("alpha", "beta", "gamma")}}),
                      nranks, layout)
    out = {}
    for nbytes, ratio in entry["corrections"]["shm"]:
        count = int(nbytes) // 4
        unit = measured_ratio("shm", 1.0, nranks, count, np.dtype(np.float32), flat, 0.0)
        out[int(nbytes)] = ratio / unit
    return out


def test_shm_is_priced_at_each_measured_size_at_most_the_larger_sizes_time():
    entry = _probe._fit(dict(EIGHT_ON_TWO), 8, LAYOUT)
    priced = _priced_times(entry, 8, LAYOUT)
    sizes = sorted(priced)
    assert sizes == list(_probe.SHM_SIZES)
    # the 64 KiB calls (1.25 ms) are held to the 256 KiB ones' 0.86 ms; the rest as measured
    assert np.isclose(priced[65536], EIGHT_ON_TWO["shm_262144"], rtol=1e-9)
    for nbytes in sizes:
        if nbytes != 65536:
            assert np.isclose(priced[nbytes], EIGHT_ON_TWO[f"shm_{nbytes}"], rtol=1e-9), nbytes
    assert all(priced[a] <= priced[b] * (1 + 1e-9) for a, b in zip(sizes, sizes[1:]))


def test_a_size_not_timed_keeps_its_price_from_syncs_and_copies():
    """A zero (not timed) is no time for the sizes below: they keep their own."""
    m = dict(EIGHT_ON_TWO, shm_262144=0.0)
    entry = _probe._fit(m, 8, LAYOUT)
    priced = _priced_times(entry, 8, LAYOUT)
    assert np.isclose(priced[65536], m["shm_65536"], rtol=1e-9)  # only 1 MiB above it now
    assert priced[262144] > 0


# A score run at 2 ranks with a core each (AMD VM, 2026-12-07, run C of
# docs/results/auto-score.md): every 256 KiB shm call of the measurement took as long
# as the 1 MiB ones (163 against 170 us; 58 against 163 in the run before).
TWO_OWN_CORES = {
    "t_small": 5.001e-06, "t_mid": 2.13e-05, "t_large": 0.0005887, "g32_in": 6.284e-11,
    "g32_out": 1.138e-10, "g64_in": 6.284e-11, "g64_out": 1.138e-10, "copy": 9.923e-11,
    "copy_far": 1.595e-10, "far_region": 6.711e+07, "barrier": 5.415e-06, "agree": 6.892e-06,
    "inter_small": 0, "inter_large": 0, "ring_8": 9.667e-05, "ring_mid": 0.0001472,
    "ring_large": 0.001199, "shm_8": 8.025e-06, "shm_4096": 8.185e-06, "shm_65536": 1.84e-05,
    "shm_262144": 0.0001631, "shm_1048576": 0.0001698, "shm_4194304": 0.001188,
    "shm_9437184": 0.002674, "agree_library": 1.169e-05}


def test_with_a_core_per_rank_shm_above_64_kib_is_held_per_byte_to_the_next_size():
    layout = Layout((2,), cores=(2,))
    entry = _probe._fit(dict(TWO_OWN_CORES), 2, layout)
    priced = _priced_times(entry, 2, layout)
    m, hold = TWO_OWN_CORES, _probe.PER_BYTE_HOLD
    want = m["shm_8"] + (m["shm_1048576"] - m["shm_8"]) * 262144 / 1048576 * hold
    assert np.isclose(priced[262144], want, rtol=1e-9) and want < 0.5 * m["shm_262144"]
    for nbytes in _probe.SHM_SIZES:  # the rest as measured: their time per byte is in bounds
        if nbytes != 262144:
            assert np.isclose(priced[nbytes], m[f"shm_{nbytes}"], rtol=1e-9), nbytes
    # ranks sharing cores: their calls' times are the scheduler's, not held per byte
    shared = Layout((2,), cores=(1,))
    priced = _priced_times(_probe._fit(dict(TWO_OWN_CORES), 2, shared), 2, shared)
    assert np.isclose(priced[262144], m["shm_262144"], rtol=1e-9)
