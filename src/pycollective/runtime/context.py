"""The library's private side of a user communicator.

Each user communicator gets, on first use, a ``Dup()`` cached as an MPI
attribute on it, so library messages can never match the caller's own
messages, and the duplicate is freed when the caller frees the communicator
(once no message of it is in flight: ``closing.py``).
The first call on a communicator is therefore collective (as every
pycollective call is anyway).

The context also holds what the library keeps per communicator: scratch
buffers for received chunks, so that steady training loops do not allocate
on every call (large scratch, above ``_KEEP_BYTES``, is not kept: holding
on to hundreds of MB after one large call would surprise a user more than
one allocation per large call costs), and the state that algorithms, the
automatic choice, the fast path and the nonblocking engine build once.
That state is stored under typed :class:`Key` objects owned by the module
that builds it, so two modules can never overwrite each other's entries.

Calls on one communicator are serialised by the context's lock: MPI requires
collectives on a communicator to be issued in the same order on every rank,
and two threads of one rank running collectives on it at once would mix
their messages and scratch buffers.  Each call gets the next number on the
communicator (``calls``), which the side channel uses to say which rank is
in which call.  A failure leaves the context ``broken``.

Per-communicator *settings* (the timeout) are stored separately, as a local
attribute of the user's communicator, because setting them must not be a
collective operation.
"""

import array
import atexit
import os
import threading
from typing import Callable, Dict, Generic, Optional, TypeVar

import numpy as np
from mpi4py import MPI

from . import closing as _closing, hosts as _hosts, watch as _watch
from .._errors import CollectiveError

__all__ = ["Context", "Key", "get_context", "find_context", "comm_settings", "set_comm_setting",
           "live_contexts"]

CALLS = 0  # Context.words: the last call's number

_KEEP_BYTES = 64 << 20

T = TypeVar("T")


class Key(Generic[T]):
    """A key of per-communicator state (or of a scratch slot); compared by identity.

    Each module creates its keys once at import (``_STATE = Key("shm")``);
    the name only serves ``repr``.
    """

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return f"Key({self.name!r})"


def describe_comm(comm) -> str:
    """``MPI_COMM_WORLD (4 ranks)``, or for an unnamed one its size and this rank's handle.

    MPI handles are local to a process, so the handle is qualified by the
    rank it is from (messages travel between ranks); ``comm.Set_name``
    gives a communicator a name every rank shares.
    """
    name = comm.Get_name()
    if name:
        return f"{name} ({comm.Get_size()} ranks)"
    handle = MPI._handleof(comm)
    if handle >> 32 == 0xFFFFFFFF:  # a 32-bit handle (MPICH) widened with its sign
        handle &= 0xFFFFFFFF
    return (f"an unnamed communicator of {comm.Get_size()} ranks (handle {handle:#x} on "
            f"rank {comm.Get_rank()})")


