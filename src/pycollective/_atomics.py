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
"""

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["fence", "give_way"]


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


@numba.njit(cache=True, nogil=True)
def give_way():
    """Let another process run on this core (``sched_yield``); cheap when none waits."""
    _sched_yield()
