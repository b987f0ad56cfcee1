"""The first-use measurement: the model's parameters from the machine the job runs on.

Without a calibration file the model has only built-in numbers, measured on
another machine; on a machine with other cores, memory and MPI library they
are other numbers (docs/cost-model.md#measured-on-first-use).  So, on a communicator's first
automatic choice, when rank 0 finds no calibration file (``PYCOLLECTIVE_MODEL``
or the cache's ``model.json``) and no saved measurement of this machine, all
ranks measure, at once and as they run inside an allreduce:

* α and β inside a node: a ring of ``Sendrecv`` (each rank sends to the right,
  receives from the left) of 8 B, 64 KiB and 4 MiB, on every node at once;
  across nodes the same ring among one rank per node gives the links between
  nodes.  A ring keeps the cost independent of N: every rank sends one message
  per step, whatever N is.
* γ per dtype: the sum kernel of float32 (and float64 where the process has
  loaded that kernel already; else float32's rate per byte) on 64 KiB (in
  cache) and 8 MiB (from memory) on every rank at once; the two-byte floats,
  which are compute bound, keep their built-in ratio to float32's γ.
* the memory bandwidth (copies of 8 MiB blocks, every rank at once: in the
  caches, and, where ranks have cores of their own, through a region out of
  them, whose slowdown β follows above 8 MiB), the cost of a sync
  (``Barrier``) and of the agreement step (a small ``Allreduce``).
* on one node, the library's own calls, on a duplicate of the communicator:
  ``allreduce(algorithm="ring")`` of 8 bytes, whose time beyond the agreement
  is nearly all α terms: α as the algorithms pay it, with the Python around
  each message (a bare ``Sendrecv`` has none), when that is more than the
  bare ring's; and the same of 64 KiB and 4 MiB, whose time beyond their α
  and γ terms is β as the algorithms pay it on vectors in cache and on large
  ones (copies, kernel passes, the MPI library's own transfer), when that is
  more than the bare ring's;
* and the shared-memory algorithm itself: ``allreduce(algorithm="shm")``
  of 8 B, 4 KiB, 64 KiB, 256 KiB, 1 MiB, 4 MiB and 9 MiB per rank on a duplicate of
  the communicator, as a program's repeated calls run it (the library's Python,
  the agreement folded into its first sync, its compiled steps and syncs).
  No α-β-γ formula prices what it does (it moves data at memory speed and
  synchronises with atomics, not messages), so the model takes its measured
  times (``corrections["shm"]``, each one's ratio to its α-β-γ cost), and
  the compiled code it loads is then loaded for the program's own calls.

Each number is the minimum over a few repetitions on every rank, then the
slowest rank's (one MAX reduction), so every rank holds the same parameters.
Ranks that share cores measure their own contention (the probe runs on the
real layout); the layout itself comes from the ranks' affinity masks
(:func:`~pycollective.collectives.auto.layout_of`).  Rank 0 keeps the result in
``$XDG_CACHE_HOME/pycollective/machines/<key>.json``, keyed by CPU model,
cores, MPI library and the ranks on each node, so later jobs on the same
machine and layout read it instead of measuring.  ``PYCOLLECTIVE_MEASURE=0``
turns the measurement off (the built-in defaults then serve); a calibration
file always wins over it.
"""

import hashlib
import json
import mmap
import os
import time
import warnings

import numpy as np
from mpi4py import MPI

from ..runtime import env as _env, machine as _machine, registry as _registry
from ..runtime.root import bcast_from_root
from ..node.group import node_comm
from ..data import kernels as _kernels
from ..data.kernels import get_kernel
from ..model.choice import measured_ratio, rates
from ..model.params import BUILTIN, DEFAULTS, ANY_DTYPE, load_params, params_for, write_json
from ..runtime.context import get_context
from .agree import agree_max

__all__ = ["VERSION", "machine_facts", "cache_file", "measure", "machine_params",
           "SMALL", "MID", "LARGE", "KERNEL_IN", "KERNEL_OUT"]

