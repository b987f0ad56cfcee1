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
# * The run is bounded by $PYCOLLECTIVE_TIMEOUT seconds (default 900): then
#   the job gets SIGTERM, and SIGKILL 10 s later; exit status 124.
# * Afterwards, shared-memory segments that killed MPI jobs leave in
#   /dev/shm (mpich_shm_*, sm_segment.*) are removed if no live process
#   still maps or holds them, so concurrent jobs are never disturbed.
# * Open MPI (if that is the library installed) gets the flags it needs to
#   run as root and oversubscribed; MPICH needs none.
set -u

if [ $# -lt 1 ] || ! [[ "$1" =~ ^[0-9]+$ ]] || [ "$1" -lt 1 ]; then
    echo "usage: $0 NP [python arguments...]" >&2
    exit 2
fi
np=$1
shift

py=${PYTHON:-$(command -v python3 || command -v python)}
bindir=$(dirname "$("$py" -c 'import sys; print(sys.executable)')")
if [ -x "$bindir/mpiexec" ]; then
    mpiexec="$bindir/mpiexec"
else
    mpiexec=$(command -v mpiexec) || { echo "$0: no mpiexec found (pip install mpich)" >&2; exit 2; }
fi
limit=${PYCOLLECTIVE_TIMEOUT:-900}

flags=()
if "$mpiexec" --version 2>/dev/null | grep -qi "open mpi"; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_btl=${OMPI_MCA_btl:-self,sm} OMPI_MCA_osc=${OMPI_MCA_osc:-^ucx}
    flags+=(--oversubscribe)
fi

clean_shm() {
    "$py" - <<'PY'
import glob, os
candidates = glob.glob("/dev/shm/mpich_shm_*") + glob.glob("/dev/shm/sm_segment.*")
if candidates:
    in_use = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as maps:
                in_use.update(line.split(None, 5)[-1].strip() for line in maps if "/dev/shm/" in line)
            for fd in os.listdir(f"/proc/{pid}/fd"):
                in_use.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    for path in candidates:
        if path not in in_use:
            try:
                os.unlink(path)
            except OSError:
                pass
PY
}

trap 'clean_shm; exit 130' INT
trap 'clean_shm; exit 143' TERM

timeout --signal=TERM --kill-after=10 "$limit" \
    "$mpiexec" "${flags[@]}" -n "$np" "$py" -m mpi4py "$@" &
child=$!
wait $child
rc=$?
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "$0: job on $np ranks stopped after the ${limit}s limit (PYCOLLECTIVE_TIMEOUT)" >&2
fi
clean_shm
exit $rc
