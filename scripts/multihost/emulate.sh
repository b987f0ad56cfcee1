#!/usr/bin/env bash
# Run a Python program under MPI on several emulated hosts of this one machine, with the
# traffic between hosts on a real network path, and take everything down afterwards.
#
#   scripts/multihost/emulate.sh [options] -- [python arguments...]
#   scripts/multihost/emulate.sh -H 2x2 -- -m pycollective.bench all --M 1e5
#   scripts/multihost/emulate.sh -H 3,2 --rate 1gbit -- -m pycollective.bench hierarchical
#   scripts/multihost/emulate.sh -H 2x2 --delay 25us -- -m pycollective.model calibrate
#   scripts/multihost/emulate.sh --mode cliques -H 2x2 -- -m pytest --with-mpi tests/mpi
#   scripts/multihost/emulate.sh --check          # can this machine run the netns mode?
#   scripts/multihost/emulate.sh --cleanup        # remove what a killed run left behind
#
# Every rank runs `$PYTHON -m mpi4py ARGS` (an exception on any rank aborts the whole job),
# as scripts/run_mpi.sh does on one host.
#
# Options:
#   -H, --hosts LAYOUT  ranks per host: KxR (K hosts of R ranks, default 2x2) or a list
#                       such as 3,2 (unequal hosts)
#   --cyclic            place rank i on host i mod K (default: consecutive blocks)
#   --mode MODE         netns (default): one network, UTS and mount namespace per host
#                         (needs root); cliques: MPICH's MPIR_CVAR_NUM_CLIQUES splits the
#                         ranks into K "nodes" of one host, TCP on loopback between them
#                         (no root; equal hosts only; no --rate or --delay)
#   --netmod NAME       ofi (default: libfabric's tcp provider) or ucx (UCX_TLS=tcp,self)
#   --rate RATE         link rate in tc's units (10gbit, 1gbit, 500mbit): a tbf qdisc on
#                       each host's veth, or the delay line's rate with --delay
#   --delay TIME        one-way delay added per packet (25us, 1ms): hosts are then wired
#                       through TUN devices and delayline.c (this kernel has no netem)
#   --loss SHARE        drop that share of the packets between hosts at random (0.1: one
#                       in ten), in the delay line (implies --delay 0us if none is given)
#   --no-pin            let every host use all CPUs (default: host k's processes are bound
#                       to its own share of this machine's CPUs, as separate machines
#                       would be, so that a host's ranks per core are what they seem)
#   --check             say whether the netns mode works here; exit 0 if so, else 3
#   --cleanup           remove namespaces and processes of runs that were killed (SIGKILL)
#   -h, --help          this text
#
# Environment: PYTHON (default python3 on PATH; mpiexec is the one beside it),
# PYCOLLECTIVE_TIMEOUT (seconds for the whole job, default 900; then exit 124),
# CC (C compiler for the delay line, default cc).
#
# The netns mode.  Host k is a network namespace (prefix mh<pid>-) whose only addresses
# are 127.0.0.1/32 on lo and 127.78.0.(k+1)/24 on eth0 (veth) or tun0 (delay line): the
# loopback range, made routable between namespaces by route_localnet=1, so nothing can
# leave them.  The veth ends meet on a bridge inside a private hub namespace.  Hydra
# starts each host's proxy through its ssh launcher pointed at a stand-in script that runs
# the command in that host's namespaces with `unshare --uts --mount`: its own hostname
# (node<k>, so MPI_Get_processor_name differs and Split_type(COMM_TYPE_SHARED) groups a
# host's ranks) and its own /dev/shm (hosts share no memory, and what a killed job leaves
# in /dev/shm vanishes with it).  UCX is told UCX_TLS=tcp,self; it would otherwise reach
# other hosts through shared memory.
#
# Tear-down.  On every way out (the end of the job, an error, the time limit, SIGINT,
# SIGTERM, SIGHUP) every process left in the namespaces is killed by PID (TERM, then KILL),
# the delay line is stopped, the namespaces are deleted (their links and qdiscs with them)
# and the stand-in's directory removed.  Only a SIGKILL of this script itself can leave
# them; --cleanup removes those of any run whose script is gone.
#
# Exit status: the job's; 124 at the time limit; 2 for a usage error; 3 when the netns
# mode is not possible here (the reason on stderr); 128+n after signal n.
set -uo pipefail

