"""One call after a Barrier against calls back to back, for point.py's MPI backends.

    PYTHON=$VENVS/impi/bin/python scripts/run_mpi.sh 8 benchmarks/peers/starts.py mpi \\
        --counts 1e3 1e4 1e5
    scripts/run_mpi.sh 8 benchmarks/peers/starts.py pycollective --algorithm shm \\
        --counts 1e3 1e4 1e5

The peers report times every contender alike: a Barrier, a clock around one
call, the slowest rank (``point.py``).  Where ranks outnumber cores, ranks
leave the Barrier at different times, and a call that starts then waits for
ranks that are not running yet.  This times, per size and ``--rounds``
times, both ways in turn with the same backend as the report:

* *after a Barrier*: ``--single`` calls, each after a Barrier (the report's
  loop); the median of the slowest rank's times;
* *back to back*: ``--calls`` calls in a row; the slowest rank's time over
  the calls.

It prints the medians over rounds and their ratio; the difference is what
starting together costs that library.  The last result of every round is
checked element by element against the float64 reference (``point.py``'s
data), and a wrong one stops the run.  ``--json`` writes the rows (rank 0)
for ``gaps.py``.  Gloo is left out: it reduces in place, so calls back to
back would not reduce the same data.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from point import BACKENDS, fill_input, reference, wrong_elements  # noqa: E402


def timed_rounds(be, case, count, rounds, calls, single):
    """(back to back, after a Barrier): medians over rounds of the slowest rank's seconds
    (``case``: what :meth:`point.Backend.select` takes once the buffers are there)."""
    x = np.empty(count, np.float32)
    fill_input(x, be.rank)
    expected = reference(count, be.nranks)
    be.buffers(x)
    be.select(case)
    for _ in range(3):  # warm-up: slots, compiled steps, the library's own buffers
        be.prepare()
        be.call()
    together, alone = [], []
    for _ in range(rounds):
        be.prepare()
        be.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            be.call()
        took = time.perf_counter() - t0
        wrong = wrong_elements(be.result(), expected)[0]
        alone.append(be.reduce([took / calls], "max")[0])
        if be.reduce([wrong], "sum")[0]:
            raise SystemExit(f"{be.library}: wrong result at M={count} (back to back)")
        each = []
        for _ in range(single):
            be.prepare()
            be.barrier()
            t0 = time.perf_counter()
            be.call()
            each.append(time.perf_counter() - t0)
        together.append(statistics.median(be.reduce(each, "max")))
        if be.reduce([wrong_elements(be.result(), expected)[0]], "sum")[0]:
            raise SystemExit(f"{be.library}: wrong result at M={count} (after a Barrier)")
    return statistics.median(alone), statistics.median(together)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("backend", choices=["mpi", "pycollective"])
    p.add_argument("--algorithm", default="auto", help="pycollective's algorithm (auto)")
    p.add_argument("--counts", nargs="+", type=lambda s: int(float(s)), required=True,
                   help="float32 per rank")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=100, help="calls back to back per round (100)")
    p.add_argument("--single", type=int, default=25,
                   help="calls after a Barrier per round (25)")
    p.add_argument("--json", help="also write the rows to this file (rank 0)")
    args = p.parse_args(argv)
    be = BACKENDS[args.backend]()
    rows = []
    try:
        for count in args.counts:
            alone, together = timed_rounds(be, args.algorithm, count, args.rounds, args.calls, args.single)
            rows.append(dict(count=count, back_to_back=alone, after_barrier=together))
            if be.rank == 0:
                print(f"{be.library}, N = {be.nranks}, M = {count}: back to back "
                      f"{alone * 1e6:.1f} us, after a Barrier {together * 1e6:.1f} us "
                      f"({together / alone:.2f}x)", flush=True)
    finally:
        be.close()
    if args.json and be.rank == 0:
        with open(args.json, "w") as f:
            json.dump(dict(library=be.library, nranks=be.nranks, backend=args.backend,
                           algorithm=args.algorithm if args.backend == "pycollective" else None,
                           rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
