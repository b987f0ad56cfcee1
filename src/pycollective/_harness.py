"""Benchmark harness: warm-up, timing, cross-rank agreement, correctness, tables.

Modelled on nccl-tests' split between ``common.cu`` and ``all_reduce.cu``:
this module knows nothing about any particular algorithm or collective.  A
:class:`Collective` supplies what is specific to one collective -- the bytes
per rank, how to fill the input, the reference implementation (native MPI)
and the bus-bandwidth factor -- and a list of :class:`Case` objects supplies
the implementations under test.  :func:`measure` then owns everything that
must be done the same way for every implementation:

* one send buffer of exact data per rank, one result buffer for the
  implementations under test and one for the reference (no other full-size
  copies: the send buffer doubles as the pristine input that in-place runs
  are restored from, and checks run in blocks);
* warm-up repetitions of every case (kernel compilation, first touch of the
  buffers and MPI's connection set-up stay out of the timings);
* timed repetitions, interleaved -- in each repetition the reference runs
  first, then every case -- so that load drifting on a shared machine hits
  all of them alike; each repetition is ``Barrier``, ``perf_counter`` around
  the one call, and its time is the maximum over ranks; the median over
  repetitions is reported;
* before every repetition, outside the timing, the result buffer is poisoned
  (out of place) or restored from the pristine input (in place), so a result
  left over from an earlier call can never pass for a new one;
* after every call (warm-up calls included), outside the timing, the result
  is compared with the reference's result of the same repetition, bit for
  bit (tolerance 0: the input data make every reduction exact, see
  :func:`fill_exact`), and its CRC-32 is kept;
* after every call, the CRC-32 of the send buffer is compared with the
  input's: a case that writes into its send buffer is blamed (and the input
  restored for the next case);
* at the end, a handful of collectives make every rank agree on the times
  (max over ranks), the wrong-element counts (summed over ranks, worst
  call), the largest error, whether all ranks held bitwise-identical
  results (CRC-32 after every call), and which cases touched their input.

The table/JSON helpers at the bottom are shared by every report.
"""

import math
import os
import platform
import socket
import statistics
import sys
import time
import zlib
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Callable

import numpy as np
from mpi4py import MPI

__all__ = ["Case", "Collective", "measure", "fill_exact", "exact_values", "compare", "parse_count",
           "parse_size", "algbw", "busbw", "format_table", "environment"]

_BLOCK = 1 << 20  # elements per block when generating or checking data


# --- argument parsing helpers -------------------------------------------------

