"""Memory ordering for flags in shared memory, from Python and from compiled code.

Ranks that share memory synchronise through counters in a shared segment:
a writer stores its data, then raises its counter; a reader sees the
counter, then loads the data.  That needs the stores to become visible in
that order and the loads to happen in that order.  x86 keeps stores and
loads in program order anyway, but other processors (ARM) do not, and a
compiler may reorder plain loads; :func:`fence` is a full barrier (an LLVM
``fence seq_cst``: ``mfence`` on x86, ``dmb ish`` on ARM) callable from
Python and from numba-compiled code.  An aligned 8-byte load or store of a
numpy int64 element is a single instruction, so counters are never torn.

Counters live in an int64 array, rank q's at word ``q * STRIDE`` (one cache
line each); the next word of the line counts the ranks asleep on that
counter.  :func:`raise_counter` and :func:`wait_counters` are the two halves
of every node synchronisation.  A waiting rank checks the counter in a loop,
giving the core away (``sched_yield``) now and then; where ranks outnumber
cores it yields at every check and, after a few hundred, sleeps in the
kernel (Linux ``futex(2)``) until the counter moves, so the core goes to a
rank with work to do instead of to a waiting loop.

Sleeping without losing a wake-up: the waiter adds itself to the sleepers
count (an atomic add, a full barrier), *then* reads the counter again, and
asks the kernel to sleep only while the counter's low 32 bits still hold
what it read; the raiser stores its counter, fences, *then* reads the
sleepers count and makes the wake-up system call only if it is not zero.
Each side's write comes before its read, with a full barrier between, so at
least one of them sees the other's write: either the waiter sees the new
counter and does not sleep, or the raiser sees the sleeper and wakes it (a
wake-up that arrives before the waiter is in the kernel makes the kernel's
own compare fail, and ``futex`` returns at once).  Every sleep has a
timeout, so a waiter comes back to Python (its deadline, the side channel,
MPI progress) however the others behave.  The futexes are shared (not
``FUTEX_PRIVATE``): the words are in a segment every rank maps, memfd or
POSIX shared memory alike, and the kernel keys such futexes by the page.
"""

import platform
import sys

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["CAN_SLEEP", "STRIDE", "fence", "raise_counter", "raise_counter_at", "raise_own",
           "set_budget", "wait_counters", "wait_own", "poll_counters", "call_word", "CALL_WORD",
           "PAUSES"]

STRIDE = 8                   # int64 words per rank: counter, sleepers, own wait budget (5),
                             # the call word (CALL_WORD)
_SLEEPERS = 1                # the sleepers count's word after the counter
_BUDGET = 2                  # this rank's wait budget (set_budget), for compiled steps
# futex(2)'s system call number (it has no libc wrapper); None: no sleeping waits.
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine()) \
    if sys.platform.startswith("linux") else None
CAN_SLEEP = _SYS_FUTEX is not None
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
# futex(2) compares 32 bits: the low half of the int64 counter, at this byte offset.
_LOW_HALF = 0 if sys.byteorder == "little" else 4


@intrinsic
def _fence(typingctx):
    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()
    return types.void(), codegen


@numba.njit(cache=True, nogil=True)
def fence():
    """A full memory barrier: earlier loads and stores complete before later ones."""
    _fence()


@intrinsic
def _sched_yield(typingctx):
    # A call to libc's sched_yield, resolved when the code is linked into the
    # process (so the compiled function can be cached, unlike a ctypes pointer).
    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), []),
                                            "sched_yield")
        return builder.call(fn, [])
    return types.int32(), codegen


@intrinsic
def _atomic_add(typingctx, address, value):
    # A sequentially consistent atomic add to the int64 at ``address``; a full
    # barrier as well (lock xadd on x86).
    def codegen(context, builder, signature, args):
        ptr = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        return builder.atomic_rmw("add", ptr, args[1], "seq_cst")
    return types.int64(types.intp, types.int64), codegen