NAME=emulate.sh
HERE=$(cd "$(dirname "$0")" && pwd)
NET=127.78.0
PREFIX_RE='^mh[0-9]+-'

say() { echo "$NAME: $*" >&2; }
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

# --- what this machine allows ---------------------------------------------------------------

netns_problem() {
    # Prints why the netns mode cannot run here, or nothing.
    [ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)"; return; }
    for tool in ip unshare tc mount; do
        command -v "$tool" >/dev/null || { echo "needs $tool"; return; }
    done
    local probe="mh$$-probe"
    if ! ip netns add "$probe" 2>/dev/null; then
        echo "cannot create a network namespace (ip netns add)"; return
    fi
    local why=""
    ip -n "$probe" link add b0 type bridge 2>/dev/null || why="no bridge support"
    [ -z "$why" ] && { ip netns exec "$probe" unshare --uts --mount true 2>/dev/null \
        || why="cannot unshare UTS and mount namespaces"; }
    ip netns del "$probe" 2>/dev/null
    echo "$why"
}

owner_alive() {
    # Is the emulate.sh run that owns namespace prefix mh<pid>- still running?
    local pid=$1
    [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q "$NAME"
}

kill_in() {
    # Signal every process in the given namespaces.
    local sig=$1 ns pid
    shift
    for ns in "$@"; do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill "-$sig" "$pid" 2>/dev/null; done
    done
}

remove_namespaces() {
    # Stop what runs in the given namespaces and delete them.
    local ns left=0
    [ $# -gt 0 ] || return 0
    kill_in TERM "$@"
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        left=0
        for ns in "$@"; do [ -n "$(ip netns pids "$ns" 2>/dev/null)" ] && left=1; done
        [ $left = 0 ] && break
        sleep 0.1
    done
    kill_in KILL "$@"
    for ns in "$@"; do ip netns del "$ns" 2>/dev/null; done
}

cleanup_stale() {
    local ns pid stale=()
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "$PREFIX_RE"); do
        pid=${ns#mh}
        pid=${pid%%-*}
        owner_alive "$pid" || stale+=("$ns")
    done
    if [ ${#stale[@]} -gt 0 ]; then
        say "removing ${#stale[@]} namespaces of runs that are gone: ${stale[*]}"
        remove_namespaces "${stale[@]}"
    fi
    for dir in "${TMPDIR:-/tmp}"/emulate-mh*; do
        [ -d "$dir" ] || continue
        pid=${dir##*/emulate-mh}
        pid=${pid%%.*}
        owner_alive "$pid" || rm -rf "$dir"
    done
}

# --- options -----------------------------------------------------------------------------------

LAYOUT=2x2 CYCLIC=0 MODE=netns NETMOD=ofi RATE="" DELAY="" LOSS="" PIN=1
while [ $# -gt 0 ]; do
    case "$1" in
        -H|--hosts) LAYOUT=${2:-}; shift 2 || { usage >&2; exit 2; };;
        --cyclic) CYCLIC=1; shift;;
        --no-pin) PIN=0; shift;;
        --mode) MODE=${2:-}; shift 2 || { usage >&2; exit 2; };;
        --netmod) NETMOD=${2:-}; shift 2 || { usage >&2; exit 2; };;
        --rate) RATE=${2:-}; shift 2 || { usage >&2; exit 2; };;
        --delay) DELAY=${2:-}; shift 2 || { usage >&2; exit 2; };;
        --loss) LOSS=${2:-}; shift 2 || { usage >&2; exit 2; };;
        --check)
            why=$(netns_problem)
            if [ -n "$why" ]; then say "the netns mode is not possible here: $why"; exit 3; fi
            say "the netns mode works here"; exit 0;;
        --cleanup) cleanup_stale; exit 0;;
        -h|--help) usage; exit 0;;
        --) shift; break;;
        *) say "unknown option $1 (see --help)"; exit 2;;
    esac
