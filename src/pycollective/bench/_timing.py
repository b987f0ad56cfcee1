"""Timing collectives: the one home of every timing loop in the project.

A collective's time is the slowest rank's: each sample starts after a
``Barrier`` and the samples are reduced with MAX over ranks.  Contenders
take turns within each repetition (round robin), so a burst of load from
another process on a shared machine hits all of them alike instead of one.
Per-rank times stay local until the end and are reduced in one collective,
so timing adds no messages between samples.
"""

import time
from typing import Callable, Dict, Mapping, Union

import numpy as np
from mpi4py import MPI

__all__ = ["timed_call", "slowest", "rounds", "calls_for_budget", "lower_quartile",
           "idle_barrier"]


def timed_call(comm, fn: Callable[[], object], inner: int = 1, barrier=None) -> float:
    """A barrier (``comm.Barrier`` unless given), then this rank's seconds per call over
    ``inner`` back-to-back calls.

    Several calls per sample is how latency benchmarks (OSU) time small
    messages: one call is shorter than the skew a barrier leaves between ranks.
    """
    (barrier or comm.Barrier)()
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner


def slowest(comm, local) -> np.ndarray:
    """Element-wise MAX over ranks of an array of per-rank times (collective)."""
    local = np.ascontiguousarray(local, dtype=np.float64)
    out = np.empty_like(local)
    comm.Allreduce(local, out, op=MPI.MAX)
    return out


def rounds(comm, calls: Mapping[str, Callable[[], object]], reps: int,
           inner: Union[int, Mapping[str, int]] = 1) -> Dict[str, np.ndarray]:
    """Time every call ``reps`` times, taking turns; ``{name: slowest rank's time per rep}``.

    Args:
        comm: the communicator every call runs on (collective).
        calls: name -> function of no arguments (one collective call).
        reps: repetitions of the round.
        inner: back-to-back calls per sample, one number or one per name.
    """
    names = list(calls)
    per = {n: (inner if isinstance(inner, int) else inner[n]) for n in names}
    local = np.zeros((reps, len(names)))
    for i in range(reps):
        for j, name in enumerate(names):
            local[i, j] = timed_call(comm, calls[name], per[name])
    worst = slowest(comm, local)
    return {name: worst[:, j] for j, name in enumerate(names)}


def calls_for_budget(comm, fn: Callable[[], object], budget: float, cap: int = 1000) -> int:
    """How many back-to-back calls of ``fn`` take about ``budget`` seconds (the same on all ranks).

    Calls ``fn`` twice (a warm-up, then one timed call).
    """
    fn()
    one = float(slowest(comm, [timed_call(comm, fn)])[0])
    return max(1, min(cap, int(budget / max(one, 1e-7))))


def lower_quartile(samples) -> float:
    """The lower quartile of timing samples.

    Other processes on a shared machine only ever add time, in bursts; the
    lower quartile ignores the bursts without trusting one lucky sample.
    """
    return float(np.percentile(samples, 25))


# How often a rank waiting in idle_barrier looks again.
_IDLE_POLL_S = 2e-4


def idle_barrier(comm):
    """A barrier whose waiting ranks sleep instead of spinning: where ranks outnumber
    cores, a rank spinning in MPI's barrier takes half of a core that a rank timing a
    copy needs (bench membw's 'alone' at N = 4: 11.9 GB/s, against 17-21 GB/s from one
    process)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(_IDLE_POLL_S)
