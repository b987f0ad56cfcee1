#!/usr/bin/env bash
# Every measurement quoted in benchmarks/speed/RESULTS.md, in one go.
#
#   benchmarks/speed/run_all.sh [LOGFILE]
#
# Run it only on a quiet machine: it prints the load and the other MPI jobs
# first, and each block is one launch, so the ratios inside a block come
# from the same run.  About 5 minutes on the 2-core machine.
set -u
cd "$(dirname "$0")/../.."
log=${1:-benchmarks/speed/last_run.txt}
export PYTHON=${PYTHON:-/work/venv/bin/python} PYCOLLECTIVE_TIMEOUT=${PYCOLLECTIVE_TIMEOUT:-600}
m=benchmarks/speed/measure.py
idle() {  # percent of CPU time idle over the next 2 s
    local a b
    read -r _ a1 a2 a3 a4 a5 _ < /proc/stat; sleep 2
    read -r _ b1 b2 b3 b4 b5 _ < /proc/stat
    a=$((b1 + b2 + b3 + b4 + b5 - a1 - a2 - a3 - a4 - a5)); b=$((b4 - a4))
    echo $((100 * b / (a > 0 ? a : 1)))
}
quiet() {  # wait (up to 10 min) until no other MPI job runs and the CPUs idle
    local i
    for i in $(seq 60); do
        if [ "$(pgrep -f hydra_pmi_proxy | wc -l)" = 0 ] && [ "$(idle)" -ge 90 ]; then
            return 0
        fi
        sleep 8
    done
    echo "# WARNING: machine not quiet, measuring anyway"
}
run() {
    quiet
    echo "\$ scripts/run_mpi.sh $*    # $(date -u +%T), idle before: $(idle)%"
    scripts/run_mpi.sh "$@" 2>&1 | grep -v '^mpi4py'
    echo "# other MPI jobs after: $(pgrep -f hydra_pmi_proxy | wc -l)"
    echo
}
{
    date -u
    uptime
    echo "other MPI jobs: $(pgrep -f hydra_pmi_proxy | wc -l)"
    echo
    # Large messages: every algorithm beside native, memory-bandwidth floor.
    run 2 $m --M 1e7 3e7 --membw --reps 9
    run 4 $m --M 1e7 --membw --reps 7
    run 8 $m --M 1e7 --membw --reps 5
    # Small messages: the pieces of one call, then back-to-back calls,
    # agreement on and off.
    run 2 $m --pieces
    for n in 2 4 8; do
        run $n $m --M 1 1000 --inner 200 --reps 15 --warmup 50 \
            --algs native shm butterfly tree rabenseifner ring
        run $n $m --M 1 1000 --inner 200 --reps 15 --warmup 50 --no-check \
            --algs native shm butterfly tree rabenseifner ring
    done
    # Segment size of ring_pipelined.
    for n in 2 4 8; do
        run $n $m --M 1e7 --reps 5 --segments 65536 262144 1048576 4194304
    done
    # Where the time goes in shm.
    run 2 $m --M 3e7 --algs native shm --reps 5 --breakdown 3e7
    run 8 $m --M 1e7 --algs native shm --reps 5 --breakdown 1e7
    date -u
    uptime
} | tee "$log"
