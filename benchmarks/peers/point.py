"""One launch of one peer: time and check an allreduce library at a few sizes.

    mpiexec -n N python point.py mpi  --counts 1 1000 --iters 100 --json out.json
    torchrun --standalone --nproc-per-node N point.py gloo --counts 1 1000 ...

``mpi`` times ``comm.Allreduce`` of whichever MPI library mpi4py loads in this
environment (MPICH, Open MPI, Intel MPI); ``pycollective`` times
``pycollective.allreduce`` on it (``--algorithms``); ``gloo`` times
``torch.distributed.all_reduce`` on the Gloo backend (CPU tensors).  All are
timed by the same loop, so the rows of every contender mean the same thing
(``python -m pycollective.bench`` times differently: it interleaves every
case with native MPI call by call and computes CRCs between calls, which
with more ranks than cores doubled every case's time at 1e6 floats, native
MPICH's included; docs/results/loops.md):

* per size and case (for pycollective, each of its algorithms):
  ``--warmup`` untimed calls (for pycollective's ``auto``, more until it has
  decided the size: its first calls are timed trials of its candidates),
  then repetitions of: prepare the buffers (outside the timing), barrier,
  ``perf_counter`` around one call; the cases take turns repetition by
  repetition (:func:`measure_cases`);
* the repetitions are ``--iters``, or fewer when ``--budget`` is set: as many
  as fit in that many seconds judged from the fastest warm-up call (never fewer than
  ``--min-iters``), agreed across ranks;
* a repetition's time is the maximum over ranks; the row's time is the
  median over repetitions;
* every call, warm-up included, is checked element by element against a
  float64 reference (below); ``wrong`` counts the elements that differ,
  summed over ranks, worst call.  A row with ``wrong > 0`` does not count.

Data: rank r holds x[i] = a(i) + r*b(i) with a in [-15, 15] and b in [-7, 7]
small integers from a hash of the index i (no short period for a misplaced
chunk to hide in, every rank's share visible in the sum), so the sum over N
ranks is N*a(i) + N(N-1)/2*b(i), computed in float64 without any
communication, and every partial sum any algorithm can form is an integer far
below 2**24: exact in float32 in any order.  The check therefore allows no
difference at all.

Out of place for MPI (the result buffer is filled with NaN before every
repetition, so a call that writes nothing is caught); in place for Gloo,
whose all_reduce has no other form (the buffer is refilled from the input
before every repetition).

Rank 0 writes the JSON; the exit status is 1 if any element was wrong.
Only the standard library, numpy, and mpi4py or torch are needed.
"""

import argparse
import json
import os
import platform
import random
import socket
import statistics
import sys
import time
import zlib

import numpy as np

BLOCK = 1 << 20  # elements per block when generating data (bounds temporaries)
SCHEMA = "pycollective-peers-point/1"
SETTLE_CALLS = 100  # at most this many extra warm-up calls until a backend has settled


# --- data and reference -----------------------------------------------------

def _hash_terms(start, stop):
    """a(i), b(i) for i in [start, stop): small integers from a 64-bit multiplicative hash."""
    i = np.arange(start, stop, dtype=np.uint64)
    h = (i + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)  # wraps modulo 2**64, as wanted
    h ^= h >> np.uint64(29)
    a = (h % np.uint64(31)).astype(np.int64) - 15
    b = ((h >> np.uint64(32)) % np.uint64(15)).astype(np.int64) - 7
    return a, b


def fill_input(x, rank):
    """x[i] = a(i) + rank*b(i)."""
    for start in range(0, x.size, BLOCK):
        stop = min(start + BLOCK, x.size)
        a, b = _hash_terms(start, stop)
        x[start:stop] = a + rank * b


def reference(count, nranks):
    """The exact sum over ranks, computed in float64 and returned as float32.

    Raises if the float32 copy is not exactly the float64 value (it always is
    for the sizes of rank counts used here; the check keeps the claim honest).
    """
    out = np.empty(count, np.float32)
    for start in range(0, count, BLOCK):
        stop = min(start + BLOCK, count)
        a, b = _hash_terms(start, stop)
        exact = nranks * a.astype(np.float64) + (nranks * (nranks - 1) / 2) * b.astype(np.float64)
        out[start:stop] = exact
        if not np.array_equal(out[start:stop].astype(np.float64), exact):
            raise ValueError("the float64 reference is not exact in float32")
    return out


