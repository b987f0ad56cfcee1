"""The sliced path of "shm" for mid-size messages (4 KiB - 4 MiB) as compiled code.

Between the small path (every rank reduces the whole vector, :mod:`._small`)
and the larger calls' paths above 4 MiB (``DOUBLE_LIMIT``), "shm" stages the data in the slots'
two alternating regions: rank i owns slice i of the result (see ``algorithms/shm/allreduce.py``).
In Python that is a dozen calls and two synchronisations per allreduce
(a call of 40 KB on two ranks: 22-27 µs, 16-21 µs with this module;
docs/results/mid.md).  Here the same protocol runs as one
compiled call that goes through three phases, each ending in the same
barrier target as the Python path's:

0. copy-in: this rank's input *except its own slice* into its slot; the
   header (call number and fingerprint) if this is the call's first step;
   raise the counter to the first target; wait.
1. check every rank's header against this rank's (``HEADERS_DIFFER``: the
   caller raises through ``NodeGroup.check``), then reduce the own slice of
   all N inputs, operands in rank order 0..N-1 (the own one from ``src``),
   block by block (``BLOCK_BYTES``) so the partial result stays in cache,
   and write each block into the own slot and into ``dst``; raise the
   counter to the second target; wait.
2. copy-out: slice q of the result from slot q into ``dst`` for every q != i.

A wait that runs out of this rank's budget (kept beside its counter, see
``node.atomics``) returns ``LATE`` and the phase to resume from: Python waits on
with the call's deadline and side channel and calls again from that phase.
The targets and the header sets come from ``NodeGroup.compiled_step``, one
call per synchronisation, so a call may mix compiled and Python steps and
ranks that take different paths still meet.

:func:`agreed_step` folds the agreement step into phase 0: this rank's
agreement row goes into the board with the copy-in, and after the first wait
every row is compared with this rank's (``DISAGREE``: the caller raises the
verdict and the communicator stays usable) before the headers.  One
synchronisation fewer than the agreement followed by :func:`step`; when a
rank that agrees took that longer way (``UNFOLDED``, see ``_small``) the
others follow it.

The reduction is the Python path's left fold by the same kernels
(``data.kernels``), float16 on its bit patterns (uint16 views), so results are
bitwise the same whichever path a call takes.
"""

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from ...node.atomics import raise_own, wait_own
from ...data.kernels import _max, _max_f16, _min, _min_f16, _prod, _prod_f16, _sum, _sum_f16
from ...node.group import BLOCK_BYTES
from ...node.views import view, writable_view
# The verdicts, header and agreement-row code and the shared control words
# are the small path's: one home.
from .small import (DISAGREE, DONE, HEADERS_DIFFER, LATE, OP, RANK, SIZE, UNFOLDED, _header,
                    _headers_agree, _row_folded, controlled, rows_verdict)

__all__ = ["step", "agreed_step", "prepared_step", "stream_copy", "CONTROL_WORDS", "DONE", "DISAGREE",
           "HEADERS_DIFFER", "LATE", "UNFOLDED", "HALF"]

HALF = 4  # op codes 4-7: float16's kernels (sum, prod, max, min) on uint16 views

_jit = numba.njit(cache=True, nogil=True)
# Arguments for compiled callees: a constant argument is typed as a literal, and numba
# compiles the callee once more for each literal value; globals of a numpy type are not.
_ZERO, _ONE = np.int64(0), np.int64(1)


def _fold(op, a, b, out):
    """``out = a (op) b`` by the kernel of op code ``op`` (compiled code only)."""
    raise NotImplementedError("compiled code only")


@overload(_fold, jit_options={"cache": True, "nogil": True})
def _fold_typed(op, a, b, out):
    # numba types every branch of a function, and float16's kernels only
    # type on uint16 arrays: so they are branches only where ``out`` is one.
    if out.dtype == types.uint16:
        def fold_bits(op, a, b, out):
            if op == HALF:
                _sum_f16(a, b, out)
            elif op == HALF + 1:
                _prod_f16(a, b, out)
            elif op == HALF + 2:
                _max_f16(a, b, out)
            elif op == HALF + 3:
                _min_f16(a, b, out)
            else:
                _fold_native(op, a, b, out)
        return fold_bits

    def fold(op, a, b, out):
        _fold_native(op, a, b, out)
    return fold


@_jit
def _fold_native(op, a, b, out):
    if op == 0:
        _sum(a, b, out)
    elif op == 1:
        _prod(a, b, out)
    elif op == 2:
        _max(a, b, out)
    else:
        _min(a, b, out)