VERSION = 10  # 2: the library's own ring and shm calls timed; 3: shm's after its ways' trials,
             # the library's ring of MID bytes; 4: shm's ratios hold its agreement;
             # 5: shm at 256 KiB and 4 MiB too; 6: the copy rate out of the caches;
             # 7: shm's times held to the larger sizes'; its step at N = 2 up to 4 KiB;
             # 8: shm's after its stores' trials too; 9: shm above 64 KiB held per byte;
             # 10: shm's one step up to 4 MiB, its stores' trials three timed calls a kind
SMALL, MID, LARGE = 8, 64 << 10, 4 << 20      # bytes of the ring messages
PER_BYTE_HOLD = 1.5  # shm above MID: at most this times the next larger size's time per byte
KERNEL_IN, KERNEL_OUT = 64 << 10, 8 << 20     # bytes reduced: in a core's cache, from memory
_REPS = 3                                     # repetitions; the minimum counts
# The copy out of the caches: every rank of a node copies 8 MiB blocks within a region of
# its own, the node's regions together FAR_NODE_BYTES or twice its shared cache, whichever
# is more (each rank's between FAR_MIN and FAR_MAX).  The probe's other large measurements
# (4-9 MiB per rank) run partly in cache where a node has few ranks: on the 2-core VM at
# N = 2 every algorithm's 1e7-float call came out 27-42 % above its price.
FAR_NODE_BYTES, FAR_MIN, FAR_MAX = 256 << 20, 16 << 20, 64 << 20  # FAR_MIN > KERNEL_OUT
_FAR_PASSES = 2                               # passes over the region; the fastest counts
# bytes per rank of the timed shm calls; the largest just above shm's SINGLE_COPY_BYTES
# (8 MiB), so that it takes the way of every larger call where ranks outnumber cores.
# 256 KiB and 4 MiB: between 64 KiB, 1 MiB and 9 MiB a call's time per byte is not the
# log-mean of theirs (at 4 ranks per core 400 KB calls were priced 31-66 % above their time
# and 4 MB ones 32-37 % below); 4 MiB is also shm's last size of one compiled step
# (node.group.DOUBLE_LIMIT), 9 MiB a size of the phases above it
SHM_SIZES = (8, 4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 9 << 20)
_WARM = 3                                     # untimed library calls of each size first
_WARM_SMALL = 12                              # ... of each size up to MID (they settle later)
_LIBRARY_REPS = 5                             # timed library calls of each size
_LIBRARY_REPS_SMALL = 15                      # ... up to MID: short, and noisier per call
_SMALL_STEPS = 8                              # exchanges per repetition of the small message


def machine_facts(layout) -> dict:
    """What the saved measurement is kept for (the same on every rank of a node)."""
    library = " ".join(MPI.Get_library_version().replace("\0", "").split())[:200]
    return {"cpu": _machine.cpu_model(), "cpu_count": os.cpu_count(), "mpi": library,
            "mpi4py": __import__("mpi4py").__version__, "ranks_per_node": list(layout.nodes),
            "cores_per_node": list(layout.cores), "blocks": bool(layout.blocks),
            "probe": VERSION}


def cache_file(facts: dict) -> str:
    """Where the measurement of this machine and layout is kept."""
    key = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:20]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "pycollective", "machines", f"{key}.json")


# --- measuring --------------------------------------------------------------------------------

def _ring_time(comm, nbytes, steps, reps):
    """Minimum over ``reps`` of one ring exchange's time (``steps`` back to back) on this rank."""
    size, rank = comm.Get_size(), comm.Get_rank()
    right, left = (rank + 1) % size, (rank - 1) % size
    out = np.ones(max(nbytes, 1), np.uint8)
    into = np.empty_like(out)
    best = float("inf")
    for rep in range(reps + 1):  # the first warms the path (buffers, eager cells)
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(steps):
            comm.Sendrecv(out, right, 0, into, left, 0)
        t = (time.perf_counter() - start) / steps
        if rep:
            best = min(best, t)
    return best


