"""Which thread a call comes from: ranks pair a communicator's calls by the calling thread's name.

The calls on one communicator are serialised on each rank by its lock, but
the lock does not make the ranks agree on WHICH thread's call comes next:
with two threads reducing their own values, rank 0 can run thread A's call
while rank 1 runs thread B's, and both would return a sum of A's and B's
data, silently wrong.  No rank can tell locally that another thread is about
to use the communicator (the very first calls already race), so every call
carries the name of its thread, hashed, in three places:

* its fingerprint (the side channel's comparison and the shared-memory
  headers, which the ranks compare before reading each other's data),
* the agreement facts (:data:`LABEL`), compared before any data moves, and
* its message tags (:func:`tag_bits`), so that with the agreement off the
  point-to-point algorithms' messages of two threads never match; a slow
  wait then compares the fingerprints and names the threads.

A pairing of two threads' calls is therefore refused on every rank with a
:class:`~pycollective.CollectiveMismatch` that names both threads; calls of
the same name pair as before.  Threads that take turns work when every rank
gives them the same names; threads that really overlap fail fast instead of
mixing data (give each its own ``comm.Dup()``).  Python names unnamed
threads ``Thread-N`` in creation order, which is the same on every rank of a
program that starts the same threads in the same order.

:func:`pairing` sets the name for code that runs calls on behalf of
something else (the DDP hook, which DDP may call from any autograd thread).
"""

import contextlib
import hashlib
import threading
from typing import Dict

__all__ = ["LABEL", "code", "pairing", "describe", "tag_bits", "hint", "seen_hint"]

#: The agreement fact's label.
LABEL = "the calling thread's name"

_local = threading.local()
_codes: Dict[str, int] = {}   # name -> code, cached (a hash costs a microsecond)
_names: Dict[int, str] = {}   # code -> name, for messages


def _hash(name: str) -> int:
    digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    # 62 bits: the agreement negates each fact, and every value must stay in int64.
    return int.from_bytes(digest, "little") >> 2


def _of(name: str) -> int:
    found = _codes.get(name)
    if found is None:
        found = _hash(name)
        _names[found] = name
        _codes[name] = found
    return found


def code() -> int:
    """The calling thread's pairing code: a hash of its name (or of :func:`pairing`'s).

    Kept per thread from its first call (reading the name costs a quarter of a
    microsecond, a tenth of a repeated small call): a thread renamed after it
    first called keeps pairing under its first name.
    """
    try:
        return _local.code
    except AttributeError:
        _local.code = _of(threading.current_thread().name)
        return _local.code


@contextlib.contextmanager
def pairing(name: str):
    """Run the calls inside under the pairing name ``name`` instead of the thread's own."""
    before = code()
    _local.code = _of(str(name))
    try:
        yield
    finally:
        _local.code = before


def describe(value: int) -> str:
    """A code as the thread name that made it, where this process has seen that name."""
    name = _names.get(int(value))
    return repr(name) if name is not None else f"#{int(value):x}"


def tag_bits(value: int) -> int:
    """The 15 bits of a code folded into message tags (:func:`pycollective.runtime.watch.tag_offset`)."""
    return int(value) & 0x7FFF


ADVICE = ("calls on one communicator are paired across ranks by the name of the calling "
          "thread, and no rank may run one thread's call while another runs a different "
          "thread's: give every thread its own communicator (comm.Dup()), or let threads "
          "that share one take turns in the same order and with the same names on every rank")


def hint(mine: tuple, theirs: tuple) -> str:
    """What to add to a mismatch of two fingerprints of calls from different threads (whatever
    else differs: a barrier of one thread paired with another's allreduce is the threads'
    doing too)."""
    if len(mine) > 8 and len(theirs) > 8 and mine[8] != theirs[8]:
        return (f": the calls come from different threads ({describe(mine[8])} and "
                f"{describe(theirs[8])}); {ADVICE}")
    return ""


def seen_hint() -> str:
    """What to add to an error that a rank in another call explains, where this process has
    called from more than one thread: the other call may be another thread's (a barrier of
    one thread against another's allreduce leaves no fact to compare but the call numbers)."""
    if len(_names) < 2:
        return ""
    names = sorted(repr(name) for name in _names.values())
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return f"; this process has called from several threads ({shown}): {ADVICE}"
