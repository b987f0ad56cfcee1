#!/usr/bin/env bash
# The standard sweep: every algorithm, algorithm="auto" and native MPI_Allreduce,
# out of place and in place, float32 sum, at N = 2, 4, 8 ranks over M = 1 ..
# MAXCOUNT elements per rank; then a Markdown report with plots.
#
#   benchmarks/run_sweep.sh                 # the standard sweep (M up to 1e7)
#   MAXCOUNT=1e8 benchmarks/run_sweep.sh    # the issue's full range (see below)
#   NS="2 4" MAXCOUNT=1e5 benchmarks/run_sweep.sh   # a quick one
#
# Writes benchmarks/results/<UTC stamp>/: model.json (the calibration used),
# sweep_N<n>.{json,txt,png}, commands.txt and report.md.  A run cited in the
# docs keeps report.md, commands.txt, model.json, the plots and the text
# tables; the JSON (every repetition) is regenerated, not committed
# (benchmarks/results/.gitignore).
#
# Why M stops at 1e7 by default: at 1e8 float32 the benchmark holds three
# 400 MB vectors per rank, and naive / ps / tree / butterfly add one to three
# more of scratch, which at 8 ranks is 15-20 GB on a 24 GB machine, and one
# size then takes 10+ minutes for all algorithms.  The single 1e8 point is
# measured for the ring by the issue's command instead (see the README).
#
# Environment: NS (default "2 4 8"), MAXCOUNT (1e7), FACTOR (3.16227766:
# half-decade steps, 15 sizes from 1 to 1e7), ITERS (30: at most this many timed repetitions), WARMUP (2),
# BUDGET (6 s of timed repetitions per size, all algorithms together, at
# least 3 repetitions), CALIBRATE (1: calibrate the model first at every N
# into the results directory; 0: use the model's default calibration),
# ALGOS ("all auto"), OUT (the results directory), PYTHON (default: python3
# on PATH), PYCOLLECTIVE_TIMEOUT (per launch, 3600 s).  The bench's progress
# bar shows when this script's stderr is a terminal.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
NS=${NS:-"2 4 8"}
MAXCOUNT=${MAXCOUNT:-1e7}
FACTOR=${FACTOR:-3.16227766}
ITERS=${ITERS:-30}
WARMUP=${WARMUP:-2}
BUDGET=${BUDGET:-6}
CALIBRATE=${CALIBRATE:-1}
ALGOS=${ALGOS:-"all auto"}
export PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
export PYCOLLECTIVE_TIMEOUT=${PYCOLLECTIVE_TIMEOUT:-3600}

stamp=$(date -u +%Y-%m-%dT%H%MZ)
out=${OUT:-"$here/results/$stamp"}
mkdir -p "$out"
run="$root/scripts/run_mpi.sh"
status=0

progress=()
[ -t 2 ] && progress=(--progress)  # under mpiexec the ranks' stderr is a pipe

params_opt=()
if [ "$CALIBRATE" = 1 ]; then
    for n in $NS; do
        cmd=("$run" "$n" -m pycollective.model calibrate --output "$out/model.json" --quiet)
        echo "${cmd[*]#$root/}" >> "$out/commands.txt"
        "${cmd[@]}" || { echo "calibration at N=$n failed" >&2; status=1; }
    done
    [ -f "$out/model.json" ] && params_opt=(--params "$out/model.json")
fi

for n in $NS; do
    # shellcheck disable=SC2086
    cmd=("$run" "$n" -m pycollective.bench $ALGOS --mincount 1 --maxcount "$MAXCOUNT"
         --stepfactor "$FACTOR" --iters "$ITERS" --warmup "$WARMUP" --budget "$BUDGET"
         "${params_opt[@]}" --json "$out/sweep_N$n.json" --plot "$out/busbw_N$n.png")
    echo "${cmd[*]//$root\//}" >> "$out/commands.txt"
    echo "== N=$n: ${cmd[*]//$root\//}" >&2
    "${cmd[@]}" "${progress[@]}" | tee "$out/sweep_N$n.txt"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
        echo "sweep at N=$n exited with status $rc" >&2
        status=$rc
    fi
done

"$PYTHON" "$here/report.py" "$out" || status=1
exit $status