class Context:
    """Private communicator, rank, size, scratch space and cached state of one user comm."""

    __slots__ = ("comm", "rank", "size", "label", "lock", "words", "broken", "pending_notices",
                 "early_notices", "hosts", "token", "version", "_scratch", "_cache",
                 "__weakref__")

    def __init__(self, comm, label=None):
        self.comm = comm
        self.rank = comm.Get_rank() if comm != MPI.COMM_NULL else 0
        self.size = comm.Get_size() if comm != MPI.COMM_NULL else 0
        self.label = label or describe_comm(comm)
        self.lock = threading.Lock()   # one collective at a time on this communicator
        # words[CALLS]: collectives started on it, numbered from 1 (``calls``).  A word of
        # an array, not an attribute, so a compiled step can number its call itself
        # (``algorithms/shm/rsag.py``'s entry) while the lock is held; an array.array, as
        # Python reads and writes its items in half a numpy array's time.
        self.words = array.array("q", [0])
        self.broken: Optional[BaseException] = None
        self.pending_notices = []      # side-channel sends not yet completed
        self.early_notices = []        # side-channel notices about a later call
        self.hosts = None              # _hosts.Hosts: where each rank runs, for messages
        # The same random number on every rank, in its side-channel notices: MPICH reuses
        # a freed communicator's context id, and a notice still in flight when it was
        # freed must not count on the communicator that gets that id next.
        self.token = 0
        self._scratch: Dict[Key, np.ndarray] = {}
        # Values may have a ``free()`` method, called when the context dies
        # (in reverse order of creation: later state may use earlier state).
        self._cache: Dict[Key, object] = {}
        # Counts what :meth:`put` replaced and :meth:`free`: whoever keeps a shortcut to
        # state found here (``collectives.plans``' bound calls) compares one number
        # instead of finding the context and its state again.
        self.version = 0

    def next_call(self) -> int:
        """Number a new collective on this communicator (from 1) and return its number.

        The one place calls are numbered; the caller holds ``self.lock``, so
        numbers follow the order of calls on the communicator, which MPI
        requires to be the same on every rank.
        """
        words = self.words
        words[CALLS] += 1
        return words[CALLS]

    @property
    def calls(self) -> int:
        """Collectives started on this communicator (the last call's number)."""
        return self.words[CALLS]

    def scratch(self, slot: Key, count: int, dtype) -> np.ndarray:
        """Return an uninitialised array of ``count`` ``dtype`` elements.

        Distinct ``slot`` keys give non-overlapping buffers; the same slot
        returns the same memory on later calls.
        """
        nbytes = count * np.dtype(dtype).itemsize
        if nbytes > _KEEP_BYTES:
            return np.empty(count, dtype)
        buf = self._scratch.get(slot)
        if buf is None or buf.nbytes < nbytes:
            buf = self._scratch[slot] = np.empty(max(nbytes, 4096), np.uint8)
        return buf[:nbytes].view(dtype)

    def cached(self, key: "Key[T]", make: Callable[["Context"], T]) -> T:
        """The state stored under ``key``, built by ``make(self)`` on first use.

        ``make`` is often collective (windows, sub-communicators), so every
        rank must ask for the same key at the same point.
        """
        value = self._cache.get(key)
        if value is None:
            value = self._cache[key] = make(self)
        return value

    def peek(self, key: "Key[T]") -> Optional[T]:
        """The state under ``key`` if it was built, else None (never collective)."""
        return self._cache.get(key)

    def put(self, key: "Key[T]", value: T) -> T:
        """Store (or replace) the state under ``key``; returns it."""
        self._cache[key] = value
        self.version += 1
        return value

    def free(self):
        """Free every cached state (newest first), the scratch and the private communicator.

        A broken context frees no shared state: peers may be stuck in it, and
        freeing windows or segments is collective.
        """
        global _RECENT
        if _RECENT[1] is self:
            _RECENT = (None, None)
        self.version += 1
        self._scratch.clear()
        cache, self._cache = self._cache, {}
        if self.broken is None:
            for value in reversed(list(cache.values())):
                free = getattr(value, "free", None)
                if free is not None:
                    free()
        if self.comm != MPI.COMM_NULL:
            # Freed once every peer's last message is in (closing.py): a notice still
            # on its way must not reach the communicator that gets this context id next.
            _closing.close(self.comm, self.pending_notices)
            self.pending_notices = []
            self.comm = MPI.COMM_NULL
        _LIVE.pop(id(self), None)


# Every live context, in creation order (the same on every rank), for freeing
# at interpreter exit before MPI_Finalize.
_LIVE: Dict[int, Context] = {}


def live_contexts():
    """Live contexts, oldest first."""
    return list(_LIVE.values())


def _delete(comm, keyval, ctx):
    # Called by MPI when the user's communicator is freed.
    if not MPI.Is_finalized():
        ctx.free()


_KEYVAL = None
_SETTINGS = None
_creating: Dict[int, threading.Lock] = {}
_creating_guard = threading.Lock()


def _keyval():
    global _KEYVAL
    if _KEYVAL is None:
        _KEYVAL = MPI.Comm.Create_keyval(delete_fn=_delete)
    return _KEYVAL


def _creation_lock(comm) -> threading.Lock:
    # Per communicator, so threads creating contexts of different
    # communicators never wait for each other (their ranks may reach the
    # collective Dup in different orders).
    with _creating_guard:
        return _creating.setdefault(MPI._handleof(comm), threading.Lock())


def get_context(comm) -> Context:
    """Return the cached :class:`Context` of ``comm`` (collective on first use).

    Raises:
        CollectiveTimeout: not every rank made its first pycollective call on
            ``comm`` within the timeout.
        CollectiveError: MPI cannot create another communicator (too many
            live communicators).
    """
    keyval = _keyval()
    ctx = comm.Get_attr(keyval)
    if ctx is not None:
        return ctx
    with _creation_lock(comm):
        ctx = comm.Get_attr(keyval)
        if ctx is None:
            ctx = _create(comm)
            comm.Set_attr(keyval, ctx)
    return ctx


