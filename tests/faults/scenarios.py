"""Fault scenarios, run on several ranks by tests/test_faults.py through scripts/run_mpi.sh.

    scenarios.py DIR SCENARIO [ARG...]

Every rank writes its PID to DIR/pid.<rank> first (the test checks that no
process of the job remains) and reports what it saw as single-write lines

    RESULT <rank> <label> <outcome> <text>

where outcome is ``ok``, ``wrong`` or an exception class name.  The test
parses those lines; nothing here asserts, so one rank's surprise cannot hang
the others.
"""

import os
import signal
import sys
import threading
import time
import warnings

import numpy as np
from mpi4py import MPI

import pycollective

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
TIMEOUT = 3.0  # every scenario's collective timeout, seconds


def report(label, outcome, text=""):
    line = f"RESULT {RANK} {label} {outcome} {' '.join(str(text).split())}\n"
    os.write(1, line.encode())


def data(rank, count, dtype="float32"):
    """Exact small integers: any reduction order gives the same bits."""
    return ((np.arange(count) * 7 + rank * 13) % 101).astype(dtype)


def expected(count, dtype="float32", nranks=SIZE):
    return sum(data(q, count, "int64") for q in range(nranks)).astype(dtype)


def attempt(label, fn, want=None):
    """Run ``fn``; report ok/wrong or the exception; never raise."""
    try:
        got = fn()
    except Exception as exc:  # noqa: BLE001  (reporting is the point)
        report(label, type(exc).__name__, exc)
        return exc
    if want is not None and not np.array_equal(np.asarray(got), want):
        report(label, "wrong", f"{int(np.count_nonzero(np.asarray(got) != want))} elements")
    else:
        report(label, "ok")
    return None


def fresh():
    """A new communicator for each sub-scenario (a failure breaks the one it happens on).

    One good call first, so the library's private side of it exists and the
    fault happens inside a call, where the side channel can name ranks.
    """
    comm = WORLD.Dup()
    pycollective.set_timeout(TIMEOUT, comm=comm)
    warm = data(RANK, 3)
    pycollective.allreduce(warm, np.empty_like(warm), comm=comm, algorithm="ring")
    return comm


# --- a rank that stops, dies or skips ----------------------------------------------------

def stop(algorithms, victim="2"):
    """The victim stops itself (SIGSTOP) before the call; the others must time out naming it.

    Then rank 0 wakes it (SIGCONT): it enters the call, hears that the call
    failed, and raises too.  Every algorithm in turn, each on a new communicator
    ("barrier": pycollective.barrier instead of an allreduce).
    """
    victim = int(victim)
    pids = WORLD.allgather(os.getpid())
    for algo in algorithms.split(","):
        comm = fresh()
        x = data(RANK, 1000)
        WORLD.Barrier()
        if RANK == victim:
            os.kill(os.getpid(), signal.SIGSTOP)  # rank 0 continues us below
        t0 = time.monotonic()
        attempt(f"stop:{algo}", _collective(algo, comm, x))
        if RANK != victim:
            report(f"stop:{algo}:seconds", "ok", f"{time.monotonic() - t0:.1f}")
        if RANK == 0:
            time.sleep(0.5)
            os.kill(pids[victim], signal.SIGCONT)
        WORLD.Barrier()
        attempt(f"stop:{algo}:again", _collective(algo, comm, x))


def _collective(algo, comm, x):
    """The call of ``stop``: allreduce by ``algo``, or (``algo`` "barrier") the barrier."""
    if algo == "barrier":
        return lambda: pycollective.barrier(comm)
    return lambda: pycollective.allreduce(x, np.empty_like(x), comm=comm, algorithm=algo)


