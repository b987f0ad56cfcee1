"""The ledger, measured: memory and traffic of each ZeRO stage beside the lecture's formulas.

For each communicator size N, :func:`measure` runs the first N ranks of the
world as one group (the other ranks sleep meanwhile, so they take no core
away), builds a :class:`ZeroOptimizer` for an MLP of about M parameters in
each stage, runs a warm-up step and ``steps`` measured steps on random
data, and records per rank:

* bytes held, from the arrays themselves (``nbytes``): working parameters,
  gradients, float32 optimizer state (master weights, float32 gradients,
  Adam's m and v) -- beside :func:`pycollective.model.ledger.memory_per_rank`;
* the resident memory the process gained (``VmRSS`` after the steps minus
  before the optimizer was built) and its peak during the steps
  (``VmHWM`` after resetting it through ``/proc/self/clear_refs``), a
  cross-check that includes what ``nbytes`` leaves out: activations, the
  gradient buckets and gathered layers of stages 2 and 3, temporaries;
* the elements it sent in a step (counted by the optimizer's one
  collective layer, :mod:`pycollective.zero._comms`) beside ``2M(N-1)/N``
  (stages 0-2) and ``3M(N-1)/N`` (stage 3);
* time, three ways, each the slowest rank's, and of that the lower
  quartile over steps or repetitions (other jobs on a shared machine only
  ever add time, in bursts; the model's α, β, γ are measured the same way):

  - ``step``: the whole training step;
  - ``in step``: the time the step spent inside its collective calls --
    including waiting for peers that were still computing (skew), and for
    stage 2 and 3's overlapped reduce-scatters only what was not hidden;
  - ``comm``: the same calls as the step made them (collective, count,
    dtype, in order) replayed one at a time, each after a barrier, on
    buffers of their size: the time of the collectives themselves, which is
    what the α-β-γ model prices;
  - ``1-elem``: those calls again with one element per rank: what each
    costs besides its bytes (the library's per-call work and Python, beside
    the model's α terms, ``1-elem model``).

  Beside ``comm``, the prediction of :func:`pycollective.model.ledger.call_time`
  summed over those calls, with α, β (at the calls' chunk size) and γ (of
  the wire dtype) measured on the group just before
  (:func:`pycollective.bench._calibration.calibrate`, ring exchanges and
  kernels only, about a second at N = 2); with ``calibrate=False`` from the
  model's saved calibration or built-in defaults instead.
"""

import ctypes
import ctypes.util
import gc
import time

import numpy as np
from mpi4py import MPI

from ..collectives.auto import layout_of
from ..runtime.context import get_context
from ._timing import lower_quartile, slowest, timed_call
from ._calibration import calibrate as _calibrate
from ..model.choice import rates
from ..model.ledger import STAGES, call_time, memory_per_rank, traffic_per_rank
from ..model.params import load_params, params_for
from ..zero._mlp import MLP
from ..zero._optimizer import ZeroOptimizer
from ..zero._precision import PRECISIONS

__all__ = ["measure", "mlp_for", "rss", "replay", "predict", "overlap"]

_DTYPES = {d.name: d for d in list(PRECISIONS.values()) + [np.dtype(np.int32)]}


def rss():
    """``(current, peak)`` resident bytes of this process (Linux ``/proc``), or (None, None)."""
    found = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    found[key] = int(value.split()[0]) * 1024
    except OSError:
        return None, None
    return found.get("VmRSS"), found.get("VmHWM")


def _reset_peak():
    """Make VmHWM start again from VmRSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _return_freed_memory():
    """Make glibc give large freed arrays back to the system, so RSS follows what is held.

    glibc raises its mmap threshold after large frees (up to 32 MB) and then
    keeps freed arrays in its heap: the next configuration's RSS would not
    grow.  A fixed threshold of 128 KiB keeps every array larger than that
    in its own mapping, unmapped when freed.  Elsewhere: nothing happens.
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt(-3, 128 * 1024)   # M_MMAP_THRESHOLD
        libc.malloc_trim(0)
    except (OSError, AttributeError, TypeError):
        pass


def mlp_for(count, nlayers=3):
    """An MLP of ``nlayers`` square layers with about ``count`` parameters."""
    width = max(2, int(round((count / nlayers) ** 0.5)))
    return MLP([width] * (nlayers + 1))


def _sleep_until_all_arrive(world):
    """A barrier that waits asleep: ranks outside the measured group must not take a core."""
    request = world.Ibarrier()
    while not request.Test():
        time.sleep(0.002)


