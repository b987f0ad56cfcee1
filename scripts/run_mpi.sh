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
# * Open MPI (if that is the library installed) gets the flags it needs to
#   run as root, and --oversubscribe when NP exceeds the cores; MPICH and
#   Intel MPI need none.
# * Exit status: the job's; 124 (and a message on stderr) when the job was
#   stopped by the limit below; 2 for a usage error.  When run_mpi.sh itself
#   gets SIGTERM, SIGINT or SIGHUP (an outer `timeout`, Ctrl-C, a closed
#   terminal) it stops the job and then dies of that same signal, so a shell
#   sees 143, 130 or 129.
#
# Stopping.  The job never outlives the launcher:
# * The limit is $PYCOLLECTIVE_TIMEOUT (default 900; seconds, or N with a
#   unit s/m/h/d as for timeout(1); 0 = none).
# * On the limit or on one of those signals the job gets SIGTERM (SIGINT for
#   SIGINT, so ranks print where they were), and SIGKILL 3 s later if any of
#   its processes is still alive; a second signal skips the 3 s.  run_mpi.sh
#   returns only when no process of the job is left, in about 4 s at most,
#   which fits inside a caller's `timeout -k 5`.
# * Why the supervisor below rather than `timeout`: Hydra's proxy puts every
#   rank in a session of its own, so no process-group signal reaches the
#   ranks, and once mpiexec is gone the ranks are orphans nobody can find by
#   parentage.  The supervisor (this script, exec'd into a small Python
#   program) makes itself a child subreaper (prctl), so orphaned proxies and
#   ranks are re-parented to it: "the job" is exactly its descendants, which
#   it can always find in /proc, kill and reap.  mpiexec runs in a process
#   group of its own, so Ctrl-C or an outer timeout (which signal the
#   caller's group) reach only the supervisor, which then stops the job in
#   order: the signal to mpiexec's group (Hydra forwards it to the ranks;
#   Open MPI's mpiexec signals them itself and escalates to SIGKILL on its
#   own), then SIGKILL to every descendant.  If the supervisor is SIGKILLed
#   itself, mpiexec gets SIGKILL too (PR_SET_PDEATHSIG), and Hydra's proxy
#   then kills the ranks (files it leaves behind then stay; see below).
#   Open MPI's mpiexec (prterun) starts the ranks itself and leaves them
#   running when it is killed outright, so under Open MPI each rank first
#   runs a few lines (the orphan guard below) that ask the kernel for
#   SIGKILL when its parent dies, then exec's Python.
#
# Clean-up.  Killed MPI jobs leave files behind: shared-memory segments in
# /dev/shm (mpich_shm_*, sm_segment.*, ...) and Hydra's topology file
# /tmp/hydra_hwloc_xmlfile_*.  On every way out (normal end, error, limit,
# signal) the supervisor removes those that this job created, and only those:
# /dev/shm may be shared with jobs this process cannot see (containers run
# with --ipc=host share /dev/shm but not /proc), so "no live process holds
# it" does not prove a file is stale.  A file is removed only if
#   1. a process of this job was seen holding it (open or mapped) while the
#      job ran, and it did not exist (same name and inode) before the launch;
#   2. it is still that same inode; and
#   3. no live process that we can see holds it now.
# The supervisor looks for new files when inotify says one appeared in
# /dev/shm or /tmp (within milliseconds, while its creator normally still
# holds it), every second as a back-stop, and just before it stops the job
# (limit or signal).  MPI libraries keep their segments mapped as long as a
# rank lives, so theirs are caught unless the job aborts within milliseconds
# of creating them (MPI_Abort kills ranks without warning the launcher); a
# file that the job created and let go of before anyone looked is kept,
# since nothing proves whose it is: a leak is possible, removing another
# job's file is not.  A process that starts MPI without mpiexec (a singleton)
# is no job of this script's and leaves files of its own: Open MPI's
# sm_segment.* even after MPI_Finalize, MPICH's mpich_shm_<pid in hex>_0 when
# it is killed.  Launch through this script (NP 1 is fine) to have them removed.
#
# Output.  mpiexec forwards each write of each rank as it arrives.  With
# PYTHONUNBUFFERED=1 one print() is several writes (each argument, the
# separators, the newline), so lines printed at once by several ranks can
# interleave.  The launcher leaves that alone (re-buffering output would
# change what users asked for); print whole lines in one write, e.g.
# sys.stdout.write(f"...\n"), or from one rank, when lines matter.
set -u

