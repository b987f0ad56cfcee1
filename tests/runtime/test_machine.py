"""What the machine says about itself (pycollective.runtime.machine), and what the
first-use measurement sizes by it (collectives.probe.far_bytes)."""

import pytest

from pycollective.collectives import probe
from pycollective.runtime import machine


def _sysfs(tmp_path, caches):
    base = tmp_path / "cache"
    for k, (level, size) in enumerate(caches):
        entry = base / f"index{k}"
        entry.mkdir(parents=True)
        (entry / "level").write_text(f"{level}\n")
        (entry / "size").write_text(f"{size}\n")
    return base


@pytest.mark.parametrize("caches, level, expected", [
    ([(1, "48K"), (1, "32K"), (2, "2048K"), (3, "491520K")], 3, 491520 << 10),
    ([(1, "48K"), (2, "2048K"), (3, "32M")], 2, 2 << 20),
    ([(1, "48K"), (2, "1M")], 3, 0),          # no shared cache listed
    ([(2, "")], 2, 0),                        # an empty size
    ([(3, "1.5G")], 3, 3 << 29),
])
def test_cache_bytes_reads_the_level_sysfs_lists(tmp_path, monkeypatch, caches, level,
                                                  expected):
    base = _sysfs(tmp_path, caches)
    real = machine.os.listdir
    monkeypatch.setattr(machine.os, "listdir",
                        lambda path: real(base) if path.endswith("/cache") else real(path))
    opened = open

    def fake_open(path, *args, **kwargs):
        prefix = "/sys/devices/system/cpu/cpu0/cache"
        if str(path).startswith(prefix):
            path = str(base) + str(path)[len(prefix):]
        return opened(path, *args, **kwargs)
    monkeypatch.setattr("builtins.open", fake_open)
    assert machine.cache_bytes(level) == expected


def test_cpu_model_names_something():
    assert isinstance(machine.cpu_model(), str) and machine.cpu_model()


@pytest.mark.parametrize("ranks, cache, expected", [
    (2, 0, 64 << 20),            # 256 MiB over 2 ranks: capped at 64 MiB each
    (16, 0, 16 << 20),           # 256 MiB over 16
    (64, 0, 16 << 20),           # never below 16 MiB each
    (16, 300 << 20, 37.5 * (1 << 20)),  # twice a 300 MiB shared cache over 16 ranks
    (4, 2 << 30, 64 << 20),      # a huge cache: still at most 64 MiB each
])
def test_the_far_region_outgrows_the_shared_cache_within_bounds(ranks, cache, expected):
    assert probe.far_bytes(ranks, cache) == int(expected)
    # the beta curve's far point lies past the near copy's blocks (probe._fit relies on it)
    assert probe.far_bytes(ranks, cache) >= probe.FAR_MIN > probe.KERNEL_OUT
