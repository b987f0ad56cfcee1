"""The lecture's memory and traffic ledger of data parallelism and ZeRO (section 2.4, table 3).

Memory per rank, in bytes, for M parameters on N ranks with mixed precision
(the lecture's figure 6: 2 B of half-precision parameters, 2 B of
half-precision gradients and 16 B of float32 optimizer state -- master
weights, float32 gradients, Adam's m and v -- per parameter):

=========  ==================  =========================================
stage      lecture             what is sharded
=========  ==================  =========================================
0          20M                 nothing: baseline data parallelism
1          4M + 16M/N          optimizer state
2          2M + 18M/N          optimizer state and gradients
3          20M/N               optimizer state, gradients and parameters
=========  ==================  =========================================

:func:`memory_per_rank` takes the working precision as an argument
(``working_bytes``: 2 for fp16/bf16, 4 for fp32 training), so the same
formula covers float32 runs.

Traffic: the elements each rank sends per iteration.  An allreduce is a
reduce-scatter and an allgather, each moving ``(N-1)/N`` of the vector, so
baseline data parallelism sends ``2M(N-1)/N`` -- the lecture's "2M" for large
N.  Stages 1 and 2 reduce-scatter the gradients and allgather the updated
parameters instead: the same ``2M(N-1)/N``.  Stage 3 allgathers each layer's
parameters before its forward and again before its backward, and
reduce-scatters the gradients: ``3M(N-1)/N``.  :func:`ring_sent` counts what
the library's ring reduce-scatter and allgather send exactly, chunk by chunk
(:func:`pycollective.partition`), for M not divisible by N.

Time: :func:`stage_comm_time` prices one iteration's collectives with the
model's α-β-γ, a ring reduce-scatter costing ``(N-1)(α + cβ) + (N-1)cγ`` and
a ring allgather ``(N-1)(α + cβ)`` (c: the largest chunk in bytes), i.e. the
two halves of :func:`pycollective.algorithms.ring.ring_cost`.

:func:`worked_example_4_5` reproduces the lecture's worked example 4.5
(M = 175e9, N = 64) from these functions.
"""

from typing import Dict, List, NamedTuple, Sequence

from ..data.partition import chunk_bounds

__all__ = ["STAGES", "LECTURE_MEMORY", "memory_per_rank", "traffic_per_rank", "ring_sent",
           "collectives_per_iteration", "call_time", "stage_comm_time", "worked_example_4_5",
           "Example45"]

STAGES = (0, 1, 2, 3)

#: The lecture's formulas, as text, by stage.
LECTURE_MEMORY = {0: "20M", 1: "4M + 16M/N", 2: "2M + 18M/N", 3: "20M/N"}
#: The lecture's traffic, as text, by stage (elements per rank per iteration).
LECTURE_TRAFFIC = {0: "2M", 1: "2M", 2: "2M", 3: "3M"}


def _check_stage(stage):
    if stage not in STAGES:
        raise ValueError(f"ZeRO stage must be one of {STAGES}, got {stage!r}")


def memory_per_rank(stage, count, nranks, *, working_bytes=2, optimizer_bytes=16):
    """Bytes of parameters + gradients + optimizer state on one rank (the lecture's table 3).

    Args:
        stage: 0 (baseline data parallelism), 1, 2 or 3.
        count: M parameters.
        nranks: N.
        working_bytes: bytes of a working parameter and of a gradient (2 for
            fp16/bf16, the lecture's case; 4 for fp32 training).
        optimizer_bytes: bytes of optimizer state per parameter (16: master
            weights, float32 gradients, Adam's m and v).

    Returns:
        ``{"params": ..., "grads": ..., "optimizer": ..., "total": ...}`` in
        bytes (floats: M/N is not rounded).
    """
    _check_stage(stage)
    if nranks < 1:
        raise ValueError(f"nranks must be >= 1, got {nranks}")
    m, n, w = float(count), float(nranks), float(working_bytes)
    params = w * m / n if stage >= 3 else w * m
    grads = w * m / n if stage >= 2 else w * m
    optimizer = optimizer_bytes * m / n if stage >= 1 else optimizer_bytes * m
    return {"params": params, "grads": grads, "optimizer": optimizer,
            "total": params + grads + optimizer}


def traffic_per_rank(stage, count, nranks):
    """Elements one rank sends per iteration: ``2M(N-1)/N`` (stages 0-2), ``3M(N-1)/N`` (3)."""
    _check_stage(stage)
    factor = 3.0 if stage == 3 else 2.0
    return factor * count * (nranks - 1) / nranks


