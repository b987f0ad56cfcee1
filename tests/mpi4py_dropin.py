"""Run mpi4py's own collective test modules through the drop-in (under MPI).

    scripts/run_mpi.sh N tests/mpi4py_dropin.py TESTDIR [--per-algorithm]

TESTDIR is the ``test/`` folder of mpi4py's source distribution for the
installed version (``tests/test_mpi4py_suites.py`` fetches it).  The
modules are imported with ``MPI.COMM_WORLD`` and ``MPI.COMM_SELF`` replaced
by :class:`pycollective.Comm` wrappers: the modules see a copy of the
``mpi4py.MPI`` namespace in which those two are wrapped, and everything else
is mpi4py's own (their ``Dup`` gives wrapped communicators too).

Runs, each a full pass of unittest over the selected tests:

* "auto": every test of the modules, pycollective's automatic choice;
* with ``--per-algorithm``, run k for k = 0, 1, ...: every collective with
  at least k+1 registered algorithms runs its k-th, and only the tests
  that call those collectives run, on the world (so each algorithm of each
  collective runs mpi4py's tests once; on ``COMM_SELF`` no algorithm runs,
  and the tests on a ``Dup`` of the world repeat those on the world), with
  numpy arrays of one type per size and kind (int8, int32, int64, float32,
  float64): the other backends and type codes exercise the reading of
  buffers and the fallbacks, which the "auto" run covers.

GPU array backends are left out, as mpi4py's own runner does by default
(its ``--numba``/``--cupy`` are off); numba is installed here for
pycollective's kernels, not for CUDA.

A test skipped through the drop-in counts only if a decorator (decided
from the MPI library's name and version) skipped it, or if it is also
skipped, with the same reason, when run on the plain communicators.

Rank 0 prints one line: ``pycollective-mpi4py-suite: `` and a JSON list of
the runs (tests run, failures, errors, skips, seconds), merged over all
ranks.
"""

import argparse
import importlib
import json
import os
import sys
import time
import types
import unittest

import mpi4py
from mpi4py import MPI

import pycollective
from pycollective.collectives.options import COLLECTIVES

MODULES = ("test_cco_buf", "test_cco_nb_buf", "test_cco_vec", "test_cco_nb_vec")
GPU_BACKENDS = ("numba", "cupy", "dlpack-cupy")
ALL_BACKENDS = None  # every backend but the GPU ones
ONE_BACKEND = {"numpy": "bilfd"}  # backend: type codes
WORLD = MPI.COMM_WORLD


def on_world(test_id):
    """A test case of a class on ``COMM_WORLD`` itself (not ``COMM_SELF``, not a ``Dup``)."""
    return test_id.split(".")[-2].endswith("World")


def collective_of(test_id):
    """The pycollective collective a test method exercises, or None (native calls only)."""
    name = test_id.rsplit(".", 1)[-1][len("test"):]
    for prefix, collective in (("Allreduce", "allreduce"), ("ReduceScatter", "reduce_scatter"),
                               ("Allgather", "allgather"), ("Bcast", "bcast")):
        if name.startswith(prefix):
            return collective
    return "reduce" if name == "Reduce" else None


def runs(per_algorithm):
    """``[(label, algorithms (None: auto), collectives whose tests run (None: all),
    backends (None: all; else {backend: type codes}))]``."""
    plan = [("auto", None, None, ALL_BACKENDS)]
    if per_algorithm:
        deepest = max(len(pycollective.algorithms(c)) for c in COLLECTIVES)
        for k in range(deepest):
            mapping = {c: pycollective.algorithms(c)[k] for c in COLLECTIVES
                       if k < len(pycollective.algorithms(c))}
            plan.append((f"#{k}", mapping, set(mapping), ONE_BACKEND))
    return plan


def load(testdir, comm_world, comm_self, backends=ALL_BACKENDS):
    """Import (again) the modules with COMM_WORLD and COMM_SELF replaced."""
    view = types.ModuleType("mpi4py.MPI")
    view.__dict__.update(MPI.__dict__)
    view.COMM_WORLD, view.COMM_SELF = comm_world, comm_self
    if testdir not in sys.path:
        sys.path.insert(0, testdir)
    mpi4py.MPI = view  # what ``from mpi4py import MPI`` in the modules finds
    try:
        import arrayimpl
        arrayimpl = importlib.reload(arrayimpl)
        arrayimpl.ArrayBackends[:] = [b for b in arrayimpl.ArrayBackends
                                      if b.backend not in GPU_BACKENDS
                                      and (backends is None or b.backend in backends)]
        for backend in arrayimpl.ArrayBackends:
            if backends is not None:
                backend.TypeMap = {code: datatype for code, datatype in backend.TypeMap.items()
                                   if code in backends[backend.backend]}
        modules = []
        for name in MODULES:
            module = sys.modules.get(name)
            modules.append(importlib.reload(module) if module else importlib.import_module(name))
        return modules
    finally:
        mpi4py.MPI = MPI


