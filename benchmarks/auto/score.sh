#!/usr/bin/env bash
# Score algorithm="auto" at several N on this machine, then one summary.
#
#   benchmarks/auto/score.sh OUT [NS] [BUDGET]
#   PYTHON=$VENVS/mpich/bin/python benchmarks/auto/score.sh /tmp/score "2 4 8 16" 15
#
# Each N is one launch of benchmarks/auto/score.py (fresh cache, no calibration file,
# BUDGET seconds of measuring after start-up, default 15); OUT gets score_N<n>.json and
# summary.{md,json}.  PYTHON as for scripts/run_mpi.sh.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$(dirname "$here")")
out=${1:?usage: score.sh OUT [NS] [BUDGET]}
ns=${2:-"2 4 8"}
budget=${3:-15}
py=${PYTHON:-$(command -v python3 || command -v python)}
mkdir -p "$out"
status=0
for n in $ns; do
    PYCOLLECTIVE_TIMEOUT=${PYCOLLECTIVE_TIMEOUT:-$(( ${budget%.*} * 4 + 60 ))} \
        "$root/scripts/run_mpi.sh" "$n" "$here/score.py" --out "$out" --budget "$budget" \
        > "$out/score_N$n.txt" 2>&1 || { status=$?; echo "N=$n failed ($status), see $out/score_N$n.txt" >&2; }
done
"$py" "$here/score.py" --report "$out"
exit $status