def wrong_elements(result, expected):
    """(elements that differ, largest difference; inf when a NaN stands where a number belongs)."""
    bad = result != expected  # NaN != anything: an unwritten result counts as wrong
    n = int(np.count_nonzero(bad))
    if not n:
        return 0, 0.0
    diff = np.abs(result[bad].astype(np.float64) - expected[bad].astype(np.float64))
    return n, float(np.nan_to_num(diff, nan=np.inf).max())


# --- backends: what differs between the libraries ---------------------------

class Backend:
    """What the loop asks every backend besides its calls (defaults: nothing to settle)."""

    def settled(self):
        """Whether this size's calls are what later calls will be (see pycollective's)."""
        return True

    def pick(self):
        """The algorithm the library chose for this size, where it says ("" if not)."""
        return ""

    def select(self, case):
        """Make the next calls ``case``'s (pycollective: an algorithm; others have one)."""


class MpiBackend(Backend):
    """``comm.Allreduce`` out of place, through mpi4py."""

    name = "mpi"

    def __init__(self):
        from mpi4py import MPI
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.nranks = self.comm.Get_rank(), self.comm.Get_size()
        version = MPI.Get_library_version().strip()
        self.library = " ".join(version.splitlines()[0].split())
        import mpi4py
        self.versions = {"mpi4py": mpi4py.__version__, "mpi_library_version": version}

    def buffers(self, x):
        self.x, self.out = x, np.empty_like(x)
        self.crc = zlib.crc32(x)

    def prepare(self):
        self.out.fill(np.nan)

    def call(self):
        self.comm.Allreduce(self.x, self.out, op=self.MPI.SUM)

    def result(self):
        return self.out

    def input_intact(self):
        return zlib.crc32(self.x) == self.crc

    def barrier(self):
        self.comm.Barrier()

    def reduce(self, values, op):
        values = np.ascontiguousarray(values, dtype=np.float64)
        out = np.empty_like(values)
        self.comm.Allreduce(values, out, op={"max": self.MPI.MAX, "sum": self.MPI.SUM}[op])
        return out

    def close(self):
        pass


class GlooBackend(Backend):
    """``torch.distributed.all_reduce`` on the Gloo backend, in place on a CPU tensor.

    Rank and size come from torchrun (RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT), or from an MPI launcher's PMI_RANK / PMI_SIZE (then the
    rendezvous is on 127.0.0.1:$MASTER_PORT, default 29500).
    """

    name = "gloo"

    def __init__(self):
        import torch
        import torch.distributed as dist
        self.torch, self.dist = torch, dist
        env = os.environ
        if "RANK" not in env and "PMI_RANK" in env:
            env["RANK"], env["WORLD_SIZE"] = env["PMI_RANK"], env["PMI_SIZE"]
            env.setdefault("MASTER_ADDR", "127.0.0.1")
            env.setdefault("MASTER_PORT", "29500")
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        torch.set_num_threads(1)
        dist.init_process_group("gloo")
        self.rank, self.nranks = dist.get_rank(), dist.get_world_size()
        self.library = f"torch {torch.__version__} Gloo"
        self.versions = {"torch": torch.__version__}

    def buffers(self, x):
        self.x = x
        self.work = np.empty_like(x)
        self.tensor = self.torch.from_numpy(self.work)  # shares memory with self.work

    def prepare(self):
        np.copyto(self.work, self.x)

    def call(self):
        self.dist.all_reduce(self.tensor)

    def result(self):
        return self.work

    def input_intact(self):
        return True  # in place by design: the input is restored before every repetition

    def barrier(self):
        self.dist.barrier()

    def reduce(self, values, op):
        t = self.torch.tensor(np.asarray(values, dtype=np.float64))
        self.dist.all_reduce(t, op={"max": self.dist.ReduceOp.MAX,
                                    "sum": self.dist.ReduceOp.SUM}[op])
        return t.numpy()

    def close(self):
        self.dist.destroy_process_group()