def tests_of(modules, keep):
    """The modules' test cases, in order, filtered by ``keep(test_id)``."""
    def flatten(suite):
        for item in suite:
            if isinstance(item, unittest.TestSuite):
                yield from flatten(item)
            else:
                yield item
    suite = unittest.TestSuite()
    for module in modules:
        for case in flatten(unittest.defaultTestLoader.loadTestsFromModule(module)):
            if keep(case.id()):
                suite.addTest(case)
    return suite


def decorator_skip(case):
    method = getattr(case, case._testMethodName, None)
    return bool(getattr(type(case), "__unittest_skip__", False)
                or getattr(method, "__unittest_skip__", False))


class _Timed(unittest.TextTestResult):
    """Records how long each test took."""

    def startTest(self, test):
        self.started = time.perf_counter()
        super().startTest(test)

    def stopTest(self, test):
        super().stopTest(test)
        self.durations.append((round(time.perf_counter() - self.started, 2), test.id()))


def run_once(suite):
    """Run ``suite``; ``(tests run, failures, errors, [(id, reason, by decorator)], slowest)``."""
    _Timed.durations = []
    with open(os.devnull, "w") as sink:
        result = unittest.TextTestRunner(stream=sink, verbosity=0, resultclass=_Timed).run(suite)
    failures = [(case.id(), text[-4000:]) for case, text in result.failures]
    errors = [(case.id(), text[-4000:]) for case, text in result.errors]
    skipped = [(case.id(), reason, decorator_skip(case)) for case, reason in result.skipped]
    return result.testsRun, failures, errors, skipped, sorted(_Timed.durations)[::-1][:3]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("testdir")
    parser.add_argument("--per-algorithm", action="store_true")
    args = parser.parse_args()
    testdir = os.path.abspath(args.testdir)
    report = []
    for label, mapping, collectives, backends in runs(args.per_algorithm):
        world = pycollective.Comm(WORLD, algorithm=mapping)
        self_ = pycollective.Comm(MPI.COMM_SELF, algorithm=mapping)
        modules = load(testdir, world, self_, backends)
        keep = (lambda tid: True) if collectives is None else \
            (lambda tid, cs=collectives: on_world(tid) and collective_of(tid) in cs)
        t0 = time.perf_counter()
        ran, failures, errors, skipped, slowest = run_once(tests_of(modules, keep))
        seconds = time.perf_counter() - t0
        # A skip at run time must also happen on the plain communicators.
        doubtful = {tid: reason for tid, reason, by_decorator in skipped if not by_decorator}
        if doubtful:
            plain = load(testdir, MPI.COMM_WORLD, MPI.COMM_SELF, backends)
            native = run_once(tests_of(plain, lambda tid: tid in doubtful))[3]
            native = {tid: reason for tid, reason, _ in native}
            for tid, reason in doubtful.items():
                if native.get(tid) != reason:
                    failures.append((tid, f"skipped through the drop-in ({reason!r}) but not "
                                          f"with plain mpi4py ({native.get(tid)!r})"))
        report.append({"run": label, "algorithms": mapping or "auto", "tests": ran,
                       "failures": failures, "errors": errors,
                       "skipped": [[tid, reason] for tid, reason, _ in skipped],
                       "seconds": round(seconds, 2), "slowest": slowest})
    merged = WORLD.gather(report, root=0)
    if WORLD.Get_rank() == 0:
        for rank, runs_of_rank in enumerate(merged):
            for mine, theirs in zip(report, runs_of_rank):
                for key in ("failures", "errors"):
                    mine[key] += [(f"rank {rank}: {tid}", text) for tid, text in theirs[key]
                                  if rank]
                mine["seconds"] = max(mine["seconds"], theirs["seconds"])
        sys.stdout.write("pycollective-mpi4py-suite: " + json.dumps(report) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
