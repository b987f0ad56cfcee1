#!/usr/bin/env bash
# The speed studies beside the standard sweep, through the bench's commands:
# large messages against native MPI with the memory-traffic floor, small
# messages (the pieces of one call, back-to-back calls with the agreement
# step on and off), ring_pipelined's segment size, and where the time of a
# large "shm" call goes.
#
#   benchmarks/run_speed.sh                       # about 5 minutes on 2 cores
#   NS=2 LARGE_M=1e5 SEGMENT_M=1e5 BREAKDOWN_M=1e5 MEMBW_BYTES=16M WAIT=0 \
#       benchmarks/run_speed.sh                   # a quick look
#
# Writes benchmarks/results/<UTC stamp>-speed/: speed.txt (everything rank 0
# printed, with the machine's idle share before each launch), commands.txt,
# and one JSON per launch (regenerated, not committed).
#
# Each launch starts only when the machine is quiet (no other MPI job, at
# least 90 % of the CPU time idle over 2 s; at most 10 minutes of waiting),
# and the ratios inside one launch come from the same run.
#
# Environment: NS ("2 4 8"), LARGE_M ("1e7 3e7" at N = 2, the first size at
# larger N), SMALL_M ("1 1000"), SEGMENT_M (1e7), BREAKDOWN_M (3e7 at N = 2,
# 1e7 above), MEMBW_BYTES (256M), WAIT (1; 0: do not wait for a quiet
# machine), OUT, PYTHON (default: python3 on PATH), PYCOLLECTIVE_TIMEOUT (per
# launch, 900 s).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
NS=${NS:-"2 4 8"}
LARGE_M=${LARGE_M:-"1e7 3e7"}
SMALL_M=${SMALL_M:-"1 1000"}
SEGMENT_M=${SEGMENT_M:-1e7}
BREAKDOWN_M=${BREAKDOWN_M:-}
MEMBW_BYTES=${MEMBW_BYTES:-256M}
WAIT=${WAIT:-1}
export PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
export PYCOLLECTIVE_TIMEOUT=${PYCOLLECTIVE_TIMEOUT:-900}

stamp=$(date -u +%Y-%m-%dT%H%MZ)
out=${OUT:-"$here/results/$stamp-speed"}
mkdir -p "$out"
log="$out/speed.txt"
status=0

idle() {  # percent of CPU time idle over the next 2 s
    local a b a1 a2 a3 a4 a5 b1 b2 b3 b4 b5
    read -r _ a1 a2 a3 a4 a5 _ < /proc/stat; sleep 2
    read -r _ b1 b2 b3 b4 b5 _ < /proc/stat
    a=$((b1 + b2 + b3 + b4 + b5 - a1 - a2 - a3 - a4 - a5)); b=$((b4 - a4))
    echo $((100 * b / (a > 0 ? a : 1)))
}
others() { pgrep -f hydra_pmi_proxy | wc -l; }
quiet() {
    local i
    [ "$WAIT" = 0 ] && return 0
    for i in $(seq 60); do
        if [ "$(others)" = 0 ] && [ "$(idle)" -ge 90 ]; then
            return 0
        fi
        sleep 8
    done
    echo "# WARNING: machine not quiet, measuring anyway"
}
k=0
bench() {  # bench NP COMMAND ARGS...: one launch, its JSON beside the log
    local n=$1; shift
    k=$((k + 1))
    local json="$out/$(printf %02d $k)_$1_N$n.json"
    local cmd=(scripts/run_mpi.sh "$n" -m pycollective.bench "$@" --json "$json")
    quiet
    echo "${cmd[*]//$root\//}" >> "$out/commands.txt"
    echo "\$ ${cmd[*]//$root\//}    # $(date -u +%T), idle before: $(idle)%"
    (cd "$root" && "${cmd[@]}")
    local rc=$?
    [ "$rc" -ne 0 ] && { echo "# exit status $rc"; status=1; }
    echo "# other MPI jobs after: $(others)"
    echo
}

exec > >(tee "$log") 2>&1
date -u
uptime
echo "other MPI jobs: $(others)"
echo
for n in $NS; do
    # shellcheck disable=SC2086
    sizes=$([ "$n" = 2 ] && echo $LARGE_M || echo ${LARGE_M%% *})
    bench "$n" membw --bytes "$MEMBW_BYTES" --M $sizes
    for m in $sizes; do
        bench "$n" allreduce ring ring_pipelined rabenseifner shm hierarchical --M "$m" \
            --iters 9
    done
done
for n in $NS; do
    # shellcheck disable=SC2086
    bench "$n" latency shm butterfly tree rabenseifner ring --M $SMALL_M --inner 200 \
        --iters 15 --warmup 50 --agree both
done
for n in $NS; do
    bench "$n" segments --M "$SEGMENT_M" --segments 64K 256K 1M 4M
done
for n in $NS; do
    m=${BREAKDOWN_M:-$([ "$n" = 2 ] && echo 3e7 || echo 1e7)}
    bench "$n" breakdown --M "$m"
done
date -u
uptime
exit $status