def stop_during(algo, victim="2"):
    """The victim is stopped from a thread while it is inside a loop of calls."""
    victim = int(victim)
    pids = WORLD.allgather(os.getpid())
    comm = fresh()
    x = data(RANK, 200_000)
    out = np.empty_like(x)
    if RANK == victim:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGSTOP)).start()
    deadline = time.monotonic() + 30
    error = None
    while error is None and time.monotonic() < deadline:
        error = attempt(f"during:{algo}", lambda: pycollective.allreduce(
            x, out, comm=comm, algorithm=algo), expected(x.size))
    if RANK == 0:
        time.sleep(0.5)
        os.kill(pids[victim], signal.SIGCONT)


def kill_during(algo, victim="2"):
    """The victim dies (SIGKILL) inside a loop of calls: the job must end, nothing left."""
    victim = int(victim)
    comm = fresh()
    x = data(RANK, 200_000)
    out = np.empty_like(x)
    if RANK == victim:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if attempt(f"kill:{algo}", lambda: pycollective.allreduce(
                x, out, comm=comm, algorithm=algo), expected(x.size)):
            break


def skip(algorithms, victim="2"):
    """The victim calls Barrier on the user's communicator instead of the collective."""
    victim = int(victim)
    for algo in algorithms.split(","):
        comm = fresh()
        x = data(RANK, 1000)
        if RANK == victim:
            request = comm.Ibarrier()  # the user's own collective, not ours
            t0 = time.monotonic()
            while not request.Test() and time.monotonic() - t0 < TIMEOUT + 3:
                time.sleep(0.01)
            report(f"skip:{algo}", "skipped", "")
        else:
            attempt(f"skip:{algo}", lambda: pycollective.allreduce(
                x, np.empty_like(x), comm=comm, algorithm=algo))
        WORLD.Barrier()


def behind(victim="2"):
    """A rank that finished a call waits in the next one for a rank still in the first.

    A ring of 3: the victim stalls (outside the library's waits) before the
    last step of a call.  Rank 0, which receives from it, waits there (2 s
    timeout); rank 1, which receives from rank 0, gets its last block, ends
    the call and waits in the next one (1.5 s timeout) for rank 0.  At rank
    1's timeout rank 0 is late but heard from, in the earlier call: rank 1
    must take rank 0's verdict (the victim), not blame rank 0.
    """
    victim = int(victim)
    comm = fresh()
    x = data(RANK, 999)
    if RANK == victim:
        from pycollective.algorithms import ring
        real, steps = ring.sendrecv, [0]

        def stalling(*args):
            steps[0] += 1
            if steps[0] == 2 * (SIZE - 1):  # the call's last step
                time.sleep(TIMEOUT + 1)
            return real(*args)
        ring.sendrecv = stalling
    WORLD.Barrier()

    def calls():
        pycollective.allreduce(x, np.empty_like(x), comm=comm, algorithm="ring", timeout=2.0)
        pycollective.allreduce(x, np.empty_like(x), comm=comm, algorithm="ring", timeout=1.5)
    attempt("behind", calls)
    WORLD.Barrier()


def comm_timeout_nonblocking(victim="1"):
    """set_timeout(comm=) reaches a drop-in Iallreduce (run on the helper's own communicator).

    The victim does not take part for longer than the process-wide timeout;
    the others' Wait must raise after the communicator's shorter one.
    """
    victim = int(victim)
    comm = pycollective.Comm(WORLD.Dup())
    pycollective.set_timeout(0.5, comm=comm)
    x = data(RANK, 1000)
    warm = np.empty_like(x)
    comm.Iallreduce(x, warm).Wait()  # the helper and its communicator exist
    if RANK == victim:
        time.sleep(TIMEOUT + 1)
        report("comm-timeout", "skipped", "")
    else:
        t0 = time.monotonic()
        attempt("comm-timeout", lambda: comm.Iallreduce(x, np.empty_like(x)).Wait())
        report("comm-timeout:seconds", "ok", f"{time.monotonic() - t0:.3f}")
    WORLD.Barrier()


# --- ranks that disagree -------------------------------------------------------------------

