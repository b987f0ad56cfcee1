"""Compressed transport: gradients travel as two-byte floats, every step accumulates wider.

Why.  An allreduce of M gradients moves about 2M elements per rank whatever
the algorithm does (the lecture, section 2.3), so halving the bytes of an
element halves the bandwidth term -- the lecture's exercise 1, answer 1:
"fp16/bf16 gradients, 2 bytes per parameter".  What must not happen is
summing in two-byte arithmetic: a float16 running sum loses the small
contributions once it is large, and overflows at 65504.

How.  A compressor has two methods, in the manner of Horovod's
``Compression``: ``compress(array) -> (buf, ctx)`` gives the array that
travels, ``decompress(buf, ctx) -> array`` turns the reduced ``buf`` back.
:func:`allreduce` compresses the send buffer, reduces the compressed buffer
with the library's allreduce and decompresses into the receive buffer.  The
reduction of two-byte buffers runs in :mod:`pycollective.data.kernels`, which
widens both operands to float64 at every step and rounds the result once to
the two-byte format: partial sums travel in two bytes, but no sum is ever
formed in two-byte arithmetic.

Pre-division.  float16's largest value is 65504, so the sum of N gradients
can overflow where each one does not.  :data:`FP16` therefore divides by N
while compressing and multiplies by N while decompressing (what torch's
fp16 compress hook does by dividing first): every partial sum is then at
most the largest input in magnitude.  The quotient is rounded once (formed
in float64), so dividing costs no accuracy beyond pushing tiny values
towards float16's subnormals.  bfloat16 has float32's exponent range, so
:data:`BF16` does not divide.  A compressor asks for it with an attribute
``divide_first = True`` and is then called as ``compress(array, divide=N)``.

Error.  For the built-in compressors (:class:`Cast`), :meth:`Cast.error_bound`
states the largest possible difference from the exact sum, per element; the
tests and the bench check it.  With A = Σ|x_i| over the N ranks, u the unit
roundoff of the wire format (float16 2^-11, bfloat16 2^-8) and ignoring
underflow, it is about (u + (N-1)·u)·A: one rounding when compressing, and
at most N-1 roundings of partial sums on the way (the longest chain of
additions any algorithm here makes; a tree makes only log2 N).
"""

import numpy as np
from mpi4py import MPI

from .data.kernels import as_dtype, float_info, from_two_bytes, is_float, to_two_bytes
from .data.ops import resolve_op

__all__ = ["Cast", "FP16", "BF16", "resolve", "allreduce", "applies", "compress_for", "CHOICES"]

_U32 = 2.0 ** -24                   # unit roundoff of float32
_ETA32 = 2.0 ** -150                # half of float32's smallest subnormal


class Cast:
    """Compression by casting to a two-byte float; decompression casts back.

    Args:
        name: how it is spelled in ``compress=`` ("fp16", "bf16").
        wire: the dtype that travels.
        divide_first: divide by N before compressing, multiply after (to keep
            every partial sum in range; see the module docstring).
    """

    def __init__(self, name, wire, divide_first):
        self.name, self._wire, self.divide_first = name, wire, bool(divide_first)
        self._info = None
        if not (isinstance(wire, str) and wire == "bfloat16"):
            self._float_info()  # a wire dtype that is not a float raises here, at once

    @property
    def wire(self) -> np.dtype:
        """The dtype that travels, resolved on first use (bfloat16 imports ml_dtypes)."""
        if not isinstance(self._wire, np.dtype):
            self._wire = as_dtype(self._wire)
        return self._wire

    @property
    def unit_roundoff(self) -> float:
        return 2.0 ** -(self._float_info().nmant + 1)

    @property
    def half_subnormal(self) -> float:
        return float(self._float_info().smallest_subnormal) / 2

    def _float_info(self):
        if self._info is None:
            self._info = float_info(self.wire)
        return self._info

    def __repr__(self):
        return f"<pycollective compression {self.name}: {self.wire.name} on the wire>"

    def compress(self, array, divide=1):
        """``(array / divide rounded once to the wire dtype, (dtype, divide))``."""
        if array.dtype in (np.float32, np.float64):
            return to_two_bytes(array, self.wire, divide), (array.dtype, divide)
        # two-byte inputs: numpy's (ml_dtypes') casts, through float32
        return (array.astype(np.float32) / np.float32(divide)).astype(self.wire), \
            (array.dtype, divide)

    def decompress(self, buf, ctx, out=None):
        """The reduced wire buffer times ``divide`` as the original dtype (one rounding).

        ``out``: write there (flat, of the original dtype) instead of a new array.
        """
        dtype, divide = ctx
        if dtype in (np.float32, np.float64):
            return from_two_bytes(buf, dtype, divide, out)
        result = (buf.astype(np.float32) * np.float32(divide)).astype(dtype)
        if out is None:
            return result
        out[...] = result
        return out

    def error_bound(self, abs_sum, nranks):
        """Largest |compressed allreduce - exact sum| per element, without overflow.

        Args:
            abs_sum: Σ over ranks of |x_i| (per element, array or scalar).
            nranks: N.

        Returns:
            The bound, in the units of the data (same shape as ``abs_sum``).
            Steps and their errors, with s = 1/N when dividing first, else 1:
            ``y = fl32(s·x)`` (u32 relative, η32 absolute), ``c = fl(y)`` on the
            wire (u, η = half the wire's smallest subnormal), N-1 rounded
            additions (Higham's γ_{N-1} = (N-1)u/(1-(N-1)u) times Σ|c|, plus
            η per addition), widening (exact), and ``fl32(sum / s)``.
        """
        a = np.asarray(abs_sum, np.float64)
        n = int(nranks)
        u, eta = self.unit_roundoff, self.half_subnormal
        s = 1.0 / n if (self.divide_first and n > 1) else 1.0
        e1 = _U32 * s * a + n * _ETA32
        e2 = u * (1 + _U32) * s * a + n * eta
        sum_c = (1 + u) * (1 + _U32) * s * a + n * (eta + _ETA32)
        gamma = (n - 1) * u / (1 - (n - 1) * u)
        e3 = gamma * sum_c + (n - 1) * eta * (1 + gamma)
        err = (e1 + e2 + e3) / s
        return err + _U32 * (a + err)


