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
  :func:`pycollective.bench._exact.fill_exact`), and its CRC-32 is kept;
* after every call, the CRC-32 of the send buffer is compared with the
  input's: a case that writes into its send buffer is blamed (and the input
  restored for the next case);
* at the end, a handful of collectives make every rank agree on the times
  (max over ranks), the wrong-element counts (summed over ranks, worst
  call), the largest error, whether all ranks held bitwise-identical
  results (CRC-32 after every call), and which cases touched their input.

Exact input data come from :mod:`pycollective.bench._exact` and timing from
:mod:`pycollective.bench._timing`; tables and the command line are the
commands' (:mod:`pycollective.bench._cli`).
"""

import math
import statistics
import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
from mpi4py import MPI

from ._exact import compare
from ..data.kernels import is_float
from ._timing import slowest, timed_call

__all__ = ["Case", "Collective", "measure", "failures", "algbw", "busbw"]


# --- bandwidth arithmetic (nccl-tests conventions) ----------------------------

def algbw(nbytes, seconds):
    """Algorithm bandwidth in GB/s (1e9 bytes): bytes per rank divided by time."""
    if seconds <= 0 or not math.isfinite(seconds):
        return float("nan")
    return nbytes / seconds / 1e9


def busbw(nbytes, seconds, factor):
    """Bus bandwidth in GB/s: ``algbw * factor`` (for allreduce factor = 2(N-1)/N)."""
    return algbw(nbytes, seconds) * factor


def _poison(buf):
    """Overwrite ``buf`` with a value that stale or unwritten results will not match."""
    if is_float(buf.dtype):
        buf.fill(np.nan)
    else:
        buf.fill(np.iinfo(buf.dtype).max)


def _crc(buf):
    return zlib.crc32(buf.view(np.uint8)) if buf.size else 0  # any dtype, bfloat16 too


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


def _time_one(comm, case, send, out, op, inplace, pristine, inner):
    if inplace:
        out[...] = pristine
        sendarg = MPI.IN_PLACE
    else:
        _poison(out)
        sendarg = send
    return timed_call(comm, lambda: case.run(comm, sendarg, out, op), inner)


def failures(rows):
    """Rows with wrong elements, replicas that differ, or a modified input."""
    return [r for r in rows if r.get("wrong") or not r.get("identical", True)
            or not r.get("input_intact", True)]


def measure(comm, collective, cases, count, dtype, op, *, inplace=False, iters=10,
            warmup=2, budget=None, min_iters=3, inner=1, empty=np.empty):
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
        inner: back-to-back calls per timed repetition (its time is per
            call), for calls shorter than the skew a barrier leaves between
            ranks; out of place only (in place, each call would reduce the
            last one's result).  Warm-up calls stay single, so every one of
            them is checked; of a timed repetition, the last call is.
        empty: ``empty(count, dtype)`` makes the input and the two result
            buffers (``numpy.empty``; the allreduce bench's ``--shared`` gives
            ``pycollective.shared_empty``, collective, so every rank makes them
            in the same order).

    Returns:
        One dict per case, reference first, with keys ``name``, ``nranks``,
        ``count``, ``dtype``, ``op``, ``inplace``, ``bytes``, ``iters``, ``inner``,
        ``times`` (seconds per repetition, max over ranks), ``time``
        (median), ``algbw``, ``busbw`` (GB/s), ``wrong`` (elements differing
        from the reference, summed over ranks, worst call, warm-up included;
        always 0 for the reference itself), ``maxerr``, ``identical`` (all
        ranks held bitwise-identical results after every call), ``input_intact``
        (the send buffer held the original input after every call of this
        case, on every rank).
    """
    if inner > 1 and inplace:
        raise ValueError("back-to-back calls (inner > 1) are timed out of place only")
    nranks, rank = comm.Get_size(), comm.Get_rank()
    dtype = np.dtype(dtype)
    allcases = [collective.reference] + list(cases)
    send = empty(count, dtype)
    collective.init(send, rank, nranks, op)
    ours = empty(count, dtype)
    expected = empty(count, dtype)

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

    def call(k, case, calls=1):
        """``calls`` timed calls of case ``k`` and the checks of the last (outside the timing)."""
        out = buffer_of(k)
        seconds = _time_one(comm, case, send, out, op, inplace, send, calls)
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
        spent = slowest(comm, spent)
        per_rep = spent[0] / warmup * inner
        if per_rep > 0:
            iters = max(min_iters, min(iters, int(budget / per_rep)))

    times = np.zeros((ncases, iters))
    for it in range(iters):
        for k, case in enumerate(allcases):
            times[k, it] = call(k, case, inner)
    wrong = np.array(wrong_calls, np.int64).reshape(ncases, warmup + iters)
    crcs = np.array(crc_calls, np.int64).reshape(ncases, warmup + iters)

    # Agreement: max of times, sum of wrong counts, max error, CRC equality.
    times = slowest(comm, times)
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
            inplace=bool(inplace), bytes=nbytes, iters=iters, inner=inner,
            times=[float(x) for x in times[k]], time=float(t),
            algbw=algbw(nbytes, t), busbw=busbw(nbytes, t, factor),
            wrong=int(wrong[k].max()) if wrong.size else 0, maxerr=float(maxerr[k]),
            identical=bool(np.array_equal(crc_lo[k], crc_hi[k])),
            input_intact=bool(changed[k] == 0)))
    return rows