def mismatch(kind, check, algorithms):
    """Rank 1 differs in ``kind`` (count, dtype, op); the agreement step ``check`` on or off."""
    pycollective.set_check(check == "on")
    for algo in algorithms.split(","):
        comm = fresh()
        count, dtype, op = 1000, "float32", MPI.SUM
        if RANK == 1:
            if kind == "count":
                count = 500
            elif kind == "dtype":
                dtype = "int32"  # the same itemsize: only the fingerprint tells
            elif kind == "op":
                op = MPI.MAX
        x = data(RANK, count, dtype)
        t0 = time.monotonic()
        attempt(f"mismatch-{kind}-{check}:{algo}", lambda: pycollective.allreduce(
            x, np.empty_like(x), op, comm=comm, algorithm=algo))
        report(f"mismatch-{kind}-{check}:{algo}:seconds", "ok", f"{time.monotonic() - t0:.1f}")
        WORLD.Barrier()


def mixed_check(algorithms):
    """Rank 1 runs with the agreement step off, the others with it on."""
    for algo in algorithms.split(","):
        comm = fresh()
        pycollective.set_check(RANK != 1)
        x = data(RANK, 1000)
        attempt(f"mixed-check:{algo}", lambda: pycollective.allreduce(
            x, np.empty_like(x), comm=comm, algorithm=algo))
        pycollective.set_check(True)
        WORLD.Barrier()


# --- misuse --------------------------------------------------------------------------------