@intrinsic
def _futex(typingctx, address, op, value, timeout_ns):
    # syscall(SYS_futex, address, op, value, &relative_timeout, NULL, 0): libc's
    # variadic ``syscall``, resolved at link time like sched_yield above.
    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        spec = cgutils.alloca_once(builder, ir.LiteralStructType([i64, i64]))
        billion = ir.Constant(i64, 1_000_000_000)
        builder.store(builder.sdiv(args[3], billion), cgutils.gep_inbounds(builder, spec, 0, 0))
        builder.store(builder.srem(args[3], billion), cgutils.gep_inbounds(builder, spec, 0, 1))
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(i64, [i64], var_arg=True), "syscall")
        return builder.call(fn, [ir.Constant(i64, _SYS_FUTEX or -1), args[0], args[1], args[2],
                                 builder.ptrtoint(spec, i64), ir.Constant(i64, 0),
                                 ir.Constant(i64, 0)])
    return types.int64(types.intp, types.int64, types.int64, types.int64), codegen


@intrinsic
def _load(typingctx, address):
    # An atomic (relaxed) load of the int64 at ``address``: one plain mov on
    # x86, but the compiler may not hoist it out of a waiting loop.
    def codegen(context, builder, signature, args):
        ptr = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        return builder.load_atomic(ptr, "monotonic", 8)
    return types.int64(types.intp), codegen


@intrinsic
def _store(typingctx, address, value):
    # An atomic (relaxed) store: never torn, never merged away.
    def codegen(context, builder, signature, args):
        ptr = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        builder.store_atomic(args[1], ptr, "monotonic", 8)
        return context.get_dummy_value()
    return types.void(types.intp, types.int64), codegen


@numba.njit(cache=True, nogil=True)
def raise_counter_at(counter, target, wakes):
    """:func:`raise_counter` by the counter's address (cheaper to call from Python)."""
    _fence()  # the data before the counter
    _store(counter, target)
    if wakes:
        _fence()  # the counter before the read of the sleepers count (module docstring)
        if _load(counter + _SLEEPERS * 8) != 0:
            _futex(counter + _LOW_HALF, _FUTEX_WAKE, 0x7FFFFFFF, 0)


@numba.njit(cache=True, nogil=True)
def raise_counter(words, rank, target, wakes):
    """Publish what this rank stored, raise its counter to ``target``, wake its sleepers.

    ``wakes``: whether any rank of the node may sleep on a counter.  Where
    none may, the store is all: the second fence, which makes this rank
    stall until the store is visible to the others, costs 0.15 µs a sync.
    """
    raise_counter_at(words.ctypes.data + rank * STRIDE * 8, target, wakes)


@numba.njit(cache=True, nogil=True)
def _sleep_on(counter, target, sleep_ns):
    """Sleep (at most ``sleep_ns``) until the counter moves, unless it has reached ``target``."""
    _atomic_add(counter + _SLEEPERS * 8, 1)   # registered before the counter is read again
    seen = _load(counter)
    if seen < target:
        _futex(counter + _LOW_HALF, _FUTEX_WAIT, seen & 0xFFFFFFFF, sleep_ns)
    _atomic_add(counter + _SLEEPERS * 8, -1)


@numba.njit(cache=True, nogil=True)
def wait_counters(words, rank, size, target, spins, yield_mask, sleep_ns, sleeps):
    """Wait until every other rank's counter has reached ``target``; -1 when they have.

    On each counter: ``spins`` checks, giving the core away
    (``sched_yield``) at every check whose number has the bits of
    ``yield_mask`` clear (0: at every check; 63: every 64th), then, if
    ``sleep_ns`` > 0, sleeps of at most ``sleep_ns`` each until it moves.
    After ``spins`` checks without sleeping, or ``sleeps`` sleeps in all,
    returns the rank still awaited, so that Python can keep waiting with a
    deadline and a side channel.  Fences before returning -1, so the
    caller's loads come after the others' stores.
    """
    slept = 0
    base = words.ctypes.data
    for q in range(size):
        if q == rank:
            continue
        counter = base + q * STRIDE * 8
        checks = 0
        while _load(counter) < target:
            checks += 1
            if checks <= spins:
                if checks & yield_mask == 0:
                    _sched_yield()
                continue
            if sleep_ns <= 0 or slept >= sleeps:
                return q
            slept += 1
            _sleep_on(counter, target, sleep_ns)
    _fence()
    return -1