def ring_sent(collective, count, nranks, rank):
    """Elements ``rank`` sends in the library's ring ``collective`` of ``count`` elements.

    The ring reduce-scatter sends every chunk but the rank's own
    (``r-1, r-2, ...``), the ring allgather every chunk but the next rank's
    (``r, r-1, ...``); a ring allreduce is both.
    """
    if nranks == 1 or count == 0:
        return 0
    bounds = chunk_bounds(count, nranks)

    def length(c):
        c %= nranks
        return bounds[c + 1] - bounds[c]

    if collective == "reduce_scatter":
        return count - length(rank)
    if collective == "allgather":
        return count - length(rank + 1)
    if collective == "allreduce":
        return 2 * count - length(rank) - length(rank + 1)
    raise ValueError(f"no ring schedule for {collective!r}")


def collectives_per_iteration(stage, layer_sizes: Sequence[int]) -> List[tuple]:
    """``[(collective, count), ...]`` one iteration of ``stage`` makes, layer by layer.

    Stage 0 allreduces each layer's gradients; stages 1 and 2 reduce-scatter
    them and allgather the updated parameters; stage 3 allgathers each
    layer's parameters for its forward and for its backward and
    reduce-scatters its gradients.  (The one-element agreement on overflow
    is left out: it is noise next to M.)
    """
    _check_stage(stage)
    calls = []
    for size in layer_sizes:
        if stage == 0:
            calls.append(("allreduce", size))
        elif stage in (1, 2):
            calls += [("reduce_scatter", size), ("allgather", size)]
        else:
            calls += [("allgather", size), ("allgather", size), ("reduce_scatter", size)]
    return calls


def call_time(collective, count, nranks, itemsize, *, alpha, beta, gamma=0.0):
    """Predicted seconds of one ring ``collective`` ("allreduce", "reduce_scatter",
    "allgather") of ``count`` elements of ``itemsize`` bytes on ``nranks`` ranks.

    A reduce-scatter is ``(N-1)(α + cβ) + (N-1)cγ``, an allgather
    ``(N-1)(α + cβ)`` (c: the largest chunk in bytes), an allreduce both.
    """
    if nranks == 1 or count == 0:
        return 0.0
    if collective not in ("allreduce", "reduce_scatter", "allgather"):
        raise ValueError(f"no ring schedule for {collective!r}")
    steps = nranks - 1
    chunk = -(-count // nranks) * itemsize
    move = steps * (alpha + chunk * beta)
    reduce = steps * chunk * gamma
    return {"allreduce": 2 * move + reduce, "reduce_scatter": move + reduce,
            "allgather": move}[collective]


def stage_comm_time(stage, layer_sizes, nranks, itemsize, *, alpha, beta, gamma=0.0):
    """Predicted seconds of one iteration's collectives (α-β-γ, ring schedules).

    Args:
        stage: 0-3.
        layer_sizes: elements of each layer's parameters (each layer is one
            collective call per step of the stage).
        nranks: N.
        itemsize: bytes per element on the wire (2 for fp16/bf16).
        alpha, beta, gamma: the model's parameters (s per message, s per byte
            sent, s per byte reduced).
    """
    return sum(call_time(collective, count, nranks, itemsize, alpha=alpha, beta=beta,
                         gamma=gamma)
               for collective, count in collectives_per_iteration(stage, layer_sizes))


class Example45(NamedTuple):
    """The lecture's worked example 4.5, computed."""

    memory_gb: Dict[int, float]      # per rank, by stage (1 GB = 1e9 B)
    traffic_gb: Dict[int, float]     # per rank per iteration, fp16, the lecture's 2M / 3M
    comm_s: float                    # 2M traffic over the link, not overlapped
    compute_s: float                 # 6PT / (N Π)
    comm_share: float                # comm_s / compute_s
    small_batch_compute_s: float     # the same at T = 8192 tokens
    small_batch_comm_share: float    # comm / (comm + compute) at T = 8192
    crossover_tokens: float          # T* where compute time equals comm time


def worked_example_4_5(count=175e9, nranks=64, bandwidth=50e9, flops=125e12, tokens=3.2e6,
                       small_tokens=8192, element_bytes=2):
    """The lecture's example 4.5: GPT-3-sized ZeRO on 64 GPUs, from this module's formulas.

    The lecture's traffic is the large-N "2M" (it does not take the
    (N-1)/N factor), so the example does the same: 2M elements of 2 bytes.
    """
    memory = {s: memory_per_rank(s, count, nranks)["total"] / 1e9 for s in STAGES}
    traffic = {s: (3.0 if s == 3 else 2.0) * count * element_bytes / 1e9 for s in STAGES}
    comm = traffic[0] * 1e9 / bandwidth
    compute = 6 * count * tokens / (nranks * flops)
    small = 6 * count * small_tokens / (nranks * flops)
    crossover = traffic[0] * 1e9 * nranks * flops / (bandwidth * 6 * count)
    return Example45(memory, traffic, comm, compute, comm / compute, small,
                     comm / (comm + small), crossover)
