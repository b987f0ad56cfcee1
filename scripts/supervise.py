"""The MPI job supervisor of scripts/run_mpi.sh and scripts/multihost/emulate.sh.

    python -I scripts/supervise.py NAME LIMIT NP COMMAND...

Runs COMMAND (mpiexec and its arguments) in a process group of its own, stops it
after LIMIT (seconds, or a number with a unit s/m/h/d; 0: none) or on SIGTERM, SIGINT
or SIGHUP, and removes the files in /dev/shm and Hydra's /tmp/hydra_hwloc_xmlfile_*
that the job created and left behind, and only those; NAME prefixes its messages, NP
is for them.  Exit status: the job's, 124 after the limit, 128 + the signal.  Why it
works as it does: the header of scripts/run_mpi.sh ("Stopping" and "Clean-up").  It
runs with -I so that no PYTHON* variable changes it; the job still gets the whole
environment.
"""
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