# --- compiled steps: each rank's budget beside its counter ----------------------------------
# A compiled step called from Python pays about 13 ns per scalar argument
# (0.1 us a step for the five of a budget), so each rank keeps its own
# wait budget in the spare words of its counter's cache line.

def set_budget(words, rank, spins, yield_mask, sleep_ns, sleeps, wakes):
    """Store this rank's budget for :func:`raise_own` and :func:`wait_own` (from Python)."""
    at = rank * STRIDE + _BUDGET
    words[at:at + 5] = (spins, yield_mask, sleep_ns, sleeps, 1 if wakes else 0)


@numba.njit(cache=True, nogil=True)
def raise_own(words, rank, target):
    """:func:`raise_counter` with this rank's stored ``wakes``."""
    raise_counter(words, rank, target, words[rank * STRIDE + _BUDGET + 4] != 0)


@numba.njit(cache=True, nogil=True)
def wait_own(words, rank, size, target):
    """:func:`wait_counters` with this rank's stored budget."""
    at = rank * STRIDE + _BUDGET
    return wait_counters(words, rank, size, target, words[at], words[at + 1], words[at + 2],
                         words[at + 3])


# --- waits where every rank has a core, and the call word beside the counter -------------
# A compiled step that numbers its call writes its *call word* into the spare word of its
# counter's line before raising the counter, so a waiting rank that sees the counter has
# the word in the same line: a call that agrees reads one metadata line per peer, and the
# full headers only where the words differ.

CALL_WORD = STRIDE - 1  # the call word's place in a rank's counter line
_MIX = -7046029254386353131  # 0x9E3779B97F4A7C15 as int64: odd, so number -> word is one-to-one
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
# Passes with a pause only; the later ones give the core away (sched_yield) between
# passes: a peer that late is not running, its core taken by another process (a node
# busier than its affinity masks say), and spinning on would keep it from running.
PAUSES = 1 << 12


@intrinsic
def _pause(typingctx):
    # x86's PAUSE (llvm.x86.sse2.pause): a spinning core yields its pipeline to the
    # other hyperthread and stops flooding the memory system; nothing elsewhere.
    def codegen(context, builder, signature, args):
        if _X86:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse2.pause")
            builder.call(fn, [])
        return context.get_dummy_value()
    return types.void(), codegen



@numba.njit(cache=True, nogil=True)
def call_word(number, values, fingerprint):
    """A call's *call word* (kept at :data:`CALL_WORD` of a rank's counter line): the call
    number mixed with a hash of the agreement row (past its number words) and the
    fingerprint: equal on two ranks that make the same call, else unequal but for a
    2**-64 chance (the full rows and headers decide then)."""
    h = np.int64(-3750763034362895579)  # FNV-1a's offset basis, as int64
    for j in range(2, values.shape[0]):
        h = (h ^ values[j]) * np.int64(1099511628211)
    for j in range(fingerprint.shape[0]):
        h = (h ^ fingerprint[j]) * np.int64(1099511628211)
    return h ^ (number * np.int64(_MIX))



@numba.njit(cache=True, nogil=True)
def poll_counters(flags, rank, size, target, passes):
    """Wait until every other counter has reached ``target``, where every rank has a core:
    each pass checks every peer from the first still awaited, a ``pause`` between passes
    (no system call for the first :data:`PAUSES`).  -1 when all have (then a fence,
    so the caller's loads come after their stores), else the first peer still awaited."""
    base = flags.ctypes.data
    first = 0
    for p in range(max(1, passes)):  # at least one look: a zero budget still sees a done wait
        awaited = -1
        for q in range(first, size):
            if q != rank and _load(base + q * STRIDE * 8) < target:
                if awaited < 0:
                    awaited = q
        if awaited < 0:
            _fence()
            return -1
        first = awaited
        if p < PAUSES:
            _pause()
        else:
            _sched_yield()
    return first
