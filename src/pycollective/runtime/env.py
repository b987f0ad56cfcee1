"""Environment settings: one home for every ``PYCOLLECTIVE_*`` variable.

Each setting is read when it is used, not when ``pycollective`` is imported,
so a bad value cannot break ``import pycollective``: it raises a
``ValueError`` naming the variable and the rule at the call that needs it.
A value is parsed once per distinct text (the variable can change between
calls, e.g. in tests, and the next read sees the change).

The list of settings is data (:data:`SETTINGS`), so the documentation and
``python -m pycollective.bench --env`` can print all of them.
"""

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional

__all__ = ["Setting", "SETTINGS", "parse_bool", "parse_positive_int", "parse_seconds",
           "parse_auto"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def parse_bool(text: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (any case)."""
    t = text.strip().lower()
    if t in _TRUE:
        return True
    if t in _FALSE:
        return False
    raise ValueError("expected one of 1, true, yes, on, 0, false, no, off")


def parse_positive_int(text: str) -> int:
    """A whole number above zero (``1e6`` allowed)."""
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError("expected a positive whole number") from None
    if not value >= 1 or value != int(value):
        raise ValueError("expected a positive whole number")
    return int(value)


def parse_seconds(text: str) -> Optional[float]:
    """Seconds as a positive number; ``0``, ``off`` or ``none`` mean no limit (None)."""
    t = text.strip().lower()
    if t in ("0", "off", "none", "inf"):
        return None
    try:
        value = float(t)
    except ValueError:
        raise ValueError("expected seconds (a positive number), or 0/off for no limit") from None
    if not value > 0 or value != value:
        raise ValueError("expected seconds (a positive number), or 0/off for no limit")
    return value


def parse_auto(text: str) -> str:
    """``tune``, ``model``, or the path of a decisions file (``~`` expanded)."""
    t = text.strip()
    if t.lower() in ("tune", "model"):
        return t.lower()
    return os.path.expanduser(t)


@dataclass
class Setting:
    """One environment variable: its name, how to parse it, its default, what it does."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    doc: str
    _parsed: Dict[str, Any] = field(default_factory=dict, repr=False)

    def get(self) -> Any:
        """The current value: the default when unset or empty, else the parsed text.

        Raises:
            ValueError: ``NAME='text': rule`` for a value that does not parse.
        """
        text = os.environ.get(self.name)
        if text is None or not text.strip():
            return self.default
        try:
            return self._parsed[text]
        except KeyError:
            pass
        try:
            value = self.parse(text)
        except ValueError as exc:
            raise ValueError(f"{self.name}={text!r}: {exc}") from None
        if len(self._parsed) > 16:
            self._parsed.clear()
        self._parsed[text] = value
        return value


SETTINGS: Dict[str, Setting] = {}


def _setting(name, parse, default, doc):
    SETTINGS[name] = s = Setting(name, parse, default, doc)
    return s


CHECK = _setting(
    "PYCOLLECTIVE_CHECK", parse_bool, True,
    "cross-rank agreement on every call (default on); pycollective.set_check overrides it")
MODEL = _setting(
    "PYCOLLECTIVE_MODEL", os.path.expanduser, None,
    "calibration file of the cost model (default ~/.cache/pycollective/model.json)")
AUTO = _setting(
    "PYCOLLECTIVE_AUTO", parse_auto, "tune",
    "how algorithm='auto' decides: tune (the first calls of each size class time the "
    "model's best 3 or 4 and keep the fastest), model (the model's choice, nothing timed), "
    "or a file: tune, keep the decisions in that JSON file and follow those it holds; "
    "rank 0's value counts")
MEASURE = _setting(
    "PYCOLLECTIVE_MEASURE", parse_bool, True,
    "without a calibration file, measure this machine's alpha, beta, gamma, memory speed and "
    "sync cost, and time the library's ring and shm calls, on the first automatic choice "
    "(well under a second) and keep them in "
    "~/.cache/pycollective/machines/ for later jobs (default on; 0: the built-in defaults)")
SEGMENT_BYTES = _setting(
    "PYCOLLECTIVE_SEGMENT_BYTES", parse_positive_int, 1 << 20,
    "segment size of ring_pipelined in bytes (default 1 MiB); must match on all ranks")
SHM_CMA = _setting(
    "PYCOLLECTIVE_SHM_CMA", parse_bool, True,
    "let shm read peers' buffers with process_vm_readv above 4 MiB (default on)")
TIMEOUT_S = _setting(
    "PYCOLLECTIVE_TIMEOUT_S", parse_seconds, 300.0,
    "longest wait without progress inside a collective before it raises CollectiveTimeout "
    "(seconds; 0 or off: no limit); pycollective.set_timeout overrides it")
STALL_WARN_S = _setting(
    "PYCOLLECTIVE_STALL_WARN_S", parse_seconds, 60.0,
    "after this many seconds of one wait, warn (StallWarning) naming the late ranks "
    "(0 or off: no warning)")
def _parse_wait(text: str) -> str:
    t = text.strip().lower()
    if t not in ("auto", "spin", "sleep"):
        raise ValueError("expected auto, spin or sleep")
    return t


SHM_WAIT = _setting(
    "PYCOLLECTIVE_SHM_WAIT", _parse_wait, "auto",
    "how a rank waits for the others of its node: spin (yielding the core now and then), "
    "sleep (yield a few hundred times, then sleep in futex(2) until woken), or auto (sleep "
    "where the node's ranks outnumber the cores they may run on; the default)")
RANKS_PER_NODE = _setting(
    "PYCOLLECTIVE_RANKS_PER_NODE", str.strip, "",
    "emulated node layout for hierarchical: k ranks per node, or sizes like 2,4")


def _parse_gpu_aware(text: str) -> str:
    t = text.strip().lower()
    if t in _TRUE:
        return "1"
    if t in _FALSE:
        return "0"
    if t == "auto":
        return "auto"
    raise ValueError("expected 0, 1 or auto")


GPU_AWARE = _setting(
    "PYCOLLECTIVE_GPU_AWARE", _parse_gpu_aware, "auto",
    "whether the MPI library takes device (CUDA, ROCm) pointers: 1 yes, 0 no (device buffers "
    "are staged through pinned host memory), auto: yes only if MPI_COMM_WORLD's "
    "mpi_memory_alloc_kinds lists a cuda or rocm kind; agreed across ranks (docs/gpu.md)")
GPU_CHUNK_BYTES = _setting(
    "PYCOLLECTIVE_GPU_CHUNK_BYTES", parse_positive_int, 8 << 20,
    "chunk of a staged allreduce of device memory, in bytes (default 8 MiB); the copies of "
    "one chunk overlap the host reduction of the next")
GPU_POOL_BYTES = _setting(
    "PYCOLLECTIVE_GPU_POOL_BYTES", parse_positive_int, 1 << 30,
    "idle pinned host memory kept for staging device buffers, in bytes (default 1 GiB)")

TIMELINE = _setting(
    "PYCOLLECTIVE_TIMELINE", os.path.expanduser, "",
    "record every collective of the job into this Chrome trace file, written by rank 0 at "
    "the end (docs/timeline.md); default: no recording")
TIMELINE_CALLS = _setting(
    "PYCOLLECTIVE_TIMELINE_CALLS", parse_positive_int, 100_000,
    "calls the timeline keeps per thread, the oldest dropped first (default 100000)")