def parse_count(text):
    """Parse an element count such as ``1000``, ``1e8``, ``2.5e6`` or ``1_000``.

    Args:
        text: the string (or an int).

    Returns:
        The count as an ``int`` (>= 0).

    Raises:
        ValueError: when the text is not a non-negative integral number.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        value = Decimal(text)
    else:
        try:
            # Decimal, not float: "123456789012345678" must stay exact.
            value = Decimal(str(text).strip().replace("_", ""))
        except InvalidOperation:
            raise ValueError(f"{text!r} is not a number (use e.g. 1000 or 1e8)") from None
    if not value.is_finite():
        raise ValueError(f"{text!r} is not a finite number")
    if value != value.to_integral_value():
        raise ValueError(f"{text!r} is not a whole number of elements")
    if value < 0:
        raise ValueError(f"{text!r} is negative")
    return int(value)


_SUFFIXES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text):
    """Parse a byte size: a number as for :func:`parse_count`, or with a K/M/G (binary) suffix.

    Args:
        text: e.g. ``4``, ``1e6``, ``64K``, ``1M``, ``0.5G`` (a trailing ``B`` is allowed).

    Returns:
        The size in bytes as an ``int``.

    Raises:
        ValueError: for anything else (including sizes that are not whole bytes).
    """
    s = str(text).strip().upper()
    if s.endswith("B"):
        s = s[:-1]
    scale = 1
    if s[-1:] in _SUFFIXES:
        s, scale = s[:-1], _SUFFIXES[s[-1]]
    try:
        value = Decimal(s.replace("_", "")) * scale
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a size (use e.g. 8, 1e6, 64K, 1M, 1G)") from None
    try:
        return parse_count(value)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole, non-negative number of bytes") from None


# --- bandwidth arithmetic (nccl-tests conventions) ----------------------------

def algbw(nbytes, seconds):
    """Algorithm bandwidth in GB/s (1e9 bytes): bytes per rank divided by time."""
    if seconds <= 0 or not math.isfinite(seconds):
        return float("nan")
    return nbytes / seconds / 1e9


def busbw(nbytes, seconds, factor):
    """Bus bandwidth in GB/s: ``algbw * factor`` (for allreduce factor = 2(N-1)/N)."""
    return algbw(nbytes, seconds) * factor


# --- exact test data ----------------------------------------------------------

def _exact_limit(dtype):
    """Largest L such that every integer in [-L, L] (or [0, L]) is exact in ``dtype``."""
    if dtype.kind == "f":
        return 2 ** (np.finfo(dtype).nmant + 1)
    return int(np.iinfo(dtype).max)


def _sum_halfwidth(dtype, nranks):
    """K such that N values in [-K, K] (or [0, K]) sum exactly, in any order."""
    return max(0, min(_exact_limit(dtype) // nranks, 1 << 20))


def _float_pow2_cap(dtype):
    """Largest k with 2**k finite (and so exact) in the floating ``dtype``."""
    return int(np.finfo(dtype).maxexp) - 1


_PROD_SIGNED = np.array([1, 2, -1, 1, -2], np.int64)
_PROD_UNSIGNED = np.array([1, 2, 3, 1, 2], np.int64)
_PROD_UNIT = np.array([1, -1, 1, -1, -1], np.int64)


def _check_exact(dtype, nranks, op):
    if op == "sum" and _sum_halfwidth(dtype, nranks) < 1:
        raise ValueError(f"{dtype} cannot hold an exact sum over {nranks} ranks "
                         f"(integers are exact only up to {_exact_limit(dtype)})")


def exact_values(start, stop, rank, nranks, dtype, op):
    """Input values of ``rank`` for element indices ``[start, stop)``.

    Every value depends on the index and the rank through a multiplicative
    hash ``u = (i * 0x9E3779B1 + (r + 1) * 0x85EBCA77) mod 2**32``, so a
    misplaced or misrouted chunk changes the result, and the pattern has no
    short period a chunk shift could hide in.  Values are small integers
    chosen so that the reduction over ``nranks`` ranks is exact in ``dtype``
    whatever the order of operations -- any difference from native MPI is an
    error, and the check uses tolerance 0:

    * sum, max, min: ``u % (2K+1) - K`` (unsigned: ``u % (K+1)``) with
      ``N*K`` within the dtype's exact-integer range (2**11 for float16,
      2**24 for float32, 2**53 for float64, the maximum for integers), so
      every partial sum is exact;
    * prod: values from {1, 2, -1, 1, -2} (unsigned {1, 2, 3, 1, 2}); for a
      float dtype, ranks beyond the largest finite power of two (float16:
      15) use {1, -1} only, so every partial product is a power of two and
      exact.  Integer overflow wraps around identically in native MPI and
      here (fixed-width integer arithmetic is associative and commutative
      modulo 2**bits), so integer products are exact at any N.

    Args:
        start, stop: index range.
        rank, nranks: this rank and the communicator size N.
        dtype: a numpy dtype.
        op: "sum", "prod", "max" or "min".

    Returns:
        An array of ``stop - start`` elements of ``dtype``.

    Raises:
        ValueError: if no exact data exist (a float sum over more ranks than
            the dtype has exact integers, e.g. float16 beyond 2048 ranks).
    """
    dtype = np.dtype(dtype)
    _check_exact(dtype, nranks, op)
    i = np.arange(start, stop, dtype=np.uint64)
    u = (i * np.uint64(0x9E3779B1) + np.uint64(((rank + 1) * 0x85EBCA77) & 0xFFFFFFFF))
    u &= np.uint64(0xFFFFFFFF)
    u >>= np.uint64(7)  # the low bits of i*odd depend on the low bits of i only
    if op == "prod":
        if dtype.kind == "u":
            table = _PROD_UNSIGNED
        elif dtype.kind == "f" and rank >= _float_pow2_cap(dtype):
            table = _PROD_UNIT
        else:
            table = _PROD_SIGNED
        v = table[(u % np.uint64(5)).astype(np.intp)]
    else:
        k = max(1, _sum_halfwidth(dtype, nranks))
        if dtype.kind == "u":
            v = (u % np.uint64(k + 1)).astype(np.int64)
        else:
            v = (u % np.uint64(2 * k + 1)).astype(np.int64) - k
    return v.astype(dtype)


def fill_exact(buf, rank, nranks, op):
    """Fill the flat array ``buf`` with :func:`exact_values` ``(0, buf.size, ...)``, in blocks."""
    for s in range(0, buf.size, _BLOCK):
        e = min(s + _BLOCK, buf.size)
        buf[s:e] = exact_values(s, e, rank, nranks, buf.dtype, op)


def _bits(a):
    return a.view(f"u{a.dtype.itemsize}") if a.dtype.kind == "f" else a


def compare(got, want):
    """Return (#elements not bitwise equal, largest |got - want|) of two flat arrays."""
    wrong, err = 0, 0.0
    for s in range(0, got.size, _BLOCK):
        g, w = got[s:s + _BLOCK], want[s:s + _BLOCK]
        bad = _bits(g) != _bits(w)
        n = int(np.count_nonzero(bad))
        if n:
            wrong += n
            with np.errstate(invalid="ignore", over="ignore"):
                diff = np.abs(g[bad].astype(np.float64) - w[bad].astype(np.float64))
            diff[np.isnan(diff)] = np.inf  # NaN where a number was due: infinitely wrong
            err = max(err, float(diff.max()))
    return wrong, err


def _poison(buf):
    """Overwrite ``buf`` with a value that stale or unwritten results will not match."""
    if buf.dtype.kind == "f":
        buf.fill(np.nan)
    else:
        buf.fill(np.iinfo(buf.dtype).max)


def _crc(buf):
    return zlib.crc32(memoryview(buf).cast("B")) if buf.size else 0


# --- the harness proper -------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """One implementation under test.

    ``run(comm, sendbuf, recvbuf, op)`` performs the collective; ``sendbuf``
    is ``MPI.IN_PLACE`` for in-place runs.
    """

    name: str
    run: Callable


@dataclass(frozen=True)
class Collective:
    """What is specific to one collective (the nccl-tests per-collective file).

    Attributes:
        name: e.g. "allreduce".
        nbytes: ``nbytes(count, itemsize)`` -> bytes per rank (algbw numerator).
        busbw_factor: ``busbw_factor(nranks)`` -> busbw / algbw.
        init: ``init(buf, rank, nranks, op)`` fills a rank's input.
        reference: the :class:`Case` every other case is checked against
            (its result is the expected result).
    """

    name: str
    nbytes: Callable
    busbw_factor: Callable
    init: Callable
    reference: Case


def _time_one(comm, case, send, out, op, inplace, pristine):
    if inplace:
        out[...] = pristine
        sendarg = MPI.IN_PLACE
    else:
        _poison(out)
        sendarg = send
    comm.Barrier()
    t0 = time.perf_counter()
    case.run(comm, sendarg, out, op)
    return time.perf_counter() - t0


def measure(comm, collective, cases, count, dtype, op, *, inplace=False, iters=10,
            warmup=2, budget=None, min_iters=3):
    """Time and check ``cases`` and the collective's reference on one configuration.

    Collective: every rank must call it with the same arguments.

    Args:
        comm: the communicator to run on.
        collective: a :class:`Collective`.
        cases: list of :class:`Case` (implementations under test).
        count: elements per rank.
        dtype: numpy dtype.
        op: reduction op name, passed to ``init`` and the cases.
        inplace: run in place (result buffer restored from the input before
            every repetition, outside the timing).
        iters: timed repetitions (at most that many when ``budget`` is set).
        warmup: untimed repetitions of every case before timing.
        budget: if set (seconds), lower ``iters`` so that the timed
            repetitions of all cases together take about this long, judged
            from the warm-up (never below ``min_iters``); the same count is
            used for every case and agreed across ranks.
        min_iters: lower bound for ``iters`` under a budget.

    Returns:
        One dict per case, reference first, with keys ``name``, ``nranks``,
        ``count``, ``dtype``, ``op``, ``inplace``, ``bytes``, ``iters``,
        ``times`` (seconds per repetition, max over ranks), ``time``
        (median), ``algbw``, ``busbw`` (GB/s), ``wrong`` (elements differing
        from the reference, summed over ranks, worst call, warm-up included;
        always 0 for the reference itself), ``maxerr``, ``identical`` (all
        ranks held bitwise-identical results after every call), ``input_intact``
        (the send buffer held the original input after every call of this
        case, on every rank).
    """
    nranks, rank = comm.Get_size(), comm.Get_rank()
    dtype = np.dtype(dtype)
    allcases = [collective.reference] + list(cases)
    send = np.empty(count, dtype)
    collective.init(send, rank, nranks, op)
    ours = np.empty(count, dtype)
    expected = np.empty(count, dtype)

    send_crc = _crc(send)
    ncases = len(allcases)
    changed = np.zeros(ncases, np.int64)
    maxerr = np.zeros(ncases)
    # Per case, one entry per call, warm-up calls included: a result that is
    # wrong only on the first call (state built lazily) must not escape.
    wrong_calls = [[] for _ in allcases]
    crc_calls = [[] for _ in allcases]

    def buffer_of(k):
        return expected if k == 0 else ours

    def call(k, case):
        """One timed call of case ``k`` and its checks (outside the timing)."""
        out = buffer_of(k)
        seconds = _time_one(comm, case, send, out, op, inplace, send)
        crc_calls[k].append(_crc(out))
        n = 0
        if k > 0:  # ``expected`` holds the reference's result on this input
            n, err = compare(ours, expected)
            maxerr[k] = max(maxerr[k], err)
        wrong_calls[k].append(n)
        if _crc(send) != send_crc:
            # Blame this case, and give the next ones their true input back.
            changed[k] += 1
            collective.init(send, rank, nranks, op)
        return seconds

    # Warm-up (the reference first, so there is an expected result), timed
    # locally only to size the run under a budget.
    spent = np.zeros(1)
    for k, case in enumerate(allcases):
        for _ in range(warmup):
            spent[0] += call(k, case)
    if budget is not None and warmup > 0:
        comm.Allreduce(MPI.IN_PLACE, spent, op=MPI.MAX)
        per_rep = spent[0] / warmup
        if per_rep > 0:
            iters = max(min_iters, min(iters, int(budget / per_rep)))

    times = np.zeros((ncases, iters))
    for it in range(iters):
        for k, case in enumerate(allcases):
            times[k, it] = call(k, case)
    wrong = np.array(wrong_calls, np.int64).reshape(ncases, warmup + iters)
    crcs = np.array(crc_calls, np.int64).reshape(ncases, warmup + iters)

    # Agreement: max of times, sum of wrong counts, max error, CRC equality.
    comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    comm.Allreduce(MPI.IN_PLACE, wrong, op=MPI.SUM)
    comm.Allreduce(MPI.IN_PLACE, maxerr, op=MPI.MAX)
    crc_lo, crc_hi = crcs.copy(), crcs.copy()
    comm.Allreduce(MPI.IN_PLACE, crc_lo, op=MPI.MIN)
    comm.Allreduce(MPI.IN_PLACE, crc_hi, op=MPI.MAX)
    comm.Allreduce(MPI.IN_PLACE, changed, op=MPI.SUM)

    nbytes = collective.nbytes(count, dtype.itemsize)
    factor = collective.busbw_factor(nranks)
    rows = []
    for k, case in enumerate(allcases):
        t = statistics.median(times[k]) if iters else float("nan")
        rows.append(dict(
            name=case.name, nranks=nranks, count=count, dtype=dtype.name, op=op,
            inplace=bool(inplace), bytes=nbytes, iters=iters,
            times=[float(x) for x in times[k]], time=float(t),
            algbw=algbw(nbytes, t), busbw=busbw(nbytes, t, factor),
            wrong=int(wrong[k].max()) if wrong.size else 0, maxerr=float(maxerr[k]),
            identical=bool(np.array_equal(crc_lo[k], crc_hi[k])),
            input_intact=bool(changed[k] == 0)))
    return rows


# --- reporting ---------------------------------------------------------------

def format_table(columns, rows):
    """Render rows as a fixed-width text table.

    Args:
        columns: list of ``(header, function(row) -> str)``.
        rows: list of row objects passed to the functions.

    Returns:
        The table as one string (header line, then one line per row).
    """
    cells = [[h for h, _ in columns]] + [[f(r) for _, f in columns] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in cells]
    return "\n".join(lines)


def fmt_num(x, digits=3):
    """Compact number: fixed point with ``digits`` significant figures where sensible."""
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return "inf" if x > 0 else ("nan" if x != x else "-inf")
    if x == 0:
        return "0"
    if abs(x) >= 10 ** digits:
        return f"{x:.0f}"
    decimals = max(0, digits - 1 - int(math.floor(math.log10(abs(x)))))
    return f"{x:.{decimals}f}"


def environment(comm):
    """Facts about the machine and software of a run, for JSON reports."""
    import mpi4py

    versions = {"python": platform.python_version(), "mpi4py": mpi4py.__version__,
                "numpy": np.__version__}
    for mod in ("numba", "pycollective"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:  # a report must not fail over a version string
            versions[mod] = None
    return dict(
        hostname=socket.gethostname(), cpu_count=os.cpu_count(), platform=platform.platform(),
        machine=platform.machine(), nranks=comm.Get_size(),
        mpi_library=" ".join(MPI.Get_library_version().strip().splitlines()[0].split()),
        mpi_library_version=MPI.Get_library_version().strip(),
        mpi_standard="%d.%d" % MPI.Get_version(),
        versions=versions, argv=list(sys.argv),
        time_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