done
[ $# -ge 1 ] || { say "no python arguments given (see --help)"; exit 2; }

# ranks per host
if [[ "$LAYOUT" =~ ^([0-9]+)x([0-9]+)$ ]]; then
    SIZES=()
    for _ in $(seq "${BASH_REMATCH[1]}"); do SIZES+=("${BASH_REMATCH[2]}"); done
elif [[ "$LAYOUT" =~ ^[0-9]+(,[0-9]+)+$ ]]; then
    IFS=, read -r -a SIZES <<< "$LAYOUT"
else
    say "--hosts $LAYOUT: expected KxR (e.g. 2x2) or a list of ranks per host (e.g. 3,2)"; exit 2
fi
K=${#SIZES[@]} N=0
for r in "${SIZES[@]}"; do
    [ "$r" -ge 1 ] 2>/dev/null || { say "--hosts $LAYOUT: every host needs a rank"; exit 2; }
    N=$((N + r))
done
[ "$K" -ge 1 ] && [ "$K" -le 30 ] || { say "--hosts $LAYOUT: 1 to 30 hosts"; exit 2; }
case "$NETMOD" in ofi|ucx) ;; *) say "--netmod ofi|ucx"; exit 2;; esac
if [ -n "$LOSS" ]; then
    awk -v l="$LOSS" 'BEGIN { exit !(l ~ /^[0-9.]+$/ && l >= 0 && l < 1) }' \
        || { say "--loss $LOSS: a share from 0 to below 1, e.g. 0.1"; exit 2; }
    DELAY=${DELAY:-0us}
fi
LIMIT=${PYCOLLECTIVE_TIMEOUT:-900}
[[ "$LIMIT" =~ ^[0-9]+$ ]] || { say "PYCOLLECTIVE_TIMEOUT=$LIMIT: whole seconds"; exit 2; }
PY=${PYTHON:-$(command -v python3 || command -v python)}
BIN=$(dirname "$("$PY" -c 'import sys; print(sys.executable)')")
MPIEXEC="$BIN/mpiexec"
[ -x "$MPIEXEC" ] || MPIEXEC=$(command -v mpiexec) || { say "no mpiexec (pip install mpich)"; exit 2; }

if [ "$MODE" = cliques ]; then
    [ -z "$RATE$DELAY$LOSS" ] || { say "--rate, --delay and --loss need --mode netns"; exit 2; }
    [ "$NETMOD" = ofi ] || { say "--mode cliques: only --netmod ofi (UCX's tcp refuses lo)"; exit 2; }
    for r in "${SIZES[@]}"; do
        [ "$r" = "${SIZES[0]}" ] || { say "--mode cliques: hosts of equal size only"; exit 2; }
    done
    if [ $CYCLIC = 1 ]; then
        [ "$K" = 2 ] || { say "--mode cliques --cyclic: 2 hosts only (odd and even ranks)"; exit 2; }
        export MPIR_CVAR_NUM_CLIQUES=2 MPIR_CVAR_ODD_EVEN_CLIQUES=1
    else
        export MPIR_CVAR_NUM_CLIQUES=$K MPIR_CVAR_CLIQUES_BY_BLOCK=1
    fi
    export MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp FI_TCP_IFACE=lo
    say "$K cliques x ${SIZES[0]} ranks on this host, OFI tcp on lo between them"
    PYCOLLECTIVE_TIMEOUT=$LIMIT exec "$HERE/../run_mpi.sh" "$N" "$@"
fi
[ "$MODE" = netns ] || { say "--mode netns|cliques"; exit 2; }

PREFIX="mh$$"
HUB="$PREFIX-hub"
HOSTS=()
for k in $(seq 0 $((K - 1))); do HOSTS+=("$PREFIX-h$k"); done
WORK=""
DELAYLINE_PID=""
JOB_PID=""

teardown() {
    trap '' INT TERM HUP
    [ -n "$JOB_PID" ] && kill -TERM "$JOB_PID" 2>/dev/null
    remove_namespaces "${HOSTS[@]}" "$HUB" "$PREFIX-probe"
    if [ -n "$DELAYLINE_PID" ]; then
        kill -TERM "$DELAYLINE_PID" 2>/dev/null
        wait "$DELAYLINE_PID" 2>/dev/null
    fi
    [ -n "$JOB_PID" ] && wait "$JOB_PID" 2>/dev/null
    [ -n "$WORK" ] && rm -rf "$WORK"
}
trap teardown EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
fail() { say "$*"; exit 1; }

why=$(netns_problem)
[ -z "$why" ] || { say "the netns mode is not possible here: $why"; exit 3; }