@intrinsic
def _memcpy(typingctx, dst, src, nbytes):
    # LLVM's memcpy, which becomes a call to the C library's: it reads
    # another core's cache lines at twice the speed of an element loop (the
    # copy-out of 20 KB at two ranks: 1.9 us against 5.6 us).
    def codegen(context, builder, signature, args):
        byte_ptr = ir.IntType(8).as_pointer()
        cgutils.raw_memcpy(builder, builder.inttoptr(args[0], byte_ptr),
                           builder.inttoptr(args[1], byte_ptr), args[2], 1)
        return context.get_dummy_value()
    return types.void(types.intp, types.intp, types.intp), codegen


@_jit
def _copy(dst, src):
    """``dst[:] = src`` for contiguous arrays of one type and size that do not overlap."""
    _memcpy(dst.ctypes.data, src.ctypes.data, src.nbytes)


@intrinsic
def _stream_block(typingctx, dst, src):
    # 32 bytes from ``src`` (any alignment) to ``dst`` (32-byte aligned) with a
    # non-temporal store (LLVM ``!nontemporal``: movntdq and the like), which
    # goes to memory instead of staying in this core's cache.  What orders it
    # before the counter that publishes it is raise_counter's seq_cst fence
    # (mfence on x86, which orders non-temporal stores too).
    def codegen(context, builder, signature, args):
        block = ir.VectorType(ir.IntType(64), 4)
        value = builder.load(builder.inttoptr(args[1], block.as_pointer()), align=1)
        store = builder.store(value, builder.inttoptr(args[0], block.as_pointer()), align=32)
        store.set_metadata("nontemporal",
                           builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()
    return types.void(types.intp, types.intp), codegen


@_jit
def _stream(dst, src):
    """:func:`_copy` past the caches: the 32-byte-aligned middle of ``dst`` with
    non-temporal stores, the ragged ends with plain ones."""
    nbytes, d, s = src.nbytes, dst.ctypes.data, src.ctypes.data
    head = min(nbytes, (32 - d % 32) % 32)
    if head:
        _memcpy(d, s, head)
    i = head
    while i + 32 <= nbytes:
        _stream_block(d + i, s + i)
        i += 32
    if i < nbytes:
        _memcpy(d + i, s + i, nbytes - i)


def stream_copy(dst, src):
    """``dst[...] = src`` by :func:`_stream` where both are contiguous arrays of one
    dtype and shape (by numpy otherwise).  Whoever reads ``dst`` on another core
    must be told through a sync, whose fence orders the non-temporal stores."""
    if (dst.dtype == src.dtype and dst.shape == src.shape and dst.flags.c_contiguous
            and src.flags.c_contiguous):
        _stream(dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8))
    else:
        dst[...] = src


@_jit
def _copy_in(dst, src, nontemporal):
    if nontemporal:
        _stream(dst, src)
    else:
        _copy(dst, src)


@_jit
def _slot(flat, stride, base, q, lo, hi):
    """Elements ``[lo, hi)`` of rank q's slot region (slot q starts at ``q * stride + base``)."""
    start = q * stride + base
    return flat[start + lo:start + hi]


@_jit
def _post(flags, rank, target, flat, stride, base, src, bounds, headers, number, fingerprint,
          nontemporal):
    """Phase 0's writes (copy-in, and the header where ``headers`` has rows), then the counter.

    ``nontemporal``: copy in past this core's cache (see ``algorithms.shm.stores.Stores``)."""
    lo, hi = bounds[rank], bounds[rank + 1]
    _copy_in(_slot(flat, stride, base, rank, _ZERO, lo), src[:lo], nontemporal)
    _copy_in(_slot(flat, stride, base, rank, hi, src.shape[0]), src[hi:], nontemporal)
    if headers.shape[0]:
        _header(headers, rank, number, fingerprint)
    raise_own(flags, rank, target)


