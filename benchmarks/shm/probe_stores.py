"""The first-use measurement's shm calls with the stores they choose, and with each kind pinned.

    scripts/run_mpi.sh 2 benchmarks/shm/probe_stores.py --passes 2

The first-use measurement (``collectives/probe.py``) times ``shm`` at each of its
sizes after the calls in which a new shape tries its two kinds of stores
(``algorithms/shm/stores.py``), so its times are those of the kind the calls
settled on.  This runs the measurement's library calls (``probe._library_times``)
in passes that take turns: the stores as the calls choose them (``chosen``),
then plain (``FORCE_STORES = 0``) and non-temporal ones (``= 1``) pinned, and
prints per pass the slowest rank's median of each size from 64 KiB to 4 MiB (µs),
and the family's settled kind.  Where ``chosen`` is near the slower pinned kind,
the choice went wrong.  A launch's state decides which kind is faster (on the
2-core VMs some launches read the other core's cache several times slower): run
it several times.  The measurement's calls are not checked here; both kinds'
results are (``tests/mpi/algorithms/test_rsag.py``).
"""

import argparse

import numpy as np
from mpi4py import MPI

import pycollective  # noqa: F401  (hands the probe its allreduce)
from pycollective.collectives import auto, probe
from pycollective.algorithms.shm import stores as _stores
from pycollective.runtime.context import get_context

FIELDS = [f"shm_{n}" for n in probe.SHM_SIZES if (64 << 10) <= n <= (4 << 20)]
KINDS = {"chosen": None, "plain": 0, "non-temporal": 1}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=2)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    layout = auto.layout_of(get_context(comm))
    if comm.rank == 0:
        print(f"{comm.size} ranks; the measurement's shm calls, slowest rank's median, us")
        print(f"{'pass':>4} {'stores':>13} " + " ".join(f"{f[4:]:>9}" for f in FIELDS)
              + "  settled")
    for k in range(args.passes):
        for name, force in KINDS.items():
            _stores.FORCE_STORES = force
            try:
                times = probe._library_times(comm, True, layout)
            finally:
                _stores.FORCE_STORES = None
            row = []
            for field in FIELDS:
                mine = np.array(times[field])
                slowest = np.empty_like(mine)
                comm.Allreduce(mine, slowest, op=MPI.MAX)
                row.append(float(np.median(slowest)))
            if comm.rank == 0:
                print(f"{k:>4} {name:>13} " + " ".join(f"{t * 1e6:9.1f}" for t in row)
                      + f"  {_stores._SETTLED.get('rsag')}")


if __name__ == "__main__":
    main()
