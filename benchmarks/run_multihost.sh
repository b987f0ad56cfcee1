#!/usr/bin/env bash
# The standard sweep on emulated hosts: 2 hosts x 2 ranks and 2 hosts x 4 ranks, once per
# link setting, through scripts/multihost/emulate.sh (network namespaces: root).
#
#   benchmarks/run_multihost.sh          # auto without a calibration file; the calibrated
#                                        # model's error beside it
#   CALIBRATE=0 benchmarks/run_multihost.sh      # no calibration at all
#   LINKS="--rate=1gbit" benchmarks/run_multihost.sh   # one link setting
#
# Each link setting gets its own results directory,
# benchmarks/results/<UTC stamp>-hosts-<link>/, with what benchmarks/run_sweep.sh writes
# there (report.md, commands.txt, the text tables, the plots, model.json).
#
# Environment: LINKS (space-separated emulate.sh link options, "=" for the space inside
# one: default "--rate=1gbit --rate=10gbit --delay=25us"), HOSTS ("2x2 2x4"), MAXCOUNT
# (1e7), FACTOR (10: one point per decade), ITERS (10), BUDGET (4 s per size), and
# whatever else run_sweep.sh reads (CALIBRATE, ALGOS, PYTHON, PYCOLLECTIVE_TIMEOUT).
set -u
here=$(cd "$(dirname "$0")" && pwd)
LINKS=${LINKS:-"--rate=1gbit --rate=10gbit --delay=25us"}
export HOSTS=${HOSTS:-"2x2 2x4"}
export MAXCOUNT=${MAXCOUNT:-1e7} FACTOR=${FACTOR:-10} ITERS=${ITERS:-10} BUDGET=${BUDGET:-4}
stamp=$(date -u +%Y-%m-%dT%H%MZ)
status=0
for link in $LINKS; do
    name=$(echo "$link" | sed 's/^--//; s/=/-/')
    echo "== link $link" >&2
    LINK=${link/=/ } OUT="$here/results/$stamp-hosts-$name" "$here/run_sweep.sh" || status=$?
done
exit $status