usage() {
    echo "usage: $0 NP [python arguments...]" >&2
    exit 2
}
if [ $# -lt 1 ] || ! [[ "$1" =~ ^[0-9]+$ ]] || [ "$1" -lt 1 ]; then
    usage
fi
np=$1
shift

limit=${PYCOLLECTIVE_TIMEOUT:-900}
if ! [[ "$limit" =~ ^[0-9]+(\.[0-9]+)?[smhd]?$ ]]; then
    echo "$0: PYCOLLECTIVE_TIMEOUT=$limit is not a duration (seconds, or N with a unit s/m/h/d)" >&2
    usage
fi

py=${PYTHON:-$(command -v python3 || command -v python)}
bindir=$(dirname "$("$py" -c 'import sys; print(sys.executable)')")
if [ -x "$bindir/mpiexec" ]; then
    mpiexec="$bindir/mpiexec"
else
    mpiexec=$(command -v mpiexec) || { echo "$0: no mpiexec found (pip install mpich)" >&2; exit 2; }
fi

flags=()
rank=("$py" -m mpi4py)  # what each rank runs before the user's arguments
if "$mpiexec" --version 2>/dev/null | grep -qi "open mpi"; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_btl=${OMPI_MCA_btl:-self,sm} OMPI_MCA_osc=${OMPI_MCA_osc:-^ucx}
    if [ "$np" -gt "$(nproc)" ]; then
        flags+=(--oversubscribe)
    fi
    # The orphan guard (see "Stopping"): SIGKILL when mpiexec dies, then
    # Python.  If mpiexec died before prctl, the rank was already re-parented
    # to the supervisor (whose pid is this shell's: it is exec'd below) or to
    # init, and it leaves at once.  Arguments: the supervisor's pid, the command.
    IFS= read -r -d '' guard <<'PY'
import ctypes, os, signal, sys
ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
if os.getppid() in (1, int(sys.argv[1])):
    os._exit(1)
os.execv(sys.argv[2], sys.argv[2:])
PY
    rank=("$py" -I -c "$guard" "$$" "${rank[@]}")
fi

# The supervisor (see "Stopping" and "Clean-up" above).  It runs with -I so
# that no PYTHON* variable changes it; the job still gets the whole
# environment.  Arguments: the name for messages, the limit, NP, the command.
IFS= read -r -d '' supervise <<'PY'
import ctypes, os, select, signal, sys, time

NAME, LIMIT, NP, *COMMAND = sys.argv[1:]
GRACE = 3.0  # seconds from SIGTERM (or SIGINT) to SIGKILL
WATCHED = (("/dev/shm", ""), ("/tmp", "hydra_hwloc_xmlfile_"))  # (folder, name prefix)
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
IN_CREATE, IN_MOVED_TO = 0x100, 0x080

try:
    libc = ctypes.CDLL(None, use_errno=True)
except OSError:
    libc = None

def say(message):
    sys.stderr.write(f"{NAME}: {message}\n")
    sys.stderr.flush()

def seconds(text):
    unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}.get(text[-1:], None)
    return float(text[:-1]) * unit if unit else float(text)

def watched_files():
    """{path: inode} of the files in WATCHED folders now (names only, no stat)."""
    found = {}
    for folder, prefix in WATCHED:
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    if entry.name.startswith(prefix) and entry.is_file(follow_symlinks=False):
                        found[entry.path] = entry.inode()
        except OSError:
            pass
    return found