def _local_time(fn, reps):
    fn()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def far_bytes(ranks_on_node, shared_cache=None):
    """Bytes of the region each of a node's ``ranks_on_node`` ranks copies within (see
    FAR_NODE_BYTES), for a shared cache of ``shared_cache`` bytes (default: this machine's,
    ``runtime.machine.cache_bytes(3)``)."""
    if shared_cache is None:
        shared_cache = _machine.cache_bytes(3)
    node = max(FAR_NODE_BYTES, 2 * shared_cache)
    return min(FAR_MAX, max(FAR_MIN, node // max(1, ranks_on_node)))


def _populated(nbytes):
    """``(array, owner)``: ``nbytes`` of writable memory with its pages already mapped: one
    ``MAP_POPULATE`` instead of a page fault per page (on the 2-core VM two ranks faulting
    32 MiB each in took 36-47 ms, populating it 9-10 ms); ``np.ones`` where there is none."""
    flags = getattr(mmap, "MAP_POPULATE", None)
    if flags is not None:
        try:
            owner = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | flags)
            return np.frombuffer(owner, np.uint8), owner
        except (OSError, ValueError):
            pass
    return np.ones(nbytes, np.uint8), None


def _copy_rates(node, far=True):
    """``(near, far, region)``: seconds per byte of copies of 8 MiB blocks, every rank of
    ``node`` at once, each pass after a Barrier, the fastest pass: ``near`` the first block
    to the second again and again (in the caches after the first), ``far`` each block to
    the next through a region of :func:`far_bytes` (out of them), and that region's bytes
    (0.0 and 0 unless ``far``).  Both passes make as many copies, so that where ranks share
    cores both wait for the scheduler alike (a pass of one copy ran whole before its core's
    other rank started, and four ranks per two cores gave ratios of 3.4 where two ranks
    had 1.8)."""
    nbytes = far_bytes(node.Get_size()) if far else 2 * KERNEL_OUT
    region, owner = _populated(nbytes)
    block = KERNEL_OUT
    pairs = nbytes // (2 * block)

    def rate(spread, passes):
        best = float("inf")
        for _ in range(passes):
            node.Barrier()
            start = time.perf_counter()
            for i in range(pairs):
                at = 2 * i * block if spread else 0
                np.copyto(region[at + block:at + 2 * block], region[at:at + block])
            best = min(best, time.perf_counter() - start)
        return best / (pairs * block)
    try:
        near = rate(False, _FAR_PASSES + 1)  # its first pass brings the two blocks in
        if not far:
            return near, 0.0, 0
        return near, rate(True, _FAR_PASSES), nbytes
    finally:
        del region
        if owner is not None:
            try:
                owner.close()
            except BufferError:  # a view still alive (an exception's traceback): the GC unmaps it
                pass


def _kernel_rate(comm, dtype, nbytes):
    kernel = get_kernel("sum", dtype)
    n = nbytes // np.dtype(dtype).itemsize
    a, b = np.ones(n, dtype), np.ones(n, dtype)
    out = np.empty(n, dtype)
    comm.Barrier()
    return _local_time(lambda: kernel(a, b, out), _REPS) / nbytes


def _comm_time(comm, fn, steps):
    fn()
    best = float("inf")
    for _ in range(_REPS):
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        best = min(best, (time.perf_counter() - start) / steps)
    return best


#: ``collectives.api.allreduce``, set by that module (it imports auto, which imports this one)
allreduce = None

_SHM_FIELDS = tuple(f"shm_{n}" for n in SHM_SIZES)
_FIELDS = ("t_small", "t_mid", "t_large", "g32_in", "g32_out", "g64_in", "g64_out", "copy",
           "copy_far", "far_region", "barrier", "agree", "inter_small", "inter_large",
           "ring_8", "ring_mid", "ring_large") + _SHM_FIELDS + ("agree_library",)


def shm_warm(layout, nbytes):
    """Untimed calls of shm at ``nbytes`` before the probe times it: what any call of a new
    size needs (:func:`_library_times`), and shm's own trials of its ways and stores
    (``Algorithm.settling``), so that the times are those of the way and stores its calls
    settle on (at N = 2 on the AMD VM the 256 KiB and 4 MiB calls timed during those
    trials took 1.2-1.6x the settled ones)."""
    base = _WARM_SMALL if nbytes <= MID else _WARM
    return max(base, _registry.get("shm").settling_calls(layout, nbytes) + 1)


def _library_times(comm, shm, layout):
    """``{field: [seconds]}``: this rank's times of the library's own calls (float32 sum, each call after a
    Barrier; ``times[field]`` a list of _LIBRARY_REPS, _LIBRARY_REPS_SMALL up to MID bytes) on a
    duplicate of ``comm`` (collective):
    ``allreduce(algorithm="ring")`` of 8 bytes, MID and LARGE, then, if ``shm``,
    ``allreduce(algorithm="shm")`` at each of SHM_SIZES, after :func:`shm_warm`'s calls
    for the ranks' ``layout``.  :func:`measure` takes each
    call's slowest rank, then the median of each field's calls, as a program sees its calls.

    A duplicate, because this runs inside the first automatic call on ``comm`` (its calls
    nest in that one, see ``runtime.watch.begin``).  The first calls of each size (_WARM,
    _WARM_SMALL up to MID bytes) are not timed: the first builds what the repeated calls use (slots, plan), the next
    load and prepare the repeated call's code, and each of them takes many times what the
    repeated calls after them take.  What the duplicate built goes with it.
    """
    if allreduce is None:
        raise RuntimeError("collectives.api was not imported: it hands the probe allreduce")
    # (field, algorithm, bytes per rank, untimed calls first): the ring of LARGE loads no
    # code of its own and is long, so it is warmed once; a small call takes a dozen calls
    # to settle at its repeated time (1.5-2x of it before: branch history, the cache lines
    # of the Python around it), and a dozen of them cost less than one large call
    def warm(nbytes):
        return _WARM_SMALL if nbytes <= MID else _WARM

    def reps(nbytes):
        return _LIBRARY_REPS_SMALL if nbytes <= MID else _LIBRARY_REPS
    plan = [("ring_8", "ring", 8, warm(8)), ("ring_mid", "ring", MID, warm(MID)),
            ("ring_large", "ring", LARGE, 1)] + [
        (field, "shm", n, shm_warm(layout, n)) for field, n in zip(_SHM_FIELDS, SHM_SIZES)
        if shm]
    dup = comm.Dup()
    times = {}
    try:
        for field, algorithm, nbytes, warm in plan:
            x = np.ones(nbytes // 4, np.float32)
            y = np.empty_like(x)
            for _ in range(warm):
                allreduce(x, y, comm=dup, algorithm=algorithm)
            mine = times[field] = []
            for _ in range(reps(nbytes)):
                comm.Barrier()
                start = time.perf_counter()
                allreduce(x, y, comm=dup, algorithm=algorithm)
                mine.append(time.perf_counter() - start)
        # The agreement step as the calls above ran it (on one node a shared-memory board,
        # not an MPI_Allreduce): what every algorithm that does not fold it in pays per call.
        ctx, values = get_context(dup), np.zeros(8, np.int64)
        mine = times["agree_library"] = []
        for rep in range(_WARM_SMALL + _LIBRARY_REPS_SMALL):
            comm.Barrier()
            start = time.perf_counter()
            agree_max(ctx, values)
            if rep >= _WARM_SMALL:
                mine.append(time.perf_counter() - start)
    finally:
        dup.Free()
    return times


def _local_measurements(comm, node, leaders, layout, shm):
    m = dict.fromkeys(_FIELDS, 0.0)
    m["t_small"] = _ring_time(node, SMALL, _SMALL_STEPS, _REPS)
    m["t_mid"] = _ring_time(node, MID, 2, _REPS)
    m["t_large"] = _ring_time(node, LARGE, 1, _REPS)
    m["g32_in"] = _kernel_rate(node, np.float32, KERNEL_IN)
    m["g32_out"] = _kernel_rate(node, np.float32, KERNEL_OUT)
    # float64's kernel only if this process loaded it already (loading one costs more than
    # the whole probe); else float32's rate per byte, as both are memory bound from memory.
    known = ("sum", np.dtype(np.float64)) in _kernels._cache
    known = node.allreduce(int(known), op=MPI.MIN)
    if known:
        m["g64_in"] = _kernel_rate(node, np.float64, KERNEL_IN)
        m["g64_out"] = _kernel_rate(node, np.float64, KERNEL_OUT)
    else:
        m["g64_in"], m["g64_out"] = m["g32_in"], m["g32_out"]
    # out of the caches only where ranks have cores of their own (see _fit)
    m["copy"], m["copy_far"], m["far_region"] = _copy_rates(node,
                                                            far=layout.ranks_per_core <= 1)
    m["barrier"] = _comm_time(node, node.Barrier, 8)
    words = np.zeros(8, np.int64)
    m["agree"] = _comm_time(comm, lambda: comm.Allreduce(MPI.IN_PLACE, words, op=MPI.MAX), 8)
    if leaders != MPI.COMM_NULL and leaders.Get_size() > 1:
        m["inter_small"] = _ring_time(leaders, SMALL, _SMALL_STEPS, _REPS)
        m["inter_large"] = _ring_time(leaders, LARGE, 1, _REPS)
    return m, (_library_times(comm, shm, layout) if not layout.spans_nodes else {})


def _fit(m, nranks, layout):
    """A calibration entry (see :mod:`pycollective.model.params`) from agreed measurements."""
    alpha = min(m["t_small"], m["t_mid"])  # a 64 KiB exchange timed faster: load, not α
    beta_mid = max((m["t_mid"] - alpha) / MID, 1e-13)
    beta = max((m["t_large"] - alpha) / LARGE, 1e-13)
    # the agreement as the library's calls pay it, where they were timed (one node)
    overhead = m["agree_library"] or m["agree"]
    if m["ring_8"] > 0:
        # α as the algorithms pay it: each of their messages costs the library's Python
        # around it too (the request, its wait, the step's bookkeeping), which a bare
        # Sendrecv does not.  The ring of 8 bytes is nearly all α terms; what it took
        # beyond the agreement, per α term, is the α of a message sent by the library.
        terms = _registry.get("ring").cost(nranks, 2, 4, 1.0, 0.0, 0.0)
        alpha = max(alpha, (m["ring_8"] - overhead) / max(terms, 1.0))
    if m["ring_mid"] > 0:
        # the same at MID bytes (the library's copies and kernel on vectors in cache):
        # mid-sized calls of the message algorithms priced by a bare Sendrecv came out
        # at 0.4-0.7 of their time, at the edge of what auto times beside shm
        ring, count = _registry.get("ring").cost, MID // 4
        rest = m["ring_mid"] - overhead - ring(nranks, count, 4, alpha, 0.0, m["g32_in"])
        per_beta = ring(nranks, count, 4, 0.0, 1.0, 0.0)
        if per_beta > 0 and rest > 0:
            beta_mid = max(beta_mid, rest / per_beta)
    if m["ring_large"] > 0:
        # β as the algorithms pay it on large vectors: the library's ring of LARGE bytes
        # (its copies, its kernel's passes, the MPI library's own transfer) beyond what
        # its α and γ terms and the agreement account for, per β term.
        ring, count = _registry.get("ring").cost, LARGE // 4
        rest = m["ring_large"] - overhead - ring(nranks, count, 4, alpha, 0.0, m["g32_out"])
        per_beta = ring(nranks, count, 4, 0.0, 1.0, 0.0)
        if per_beta > 0 and rest > 0:
            beta = max(beta, rest / per_beta)
    g32_in, g32_out = m["g32_in"], m["g32_out"]
    beta_curve = [[float(MID), beta_mid], [float(LARGE), beta]]
    if m["copy_far"] > 0 and m["copy"] > 0:
        # β out of the caches: the large ring's β up to the near copy's 8 MiB blocks, then
        # rising (log-linear) to its product with how much slower the far copy ran, at
        # messages as large as the far copy's region.  Only β: γ is the reduction's rate
        # on operands that moving them (β) brought in, and α is not memory's.  On the
        # 2-core VM at N = 2 this priced the 1e7-float calls of ring, rabenseifner,
        # butterfly and shm within 20 % (18-42 % below without it; docs/results/auto-score.md).
        # Measured only where ranks have cores of their own: at 2 and 4 ranks per core the
        # 1e7 shm calls took the 9 MiB calls' time per byte (waiting for the scheduler
        # hides waiting for memory), and the far copy's ratio priced them at twice that.
        # the region (agreed: nodes may report other caches) is at least FAR_MIN, past 8 MiB
        beta_curve += [[float(KERNEL_OUT), beta], [float(m["far_region"]),
                       beta * min(4.0, max(1.0, m["copy_far"] / m["copy"]))]]
    entry = {
        "nranks": nranks, "alpha": alpha, "beta": beta, "gamma": g32_out,
        "overhead": overhead,
        "beta_curve": beta_curve,
        "gamma_curves": {
            "float32": [[float(KERNEL_IN), g32_in], [float(KERNEL_OUT), g32_out]],
            "float64": [[float(KERNEL_IN), m["g64_in"]], [float(KERNEL_OUT), m["g64_out"]]],
            ANY_DTYPE: [[float(KERNEL_IN), g32_in], [float(KERNEL_OUT), g32_out]],
        },
        "gamma_by_dtype": {
            "float32": g32_out, "float64": m["g64_out"],
            # compute bound: their built-in ratio to float32's rate, on this machine's rate
            "float16": g32_out * BUILTIN["gamma_float16"] / DEFAULTS["gamma"],
            "bfloat16": g32_out * BUILTIN["gamma_bfloat16"] / DEFAULTS["gamma"],
        },
        "nodes": len(layout.nodes),
        "measured": {k: m[k] for k in _FIELDS},
    }
    if layout.spans_nodes and m["inter_small"] > 0:
        entry["inter"] = {"alpha": m["inter_small"],
                          "beta": max((m["inter_large"] - m["inter_small"]) / LARGE, 1e-13)}
    if "shm" in _registry.names() and not layout.spans_nodes:
        entry["corrections"] = {"shm": _shm_ratio(m, nranks, entry, layout)}
    return entry


def _shm_ratio(m, nranks, entry, layout):
    """shm's measured time (``m["shm_<bytes>"]``) over its α-β-γ cost, per size, as the model
    will price a call of that size with ``entry``'s parameters (``model.choice.measured_ratio``:
    its curves, interpolated, so that the prediction at each timed size is the time measured
    there; shm pays no separate agreement, its times hold it), each at most the larger
    sizes' measured times.  Where it was not timed (0),
    its price from the sync and copy measurements (syncs at ``Barrier`` cost, data at copy
    speed).  Above its largest timed size the model keeps that size's ratio, and the β
    curve carries the calls out of the caches."""
    flat = params_for(load_params_from({"by_nranks": {str(nranks): entry},
                                        **{k: entry[k] for k in ("alpha", "beta", "gamma")}}),
                      nranks, layout)
    cost, f32 = _registry.get("shm").cost, np.dtype(np.float32)
    curve, below = [], float("inf")
    fixed, larger = m[f"shm_{SHM_SIZES[0]}"], None  # the smallest call's time; (bytes, s)
    for nbytes in reversed(SHM_SIZES):
        count = nbytes // 4
        seconds = m[f"shm_{nbytes}"]
        if seconds:
            # a call of fewer bytes takes no longer than one of more: a size whose calls
            # all met a busy scheduler (ranks sharing cores; N = 8, 64 KiB: 1.25 ms where
            # 256 KiB took 0.86) is held to the larger sizes' time
            seconds = below = min(seconds, below)
            if (larger is not None and fixed and nbytes > MID
                    and layout.ranks_per_core <= 1):
                # and, above MID, where the same steps serve both sizes, its time per byte
                # beyond the smallest call's to at most PER_BYTE_HOLD times the next larger
                # size's: at N = 2 a 256 KiB pass took 163 us, as long as the 1 MiB one
                # (58 us in the launch before), and priced 1e5 floats +115 %
                at_most = fixed + (larger[1] - fixed) * nbytes / larger[0] * PER_BYTE_HOLD
                seconds = below = min(seconds, max(at_most, fixed))
            larger = (nbytes, seconds)
        else:
            seconds = cost(nranks, count, 4, m["barrier"], m["copy"], rates(flat, count, f32)[1])
        curve.append([float(nbytes), measured_ratio("shm", seconds, nranks, count, f32, flat,
                                                    0.0)])
    return curve[::-1]


def measure(comm, layout, shm=False):
    """Measure this machine's parameters on ``comm`` (collective); an entry for ``by_nranks``.

    ``shm``: time the shared-memory algorithm too (it can run on ``comm``: the same on
    every rank).

    Returns ``(entry, seconds)``: the agreed entry and how long the measurement took
    (the slowest rank's).
    """
    get_kernel("sum", np.float32)  # loaded by any float32 call: not the probe's cost
    start = time.perf_counter()
    node, _ = node_comm(comm)
    leaders = comm.Split(0 if node.Get_rank() == 0 else MPI.UNDEFINED, comm.Get_rank())
    try:
        m, library = _local_measurements(comm, node, leaders, layout, shm)
    finally:
        node.Free()
        if leaders != MPI.COMM_NULL:
            leaders.Free()
    calls = [t for ts in library.values() for t in ts]
    values = np.array([m[k] for k in _FIELDS] + calls + [time.perf_counter() - start],
                      np.float64)
    comm.Allreduce(MPI.IN_PLACE, values, op=MPI.MAX)
    agreed = dict(zip(_FIELDS, values[:len(_FIELDS)].tolist()))
    # each library call's slowest rank; the median of each field's calls (every rank
    # timed the same fields in the same order: the layout and ``shm`` are agreed)
    at = len(_FIELDS)
    for field, ts in library.items():
        agreed[field] = float(np.median(values[at:at + len(ts)]))
        at += len(ts)
    entry = _fit(agreed, comm.Get_size(), layout)
    entry["probe_seconds"] = float(values[-1])
    return entry, float(values[-1])


# --- when -------------------------------------------------------------------------------------

def _lookup(layout):
    """On rank 0: ("off" | "saved" | "measure", params or path)."""
    if not _env.MEASURE.get():
        return "off", None
    facts = machine_facts(layout)
    path = cache_file(facts)
    if os.path.exists(path):
        try:
            params = load_params(path)
            if params.get("by_nranks"):
                return "saved", params
        except ValueError as exc:
            warnings.warn(f"pycollective: measuring again: {exc}")
    return "measure", path


def machine_params(ctx, layout, loaded):
    """The parameters auto uses: ``loaded`` (rank 0's calibration) if it is a calibration
    file, else this machine's saved measurement, else a new one (collective; the same on
    every rank).  ``loaded`` again when the measurement is off."""
    if not loaded.get("builtin") or ctx.size == 1:
        return loaded
    comm = ctx.comm
    what, found = bcast_from_root(comm, lambda: _lookup(layout),
                                  what="algorithm='auto': looking for this machine's parameters")
    if what == "off":
        return loaded
    if what == "saved":
        found["measured_here"] = True
        return found
    # shm times itself where it can run on the whole communicator (one node); its
    # ``usable`` answers alike on every rank, so every rank takes the same branch
    shm = "shm" in _registry.names() and not layout.spans_nodes \
        and not _registry.get("shm").usable(ctx)
    entry, _ = measure(comm, layout, shm)
    data = {"version": 1, "by_nranks": {str(ctx.size): entry}, "machine": machine_facts(layout),
            **{k: entry[k] for k in ("alpha", "beta", "gamma", "overhead", "gamma_by_dtype")}}
    if ctx.rank == 0:
        try:
            write_json(data, found)
        except OSError as exc:
            warnings.warn(f"pycollective: cannot keep this machine's parameters in {found}: {exc}")
    params = load_params_from(data)
    params["source"] = f"measured on first use ({found})"
    params["measured_here"] = True
    return params


#: With parameters measured on this machine, auto times only the algorithms the model
#: puts within this factor of its best (and the layout-aware ones it always times
#: within it): the model's error target is 25 %, and each trial call goes the full
#: path, many times a decided call's time (docs/results/auto-score.md).
TRUST = 1.5


def trusted(ranking, params):
    """``ranking`` cut to what auto should time: all of it unless ``params`` were measured
    here, else the algorithms predicted within :data:`TRUST` of the best."""
    if not params.get("measured_here") or not ranking:
        return ranking
    best = ranking[0][1]
    return [(name, t) for name, t in ranking if t <= TRUST * best]


def load_params_from(data):
    """The checked parameters of calibration ``data`` (as :func:`load_params` reads a file)."""
    from ..model.params import _clean
    return _clean(data, "measured")