class PycollectiveBackend(MpiBackend):
    """``pycollective.allreduce(x, out, "sum", algorithm=...)`` out of place, on mpi4py.

    The same loop as the peers, the algorithms (``--algorithms``) taking turns
    repetition by repetition at each size (:func:`measure_cases`).  A case
    ``<algorithm>+shared`` runs ``<algorithm>`` on copies of the buffers made
    with ``pycollective.shared_empty`` (which ``shm`` reads in place), made
    when the case is first selected at a size (every rank selects the same
    cases in the same order, so the allocation is collective) and released
    when the next size's buffers come.
    """

    name = "pycollective"
    SHARED = "+shared"

    def __init__(self):
        super().__init__()
        import pycollective
        self.pycollective = pycollective
        self.algorithm = "auto"
        self.library = f"pycollective on {self.library}"
        self.shared = None  # (input, output) in shared memory, for the "+shared" cases
        self.plain = None   # (input, output) as MpiBackend.buffers made them

    def buffers(self, x):
        self._release()
        super().buffers(x)
        self.plain = (self.x, self.out)

    def _release(self):
        if self.shared is not None:
            for a in self.shared:
                self.pycollective.release(a, comm=self.comm)
            self.shared = None

    def select(self, case):
        shared = case.endswith(self.SHARED)
        self.algorithm = case[:-len(self.SHARED)] if shared else case
        if shared and self.shared is None:
            x = self.pycollective.shared_empty(self.plain[0].size, np.float32, comm=self.comm)
            out = self.pycollective.shared_empty(x.size, np.float32, comm=self.comm)
            x[...] = self.plain[0]
            self.shared = (x, out)
        self.x, self.out = self.shared if shared else self.plain

    def call(self):
        self.pycollective.allreduce(self.x, self.out, "sum", comm=self.comm,
                                    algorithm=self.algorithm)

    def barrier(self):
        # Every contender starts after its own library's barrier (pycollective's lets the
        # ranks out together; MPICH's up to a microsecond apart: docs/results/barrier.md).
        self.pycollective.barrier(comm=self.comm)

    def close(self):
        self._release()

    def _decision(self):
        # auto's tuning state (internal): its decision for this size, or None.
        from pycollective.collectives import auto as _auto
        from pycollective.runtime import context as _context
        ctx = _context.find_context(self.comm)
        state = None if ctx is None else ctx.peek(_auto.KEY)
        return None if state is None else state.decision(self.x.size, self.x.dtype, "sum")

    def settled(self):
        """``auto`` has decided this size: its first calls of a size are timed trials of
        its candidates (at most 40, docs/cost-model.md), not what a training step costs."""
        return self.algorithm != "auto" or self._decision() is not None

    def pick(self):
        decision = self._decision() if self.algorithm == "auto" else None
        return "" if decision is None else decision.algorithm


BACKENDS = {"mpi": MpiBackend, "gloo": GlooBackend, "pycollective": PycollectiveBackend}


# --- the loop ---------------------------------------------------------------

def measure(be, count, *, iters, warmup, budget, min_iters):
    """One row: the timing and the check of ``count`` elements per rank (collective)."""
    return measure_cases(be, count, [None], iters=iters, warmup=warmup, budget=budget,
                         min_iters=min_iters)[0]


def turns(n, k):
    """The order of ``n`` cases in repetition ``k``: a permutation drawn from ``k`` alone
    (the same on every rank).  Not a rotation: with one, each case always followed the
    same other case, and in the 07:21 report auto, which followed hierarchical (shm's
    slots too), took 0.84-0.87 of the time of shm, which followed rabenseifner, at N = 4
    though it runs shm; with the two alone they were level."""
    order = list(range(n))
    random.Random(k).shuffle(order)
    return order