def duplicate(comm, label, waiting_for):
    """A private ``Dup`` of ``comm``, waited for with a deadline (collective).

    Raises:
        CollectiveTimeout: not every rank came within the timeout.
        CollectiveError: MPI cannot create another communicator.
    """
    try:
        private, request = MPI.Intracomm(comm).Idup()
    except MPI.Exception as exc:
        raise CollectiveError(
            f"pycollective could not create its private duplicate of {label}: MPI has no "
            f"communicator left ({exc.Get_error_string().strip()}); {len(_LIVE)} communicators "
            "are in use by pycollective: free the ones you no longer need") from None
    _watch.waitall([request], waiting_for=waiting_for)
    return private


def _create(comm) -> Context:
    # A plain Intracomm handle: a wrapped pycollective.Comm passed as comm
    # must not route the library's own traffic back through the wrapper.
    plain = MPI.Intracomm(comm)
    label = describe_comm(plain)
    waiting_for = f"every rank's first pycollective call on {label}"
    _closing.reap()  # free what has closed before taking another communicator
    try:
        private = duplicate(plain, label, waiting_for)
        hosts, token = _gather_hosts(private, waiting_for)
    except _watch.CollectiveTimeout as exc:
        # Later calls raise at once instead of waiting again.
        broken = Context(MPI.COMM_NULL, label)
        broken.broken = exc
        comm.Set_attr(_keyval(), broken)
        raise
    ctx = Context(private, label)
    ctx.hosts, ctx.token = hosts, token
    _LIVE[id(ctx)] = ctx
    return ctx


def _gather_hosts(private, waiting_for):
    """``(hosts, token)``: every rank's processor name, for naming nodes in messages, and
    rank 0's random token (collective, bounded: one small Iallgather)."""
    if private.Get_size() == 1:
        return None, 0
    n = _hosts.NAME_BYTES
    mine = np.zeros(n + 8, np.uint8)
    raw = MPI.Get_processor_name().encode("utf-8", "replace")[:n]
    mine[:len(raw)] = np.frombuffer(raw, np.uint8)
    mine[n:] = np.frombuffer(os.urandom(8), np.uint8)
    rows = np.empty((private.Get_size(), n + 8), np.uint8)
    _watch.waitall([private.Iallgather(mine, rows)], waiting_for=waiting_for)
    token = int.from_bytes(rows[0, n:].tobytes(), "little") >> 1 or 1
    return _hosts.Hosts.from_bytes(rows[:, :n]), token


@atexit.register
def _free_at_exit():
    # Before MPI_Finalize (mpi4py registered its own exit hook earlier, so it
    # runs later): shared memory and private communicators left attached to
    # COMM_WORLD's attributes until Finalize make some network modules fail
    # there (OFI: "fabricclose failed ... Device or resource busy").
    if MPI.Is_initialized() and not MPI.Is_finalized():
        for ctx in reversed(live_contexts()):
            try:
                ctx.free()
            except Exception:  # noqa: BLE001  (exiting: free what can be freed)
                pass
        _closing.release()


# The communicator object of the last find_context that found one, and that
# context: a training loop asks for the same one every call, and an identity
# test costs a tenth of MPI_Comm_get_attr through mpi4py (0.4 us).  Freeing
# the context forgets it (Context.free), so a freed communicator's object
# never finds a dead context here.
_RECENT = (None, None)


def find_context(comm) -> Optional[Context]:
    """The :class:`Context` of ``comm`` if it has one, else None (never collective)."""
    global _RECENT
    recent = _RECENT
    if comm is recent[0]:
        return recent[1]
    if _KEYVAL is None:
        return None
    try:
        ctx = comm.Get_attr(_KEYVAL)
    except MPI.Exception:  # e.g. a freed communicator: the full path says so
        return None
    if ctx is not None:
        _RECENT = (comm, ctx)
    return ctx


def comm_settings(comm) -> dict:
    """Per-communicator settings (e.g. ``{"timeout": 30.0}``); local, never collective."""
    if _SETTINGS is None:
        return {}
    try:
        return comm.Get_attr(_SETTINGS) or {}
    except MPI.Exception:
        return {}


def set_comm_setting(comm, name, value):
    """Set one per-communicator setting; returns the previous value (or None)."""
    global _SETTINGS
    if _SETTINGS is None:
        _SETTINGS = MPI.Comm.Create_keyval()
    settings = dict(comm_settings(comm))
    previous = settings.get(name)
    settings[name] = value
    comm.Set_attr(_SETTINGS, settings)
    return previous