# tc-style units for the delay line
bytes_per_s() {
    awk -v r="$1" 'BEGIN { if (!match(r, /^[0-9.]+/)) exit 1
        v = substr(r, 1, RLENGTH); u = tolower(substr(r, RLENGTH + 1))
        f["bit"] = 0.125; f["kbit"] = 125; f["mbit"] = 125e3; f["gbit"] = 125e6
        f["bps"] = 1; f["kbps"] = 1e3; f["mbps"] = 1e6; f["gbps"] = 1e9
        if (!(u in f)) exit 1; printf "%.0f\n", v * f[u] }'
}
micros() {
    awk -v d="$1" 'BEGIN { if (!match(d, /^[0-9.]+/)) exit 1
        v = substr(d, 1, RLENGTH); u = tolower(substr(d, RLENGTH + 1))
        f["us"] = 1; f["ms"] = 1e3; f["s"] = 1e6
        if (!(u in f)) exit 1; printf "%.3f\n", v * f[u] }'
}

# --- building the hosts ------------------------------------------------------------------------

WORK=$(mktemp -d "${TMPDIR:-/tmp}/emulate-$PREFIX.XXXX")

IFACE=eth0
[ -n "$DELAY" ] && IFACE=tun0
for k in $(seq 0 $((K - 1))); do
    ns=${HOSTS[$k]}
    ip netns add "$ns" || fail "cannot create namespace $ns"
    ip -n "$ns" link set lo up
    # lo keeps 127.0.0.1 only, so the rest of 127/8 is routed out of the host's link
    ip -n "$ns" addr del 127.0.0.1/8 dev lo && ip -n "$ns" addr add 127.0.0.1/32 dev lo \
        || fail "cannot narrow lo in $ns"
    ip netns exec "$ns" sysctl -qw net.ipv4.conf.all.route_localnet=1 || fail "route_localnet"
done
if [ -z "$DELAY" ]; then
    ip netns add "$HUB" || fail "cannot create namespace $HUB"
    ip -n "$HUB" link add br0 type bridge && ip -n "$HUB" link set br0 up || fail "bridge"
    for k in $(seq 0 $((K - 1))); do
        ns=${HOSTS[$k]}
        ip link add "p$k" netns "$HUB" type veth peer name eth0 netns "$ns" || fail "veth for $ns"
        ip -n "$HUB" link set "p$k" master br0 && ip -n "$HUB" link set "p$k" up || fail "bridge port"
        if [ -n "$RATE" ]; then
            # burst above veth's 64 KiB GSO packets, or tbf drops them all
            tc -n "$ns" qdisc add dev eth0 root tbf rate "$RATE" burst 256kb latency 10ms \
                || fail "tbf rate $RATE"
        fi
    done
else
    us=$(micros "$DELAY") || fail "--delay $DELAY: e.g. 25us or 1ms"
    rate=0
    [ -z "$RATE" ] || rate=$(bytes_per_s "$RATE") || fail "--rate $RATE: e.g. 1gbit"
    "${CC:-cc}" -O2 -o "$WORK/delayline" "$HERE/delayline.c" || fail "cannot build delayline.c"
    mkfifo "$WORK/ready"
    "$WORK/delayline" ${LOSS:+-l "$LOSS"} "$us" "$rate" "${HOSTS[@]}" > "$WORK/ready" &
    DELAYLINE_PID=$!
    read -r -t 10 line < "$WORK/ready" && [ "$line" = ready ] || fail "the delay line did not start"
fi
# host k's share of the CPUs this script may use (one each, round robin, if fewer than hosts)
read -r -a CPUS <<< "$(taskset -pc $$ 2>/dev/null | sed 's/.*: //' | tr ',' ' ' \
    | xargs -n1 | awk -F- '{ if (NF == 2) for (i = $1; i <= $2; i++) print i; else print $1 }' \
    | xargs)"
