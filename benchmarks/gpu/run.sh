#!/usr/bin/env bash
# GPU check of device-buffer staging (issue 32), one command on the GPU machine:
#
#   benchmarks/gpu/run.sh OUTDIR [--fake] [--only matrix,ddp,perf] [--budget SECONDS]
#
# Runs benchmarks/gpu/check.py (its docstring says what it checks and measures):
# phases under mpiexec, each bounded by `timeout`, all within --budget seconds
# (default 230, CHECK_BUDGET_S); writes OUTDIR/summary.md, OUTDIR/results.json and
# one log per phase.  --fake: a dry run on CPUs with the fake device.
# Environment: PYTHON (default python3), MPIEXEC (default mpiexec).  The source
# tree's src/ is put on PYTHONPATH.  Exit status 0 when every target was met.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: benchmarks/gpu/run.sh OUTDIR [--fake] [--only PHASES] [--budget SECONDS]}
shift
exec timeout -k 10 "${CHECK_HARD_LIMIT_S:-300}" "${PYTHON:-python3}" benchmarks/gpu/check.py \
    --out "$out" "$@"