def threads(algorithms, calls="60", shapes="same", check="on", first="none"):
    """Two threads call collectives on one communicator at once.

    With ``shapes=same`` every call has the same shape and data, so however
    the calls of different ranks pair up, every result must be right.  With
    ``shapes=differ`` the threads' calls differ: pairings that mix them must
    raise, never return wrong data or crash.  With ``shapes=values`` they
    have the same shape but each thread reduces its own values (``x * (k +
    1)`` in thread k): a pairing of two threads' calls that is not refused
    returns the wrong sum.  ``shapes=barrier``: the second thread calls barriers instead.
    ``first=main``: one call on the main thread first.
    """
    calls = int(calls)
    pycollective.set_check(check == "on")
    for algo in algorithms.split(","):
        # Compile (or load) the algorithm's code first, on another communicator,
        # so that the threads' first calls do not spend the 3 s timeout on it:
        # a fresh clone's first shm calls compile for 2-3 s per rank on an idle
        # machine, and the test is about the calls' order, not about that.
        warm = WORLD.Dup()
        # the full path, the repeated call's first (it resolves the slots), then its fast way
        for _ in range(3):
            x = data(RANK, 2000)
            pycollective.allreduce(x, np.empty_like(x), comm=warm, algorithm=algo)
        warm.Free()
        comm = WORLD.Dup()
        pycollective.set_timeout(TIMEOUT, comm=comm)
        if first == "main":
            x = data(RANK, 2000)
            pycollective.allreduce(x, np.empty_like(x), comm=comm, algorithm=algo)
        wrong, errors = [0], []

        def work(seed):
            scale = seed + 1 if shapes == "values" else 1
            for i in range(calls):
                count = 2000 + seed if shapes == "differ" else 2000
                x = data(RANK, count) * scale
                try:
                    if shapes == "barrier" and seed == 1:
                        pycollective.barrier(comm)
                        continue
                    out = pycollective.allreduce(x, np.empty_like(x), comm=comm, algorithm=algo)
                except Exception as exc:  # noqa: BLE001
                    errors.append(f"{type(exc).__name__}: {exc}")
                    return
                if not np.array_equal(out, expected(count) * scale):
                    wrong[0] += 1

        pool = [threading.Thread(target=work, args=(s,)) for s in range(2)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        outcome = "wrong" if wrong[0] else (errors[0].split(":")[0] if errors else "ok")
        report(f"threads:{algo}", outcome, f"{wrong[0]} wrong of {2 * calls}; {errors[:1]}")
        comm.Free()


def threads_turns(algorithms, checks="on"):
    """Threads that take turns on one communicator, started in the same order on every
    rank (so named alike): the main thread, a worker, the main thread, a second worker,
    each with its own values, a barrier before each call.  Supported: every result must
    be right."""
    for check, algo in [(c, a) for c in checks.split(",") for a in algorithms.split(",")]:
        pycollective.set_check(check == "on")
        comm = WORLD.Dup()
        pycollective.set_timeout(TIMEOUT, comm=comm)
        wrong, errors = [0], []

        def work(scale, calls=5):
            for _ in range(calls):
                x = data(RANK, 2000) * scale
                try:
                    pycollective.barrier(comm)
                    out = pycollective.allreduce(x, np.empty_like(x), comm=comm, algorithm=algo)
                except Exception as exc:  # noqa: BLE001
                    errors.append(f"{type(exc).__name__}: {exc}")
                    return
                wrong[0] += not np.array_equal(out, expected(2000) * scale)

        for scale in (1, 2, 3, 4):
            if scale % 2:
                work(scale)
            else:
                worker = threading.Thread(target=work, args=(scale,))
                worker.start()
                worker.join()
        outcome = "wrong" if wrong[0] else (errors[0].split(":")[0] if errors else "ok")
        report(f"threads-turns-{check}:{algo}", outcome, f"{wrong[0]} wrong of 20; {errors[:1]}")
        comm.Free()


def inflight():
    """Exit with Iallreduce requests that were never waited for."""
    comm = pycollective.Comm(WORLD)
    x = data(RANK, 1_000_000)
    keep = [comm.Iallreduce(MPI.IN_PLACE, x.copy()) for _ in range(4)]
    report("inflight", "ok", f"{len(keep)} requests left in flight")


def many_comms(count="500"):
    """Hundreds of live communicators that pycollective has used."""
    comms, wrong = [], 0
    x = data(RANK, 100)
    try:
        for i in range(int(count)):
            comm = WORLD.Dup()
            comms.append(comm)
            out = pycollective.allreduce(x, np.empty_like(x), comm=comm)
            wrong += not np.array_equal(out, expected(100))
    except Exception as exc:  # noqa: BLE001
        report("many-comms", type(exc).__name__, f"after {len(comms)}: {exc}")
    else:
        report("many-comms", "wrong" if wrong else "ok", f"{len(comms)} communicators")
    for comm in comms:
        comm.Free()


def calibration(kind, algorithm="auto"):
    """A hostile calibration file (PYCOLLECTIVE_MODEL, set by the test): the collective works.

    With ``auto``, rank 0 warns once and the defaults are used; a named
    algorithm never reads the file.
    """
    x = data(RANK, 1000)
    comm = WORLD.Dup()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        attempt(f"calibration-{kind}:{algorithm}", lambda: pycollective.allreduce(
            x, np.empty_like(x), comm=comm, algorithm=algorithm), expected(1000))
    mine = [str(w.message) for w in caught if "calibration" in str(w.message)]
    report(f"calibration-{kind}:{algorithm}:warnings", "ok", f"{len(mine)} {mine[:1]}")


def note_shared_memory(folder):
    """Append the /dev/shm files this process maps (the test checks they are gone after)."""
    with open("/proc/self/maps") as maps:
        names = {line.split()[-1] for line in maps if "/dev/shm/" in line}
    with open(os.path.join(folder, f"shm.{RANK}"), "a") as f:
        f.writelines(name.replace(" (deleted)", "") + "\n" for name in names
                     if not name.endswith("(deleted)"))


def main():
    folder, scenario, *args = sys.argv[1:]
    with open(os.path.join(folder, f"pid.{RANK}"), "w") as f:
        f.write(str(os.getpid()))
    note_shared_memory(folder)
    pycollective.set_timeout(TIMEOUT)
    globals()[scenario.replace("-", "_")](*args)
    note_shared_memory(folder)
    os.write(1, f"DONE {RANK}\n".encode())


if __name__ == "__main__":
    main()