def replay(comms, calls, reps=7):
    """Seconds of ``calls`` ((collective, count, dtype name), as a step made them) run alone.

    Each call runs blocking after a barrier (:func:`pycollective.bench._timing.timed_call`),
    so neither skew nor overlap is in it; collective over ``comms.comm``.
    Returns ``(lower quartile over reps of the sum over calls, lower quartile
    of each call)``, each call's time the slowest rank's.
    """
    bufs = [np.zeros(count, _DTYPES[dtype]) for _, count, dtype in calls]
    run = {"allreduce": comms.allreduce, "reduce_scatter": comms.reduce_scatter,
           "allgather": comms.allgather}
    times = np.zeros((reps + 1, len(calls)))
    for rep in range(reps + 1):  # the first is a warm-up (scratch, first touch of bufs)
        for i, ((collective, _, _), buf) in enumerate(zip(calls, bufs)):
            times[rep, i] = timed_call(comms.comm,
                                       lambda f=run[collective], b=buf: f(b, counted=False))
    times = slowest(comms.comm, times)[1:]
    return (lower_quartile(times.sum(axis=1)),
            [lower_quartile(column) for column in times.T])


def predict(calls, nranks, flat):
    """α-β-γ seconds of ``calls`` on ``nranks`` ranks with the model parameters ``flat``.

    β and γ are taken at each call's chunk size (a ring moves and reduces
    chunks of ceil(count/N) elements), γ of the call's dtype.
    """
    total = 0.0
    for collective, count, dtype in calls:
        dt = _DTYPES[dtype]
        beta, gamma = rates(flat, max(1, -(-count // nranks)), dt)
        total += call_time(collective, count, nranks, dt.itemsize, alpha=flat["alpha"],
                           beta=beta, gamma=gamma)
    return total


def _typical_slowest(comm, values):
    return lower_quartile(slowest(comm, values))


def _one(comm, model, stage, precision, batch, seed, steps=5, reps=7):
    """Measure one (N, stage) on ``comm``; returns this rank's numbers."""
    rng = np.random.default_rng(seed + comm.Get_rank())
    x = rng.standard_normal((batch, model.sizes[0])).astype(np.float32)
    y = rng.integers(0, model.sizes[-1], batch)
    params = model.init(seed)
    before, _ = rss()
    opt = ZeroOptimizer(params, model.layers, comm, stage=stage, precision=precision)
    model.train_step(opt, x, y, batch * comm.Get_size())        # warm-up (kernels, contexts)
    resettable = _reset_peak()
    opt.reset_peak()
    step_s, in_step_s = [], []
    for _ in range(max(1, steps)):
        opt.comms.traffic = type(opt.comms.traffic)()
        comm.Barrier()
        t0 = time.perf_counter()
        model.train_step(opt, x, y, batch * comm.Get_size())
        step_s.append(time.perf_counter() - t0)
        in_step_s.append(opt.comms.traffic.seconds)
    now, peak = rss()
    traffic = opt.comms.traffic
    calls = list(traffic.log)
    comm_s, per_call = replay(opt.comms, calls, reps) if comm.Get_size() > 1 else (0.0, [])
    # The same calls with one element per rank: what a call costs besides its bytes.
    tiny = [(c, min(count, comm.Get_size()), dtype) for c, count, dtype in calls]
    fixed_s = replay(opt.comms, tiny, reps)[0] if comm.Get_size() > 1 else 0.0
    out = dict(opt.memory(), sent=traffic.elements, calls=traffic.calls, call_log=calls,
               comm_s=comm_s, call_s=per_call, fixed_s=fixed_s,
               in_step_s=_typical_slowest(comm, in_step_s),
               step_s=_typical_slowest(comm, step_s),
               rss=None if before is None else now - before,
               peak_rss=None if (before is None or not resettable) else peak - before,
               layers=[layer.size for layer in opt.layers], itemsize=opt.dtype.itemsize,
               dtype=opt.wire.name)
    return out


def _model_params(comm, dtypes, calibrate, saved):
    """``(flat parameters for comm, where they come from)``; collective over ``comm``."""
    layout = layout_of(get_context(comm))
    if calibrate and comm.Get_size() > 1:
        entry = _calibrate(comm, max_bytes=1 << 23, reps=5, dtypes=dtypes, counts=())
        flat = params_for(entry, comm.Get_size(), layout)
        return flat, (f"measured on the group just before (ring exchanges 4 B-8 MiB, "
                      f"kernels of {', '.join(dtypes)})")
    flat = params_for(saved, comm.Get_size(), layout)
    return flat, flat.get("source") or "given"


def measure(world, count, *, sizes=(1, 2, 4, 8), stages=STAGES, precision="fp16", batch=8,
            seed=0, params=None, calibrate=True, steps=5, reps=7):
    """The measured ledger; collective over ``world``; the same rows on every rank.

    Args:
        world: the communicator whose first N ranks form the group of size N.
        count: M, about (the MLP's layers are square).
        sizes: the N to measure (those above the world size are skipped).
        stages: which of 0 (baseline data parallelism), 1, 2, 3.
        precision: working precision ("fp16": the lecture's ledger).
        batch: samples per rank.
        params: the model's α, β, γ when not calibrating (default: this
            machine's saved calibration or the built-in defaults,
            :func:`pycollective.model.load_params`).
        calibrate: measure α, β, γ on each group first (see the module).
        steps: measured training steps; reps: replays of the step's calls.

    Returns:
        One dict per (N, stage): measured and predicted bytes, elements sent,
        times; measured numbers are rank 0's, except the times (slowest
        rank) and ``sent`` (largest over ranks).
    """
    model = mlp_for(count)
    saved = load_params() if params is None else params
    rank, wsize = world.Get_rank(), world.Get_size()
    _return_freed_memory()
    gc.collect()  # once: arrays are freed by reference counting, none sits in a cycle
    tiny = MLP([4, 4, 4])
    for stage in stages:  # compile kernels, create contexts: not in any measurement
        _one(world, tiny, stage, precision, 2, seed, steps=1, reps=1)
    wire = PRECISIONS[precision].name
    dtypes = tuple(dict.fromkeys(("float32", wire)))
    rows = []
    for n in sizes:
        if n > wsize:
            continue
        comm = world.Split(0 if rank < n else MPI.UNDEFINED, rank)
        mine = None
        if comm != MPI.COMM_NULL:
            flat, source = _model_params(comm, dtypes, calibrate, saved)
            chunk = -(-max(model.layer_sizes) // n)  # a layer's ring chunk, in elements
            beta, gamma = rates(flat, chunk, PRECISIONS[precision])
            rates_at_chunk = dict(alpha=flat["alpha"], beta=beta, gamma=gamma, chunk=chunk)
            mine = []
            for stage in stages:
                got = _one(comm, model, stage, precision, batch, seed, steps, reps)
                got["sent"] = comm.allreduce(got["sent"], op=MPI.MAX)
                got["predicted_s"] = predict(got["call_log"], n, flat)
                got["fixed_predicted_s"] = predict([(c, n, d) for c, _, d in got["call_log"]],
                                                   n, flat)
                got["source"], got["rates"] = source, rates_at_chunk
                mine.append(got)
            comm.Free()
        _sleep_until_all_arrive(world)
        for stage, got in zip(stages, world.bcast(mine, root=0)):
            w = got["itemsize"]
            formula = memory_per_rank(stage, model.count, n, working_bytes=w)
            rows.append(dict(
                nranks=n, stage=stage, count=model.count, precision=precision,
                params=got["params"], grads=got["grads"], optimizer=got["optimizer"],
                total=got["total"], transient=got["transient"], rss=got["rss"],
                peak_rss=got["peak_rss"], formula=formula["total"],
                formula_parts=formula,
                sent=got["sent"], sent_formula=traffic_per_rank(stage, model.count, n),
                calls=got["calls"], comm_s=got["comm_s"], in_step_s=got["in_step_s"],
                step_s=got["step_s"], layers=got["layers"], call_log=got["call_log"],
                call_s=got["call_s"], fixed_s=got["fixed_s"],
                fixed_predicted_s=got["fixed_predicted_s"], predicted_s=got["predicted_s"],
                params_source=got["source"], rates=got["rates"]))
    return rows


def overlap(comm, count, *, precision="fp32", stage=2, batch=8, limits=(1, 2), reps=15,
            seed=0, nlayers=3):
    """Step times of ``stage`` with each ``buckets_in_flight`` in ``limits``, interleaved.

    1 waits for each layer's reduce-scatter before the next layer's backward
    (no overlap); larger values let it run during the backward below.
    Collective over ``comm``.  Returns ``{limit: slowest rank's step time of
    each repetition}`` (the same on every rank), and checks that every limit
    ends with bitwise the same master weights.
    """
    model = mlp_for(count, nlayers)
    rng = np.random.default_rng(seed + comm.Get_rank())
    x = rng.standard_normal((batch, model.sizes[0])).astype(np.float32)
    y = rng.integers(0, model.sizes[-1], batch)
    opts = {k: ZeroOptimizer(model.init(seed), model.layers, comm, stage=stage,
                             precision=precision, buckets_in_flight=k) for k in limits}
    for opt in opts.values():  # warm-up: kernels, contexts, the helper thread
        model.train_step(opt, x, y, batch * comm.Get_size())
    times = {k: [] for k in limits}
    for rep in range(reps):
        order = list(opts.items())
        for k, opt in (order if rep % 2 == 0 else order[::-1]):  # neither always goes first
            times[k].append(timed_call(comm, lambda o=opt: model.train_step(
                o, x, y, batch * comm.Get_size())))
    masters = [opt.master for opt in opts.values()]
    if not all(np.array_equal(m, masters[0]) for m in masters[1:]):
        raise AssertionError("buckets_in_flight changed the weights")
    return {k: slowest(comm, v) for k, v in times.items()}