def measure_cases(be, count, cases, *, iters, warmup, budget, min_iters):
    """One row per case (``be.select(case)``: pycollective's algorithms, or ``[None]``),
    the cases taking turns repetition by repetition (collective).

    Every case is warmed up (and settled) first, then repetition k times every
    case once, in the order :func:`turns` draws for k, each timed call right
    after an untimed one of the same case.  So the ratio of two cases
    compares calls made in the same seconds: on the shared 2-core machines a
    launch can switch between a fast and a slow state for moving data between
    cores, and cases timed one after another (as before) differed by the
    state they met, not only by what they do (``auto`` against the very
    algorithm it runs, 2026-12-02T0415Z-peers: up to 1.68).  With several
    cases a repetition makes two calls per case, so a launch takes about
    twice ``--budget`` per case and size.
    """
    x = np.empty(count, np.float32)
    fill_input(x, be.rank)
    expected = reference(count, be.nranks)
    be.buffers(x)
    worst = {c: 0 for c in range(len(cases))}
    maxerr = {c: 0.0 for c in range(len(cases))}

    def one(c):
        be.select(cases[c])
        be.prepare()
        be.barrier()
        t0 = time.perf_counter()
        be.call()
        seconds = time.perf_counter() - t0
        n, err = wrong_elements(be.result(), expected)
        worst[c], maxerr[c] = max(worst[c], n), max(maxerr[c], err)
        return seconds

    todo, settling = [], []
    for c in range(len(cases)):
        be.select(cases[c])
        settle = 0  # warm-up calls (checked alike) until the backend has settled
        while settle < SETTLE_CALLS and be.reduce([0 if be.settled() else 1], "max")[0]:
            one(c)
            settle += 1
        settling.append(settle)
        # Then the warm-up proper, settled: the first call after auto decided
        # a size took 25 ms (its plan is made then), and was a timed one.
        warm = [one(c) for _ in range(warmup)]
        n = iters
        if budget is not None and warm:
            # The fastest warm-up call, not their mean: the first call at a size
            # builds state (shared slots, compiled steps, MPI's own buffers), and
            # its 0.4 s and more left 3-4 repetitions of a 10-100 us call (the
            # first algorithm of a launch at 1e3; 2026-12-02T0139Z-peers).
            per_call = be.reduce([min(warm)], "max")[0]
            if per_call > 0:
                n = max(min_iters, min(iters, int(budget / per_call)))
        todo.append(n)
    local = [[] for _ in cases]
    for k in range(max(todo, default=0)):
        for c in turns(len(cases), k):
            if k < todo[c]:
                if len(cases) > 1:
                    # One untimed call first, so that the timed one follows a call of
                    # its own, as every peer's does: after another algorithm's call
                    # shm at N = 8, 1e3 took 2.2x its time (2026-12-02T0658Z-peers),
                    # and auto after shm's (the same slots) 0.8x.
                    one(c)
                local[c].append(one(c))
    rows = []
    for c, case in enumerate(cases):
        be.select(case)
        n = todo[c]
        times = be.reduce(local[c], "max") if n else np.zeros(0)
        wrong, changed = be.reduce([worst[c], 0 if be.input_intact() else 1], "sum")
        err = be.reduce([maxerr[c]], "max")[0]
        median = statistics.median(times) if n else None
        nbytes = count * 4
        factor = 2 * (be.nranks - 1) / be.nranks
        row = dict(count=count, bytes=nbytes, iters=n, warmup=warmup, settling=settling[c],
                   pick=be.pick(),
                   times=[float(t) for t in times], time=median,
                   busbw=(nbytes / median * factor / 1e9) if median else None,
                   wrong=int(wrong), maxerr=float(err), input_intact=bool(changed == 0))
        rows.append(dict(row, algorithm=case) if case is not None else row)
    return rows


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("backend", choices=sorted(BACKENDS))
    p.add_argument("--counts", nargs="+", required=True, type=lambda s: int(float(s)),
                   help="elements per rank (float32), e.g. 1 1e3 1e5")
    p.add_argument("--iters", type=int, default=20, help="timed repetitions per size (at most)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per size")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds of timed repetitions per size (fewer repetitions when slow)")
    p.add_argument("--min-iters", type=int, default=3)
    p.add_argument("--algorithms", nargs="+", default=["auto"],
                   help="pycollective backend: the algorithms to time, taking turns")
    p.add_argument("--json", required=True, help="where rank 0 writes the rows")
    return p.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    be = BACKENDS[args.backend]()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    rows = []
    cases = args.algorithms if args.backend == "pycollective" else [None]
    for c in args.counts:
        rows += measure_cases(be, c, cases, iters=args.iters, warmup=args.warmup,
                              budget=args.budget, min_iters=args.min_iters)
    if be.rank == 0:
        report = dict(schema=SCHEMA, backend=be.name, library=be.library, nranks=be.nranks,
                      hostname=socket.gethostname(), cpu_count=os.cpu_count(),
                      python=platform.python_version(), numpy=np.__version__,
                      versions=be.versions, argv=sys.argv, started_utc=started,
                      ended_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), rows=rows)
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(report, f, indent=1)
        os.replace(tmp, args.json)
        for r in rows:
            sys.stdout.write(f"# {be.library}{' ' + r['algorithm'] if 'algorithm' in r else ''}, "
                             f"N={be.nranks}, M={r['count']}: "
                             f"{r['time'] * 1e6 if r['time'] else float('nan'):.1f} us "
                             f"median of {r['iters']}, wrong {r['wrong']}\n")
    bad = any(r["wrong"] or not r["input_intact"] for r in rows)
    be.close()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