#: float16 on the wire, divided by N first (its range is small).
FP16 = Cast("fp16", np.float16, divide_first=True)
#: bfloat16 on the wire (float32's range: no division needed).
BF16 = Cast("bf16", "bfloat16", divide_first=False)

_BY_NAME = {"fp16": FP16, "float16": FP16, "bf16": BF16, "bfloat16": BF16}
#: The names ``compress=`` accepts besides None and compressor objects.
CHOICES = ("none", "fp16", "bf16")


def resolve(compress):
    """The compressor ``compress`` names: None, "none", "fp16", "bf16" or an object.

    Raises:
        ValueError: an unknown name, or an object without ``compress`` and
            ``decompress`` methods.
    """
    if compress is None or (isinstance(compress, str) and compress.lower() == "none"):
        return None
    if isinstance(compress, str):
        found = _BY_NAME.get(compress.lower())
        if found is None:
            raise ValueError(f"unknown compression {compress!r}; expected one of "
                             f"{', '.join(CHOICES)} or an object with compress/decompress")
        return found
    if not (callable(getattr(compress, "compress", None))
            and callable(getattr(compress, "decompress", None))):
        raise ValueError(f"compress={compress!r} has no compress(array) -> (buf, ctx) and "
                         "decompress(buf, ctx) -> array methods")
    return compress


def applies(dtype, op) -> bool:
    """Whether a reduction of ``dtype`` with ``op`` is compressed (floating sums only)."""
    try:
        return is_float(dtype) and resolve_op(op) == "sum"
    except (TypeError, ValueError):
        return False


def _check(sendbuf, recvbuf, op):
    """(source array, flat writable destination); raises TypeError/ValueError."""
    if resolve_op(op) != "sum":
        raise ValueError(f"compressed allreduce reduces sums only, got op {op!r}")
    if not isinstance(recvbuf, np.ndarray):
        raise TypeError(f"recvbuf must be a numpy array, got {type(recvbuf).__name__}")
    if not recvbuf.flags.writeable:
        raise ValueError("recvbuf is read-only")
    src = recvbuf if sendbuf is MPI.IN_PLACE else sendbuf
    if not isinstance(src, np.ndarray):
        raise TypeError(f"sendbuf must be a numpy array, got {type(src).__name__}")
    if src.dtype != recvbuf.dtype:
        raise TypeError(f"recvbuf dtype {recvbuf.dtype} differs from sendbuf dtype {src.dtype}")
    if not is_float(src.dtype):
        raise TypeError(f"compression needs a floating dtype, got {src.dtype}")
    if src.size != recvbuf.size:
        raise ValueError(f"recvbuf has {recvbuf.size} elements but sendbuf has {src.size}")
    return src.reshape(-1), recvbuf


def allreduce(reduce, sendbuf, recvbuf, op, compress, *, comm=None, **kwargs):
    """Sum ``sendbuf`` over all ranks into ``recvbuf``, moving compressed data.

    Args:
        reduce: the uncompressed allreduce (``pycollective.allreduce``),
            called on the compressed buffer in place with ``comm`` and
            ``kwargs``.
        sendbuf, recvbuf, op: as for ``pycollective.allreduce``; op must be a
            sum and the dtype floating.
        compress: see :func:`resolve`.

    Returns:
        ``recvbuf``: the decompressed sum, bitwise identical on every rank.

    Raises:
        TypeError, ValueError: bad arguments -- on every rank: a rank whose
            own arguments are wrong still joins the reduction with an empty
            buffer, so the others raise the library's count mismatch.
        CollectiveError: as ``pycollective.allreduce``.
    """
    compressor = resolve(compress)
    if compressor is None:
        return reduce(sendbuf, recvbuf, op, comm=comm, **kwargs)
    try:
        src, dst = _check(sendbuf, recvbuf, op)
    except (TypeError, ValueError):
        try:
            reduce(MPI.IN_PLACE, np.empty(0, np.float16), "sum", comm=comm, **kwargs)
        except (TypeError, ValueError):
            pass  # the others raise from this disagreement; this rank raises its own
        raise
    nranks = (MPI.COMM_WORLD if comm is None else comm).Get_size()
    wire, ctx = compress_for(compressor, src, nranks)
    reduce(MPI.IN_PLACE, wire, "sum", comm=comm, **kwargs)
    flat = dst.reshape(-1)
    if isinstance(compressor, Cast) and np.shares_memory(flat, dst):
        compressor.decompress(wire, ctx, out=flat)  # straight into recvbuf: no copy
    else:
        dst[...] = np.asarray(compressor.decompress(wire, ctx)).reshape(dst.shape)
    return recvbuf


def compress_for(compressor, array, nranks):
    """``compressor.compress(array)``, divided by ``nranks`` first if the compressor asks.

    A compressor with ``divide_first = True`` is called as
    ``compress(array, divide=N)``; its ``decompress`` multiplies back.
    """
    if getattr(compressor, "divide_first", False) and nranks > 1:
        return compressor.compress(array, divide=nranks)
    return compressor.compress(array)
