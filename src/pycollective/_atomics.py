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
from numba import types
from numba.extending import intrinsic

__all__ = ["fence"]


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