@_jit
def _reduce_own(op, flat, stride, base, src, rank, size, lo, hi, dst):
    """Slice ``[lo, hi)`` of all inputs, in rank order, into the own slot and ``dst``."""
    block = max(1, BLOCK_BYTES // src.itemsize)
    for b in range(lo, hi, block):
        e = min(b + block, hi)
        out = _slot(flat, stride, base, rank, b, e)
        # Separate calls, not one with a choice of operand: ``src`` may be
        # read-only, a type numba does not unify with the slots'.
        if rank == 0:
            _fold(op, src[b:e], _slot(flat, stride, base, _ONE, b, e), out)
        elif rank == 1:
            _fold(op, _slot(flat, stride, base, _ZERO, b, e), src[b:e], out)
        else:
            _fold(op, _slot(flat, stride, base, _ZERO, b, e),
                  _slot(flat, stride, base, _ONE, b, e), out)
        for q in range(2, size):
            if q == rank:
                _fold(op, out, src[b:e], out)
            else:
                _fold(op, out, _slot(flat, stride, base, q, b, e), out)
        _copy(dst[b:e], out)  # still in cache


@_jit
def _finish(flags, rank, size, phase, second, flat, stride, base, src, dst, bounds, checking,
            op):
    """Phases 1 (from the header check) and 2, or LATE before phase 2."""
    if phase <= 1:
        if checking.shape[0] and not _headers_agree(checking, rank, size):
            return HEADERS_DIFFER, 1
        _reduce_own(op, flat, stride, base, src, rank, size, bounds[rank], bounds[rank + 1],
                    dst)
        raise_own(flags, rank, second)
        if wait_own(flags, rank, size, second) >= 0:
            return LATE, 2
    for q in range(size):
        if q != rank:
            lo, hi = bounds[q], bounds[q + 1]
            _copy(dst[lo:hi], _slot(flat, stride, base, q, lo, hi))
    return DONE, 3


@_jit
def step(flags, rank, size, phase, first, second, flat, stride, base, src, dst, bounds,
         headers, number, fingerprint, checking, op):
    """The sliced protocol from ``phase`` (0, 1 or 2) on; ``(verdict, phase)``.

    ``flat``: every slot as one array of ``dst``'s type, this call's region
    of slot q at ``q * stride + base``; ``bounds``: the N + 1 slice bounds;
    ``headers``: the header set to write this rank's header into (no rows:
    not the call's first step); ``checking``: the set to compare after the
    first wait (no rows: checked already).  Returns ``(DONE, 3)``,
    ``(HEADERS_DIFFER, 1)``, or ``(LATE, p)``: wait for the target before
    phase p (``first`` for 1, ``second`` for 2), then call again from p.
    """
    if phase == 0:
        _post(flags, rank, first, flat, stride, base, src, bounds, headers, number, fingerprint,
              _ZERO)
        if wait_own(flags, rank, size, first) >= 0:
            return LATE, 1
    return _finish(flags, rank, size, phase, second, flat, stride, base, src, dst, bounds,
                   checking, op)


@_jit
def agreed_step(flags, rank, size, first, second, board, values, flat, stride, base, src, dst,
                bounds, headers, number, fingerprint, checking, op, nontemporal):
    """:func:`step` from phase 0 with this rank's agreement row posted in ``board``.

    After the first wait, ``(DISAGREE, 1)`` if any rank's row differs from
    ``values`` (nothing reduced); ``(UNFOLDED, 1)`` if a rank posted its row
    alone (its copy-in comes with the next sync: the caller runs
    :func:`step` with the next two targets); ``(LATE, 1)``: wait, compare
    the rows (``_small.rows_verdict``) and go on with
    :func:`step` from phase 1.
    """
    _row_folded(board, rank, values)
    _post(flags, rank, first, flat, stride, base, src, bounds, headers, number, fingerprint,
          nontemporal)
    if wait_own(flags, rank, size, first) >= 0:
        return LATE, 1
    verdict = rows_verdict(board, values, size)
    if verdict != DONE:
        return verdict, 1
    return _finish(flags, rank, size, _ONE, second, flat, stride, base, src, dst, bounds,
                   checking, op)


# --- the folded step of a prepared call (``algorithms.shm.steps.RepeatedMid``), by address -----------
# Control words after the shared ones (``_small.FLAGS`` .. ``_small.OP``, the
# op with HALF added for float16): the whole segment as one array, the
# slot stride, each region's base (bit 1 of ``sides``), the slice bounds.
FLAT, FLAT_LEN, STRIDE, BASE, _BASE_1, BOUNDS = range(15, 21)
CONTROL_WORDS = 21
# What prepared_step calls, bound here: compiled code takes a global's value when it is
# compiled, and tests wrap the module's agreed_step in Python to count or fail its calls.
_agreed = agreed_step


@_jit
def prepared_step(ctl, src, dst, first, number, sides):
    """:func:`agreed_step` (targets ``first`` and ``first + 1``, the same header set to
    publish and check) with its other arrays at the addresses in ``ctl``."""
    src = writable_view(src, dst.dtype)  # a read-only one would compile the step again
    flags, board, values, headers, fingerprint = controlled(ctl, sides)
    flat = view(ctl[FLAT], ctl[FLAT_LEN], dst.dtype)
    bounds = view(ctl[BOUNDS], ctl[SIZE] + 1, np.int64)
    return _agreed(flags, ctl[RANK], ctl[SIZE], first, first + 1, board, values, flat,
                   ctl[STRIDE], ctl[BASE + (sides >> 1 & 1)], src, dst, bounds, headers, number,
                   fingerprint, headers, ctl[OP], sides >> 3 & 1)