[ ${#CPUS[@]} -gt 0 ] || PIN=0
cpus_of() {
    local k=$1 c=${#CPUS[@]} first last list="" i
    if [ "$c" -lt "$K" ]; then
        echo "${CPUS[$((k % c))]}"
        return
    fi
    first=$((k * c / K)) last=$(((k + 1) * c / K - 1))
    for i in $(seq "$first" "$last"); do list+="${list:+,}${CPUS[$i]}"; done
    echo "$list"
}
HOSTLIST=()
for k in $(seq 0 $((K - 1))); do
    ns=${HOSTS[$k]} addr="$NET.$((k + 1))"
    ip netns exec "$ns" sysctl -qw "net.ipv4.conf.$IFACE.route_localnet=1"
    ip -n "$ns" addr add "$addr/24" dev "$IFACE" && ip -n "$ns" link set "$IFACE" up \
        || fail "address $addr in $ns"
    # fewer, larger packets through the user-space delay line
    [ "$IFACE" = tun0 ] && ip -n "$ns" link set tun0 mtu 65000
    if [ $PIN = 1 ]; then pin="taskset -c $(cpus_of "$k")"; else pin=""; fi
    echo "$addr) ns=$ns host=node$k pin=\"$pin\";;" >> "$WORK/hosts.case"
    HOSTLIST+=("$addr:${SIZES[$k]}")
done

# Hydra's "ssh HOST COMMAND...": run COMMAND in HOST's namespaces (Hydra quotes COMMAND
# for a remote shell, hence sh -c).  Each host gets its own hostname and /dev/shm.
{
    echo '#!/bin/sh'
    echo 'while [ $# -gt 0 ]; do case "$1" in -[oplFi]) shift 2;; -*) shift;; *) break;; esac; done'
    echo 'addr=$1; shift'
    echo 'case "$addr" in'
    cat "$WORK/hosts.case"
    echo "*) echo \"$NAME ssh stand-in: unknown host \$addr\" >&2; exit 255;;"
    echo 'esac'
    echo 'exec ip netns exec "$ns" $pin unshare --uts --mount --propagation private /bin/sh -c \'
    echo '    "mount -t tmpfs -o mode=1777 tmpfs /dev/shm && hostname $host && exec $*"'
} > "$WORK/ssh"
chmod +x "$WORK/ssh"

if [ "$NETMOD" = ofi ]; then
    export MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp FI_TCP_IFACE=$IFACE
else
    export MPIR_CVAR_CH4_NETMOD=ucx UCX_TLS=tcp,self UCX_NET_DEVICES=$IFACE
fi
if [ $CYCLIC = 1 ]; then
    # Hydra deals ranks round robin over a list of one slot per host (one proxy per host:
    # a host listed twice would be two proxies, i.e. two "nodes").
    HOSTSPEC=""
    for k in $(seq 0 $((K - 1))); do
        [ "${SIZES[$k]}" = $(((N - k + K - 1) / K)) ] \
            || fail "--cyclic: --hosts $LAYOUT is not what dealing $N ranks over $K hosts gives"
        HOSTSPEC+="${HOSTSPEC:+,}$NET.$((k + 1)):1"
    done
else
    HOSTSPEC=$(IFS=,; echo "${HOSTLIST[*]}")
fi
pinned=""
[ $PIN = 1 ] && pinned=", CPUs $(for k in $(seq 0 $((K - 1))); do printf '%s ' "node$k:$(cpus_of "$k")"; done)"
say "$K hosts ${SIZES[*]} ranks (${LAYOUT}$([ $CYCLIC = 1 ] && echo ", cyclic")), $IFACE link${RATE:+, rate $RATE}${DELAY:+, delay $DELAY}${LOSS:+, loss $LOSS}, netmod $NETMOD${pinned% }"

# mpiexec runs on host 0, as host 0 (Hydra starts host 0's ranks itself, without the
# stand-in: the address is its own), in the background so that signals reach the traps
# at once, under scripts/run_mpi.sh's supervisor (scripts/supervise.py): the limit, and
# the files a job that ends badly leaves in the shared /tmp (Hydra's topology file, one
# per emulated host; each host's /dev/shm goes with its namespace).
pin0=()
[ $PIN = 1 ] && pin0=(taskset -c "$(cpus_of 0)")
ip netns exec "${HOSTS[0]}" "${pin0[@]}" unshare --uts --mount --propagation private \
    /bin/sh -c 'mount -t tmpfs -o mode=1777 tmpfs /dev/shm && hostname node0 && exec "$@"' sh \
    "$PY" -I "$HERE/../supervise.py" "$0" "$LIMIT" "$N" \
    "$MPIEXEC" -launcher ssh -launcher-exec "$WORK/ssh" -iface "$IFACE" -hosts "$HOSTSPEC" \
    -n "$N" "$PY" -m mpi4py "$@" &
JOB_PID=$!
wait "$JOB_PID"
status=$?
JOB_PID=""
exit $status
