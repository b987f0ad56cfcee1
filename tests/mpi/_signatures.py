"""The numba signatures the multi-rank suite compiles, compiled up front and split
between the launch's ranks.

The first launch of a fresh clone (2 ranks: ``tests/conftest.py`` runs it first) spends
most of its time in numba compiling into an empty cache, and both ranks compile the
same signatures side by side, as the tests call them together.  At the start of each
launch whose ranks have a CPU each (``tests/mpi/conftest.py``) every rank compiles its
share of the signatures in ``numba_signatures.txt`` (the longest first, each to the
rank with the least recorded
time so far: the same split on every rank), which numba keeps in its cache; after a
Barrier the tests load the others' shares from there.  Where the cache is warm a
rank's share only loads, as the tests would have.  A line that no longer names a
compiled function or no longer compiles is passed over: the tests compile what they
need as before.  ``PYCOLLECTIVE_PRECOMPILE=0`` turns it off.

The list is made by the suite itself::

    rm -rf /tmp/sigs && PYCOLLECTIVE_RECORD_SIGNATURES=/tmp/sigs NUMBA_CACHE_DIR=$(mktemp -d) \\
        scripts/run_mpi.sh 2 -m pytest --with-mpi -q -p no:cacheprovider tests/mpi
    python tests/mpi/_signatures.py merge /tmp/sigs > tests/mpi/numba_signatures.txt

(an empty cache, so that every signature is compiled and timed; with the recording
on, nothing is compiled up front).  Each line: the seconds its compile took, the
module, the function's name, and the argument types as numba writes them, tab-separated.
"""

import importlib
import os
import sys
import time
from pathlib import Path

FILE = Path(__file__).with_name("numba_signatures.txt")
RECORD = "PYCOLLECTIVE_RECORD_SIGNATURES"


def _type_names():
    from numba.core import types
    names = {name: getattr(types, name) for name in dir(types)
             if isinstance(getattr(types, name), types.Type)}
    names.update(Array=types.Array, bool=types.boolean)
    return names


def read(path=FILE):
    """``[(seconds, module, function name, argument reprs)]``; [] if there is no list."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    entries = []
    for line in lines:
        if line and not line.startswith("#"):
            seconds, module, name, *args = line.split("\t")
            entries.append((float(seconds), module, name, tuple(args)))
    return entries


def share(entries, rank, size):
    """The entries ``rank`` of ``size`` compiles: longest first, each to the least loaded."""
    load, mine = [0.0] * size, []
    for entry in sorted(entries, key=lambda e: (-e[0], e[1:])):
        r = load.index(min(load))
        load[r] += entry[0]
        if r == rank:
            mine.append(entry)
    return mine


def precompile(comm):
    """Compile this rank's share of the list, then wait for every rank (collective).
    Only where the ranks have a CPU each (the first launch of the suite on 2 CPUs): where
    they share them, splitting gains nothing, and a rank would load signatures its
    launch's tests never call (the 8-rank launch leaves some out).  Returns
    ``(compiled, passed over, seconds)``."""
    if os.environ.get("PYCOLLECTIVE_PRECOMPILE", "1") == "0" or os.environ.get(RECORD):
        return 0, 0, 0.0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    from mpi4py import MPI
    if comm.allreduce(int(comm.Get_size() > (cpus or 1)), op=MPI.MAX):
        return 0, 0, 0.0
    start = time.perf_counter()
    done = skipped = 0
    mine = share(read(), comm.Get_rank(), comm.Get_size())
    names = _type_names() if mine else {}
    for _, module, name, args in mine:
        try:
            target = importlib.import_module(module)
            for part in name.split("."):
                target = getattr(target, part)
            target.compile(tuple(eval(a, {"__builtins__": {}}, names) for a in args))
            done += 1
        except Exception:  # a stale line: the tests compile what they call
            skipped += 1
    seconds = time.perf_counter() - start
    comm.Barrier()
    return done, skipped, seconds


def record(directory):
    """Log every compile that no other compile of this process encloses, with its
    seconds, to ``directory/rank<pid>.txt`` at exit."""
    import atexit
    from numba.core import dispatcher
    compile_, depth, log = dispatcher.Dispatcher.compile, [0], []

    def timed(self, sig):
        depth[0] += 1
        start = time.perf_counter()
        try:
            return compile_(self, sig)
        finally:
            depth[0] -= 1
            func = self.py_func
            if depth[0] == 0 and "<locals>" not in func.__qualname__:
                args = sig.args if hasattr(sig, "args") else tuple(sig)
                log.append("\t".join([f"{time.perf_counter() - start:.3f}", func.__module__,
                                      func.__qualname__] + [repr(a) for a in args]))
    dispatcher.Dispatcher.compile = timed

    def write():
        os.makedirs(directory, exist_ok=True)
        Path(directory, f"rank{os.getpid()}.txt").write_text("".join(l + "\n" for l in log))
    atexit.register(write)


def merge(directory):
    """One list from every rank's log: each signature once, at its longest time."""
    best = {}
    for path in sorted(Path(directory).glob("rank*.txt")):
        for line in path.read_text().splitlines():
            seconds, key = line.split("\t", 1)
            best[key] = max(best.get(key, 0.0), float(seconds))
    lines = [f"{seconds:.3f}\t{key}" for key, seconds in
             sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))]
    return "# made by: python tests/mpi/_signatures.py merge DIR (see its docstring)\n" + \
        "".join(l + "\n" for l in lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["merge"] and len(sys.argv) == 3:
        sys.stdout.write(merge(sys.argv[2]))
    else:
        sys.exit("usage: python tests/mpi/_signatures.py merge DIR")