def parents():
    """{pid: parent pid} of every process in /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    table[int(name)] = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return table

def job():
    """Pids of the job: all our descendants (we are their subreaper)."""
    children = {}
    for pid, ppid in parents().items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found

def held(pids):
    """{(path, inode)} of the files in WATCHED folders that pids have open or mapped.

    Files already deleted show as "path (deleted)"; such a path does not exist
    (or is another inode), so clean-up never acts on it."""
    found = set()
    for pid in pids:
        fds = f"/proc/{pid}/fd"
        try:
            names = os.listdir(fds)
        except OSError:
            names = ()
        for fd in names:
            try:
                path = os.readlink(f"{fds}/{fd}")
                if is_watched(path):
                    found.add((path, os.stat(f"{fds}/{fd}").st_ino))
            except OSError:
                pass
        try:
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    fields = line.rstrip("\n").split(None, 5)
                    if len(fields) == 6 and is_watched(fields[5]):
                        found.add((fields[5], int(fields[4])))
        except (OSError, ValueError):
            pass
    return found

def is_watched(path):
    folder, _, name = path.rpartition("/")
    return any(folder == top and name.startswith(prefix) for top, prefix in WATCHED)

before = set(watched_files().items())  # (path, inode) that are not ours, whatever happens
owned = set()  # (path, inode) seen held by the job and new since the launch

def attribute():
    """Record the new files that a process of the job holds now."""
    new = set(watched_files().items()) - before - owned
    if new:
        owned.update(held(job()) & new)

def clean():
    now = watched_files()
    left = {(path, inode) for path, inode in owned if now.get(path) == inode}
    if left:
        left -= held(parents())  # still held by a live process (not ours: the job is gone)
    for path, _ in left:
        try:
            os.unlink(path)
        except OSError:
            pass

def signal_all(pids, signum, group=False):
    for pid in pids:
        try:
            (os.killpg if group else os.kill)(pid, signum)
        except OSError:  # gone already
            pass

def inotify():
    """A descriptor that becomes readable when a file appears in a WATCHED folder, or None."""
    if libc is None or not hasattr(libc, "inotify_init1"):
        return None
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        return None
    for folder, _ in WATCHED:
        libc.inotify_add_watch(fd, folder.encode(), IN_CREATE | IN_MOVED_TO)
    return fd

def drain(fd):
    try:
        while os.read(fd, 65536):
            pass
    except OSError:  # EAGAIN: empty
        pass

# Signals: a handler only records them (and, through the wakeup pipe, ends the
# select() below); signals ignored when we started stay ignored, as nohup wants.
received = []
wake_r, wake_w = os.pipe()
os.set_blocking(wake_r, False)
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
stopping_signals = [s for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
                    if signal.getsignal(s) is not signal.SIG_IGN]
for s in stopping_signals:
    signal.signal(s, lambda signum, frame: received.append(signum))
signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # only to wake select()
if libc is not None:
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
events = inotify()

# Start mpiexec in a process group of its own, with signals blocked across
# fork() so that none is lost or handled by Python in the child.
handled = stopping_signals + [signal.SIGCHLD]
mask = signal.pthread_sigmask(signal.SIG_BLOCK, handled)
me = os.getpid()
child = os.fork()
if child == 0:
    try:
        os.setpgid(0, 0)
        if libc is not None:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != me:  # the supervisor died before prctl
            os._exit(1)
        signal.set_wakeup_fd(-1)
        for s in handled + [signal.SIGPIPE, signal.SIGXFSZ]:  # Python ignores these two
            signal.signal(s, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.execv(COMMAND[0], COMMAND)
    except BaseException as error:
        os.write(2, f"{NAME}: cannot run {COMMAND[0]}: {error}\n".encode())
    os._exit(127)
try:
    os.setpgid(child, child)
except OSError:  # it has already exec'd: it did this itself
    pass
signal.pthread_sigmask(signal.SIG_SETMASK, mask)

limit = seconds(LIMIT)
start = time.monotonic()
deadline = start + limit if limit > 0 else None
status = None  # mpiexec's wait status
reason = None  # why we stop the job: "limit", "leftovers" or a signal number
kill_at = give_up_at = None
next_look = start

while True:
    # Reap every child that has ended (mpiexec, and orphans re-parented to us).
    try:
        while True:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            if pid == child:
                status = wait_status
    except ChildProcessError:
        break  # no process of the job is left
    now = time.monotonic()
    if reason is None:
        if received:
            reason = received[0]
        elif deadline is not None and now >= deadline:
            reason = "limit"
        elif status is not None:
            reason = "leftovers"  # mpiexec has ended but left processes behind
        if reason is not None:
            attribute()  # last look while the job is alive
            signals_then = len(received)
            if status is None:
                signal_all([child], signal.SIGINT if reason == signal.SIGINT else signal.SIGTERM,
                           group=True)
            else:
                signal_all(job(), signal.SIGTERM)
            kill_at = now + GRACE
    if kill_at is not None and (now >= kill_at or len(received) > signals_then):
        if give_up_at is None:
            if reason != "leftovers":
                say(f"the job on {NP} ranks did not stop within {GRACE:g} s; killing it")
            give_up_at = now + 10
        signal_all(job(), signal.SIGKILL)
        if now >= give_up_at:
            say("some processes of the job do not die (SIGKILL sent): " + " ".join(map(str, job())))
            break
    if reason is None:
        if now >= next_look:
            attribute()
            next_look = now + 1.0
        wake_at = min(next_look, deadline or next_look)
    else:
        wake_at = now + 0.1 if give_up_at is not None else kill_at
    timeout = max(0.0, wake_at - now)
    ready, _, _ = select.select([wake_r] + ([events] if events is not None else []), [], [], timeout)
    drain(wake_r)
    if events is not None and events in ready:
        drain(events)
        if reason is None:
            attribute()

clean()
if reason == "limit":
    say(f"job on {NP} ranks stopped after the {LIMIT}{'' if LIMIT[-1:].isalpha() else 's'} "
        "limit (PYCOLLECTIVE_TIMEOUT)")
    sys.exit(124)
if isinstance(reason, int):  # a signal: die of it, as the conventions of shells want
    sys.stderr.flush()
    signal.signal(reason, signal.SIG_DFL)
    os.kill(os.getpid(), reason)
    sys.exit(128 + reason)
if status is None:
    sys.exit(1)
if os.WIFSIGNALED(status):
    sys.exit(128 + os.WTERMSIG(status))
sys.exit(os.WEXITSTATUS(status))
PY

exec "$py" -I -c "$supervise" "$0" "$limit" "$np" \
    "$mpiexec" "${flags[@]}" -n "$np" "${rank[@]}" "$@"
