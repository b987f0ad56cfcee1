"""Whether the MPI library takes device pointers: decided once per communicator, agreed.

1. ``PYCOLLECTIVE_GPU_AWARE`` = ``0`` or ``1`` is the user's word and wins
   (``auto``, the default, asks the library).
2. Else MPI 4.1's ``mpi_memory_alloc_kinds`` info of ``MPI.COMM_WORLD``: a
   ``cuda`` kind (``cuda``, ``cuda:device``, ...) means the library was
   built to take CUDA pointers (a ``rocm`` kind likewise for ROCm).
3. Else it does not (the MPI wheels on PyPI, MPICH's and Open MPI's, list
   only ``mpi,system``).

A rank whose own answer is "no" never hands a device pointer to MPI and
needs nobody's consent: it stages, with no message.  A rank whose answer is
"yes" hands device pointers to MPI only if every rank said yes: the ranks
agree once per communicator, with one MIN reduction on the communicator's
private duplicate, bounded by pycollective's timeout (a rank answering
"no" does not join, so a job whose ranks answer differently gets a timeout
naming this setting rather than a crash).
"""

import threading

import numpy as np
from mpi4py import MPI

from ..runtime import env as _env
from ..runtime.context import Key, get_context
from ..runtime.watch import waitall

SETTING = "PYCOLLECTIVE_GPU_AWARE"
_AGREED = Key("gpu-aware")
_local = None
_lock = threading.Lock()


def library_name() -> str:
    try:
        return MPI.Get_library_version().strip().splitlines()[0].strip()
    except Exception:  # noqa: BLE001  (only used in messages)
        return "the MPI library"


def memory_kinds() -> str:
    """``mpi_memory_alloc_kinds`` of ``MPI.COMM_WORLD`` ("" where MPI has no such info)."""
    try:
        info = MPI.COMM_WORLD.Get_info()
    except MPI.Exception:
        return ""
    try:
        return info.Get("mpi_memory_alloc_kinds") or ""
    finally:
        info.Free()


def local_decision():
    """``(takes device pointers, why)`` as this rank sees it (cached: once per process)."""
    global _local
    with _lock:
        if _local is None:
            _local = _decide(_env.GPU_AWARE.get())
        return _local


def _decide(value):
    if value == "0":
        return False, f"{SETTING}=0"
    if value == "1":
        return True, f"{SETTING}=1"
    kinds = memory_kinds()
    names = {k.split(":", 1)[0].strip() for k in kinds.split(",") if k.strip()}
    why = f"{SETTING}=auto and mpi_memory_alloc_kinds={kinds or 'not reported'!r}"
    return bool(names & {"cuda", "rocm"}), why


def forget():
    """Forget the cached local decision (tests change the setting)."""
    global _local
    with _lock:
        _local = None


def gpu_aware(comm) -> bool:
    """True when every rank of ``comm`` says the MPI library takes device pointers."""
    yes, _ = local_decision()
    if not yes:
        return False
    ctx = get_context(MPI.Intracomm(comm))

    def agree(ctx):
        out = np.zeros(1, np.int32)
        request = ctx.comm.Iallreduce(np.ones(1, np.int32), out, MPI.MIN)
        waitall([request], waiting_for=f"every rank to agree whether MPI takes device pointers "
                f"({SETTING}, mpi_memory_alloc_kinds; a rank that says no does not join)")
        return bool(out[0] == 1)
    return ctx.cached(_AGREED, agree)


def setting() -> str:
    """The setting as decided, for messages."""
    return local_decision()[1]
