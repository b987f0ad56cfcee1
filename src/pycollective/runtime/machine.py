"""What the machine a process runs on says about itself: its processor's name and caches.

Read from the system where it says (``/proc/cpuinfo``, sysfs); the callers take an
empty name or 0 bytes as "not known".  Layouts (:mod:`pycollective.collectives.auto`)
keep a core's private cache; the first-use measurement (:mod:`pycollective.collectives.probe`)
keys its saved parameters by the processor and sizes its copy out of the caches by the
shared one.
"""

import os
import platform

__all__ = ["cpu_model", "cache_bytes"]


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``), else what ``platform`` says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_bytes(level: int) -> int:
    """The size of CPU 0's cache of ``level`` (2: a core's own, 3: the shared one, as sysfs
    lists them), in bytes; 0 when the system does not say.  Where a virtual machine reports
    its host's cache, that is what this says (more than its processes may hold)."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = os.listdir(base)
    except OSError:
        return 0
    for entry in sorted(entries):
        try:
            with open(f"{base}/{entry}/level") as f:
                found = int(f.read())
            with open(f"{base}/{entry}/size") as f:
                text = f.read().strip().upper()
        except (OSError, ValueError):
            continue
        if found == level and text:
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
            try:
                return int(float(text.rstrip("KMG")) * scale)
            except ValueError:
                return 0
    return 0
