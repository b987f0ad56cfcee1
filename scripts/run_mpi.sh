#!/usr/bin/env bash
# Launch a Python program on NP MPI ranks, the one way README, tests and
# benchmarks do it.
#
#   scripts/run_mpi.sh NP [python arguments...]
#   scripts/run_mpi.sh 8 -m pycollective.bench ring --M 1e8
#   scripts/run_mpi.sh 4 -m pytest --with-mpi tests/mpi
#
# * mpiexec: the one beside the Python in use (the mpich wheel puts it in the
#   virtual environment's bin/), else the first on PATH.  $PYTHON overrides
#   the interpreter (default: python3 on PATH).
# * Python runs under `python -m mpi4py`, so an uncaught exception on any rank
#   calls MPI_Abort and the whole job ends instead of hanging.
# * Open MPI (if that is the library installed) gets the flags it needs to
#   run as root, and --oversubscribe when NP exceeds the cores; MPICH and
#   Intel MPI need none.
# * Exit status: the job's; 124 (and a message on stderr) when the job was
#   stopped by the limit below; 2 for a usage error.  When run_mpi.sh itself
#   gets SIGTERM, SIGINT or SIGHUP (an outer `timeout`, Ctrl-C, a closed
#   terminal) it stops the job and then dies of that same signal, so a shell
#   sees 143, 130 or 129.
#
# Stopping.  The job never outlives the launcher:
# * The limit is $PYCOLLECTIVE_TIMEOUT (default 900; seconds, or N with a
#   unit s/m/h/d as for timeout(1); 0 = none).
# * On the limit or on one of those signals the job gets SIGTERM (SIGINT for
#   SIGINT, so ranks print where they were), and SIGKILL 3 s later if any of
#   its processes is still alive; a second signal skips the 3 s.  run_mpi.sh
#   returns only when no process of the job is left, in about 4 s at most,
#   which fits inside a caller's `timeout -k 5`.
# * Why the supervisor below rather than `timeout`: Hydra's proxy puts every
#   rank in a session of its own, so no process-group signal reaches the
#   ranks, and once mpiexec is gone the ranks are orphans nobody can find by
#   parentage.  The supervisor (this script, exec'd into a small Python
#   program) makes itself a child subreaper (prctl), so orphaned proxies and
#   ranks are re-parented to it: "the job" is exactly its descendants, which
#   it can always find in /proc, kill and reap.  mpiexec runs in a process
#   group of its own, so Ctrl-C or an outer timeout (which signal the
#   caller's group) reach only the supervisor, which then stops the job in
#   order: the signal to mpiexec's group (Hydra forwards it to the ranks;
#   Open MPI's mpiexec signals them itself and escalates to SIGKILL on its
#   own), then SIGKILL to every descendant.  If the supervisor is SIGKILLed
#   itself, mpiexec gets SIGKILL too (PR_SET_PDEATHSIG), and Hydra's proxy
#   then kills the ranks (files it leaves behind then stay; see below).
#   Open MPI's mpiexec (prterun) starts the ranks itself and leaves them
#   running when it is killed outright, so under Open MPI each rank first
#   runs a few lines (the orphan guard below) that ask the kernel for
#   SIGKILL when its parent dies, then exec's Python.
#
# Clean-up.  Killed MPI jobs leave files behind: shared-memory segments in
# /dev/shm (mpich_shm_*, sm_segment.*, ...) and Hydra's topology file
# /tmp/hydra_hwloc_xmlfile_*.  On every way out (normal end, error, limit,
# signal) the supervisor removes those that this job created, and only those:
# /dev/shm may be shared with jobs this process cannot see (containers run
# with --ipc=host share /dev/shm but not /proc), so "no live process holds
# it" does not prove a file is stale.  A file is removed only if
#   1. a process of this job was seen holding it (open or mapped) while the
#      job ran, and it did not exist (same name and inode) before the launch;
#   2. it is still that same inode; and
#   3. no live process that we can see holds it now.
# The supervisor looks for new files when inotify says one appeared in
# /dev/shm or /tmp (within milliseconds, while its creator normally still
# holds it), every second as a back-stop, and just before it stops the job
# (limit or signal).  MPI libraries keep their segments mapped as long as a
# rank lives, so theirs are caught unless the job aborts within milliseconds
# of creating them (MPI_Abort kills ranks without warning the launcher); a
# file that the job created and let go of before anyone looked is kept,
# since nothing proves whose it is: a leak is possible, removing another
# job's file is not.  A process that starts MPI without mpiexec (a singleton)
# is no job of this script's and leaves files of its own: Open MPI's
# sm_segment.* even after MPI_Finalize, MPICH's mpich_shm_<pid in hex>_0 when
# it is killed.  Launch through this script (NP 1 is fine) to have them removed.
#
# Output.  mpiexec forwards each write of each rank as it arrives.  With
# PYTHONUNBUFFERED=1 one print() is several writes (each argument, the
# separators, the newline), so lines printed at once by several ranks can
# interleave.  The launcher leaves that alone (re-buffering output would
# change what users asked for); print whole lines in one write, e.g.
# sys.stdout.write(f"...\n"), or from one rank, when lines matter.
set -u

usage() {
    echo "usage: $0 NP [python arguments...]" >&2
    exit 2
}
if [ $# -lt 1 ] || ! [[ "$1" =~ ^[0-9]+$ ]] || [ "$1" -lt 1 ]; then
    usage
fi
np=$1
shift

limit=${PYCOLLECTIVE_TIMEOUT:-900}
if ! [[ "$limit" =~ ^[0-9]+(\.[0-9]+)?[smhd]?$ ]]; then
    echo "$0: PYCOLLECTIVE_TIMEOUT=$limit is not a duration (seconds, or N with a unit s/m/h/d)" >&2
    usage
fi

py=${PYTHON:-$(command -v python3 || command -v python)}
bindir=$(dirname "$("$py" -c 'import sys; print(sys.executable)')")
if [ -x "$bindir/mpiexec" ]; then
    mpiexec="$bindir/mpiexec"
else
    mpiexec=$(command -v mpiexec) || { echo "$0: no mpiexec found (pip install mpich)" >&2; exit 2; }
fi

flags=()
rank=("$py" -m mpi4py)  # what each rank runs before the user's arguments
if "$mpiexec" --version 2>/dev/null | grep -qi "open mpi"; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_btl=${OMPI_MCA_btl:-self,sm} OMPI_MCA_osc=${OMPI_MCA_osc:-^ucx}
    if [ "$np" -gt "$(nproc)" ]; then
        flags+=(--oversubscribe)
    fi
    # The orphan guard (see "Stopping"): SIGKILL when mpiexec dies, then
    # Python.  If mpiexec died before prctl, the rank was already re-parented
    # to the supervisor (whose pid is this shell's: it is exec'd below) or to
    # init, and it leaves at once.  Arguments: the supervisor's pid, the command.
    IFS= read -r -d '' guard <<'PY'
import ctypes, os, signal, sys
ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
if os.getppid() in (1, int(sys.argv[1])):
    os._exit(1)
os.execv(sys.argv[2], sys.argv[2:])
PY
    rank=("$py" -I -c "$guard" "$$" "${rank[@]}")
fi

# The supervisor (see "Stopping" and "Clean-up" above): scripts/supervise.py, shared
# with scripts/multihost/emulate.sh.  Arguments: the name for messages, the limit, NP,
# the command.
exec "$py" -I "$(cd "$(dirname "$0")" && pwd)/supervise.py" "$0" "$limit" "$np" \
    "$mpiexec" "${flags[@]}" -n "$np" "${rank[@]}" "$@"
