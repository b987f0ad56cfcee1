"""The ledger, measured: memory and traffic of each ZeRO stage beside the lecture's formulas.

For each communicator size N (sub-communicators of the world: groups of N
ranks run side by side) and each stage, :func:`measure` builds a
:class:`ZeroOptimizer` for an MLP of about M parameters, runs a warm-up step
and a measured step on random data, and records per rank:

* bytes held, from the arrays themselves (``nbytes``): working parameters,
  gradients, float32 optimizer state (master weights, float32 gradients,
  Adam's m and v) -- beside :func:`pycollective.model.ledger.memory_per_rank`;
* the resident memory the process gained (``VmRSS`` after the steps minus
  before the optimizer was built) and its peak during the steps
  (``VmHWM`` after resetting it through ``/proc/self/clear_refs``), a
  cross-check that includes what ``nbytes`` leaves out: activations, the
  gradient buckets and gathered layers of stages 2 and 3, temporaries;
* the elements it sent in the measured step (counted by the optimizer's one
  collective layer, :mod:`pycollective.zero._comms`) beside ``2M(N-1)/N``
  (stages 0-2) and ``3M(N-1)/N`` (stage 3);
* the time its collectives took (slowest rank) beside the α-β-γ prediction
  of :func:`pycollective.model.ledger.stage_comm_time` with this machine's
  calibration (or the model's defaults, which price every dtype's reduction
  at float32's γ), for the wire dtype at the layers' size.
"""

import ctypes
import ctypes.util
import gc
import time

import numpy as np
from mpi4py import MPI

from ..model.choice import rates
from ..model.ledger import STAGES, memory_per_rank, stage_comm_time, traffic_per_rank
from ..model.params import load_params, params_for
from ._mlp import MLP
from ._optimizer import ZeroOptimizer

__all__ = ["measure", "mlp_for", "rss"]


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


def _one(comm, model, stage, precision, batch, seed):
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
    opt.comms.traffic = type(opt.comms.traffic)()
    comm.Barrier()
    t0 = time.perf_counter()
    model.train_step(opt, x, y, batch * comm.Get_size())
    step_s = time.perf_counter() - t0
    now, peak = rss()
    out = dict(opt.memory(), sent=opt.comms.traffic.elements, calls=opt.comms.traffic.calls,
               comm_s=opt.comms.traffic.seconds, step_s=step_s,
               rss=None if before is None else now - before,
               peak_rss=None if (before is None or not resettable) else peak - before,
               layers=[layer.size for layer in opt.layers], itemsize=opt.dtype.itemsize,
               dtype=opt.wire.name)
    return out


def measure(world, count, *, sizes=(1, 2, 4, 8), stages=STAGES, precision="fp16", batch=8,
            seed=0, params=None):
    """The measured ledger; collective over ``world``; the same rows on every rank.

    Args:
        world: the communicator to cut groups of N ranks from.
        count: M, about (the MLP's layers are square).
        sizes: the N to measure (those above the world size are skipped).
        stages: which of 0 (baseline data parallelism), 1, 2, 3.
        precision: working precision ("fp16": the lecture's ledger).
        batch: samples per rank.
        params: the model's α, β, γ (default: this machine's calibration or
            the defaults, :func:`pycollective.model.load_params`).

    Returns:
        One dict per (N, stage): measured and predicted bytes, elements sent,
        times; measured numbers are rank 0's of its group, except ``comm_s``
        and ``step_s`` (slowest rank) and ``sent`` (largest over ranks).
    """
    model = mlp_for(count)
    params = load_params() if params is None else params
    rank, wsize = world.Get_rank(), world.Get_size()
    _return_freed_memory()
    gc.collect()  # once: arrays are freed by reference counting, none sits in a cycle
    tiny = MLP([4, 4, 4])
    for stage in stages:  # compile kernels, create contexts: not in any measurement
        _one(world, tiny, stage, precision, 2, seed)
    rows = []
    for n in sizes:
        if n > wsize:
            continue
        ngroups = wsize // n
        color = rank // n if rank < ngroups * n else MPI.UNDEFINED
        comm = world.Split(color, rank)
        for stage in stages:
            mine = _one(comm, model, stage, precision, batch, seed) if comm != MPI.COMM_NULL \
                else None
            if comm != MPI.COMM_NULL:
                mine["comm_s"] = comm.allreduce(mine["comm_s"], op=MPI.MAX)
                mine["step_s"] = comm.allreduce(mine["step_s"], op=MPI.MAX)
                mine["sent"] = comm.allreduce(mine["sent"], op=MPI.MAX)
            got = world.bcast(mine, root=0)
            flat = params_for(params, n)
            w = got["itemsize"]
            # β and γ of the wire dtype at the layers' size (γ of float16 is
            # its own where calibrated: reducing it costs more than float32)
            beta, gamma = rates(flat, max(got["layers"]), np.dtype(got["dtype"]))
            formula = memory_per_rank(stage, model.count, n, working_bytes=w)
            rows.append(dict(
                nranks=n, stage=stage, count=model.count, precision=precision,
                params=got["params"], grads=got["grads"], optimizer=got["optimizer"],
                total=got["total"], transient=got["transient"], rss=got["rss"],
                peak_rss=got["peak_rss"], formula=formula["total"],
                formula_parts=formula,
                sent=got["sent"], sent_formula=traffic_per_rank(stage, model.count, n),
                calls=got["calls"], comm_s=got["comm_s"], step_s=got["step_s"],
                layers=got["layers"],
                predicted_s=stage_comm_time(stage, got["layers"], n, w, alpha=flat["alpha"],
                                            beta=beta, gamma=gamma),
                params_source=flat.get("source")))
        if comm != MPI.COMM_NULL:
            comm.Free()
    return rows
