"""A job whose hosts lose each other: run on emulated hosts by tests/test_multihost.py.

    partition.py DIR cut ALGORITHM [COUNT]   # calls until an error; the test cuts a link
    partition.py DIR loss ALGORITHM CALLS

``cut``: every rank calls allreduce (COUNT float32, 2**16 by default, checked exactly)
in a loop; after 20 good calls rank 0 writes DIR/started, and the test cuts
the last host's link.  A rank that gets an error writes DIR/result.<rank>
(JSON: the error, its ranks, when it came on CLOCK_MONOTONIC, which all
namespaces share), waits LINGER_S and raises it, so that the job ends as a
user's would.  The wait is the test's, not the library's: the first rank to
raise aborts the job (python -m mpi4py), and a rank that was about to raise
-- it reads the notice within a millisecond on a quiet machine, later on CI's
loaded 2 cores -- would be killed before it wrote what it raised.
A rank that sees no error within LIMIT_S writes that instead.

``loss``: CALLS checked calls over a lossy link; each rank writes how many
were right and how long the slowest took.
"""

import json
import os
import socket
import sys
import time

import numpy as np
from mpi4py import MPI

import pycollective

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
COUNT = 1 << 16  # float32 per call (cut: the optional COUNT argument)
LIMIT_S = 60.0
LINGER_S = 3.0  # after writing an error, before raising it (see above)


def data(rank, count):
    return ((np.arange(count) * 7 + rank * 13) % 101).astype(np.float32)


def write(folder, **fields):
    fields.update(rank=RANK, host=socket.gethostname())
    path = os.path.join(folder, f"result.{RANK}")
    with open(path + ".tmp", "w") as f:
        json.dump(fields, f)
    os.replace(path + ".tmp", path)


def main():
    folder, mode, algorithm, *rest = sys.argv[1:]
    count = int(rest[0]) if mode == "cut" and rest else COUNT
    total = int(rest[0]) if mode == "loss" else None
    x = data(RANK, count)
    want = sum(data(q, count).astype(np.int64) for q in range(SIZE)).astype(np.float32)
    y = np.empty_like(x)
    calls, wrong, slowest = 0, 0, 0.0
    start = time.monotonic()
    try:
        while (total is None and time.monotonic() - start < LIMIT_S) or (
                total is not None and calls < total):
            t0 = time.monotonic()
            pycollective.allreduce(x, y, algorithm=algorithm)
            slowest = max(slowest, time.monotonic() - t0)
            calls += 1
            wrong += not np.array_equal(y, want)
            if calls == 20 and RANK == 0 and mode == "cut":
                open(os.path.join(folder, "started"), "w").close()
    except Exception as exc:
        write(folder, outcome=type(exc).__name__, text=str(exc),
              ranks=list(getattr(exc, "ranks", ())), at=time.monotonic(), calls=calls,
              wrong=wrong)
        time.sleep(LINGER_S)
        raise
    write(folder, outcome="ok", calls=calls, wrong=wrong, slowest=slowest,
          seconds=time.monotonic() - start)


if __name__ == "__main__":
    main()
