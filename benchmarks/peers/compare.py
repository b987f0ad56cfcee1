"""pycollective against its peers: MPICH, Open MPI, Intel MPI and torch Gloo, interleaved.

    benchmarks/peers/run.sh [options]              # sets up the environments, then runs this
    python compare.py --venvs DIR [options]        # the environments already there
    python compare.py --report DIR                 # remake report.md and the plot from DIR

Every contender runs in its own virtual environment (``DIR/<env>``, made by
run.sh; two MPI libraries never share one), so different libraries cannot
share a job: each launch runs one contender at one N over a small group of
sizes, and the contenders take turns.

How the comparison is interleaved, exactly:

* the sizes of each N are cut into groups of at most ``--group`` consecutive
  sizes that form one geometric sweep (the largest sizes capped by memory,
  below);
* round r = 1 .. ``--rounds``: for each N, for each group, every contender
  is launched once on that group, in an order rotated by one place per group
  and per round (each contender goes first, and last, equally often);
* one launch gives, per size, the median over its repetitions of the
  slowest rank's time per call (a barrier, ``perf_counter`` around one call,
  MAX over ranks; each contender's own library's barrier, pycollective's
  ``pycollective.barrier``), all by ``point.py``'s loop: the peers' libraries, and
  pycollective's algorithms and ``auto`` taking turns repetition by
  repetition in an order drawn per repetition, each timed call after an
  untimed one of its own, so ``auto / best`` compares calls of the same
  seconds (``auto`` once it has decided the size);
* ``pycollective-bench`` also runs ``python -m pycollective.bench`` (every
  algorithm and ``auto`` beside MPICH's native call in the same repetitions,
  checked bit for bit against it): the report's same-run table.  Its loop
  differs (native and every case take turns call by call, with CRCs between
  calls), and with more ranks than cores it timed every case, native
  MPICH's too, up to twice as long as ``point.py`` did at 1e5-1e6 floats,
  so the main table takes ``point.py``'s times only;
* a size's number is the median over rounds of those per-launch medians; the
  spread is (max - min) / median over rounds;
* a launch's row counts only if its result was checked and right: against
  a float64 reference element by element (``point.py``), or bit for bit
  against MPICH's native result on exact data (the bench);
* "pycollective best" is, per (N, size), the algorithm with the lowest
  median over rounds (chosen after the fact, so slightly flattered by noise
  when several algorithms are close), on the caller's own (plain numpy)
  arrays; "pycollective auto" is ``algorithm="auto"`` timed as a user calls
  it;
* ``--shared`` (default ``shm``) also times those algorithms on buffers from
  ``pycollective.shared_empty`` (cases ``shm+shared``, in the same
  repetitions); the report lists them apart, against the best plain case,
  the fastest peer and the floor, and no target counts them.

Before each launch the CPU idle share over one second and other MPI jobs on
the machine are recorded, and the driver waits (up to ``--wait`` seconds)
for a quiet machine; the report shows how quiet each contender's launches
were.

Outputs in ``--out`` (default ``benchmarks/results/<UTC stamp>-peers``):
``points.csv`` (every launch's row per size, the raw material of the rest),
``plan.txt`` (the run's settings, JSON),
``report.md`` (the tables, and every row judged against the targets of
issue 30, with the memory-traffic floor from one ``bench membw`` launch per
N), ``peers.png`` (time and busbw against size, one
line per contender, one column per N), ``commands.txt`` (every launch),
``profiles.txt`` (the missed targets' profiles, measured after the rounds by
``gaps.py``'s launches; ``--no-profiles`` skips them), ``barriers.txt`` (how far
apart each library's barrier lets the ranks out, ``barrier_skew.py``, after the
rounds; skipped with the profiles),
``launches/`` (each launch's JSON and output; JSON is not committed).
Only the standard library is needed to measure; numpy and matplotlib for the
plot (the MPICH environment has both).
"""

import argparse
import csv
import json
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(HERE) not in sys.path:  # gaps.py beside it, also when loaded by path (tests)
    sys.path.insert(0, str(HERE))
import gaps  # noqa: E402
POINT = HERE / "point.py"
RUN_MPI = ROOT / "scripts" / "run_mpi.sh"


@dataclass(frozen=True)
class Contender:
    key: str    # name on the command line
    env: str    # virtual environment under --venvs
    kind: str   # point.py's backend ("mpi", "gloo", "pycollective"), or "bench" (pycollective.bench)
    label: str  # default label; the report names the library's version as it ran


CONTENDERS = {c.key: c for c in [
    Contender("pycollective", "mpich", "pycollective", "pycollective (MPICH)"),
    # auto in a launch of its own, as every peer runs: the peers' targets are judged on it
    Contender("pycollective-alone", "mpich", "pycollective", "pycollective auto alone"),
    Contender("mpich", "mpich", "mpi", "MPICH"),
    Contender("openmpi", "openmpi", "mpi", "Open MPI"),
    Contender("impi", "impi", "mpi", "Intel MPI"),
    Contender("gloo", "gloo", "gloo", "torch Gloo"),
    Contender("pycollective-bench", "mpich", "bench", "pycollective (MPICH), bench"),
    Contender("pycollective-openmpi", "openmpi", "bench", "pycollective (Open MPI)"),
    Contender("pycollective-impi", "impi", "bench", "pycollective (Intel MPI)"),
]}
DEFAULT_CONTENDERS = ["pycollective", "pycollective-alone", "pycollective-bench", "mpich",
                      "openmpi", "impi", "gloo"]
ALONE = "pycollective-alone:auto"  # its series
PEERS = ("mpich", "openmpi", "impi", "gloo")  # the columns "fastest peer" is taken over

# Buffers of M float32 per rank that one point may hold at once: the bench
# keeps three (input, result, native's result) and its algorithms add up to
# three more of scratch (naive, ps); MPI libraries keep temporaries too.
BUFFERS = 8
MEMORY_SHARE = 0.6  # of MemTotal for the ladder; a launch also needs that much MemAvailable

SHARED = "+shared"  # the suffix of a case on shared_empty buffers (point.py)
PLAN = "plan.txt"  # the run's settings, JSON (not *.json: benchmarks/results ignores those)
FIELDS = ["round", "launch", "contender", "series", "nranks", "count", "time_s", "iters",
          "ok", "wrong", "pick", "library", "idle_pct", "others", "started_utc", "note"]


# --- machine ------------------------------------------------------------------

def cpu_model():
    """The processor's model name, as the library reads it (``runtime/machine.py``, loaded by
    its path: that module needs only the standard library, the package's ``__init__`` more)."""
    import importlib.util
    path = ROOT / "src" / "pycollective" / "runtime" / "machine.py"
    spec = importlib.util.spec_from_file_location("_pycollective_machine", path)
    machine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(machine)
    return machine.cpu_model()


def usable_cpus():
    """CPUs this process may run on (its affinity mask), which is what its ranks share."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def placement(nranks, cpus):
    """How N ranks sit on the machine's CPUs, in words, for the report."""
    if nranks <= cpus:
        share = cpus // nranks
        return (f"N = {nranks}: dedicated CPUs, not oversubscribed "
                f"({share} CPU{'s' if share != 1 else ''} per rank)")
    return (f"N = {nranks}: oversubscribed, {nranks / cpus:g} ranks per CPU "
            f"({cpus / nranks:.2g} CPU per rank)")


def meminfo(field):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def idle_share(seconds=1.0):
    """Percent of CPU time idle over the next ``seconds``."""
    def read():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]  # total, idle + iowait
    t0, i0 = read()
    time.sleep(seconds)
    t1, i1 = read()
    return 100.0 * (i1 - i0) / max(t1 - t0, 1)


LAUNCHERS = ("hydra_pmi_proxy", "prterun", "prted", "torchrun", "mpiexec", "mpirun")


def other_jobs():
    """Processes of MPI launchers on the machine (ours have all ended between launches)."""
    n = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/comm") as f:
                    n += f.read().strip() in LAUNCHERS
            except OSError:
                pass
    return n


def wait_quiet(max_wait, min_idle):
    """Wait up to ``max_wait`` s for no other MPI job and ``min_idle`` % idle; (idle, others)."""
    deadline = time.monotonic() + max_wait
    while True:
        others = other_jobs()
        idle = idle_share()
        if (others == 0 and idle >= min_idle) or time.monotonic() >= deadline:
            return idle, others
        time.sleep(4)


# --- plan ---------------------------------------------------------------------

def fits(nranks, count, total=None):
    """Whether ``nranks`` x ``BUFFERS`` vectors of ``count`` float32 fit in MEMORY_SHARE of memory."""
    total = meminfo("MemTotal") if total is None else total
    return nranks * count * 4 * BUFFERS <= MEMORY_SHARE * total


def groups(counts, size):
    """Consecutive sizes, at most ``size`` per group, each group one geometric sweep (the bench's)."""
    out = []
    for c in counts:
        if out and len(out[-1]) < size and bench_counts_args(out[-1] + (c,)) is not None:
            out[-1] += (c,)
        else:
            out.append((c,))
    return out


def plan(ns, counts, rounds, group, contenders, total=None):
    """[(round, nranks, group of counts, contender key)] in launch order, and the skipped points."""
    launches, skipped = [], []
    for n in ns:
        skipped += [(n, c) for c in counts if not fits(n, c, total)]
    k = 0
    for r in range(1, rounds + 1):
        for n in ns:
            for g in groups([c for c in counts if fits(n, c, total)], group):
                shift = k % len(contenders)
                k += 1
                for key in contenders[shift:] + contenders[:shift]:
                    launches.append((r, n, g, key))
    return launches, skipped


# --- launching ----------------------------------------------------------------

def env_python(venvs, contender):
    return Path(venvs) / contender.env / "bin" / "python"


def bench_counts_args(counts):
    """Bench options that sweep exactly ``counts`` (None if no geometric sweep does)."""
    if len(counts) == 1:
        return ["--M", str(counts[0])]
    factor = (counts[-1] / counts[0]) ** (1 / (len(counts) - 1))
    expected = [int(round(counts[0] * factor ** k)) for k in range(len(counts))]
    if expected != list(counts):
        return None
    return ["--mincount", str(counts[0]), "--maxcount", str(counts[-1]),
            "--stepfactor", repr(factor)]


def command(contender, nranks, counts, args, json_path):
    """(argv, extra environment, limit) of one launch."""
    py = str(env_python(args.venvs, contender))
    limit = args.launch_timeout
    timing = ["--iters", str(args.iters), "--warmup", str(args.warmup)]
    if contender.kind == "bench":
        sweep = bench_counts_args(counts)  # never None: groups() makes only such groups
        # The bench shares its budget among its cases (every algorithm, auto, native).
        budget = args.budget * (len(args.algorithms) + 2)
        argv = [str(RUN_MPI), str(nranks), "-m", "pycollective.bench", "allreduce",
                *args.algorithms, *(["auto"] if "auto" not in args.algorithms else []),
                *sweep, "--mode", "oop", *timing,
                "--budget", repr(budget), "--quiet", "--json", str(json_path)]
        return argv, {"PYTHON": py, "PYCOLLECTIVE_TIMEOUT": str(limit)}, limit
    point = [str(POINT), contender.kind, "--counts", *map(str, counts), *timing,
             "--budget", repr(args.budget), "--json", str(json_path)]
    if contender.key == "pycollective-alone":
        point += ["--algorithms", "auto"]
    elif contender.kind == "pycollective":
        # auto always (the report's auto column), once: a second "auto" case took turns
        # with the first and timed the same calls twice
        point += ["--algorithms", *args.algorithms, *(a + SHARED for a in args.shared),
                  *(["auto"] if "auto" not in args.algorithms else [])]
    if contender.kind in ("mpi", "pycollective"):
        return ([str(RUN_MPI), str(nranks), *point],
                {"PYTHON": py, "PYCOLLECTIVE_TIMEOUT": str(limit)}, limit)
    torchrun = str(Path(py).parent / "torchrun")
    return (["timeout", "-k", "5", str(limit), torchrun, "--standalone",
             f"--nproc-per-node={nranks}", *point],
            {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}, limit)


def record(out, argv, extra=None):
    """Append one launch's command to ``out``/commands.txt, paths relative to the clone."""
    with open(Path(out) / "commands.txt", "a") as f:
        f.write("".join(f"{k}={shlex.quote(v)} " for k, v in (extra or {}).items()
                        if k != "PYCOLLECTIVE_TIMEOUT")
                + shlex.join(a.replace(str(ROOT) + "/", "") for a in argv) + "\n")


def launch(argv, extra, limit, log_path):
    """Run one launch, its output into ``log_path``; its exit status."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the venv's own packages
    env.update(extra)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        try:
            return proc.wait(timeout=limit + 60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            return proc.wait(timeout=30)
        except BaseException:  # Ctrl-C: stop the launch (both launchers stop their job on TERM)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            raise


def short_library(text):
    """'MPICH 5.0.2', 'Open MPI 5.0.11', 'Intel MPI 2021.19.0', 'torch Gloo 2.13.0+cpu'."""
    for pattern, fmt in ((r"MPICH Version:\s*(\S+)", "MPICH {}"),
                         (r"Open MPI v?([\d.]+\S*?),", "Open MPI {}"),
                         (r"Intel\(R\) MPI Library ([\d.]+)", "Intel MPI {}"),
                         (r"torch (\S+) Gloo", "torch Gloo {}")):
        m = re.search(pattern, text)
        if m:
            return fmt.format(m.group(1))
    return text.split(",")[0]


def rows_of(contender, json_path, counts):
    """[(series, count, time, iters, ok, wrong, pick, note)] and the library of one finished launch."""
    with open(json_path) as f:
        data = json.load(f)
    out = []
    if contender.kind == "bench":
        library = data["environment"]["mpi_library"]
        calibration = (data.get("calibration") or {}).get("source", "")
        for m in data["measurements"]:
            ok = not m["wrong"] and m["identical"] and m["input_intact"]
            series = f"{contender.key}:{m['name']}"
            auto = m["name"] == "auto"
            out.append((series, m["count"], m["time"], m["iters"], ok, m["wrong"],
                        m.get("auto") if auto else "", f"calibration: {calibration}" if auto else ""))
        got = sorted({m["count"] for m in data["measurements"]})
        if got != sorted(counts):
            raise ValueError(f"the bench measured sizes {got}, not {counts}")
    else:
        library = data["library"]
        for r in data["rows"]:
            ok = not r["wrong"] and r["input_intact"] and r["time"] is not None
            series = f"{contender.key}:{r['algorithm']}" if "algorithm" in r else contender.key
            out.append((series, r["count"], r["time"], r["iters"], ok, r["wrong"],
                        r.get("pick", ""), ""))
    return out, library


def revision():
    """The checkout's commit (``+`` if it has changes), or "" outside git; a copy of a tree
    without its history names its commit in a file REVISION at its root."""
    if (ROOT / "REVISION").is_file():
        return (ROOT / "REVISION").read_text().strip().splitlines()[0]
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain",
                                "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    if head.returncode != 0:
        return ""
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


# --- the memory-traffic floor ----------------------------------------------------

#: What bench membw's floor counts per payload byte and rank (pycollective.bench._speed).
FLOOR_TRAFFIC = 3


def measure_floors(args, out):
    """One ``bench membw`` launch per N in the MPICH environment: every rank copying at once."""
    status = 0
    for n in args.ns:
        json_path = out / "launches" / f"membw_N{n}.json"
        argv = [str(RUN_MPI), str(n), "-m", "pycollective.bench", "membw", "--quiet",
                "--json", str(json_path)]
        extra = {"PYTHON": str(env_python(args.venvs, CONTENDERS["pycollective"])),
                 "PYCOLLECTIVE_TIMEOUT": str(args.launch_timeout)}
        record(out, argv, extra)
        wait_quiet(args.wait, args.idle)
        rc = launch(argv, extra, args.launch_timeout, out / "launches" / f"membw_N{n}.log")
        print(f"[membw] N={n} exit {rc}", flush=True)
        status |= rc != 0
    return status


def floors_of(out):
    """{N: bytes per second per rank while every rank copies}, from the membw launches."""
    rates = {}
    for path in sorted((Path(out) / "launches").glob("membw_N*.json")):
        try:
            data = json.loads(path.read_text())
            together = next(m for m in data["measurements"] if m["name"] == "together")
            rates[int(together["nranks"])] = together["traffic"] * 1e9
        except (OSError, ValueError, KeyError, StopIteration):
            continue
    return rates


def machine_rate(rates, n):
    """Bytes of traffic per second all ranks of an ``n``-rank job can move together: the
    highest total (per-rank rate x ranks) that ``n`` or fewer ranks reached in the membw
    launches.  Where ranks outnumber cores, fewer ranks moved more (2026-12-02T0658Z:
    31.8 GB/s with 2 ranks on the 2 cores, 24.6 with 4, 27.5 with 8), and the floor is
    what the cores can do, not what a copy benchmark that shares them reached."""
    totals = [k * rate for k, rate in rates.items() if k <= n]
    return max(totals) if n in rates and totals else None


def floor_time(rates, n, count):
    """Seconds of memory traffic no allreduce of ``count`` float32 on ``n`` ranks of one node
    can beat: every rank's traffic at :func:`machine_rate`."""
    total = machine_rate(rates, n)
    return n * FLOOR_TRAFFIC * 4 * count / total if total else None


# --- the barriers every call is timed after ------------------------------------------

BARRIERS = "barriers.txt"  # JSON (not *.json: benchmarks/results ignores those)
BARRIER_SKEW = HERE / "barrier_skew.py"


def measure_barriers(args, out):
    """After the rounds: one ``barrier_skew.py`` launch per N and MPI library among the
    contenders (in MPICH's, ``pycollective.barrier`` beside MPICH's ``Barrier``), kept in
    ``barriers.txt``: how far apart each barrier lets the ranks out, which every timed
    call carries.  Nonzero if a launch failed."""
    envs = [e for e in ("mpich", "openmpi", "impi")
            if e in args.contenders or (e == "mpich" and any(
                CONTENDERS[c].env == "mpich" for c in args.contenders))]
    found, status = [], 0
    for n in args.ns:
        for env in envs:
            ours = env == "mpich" and any(c.startswith("pycollective") for c in args.contenders)
            json_path = out / "launches" / f"barrier_{env}_N{n}.json"
            argv = [str(RUN_MPI), str(n), str(BARRIER_SKEW), "--json", str(json_path),
                    *(["--pycollective"] if ours else [])]
            extra = {"PYTHON": str(env_python(args.venvs, CONTENDERS[env])),
                     "PYCOLLECTIVE_TIMEOUT": str(args.launch_timeout)}
            record(out, argv, extra)
            wait_quiet(args.wait, args.idle)
            rc = launch(argv, extra, args.launch_timeout,
                        out / "launches" / f"barrier_{env}_N{n}.log")
            print(f"[barrier] N={n} {env}: exit {rc}", flush=True)
            status |= rc != 0
            try:
                found += [dict(row, env=env) for row in json.loads(json_path.read_text())]
            except (OSError, ValueError):
                pass
    (out / BARRIERS).write_text(json.dumps(found, indent=1))
    return status


def barriers_section(out):
    """The report's table of the barriers' spreads (from ``barriers.txt``), or nothing."""
    try:
        found = json.loads((Path(out) / BARRIERS).read_text())
    except (OSError, ValueError):
        return []
    if not found:
        return []
    lines = ["", "## The barriers the calls are timed after", "",
             "Each call above is timed right after its own library's barrier (pycollective's: "
             "`pycollective.barrier`); a rank that leaves it early waits inside the timed call "
             "for the last one. Measured after the rounds (`benchmarks/peers/barrier_skew.py`, "
             "one launch per N and library): *spread*, the median over the barriers of the "
             "time between the first and the last rank leaving it (p90 beside it); *back to "
             "back*, one barrier's time in a loop.", "",
             "| N | barrier | spread | p90 | back to back |", "|---|---|---|---|---|"]
    for row in sorted(found, key=lambda r: (r["nranks"], r["env"], r["barrier"])):
        name = ("pycollective.barrier" if row["barrier"] == "pycollective.barrier"
                else short_library(row["barrier"]) or row["barrier"])
        lines.append(f"| {row['nranks']} | {name} | {row['spread_us']:.2f} µs | "
                     f"{row['p90_us']:.2f} µs | {row['back_to_back_us']:.2f} µs |")
    return lines


# --- the gaps' profiles ----------------------------------------------------------

def profile_gaps(args, out):
    """After the rounds: gaps.py's profile launches for the missed targets, then
    profiles.txt; nonzero if a launch failed."""
    summary, libraries = aggregate(read_points(out / "points.csv"))
    rows, _ = lines_of(summary, libraries)
    items = gaps.plan(rows, verdicts(rows, floors_of(out)))
    status = 0
    for item in items:
        extra = {"PYTHON": str(env_python(args.venvs, CONTENDERS[item["env"]])),
                 "PYCOLLECTIVE_TIMEOUT": str(args.launch_timeout)}
        argv = [str(RUN_MPI), str(item["n"]),
                *gaps.argv(item, out / "launches" / f"{item['name']}.json")]
        record(out, argv, extra)
        wait_quiet(args.wait, args.idle)
        t0 = time.monotonic()
        rc = launch(argv, extra, args.launch_timeout, out / "launches" / f"{item['name']}.log")
        print(f"[profile] {item['kind']} N={item['n']} {item['algorithm']} "
              f"{' '.join(map(fmt_count, item['counts']))}: exit {rc}, "
              f"{time.monotonic() - t0:.1f}s", flush=True)
        status |= rc != 0
    found = gaps.collect(items, lambda item: out / "launches" / f"{item['name']}.json")
    (out / gaps.PROFILES).write_text(json.dumps(found, indent=1))
    return status


# --- the targets -----------------------------------------------------------

def verdicts(rows, rates):
    """[(N, M, target, verdict)] for the targets of issue 30, from the report's rows."""
    out = []
    for r in rows:
        n, c, best, auto = r["n"], r["c"], r["best"], r["auto"]
        if not best or not best["time"]:
            continue
        t = best["time"]
        # against the peers: ours as a user calls it, auto in a launch of its own as each
        # peer runs, where measured; else the best of the launch whose cases take turns
        ours = ours_against_peers(r)
        peers = {k: v["time"] for k, v in r["peers"].items() if v and v["time"]}
        fastest = min(peers.values()) if peers else None

        def ratio(what, limit, value):
            ok = value <= limit
            out.append((n, c, what, f"{'met' if ok else 'gap'}: {value:.2f}"
                        + ("" if ok else f" (target {limit:.2f})")))

        if fastest:
            if c >= 10 ** 6:
                ratio("≥ 1.2x faster than the fastest peer (ours / fastest ≤ 0.83)",
                      1 / 1.2, ours / fastest)
            elif c >= 10 ** 4:
                ratio("at least as fast as the fastest peer (ours / fastest ≤ 1)", 1.0,
                      ours / fastest)
            else:
                # Small calls are judged against the two libraries with the fastest small
                # allreduce (issue 30): a looser bound at N = 2, where a call is a few µs.
                rivals = [peers[k] for k in ("openmpi", "impi") if k in peers]
                limit = 1.5 if n == 2 else 1.25
                if rivals:
                    ratio(f"within {limit:g}x of the faster of Open MPI and Intel MPI "
                          f"(ours / faster of them ≤ {limit:g})", limit, ours / min(rivals))
        floor = floor_time(rates, n, c)
        if c >= 10 ** 6 and floor:
            ratio("within 1.25x of the memory floor (ours / floor)", 1.25, ours / floor)
        if auto and auto["time"]:
            ratio("auto within 10 % of our best (auto / best)", 1.10, auto["time"] / t)
    return out


def ours_against_peers(row):
    """The time judged against the peers at one row: ``auto`` alone where measured, else
    the best case of the launch whose cases take turns (a run without the alone launch)."""
    alone = row.get("alone")
    return alone["time"] if alone and alone["time"] else row["best"]["time"]


def targets_section(found, rates):
    """The report's lines judging every row against the targets (``found``: :func:`verdicts`)."""
    lines = ["", "## Targets", ""]
    if rates:
        lines += [f"Memory floor: {FLOOR_TRAFFIC} bytes of traffic per payload "
                  "byte and rank (read the input, read the others' data, write the output), "
                  "every rank's, at the highest rate all ranks together reached copying at once "
                  "with N or fewer ranks (`python -m pycollective.bench membw`, one launch per "
                  "N; where ranks outnumber cores, fewer ranks can move more): "
                  + ", ".join(f"N = {n}: {rate / 1e9:.3g} GB/s per rank, "
                              f"{n * rate / 1e9:.3g} together"
                              for n, rate in sorted(rates.items()))
                  + "; the floor's rate: "
                  + ", ".join(f"N = {n}: {machine_rate(rates, n) / 1e9:.3g} GB/s"
                              for n in sorted(rates)) + ".", ""]
    else:
        lines += ["No memory floor measured (run without `--no-membw`).", ""]
    lines += ["| N | M | target | verdict |", "|---|---|---|---|"]
    lines += [f"| {n} | {fmt_count(c)} | {what} | {v} |" for n, c, what, v in found]
    met = sum(v.startswith("met") for *_, v in found)
    lines += ["", f"{met} of {len(found)} met."]
    return lines


def shared_section(rows, rates):
    """The ``+shared`` cases beside the plain ones (not a target: the targets are on the
    caller's own arrays)."""
    rows = [r for r in rows if r.get("shared") and r["shared"]["time"]]
    if not rows:
        return []
    lines = ["", "## On `pycollective.shared_empty` buffers", "",
             "The same calls on buffers allocated with `pycollective.shared_empty`, which "
             "`shm` reads in place above 1 MiB (docs/usage.md#shared-buffers); timed in the "
             "same repetitions as the plain cases. Not counted above: the targets are on "
             "the caller's own arrays.", "",
             "| N | M | shared | shared / best plain | shared / fastest peer | "
             "shared / floor |", "|---|---|---|---|---|---|"]
    for r in rows:
        t = r["shared"]["time"]
        floor = floor_time(rates, r["n"], r["c"]) if rates else None
        fastest = r["peers"][r["fastest"]]["time"] if r["fastest"] else None
        cells = [f"{fmt_time(t)} ({r['shared_algo']})",
                 f"{t / r['best']['time']:.2f}" if r["best"] and r["best"]["time"] else "-",
                 f"{t / fastest:.2f}" if fastest else "-",
                 f"{t / floor:.2f}" if floor and r["c"] >= 10 ** 6 else "-"]
        lines.append(f"| {r['n']} | {fmt_count(r['c'])} | " + " | ".join(cells) + " |")
    return lines


# --- aggregation ----------------------------------------------------------------

def read_points(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def aggregate(points):
    """{(series, nranks, count): summary} over rounds, from the rows that were right."""
    per = defaultdict(list)
    failed = defaultdict(int)
    picks = defaultdict(list)
    libraries = {}
    for p in points:
        if not p["series"]:
            continue
        key = (p["series"], int(p["nranks"]), int(p["count"]))
        if p["library"]:
            libraries[p["series"].split(":")[0]] = p["library"]
        if p["ok"] == "1":
            per[key].append(float(p["time_s"]))
            if p["pick"]:
                picks[key].append(p["pick"])
        else:
            failed[key] += 1
    summary = {}
    for key in set(per) | set(failed):
        times = per.get(key, [])
        med = statistics.median(times) if times else None
        summary[key] = dict(
            time=med, rounds=len(times), failed=failed.get(key, 0),
            spread=(max(times) - min(times)) / med if times and med else None,
            pick=max(set(picks[key]), key=picks[key].count) if picks.get(key) else "")
    return summary, libraries


def best_of_ours(summary, nranks, count, prefix="pycollective", shared=False):
    """(algorithm, summary) of our fastest named algorithm at one point, or (None, None):
    on the caller's plain arrays, or (``shared``) among the ``+shared`` cases."""
    cands = {s.split(":", 1)[1]: v for (s, n, c), v in summary.items()
             if s.startswith(prefix + ":") and n == nranks and c == count and v["time"]
             and s.split(":", 1)[1] not in ("auto", "native")
             and s.endswith(SHARED) == shared}
    if not cands:
        return None, None
    name = min(cands, key=lambda a: cands[a]["time"])
    return name, cands[name]


def busbw(count, nranks, seconds):
    return count * 4 / seconds * 2 * (nranks - 1) / nranks / 1e9 if seconds else None


# --- report -------------------------------------------------------------------

def fmt_time(t):
    if t is None:
        return "-"
    if t >= 1e-3:
        return f"{t * 1e3:.3g} ms" if t < 1 else f"{t:.3g} s"
    return f"{t * 1e6:.3g} µs"


def fmt_count(c):
    if c >= 10 and math.log10(c).is_integer():
        return f"1e{int(math.log10(c))}"
    return f"{c:g}"


def lines_of(summary, libraries):
    """Per (nranks, count): the table cells, in the report's column order."""
    label = {k: short_library(libraries.get(k, "")) or CONTENDERS[k].label for k in PEERS}
    points = sorted({(n, c) for (_, n, c) in summary})
    rows = []
    for n, c in points:
        algo, best = best_of_ours(summary, n, c)
        shared_algo, shared = best_of_ours(summary, n, c, shared=True)
        auto = summary.get(("pycollective:auto", n, c))
        alone = summary.get((ALONE, n, c))
        peers = {k: summary.get((k, n, c)) for k in PEERS}
        fastest = min((k for k in PEERS if peers[k] and peers[k]["time"]),
                      key=lambda k: peers[k]["time"], default=None)
        rows.append(dict(n=n, c=c, algo=algo, best=best, auto=auto, alone=alone, peers=peers,
                         fastest=fastest, shared_algo=shared_algo, shared=shared))
    return rows, label


def report(out, args_text=None):
    """Write report.md and peers.png from out/points.csv."""
    out = Path(out)
    points = read_points(out / "points.csv")
    summary, libraries = aggregate(points)
    rows, label = lines_of(summary, libraries)
    meta = json.loads((out / PLAN).read_text()) if (out / PLAN).exists() else {}
    ours_lib = short_library(libraries.get("pycollective", ""))
    lines = [f"# pycollective and its peers, {meta.get('started_utc', '')[:10]}", ""]
    if meta:
        lines += [
            f"Measured {meta['started_utc']} – {meta.get('ended_utc', '(unfinished)')} on "
            f"{meta['hostname']} ({meta.get('cpu_model') or 'CPU model unknown'}, "
            f"{meta['cpu_count']} CPUs, {meta['mem_gib']:.0f} GiB), "
            f"float32 SUM, out of place (Gloo in place)"
            + (f", on pycollective {meta['revision']}" if meta.get("revision") else "")
            + ". Command:", "",
            "```", meta["command"], "```", "",
            f"N = {', '.join(map(str, meta['ns']))}; M = {', '.join(map(fmt_count, meta['counts']))} "
            f"elements per rank; {meta['rounds']} rounds; at most {meta['group']} sizes per launch; "
            f"{meta['iters']} repetitions per size at most (fewer when one size would take more "
            f"than {meta['budget']:g} s per contender, never fewer than 3), {meta['warmup']} "
            f"warm-up calls. pycollective's algorithms: {' '.join(meta['algorithms'])}.", ""]
        cpus = meta.get("usable_cpus") or meta["cpu_count"]
        lines += ["Placement, on the " + f"{cpus} CPUs the launches could use: "
                  + "; ".join(placement(n, cpus) for n in meta["ns"]) + ".", ""]
        if meta.get("skipped"):
            lines += ["Left out by memory (" + f"{BUFFERS} buffers of M float32 per rank above "
                      f"{MEMORY_SHARE:.0%} of memory): "
                      + ", ".join(f"N = {n}, M = {fmt_count(c)}" for n, c in meta["skipped"]),
                      ""]
    per_launch = [float(p["idle_pct"]) for p in {p["launch"]: p for p in points}.values()
                  if p["idle_pct"]]
    if per_launch and statistics.median(per_launch) < 50:
        lines += [f"**Busy machine**: the CPU was {statistics.median(per_launch):.0f} % idle (median) "
                  "in the second before each launch; other jobs shared the cores, so these "
                  "numbers carry their scheduling, most for libraries that pin ranks to cores. "
                  "See the tables at the end.", ""]
    lines += [
        "Each cell: the median over rounds of each launch's median over repetitions of the "
        "slowest rank's time per call, each call right after its own library's barrier "
        "(pycollective's: `pycollective.barrier`; see `benchmarks/peers/compare.py` for how "
        "launches take turns). *pycollective best* and *auto*: pycollective's cases taking turns in one "
        "launch (each call after the others' calls, its caches theirs); *auto alone*: "
        "`algorithm=\"auto\"` in a launch of its own, as each peer runs. **Bold**: the "
        "fastest peer. *ours / fastest peer*: auto alone (else the best case) over the fastest "
        "peer, below 1 means pycollective is faster; the targets judge it. A cell is `✗` when "
        "no round gave a right result.", "",
        f"| N | M | pycollective best{f' ({ours_lib})' if ours_lib else ''} | auto (its pick) | "
        "auto alone | " + " | ".join(label[k] for k in PEERS)
        + " | ours / fastest peer | auto / best |",
        "|---|---|---|---|---|" + "---|" * len(PEERS) + "---|---|"]
    for r in rows:
        def cell(s, bold=False):
            if s is None:
                return "-"
            if s["time"] is None:
                return "✗"
            text = fmt_time(s["time"])
            return f"**{text}**" if bold else text
        best = f"{cell(r['best'])} ({r['algo']})" if r["best"] else "-"
        auto = _with_pick(r["auto"]) if r["auto"] and r["auto"]["time"] else cell(r["auto"])
        alone = _with_pick(r["alone"]) if r["alone"] and r["alone"]["time"] else cell(r["alone"])
        peers = [cell(r["peers"][k], k == r["fastest"]) for k in PEERS]
        ratio = (f"{ours_against_peers(r) / r['peers'][r['fastest']]['time']:.2f}"
                 if r["best"] and r["best"]["time"] and r["fastest"] else "-")
        auto_ratio = (f"{r['auto']['time'] / r['best']['time']:.2f}"
                      if r["best"] and r["auto"] and r["auto"]["time"] else "-")
        lines.append(f"| {r['n']} | {fmt_count(r['c'])} | {best} | {auto} | {alone} | "
                     + " | ".join(peers) + f" | {ratio} | {auto_ratio} |")
    lines += ["", "Bus bandwidth, GB/s (busbw = bytes per rank / time × 2(N−1)/N):", "",
              "| N | M | pycollective best | auto | " + " | ".join(label[k] for k in PEERS) + " |",
              "|---|---|---|---|" + "---|" * len(PEERS)]
    for r in rows:
        def bw(s):
            v = busbw(r["c"], r["n"], s["time"]) if s and s["time"] else None
            return "-" if v is None else f"{v:.3g}"
        lines.append(f"| {r['n']} | {fmt_count(r['c'])} | {bw(r['best'])} | {bw(r['auto'])} | "
                     + " | ".join(bw(r["peers"][k]) for k in PEERS) + " |")
    rates = floors_of(out) or {int(n): r for n, r in meta.get("floors", {}).items()}
    found = verdicts(rows, rates)
    lines += targets_section(found, rates)
    profiles = (json.loads((out / gaps.PROFILES).read_text())
                if (out / gaps.PROFILES).exists() else None)
    lines += gaps.section(profiles, rows, found,
                          lambda n, c: floor_time(rates, n, c), fmt_count, label)
    lines += shared_section(rows, rates)
    lines += barriers_section(out)
    lines += same_launch_tables(summary, libraries)
    # Honesty: spread over rounds, how quiet the machine was, failures.
    lines += ["", "Spread over rounds, (max − min) / median, median over the sizes of each N:", "",
              "| contender | " + " | ".join(f"N = {n}" for n in sorted({r['n'] for r in rows}))
              + " |", "|---|" + "---|" * len({r['n'] for r in rows})]
    series = ["pycollective:auto", ALONE] + list(PEERS)
    for s in series:
        cells = []
        for n in sorted({r["n"] for r in rows}):
            v = [x["spread"] for (k, nn, _), x in summary.items()
                 if k == s and nn == n and x["spread"] is not None]
            cells.append(f"{statistics.median(v):.0%}" if v else "-")
        name = {"pycollective:auto": "pycollective auto",
                ALONE: "pycollective auto alone"}.get(s) or label[s]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    idle = defaultdict(list)
    busy = defaultdict(int)
    for p in {p["launch"]: p for p in points}.values():  # one row per launch
        if p["idle_pct"]:
            idle[p["contender"]].append(float(p["idle_pct"]))
        busy[p["contender"]] += int(p["others"] or 0) > 0
    if idle:
        lines += ["", "CPU idle in the second before each launch (median, min) and launches that "
                  "started beside another MPI job:", "",
                  "| contender | idle median | idle min | beside another job |", "|---|---|---|---|"]
        for k in sorted(idle):
            lines.append(f"| {k} | {statistics.median(idle[k]):.0f} % | {min(idle[k]):.0f} % | "
                         f"{busy[k]} |")
    calibrations = sorted({p["note"] for p in points if p["series"].endswith(":auto") and p["note"]})
    if calibrations:
        lines += ["", "`auto` chose with: " + "; ".join(c.split(": ", 1)[1] for c in calibrations)
                  + " (what a user gets without calibrating; see docs/cost-model.md)."]
    bad = [p for p in points if p["series"] and p["ok"] != "1"]
    notes = [p for p in points if not p["series"] and p["note"]]
    lines += ["", f"Rows not counted (wrong result or failed launch): {len(bad)}."]
    for p in notes:
        lines.append(f"- round {p['round']}, {p['contender']}, N = {p['nranks']}: {p['note']}")
    if (out / "peers.png").exists() or plot(out, rows, label):
        lines += ["", "![time and busbw against size](peers.png)"]
    lines += ["", "Raw rows (every launch, every size): [points.csv](points.csv); every launch's "
              "command: [commands.txt](commands.txt)."]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return out / "report.md"


def _with_pick(auto):
    if not auto or not auto["time"]:
        return "-"
    return fmt_time(auto["time"]) + (f" ({auto['pick']})" if auto["pick"] else "")


def same_launch_tables(summary, libraries):
    """Per pycollective contender: best, auto and the library's native call from the same launches."""
    lines = []
    for key in [k for k in CONTENDERS if CONTENDERS[k].kind == "bench"]:
        points = sorted({(n, c) for (s, n, c) in summary if s.startswith(key + ":")})
        if not points:
            continue
        lib = short_library(libraries.get(key, "")) or CONTENDERS[key].label
        lines += ["", f"pycollective on {lib} beside {lib}'s own `MPI_Allreduce` timed in the same "
                  "repetitions (`python -m pycollective.bench`): the same-run ratio.", ""]
        lines += [
                  "| N | M | best | auto (its pick) | native | native / best |",
                  "|---|---|---|---|---|---|"]
        for n, c in points:
            algo, best = best_of_ours(summary, n, c, key)
            auto = summary.get((f"{key}:auto", n, c))
            native = summary.get((f"{key}:native", n, c))
            ratio = (f"{native['time'] / best['time']:.2f}"
                     if best and native and native["time"] else "-")
            lines.append(
                f"| {n} | {fmt_count(c)} | {fmt_time(best['time']) + f' ({algo})' if best else '-'} | "
                f"{_with_pick(auto)} | "
                f"{fmt_time(native['time']) if native else '-'} | {ratio} |")
    return lines


def plot(out, rows, label):
    """peers.png: time and busbw against size, one column per N; False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ns = sorted({r["n"] for r in rows})
    fig, axes = plt.subplots(2, len(ns), figsize=(max(8, 5 * len(ns)), 8), squeeze=False)
    styles = {"best": ("pycollective best", "tab:red", "-"),
              "auto": ("pycollective auto", "tab:red", ":"),
              "mpich": (label["mpich"], "tab:blue", "-"), "openmpi": (label["openmpi"], "tab:orange", "-"),
              "impi": (label["impi"], "tab:green", "-"), "gloo": (label["gloo"], "tab:purple", "-")}
    for j, n in enumerate(ns):
        sel = [r for r in rows if r["n"] == n]
        for key, (name, color, ls) in styles.items():
            pts = []
            for r in sel:
                s = r[key] if key in ("best", "auto") else r["peers"][key]
                if s and s["time"]:
                    pts.append((r["c"], s["time"]))
            if not pts:
                continue
            cs, ts = zip(*pts)
            axes[0][j].plot([c * 4 for c in cs], ts, marker="o", ms=3, color=color, ls=ls,
                            label=name)
            axes[1][j].plot([c * 4 for c in cs], [busbw(c, n, t) for c, t in pts], marker="o",
                            ms=3, color=color, ls=ls, label=name)
        axes[0][j].set_title(f"N = {n}")
        axes[0][j].set_yscale("log")
        axes[0][j].set_ylabel("time per call (s)")
        axes[1][j].set_ylabel("busbw (GB/s)")
        for ax in (axes[0][j], axes[1][j]):
            ax.set_xscale("log")
            ax.set_xlabel("bytes per rank (float32)")
            ax.grid(True, which="both", alpha=0.3)
        axes[1][j].set_yscale("log")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("allreduce, float32 SUM", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "peers.png", dpi=110)
    plt.close(fig)
    return True


# --- main ---------------------------------------------------------------------

def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--venvs", help="folder of the environments run.sh made")
    p.add_argument("--report", metavar="DIR", help="only remake DIR/report.md and DIR/peers.png")
    p.add_argument("--ns", nargs="+", type=int, default=[2, 4, 8])
    p.add_argument("--counts", nargs="+", type=lambda s: int(float(s)),
                   default=[10 ** k for k in range(9)],
                   help="elements per rank, a geometric ladder (default 1 10 ... 1e8)")
    p.add_argument("--contenders", nargs="+", choices=list(CONTENDERS),
                   default=DEFAULT_CONTENDERS)
    p.add_argument("--algorithms", nargs="+", default=None,
                   help="pycollective's algorithms (default: every registered one)")
    p.add_argument("--shared", nargs="*", default=["shm"],
                   help="pycollective's algorithms also timed on pycollective.shared_empty "
                        "buffers (case <name>+shared; reported apart, not a target); "
                        "--shared alone: none")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--group", type=int, default=3, help="sizes per launch (at most)")
    p.add_argument("--iters", type=int, default=50, help="timed repetitions per size (at most)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--budget", type=float, default=1.0,
                   help="seconds of timed repetitions per size and contender")
    p.add_argument("--wait", type=float, default=120,
                   help="seconds to wait before a launch for a quiet machine (then it goes anyway)")
    p.add_argument("--idle", type=float, default=80, help="percent idle that counts as quiet")
    p.add_argument("--launch-timeout", type=int, default=900, help="seconds per launch")
    p.add_argument("--no-membw", dest="membw", action="store_false",
                   help="skip measuring the memory-traffic floor (one bench membw launch per N)")
    p.add_argument("--no-profiles", dest="profiles", action="store_false",
                   help="skip profiling the missed targets after the rounds (gaps.py)")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def registered_algorithms(venvs):
    """pycollective's registered algorithms, asked of the MPICH environment."""
    py = env_python(venvs, CONTENDERS["pycollective"])
    code = "import pycollective; print(' '.join(pycollective.algorithms()))"
    return subprocess.run([str(py), "-c", code], check=True, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                          ).stdout.split()


def main(argv=None):
    args = parse(argv)
    # SIGTERM (also from a shell that ran this in the background, where SIGINT is ignored)
    # unwinds like Ctrl-C, so the launch under way is stopped too (launch()).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.report:
        print(report(args.report))
        return 0
    if not args.venvs:
        raise SystemExit("--venvs is required (run.sh gives it)")
    for key in args.contenders:
        py = env_python(args.venvs, CONTENDERS[key])
        if not py.exists():
            raise SystemExit(f"{key}: no environment at {py.parent.parent} (run.sh makes it)")
    if any(CONTENDERS[k].kind in ("bench", "pycollective") for k in args.contenders) \
            and args.algorithms is None:
        args.algorithms = registered_algorithms(args.venvs)
    args.algorithms = args.algorithms or []
    stamp = time.strftime("%Y-%m-%dT%H%MZ", time.gmtime())
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"{stamp}-peers")
    (out / "launches").mkdir(parents=True, exist_ok=True)
    counts = sorted(set(args.counts))
    launches, skipped = plan(args.ns, counts, args.rounds, args.group, args.contenders)
    meta = dict(started_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                hostname=os.uname().nodename, cpu_count=os.cpu_count(),
                cpu_model=cpu_model(), usable_cpus=usable_cpus(),
                mem_gib=meminfo("MemTotal") / 2 ** 30,
                command="benchmarks/peers/run.sh " + shlex.join(sys.argv[1:]),
                revision=revision(),
                ns=args.ns, counts=counts, rounds=args.rounds, group=args.group,
                iters=args.iters, warmup=args.warmup, budget=args.budget,
                contenders=args.contenders, algorithms=args.algorithms, shared=args.shared,
                skipped=skipped)
    (out / PLAN).write_text(json.dumps(meta, indent=1))
    print(f"# {len(launches)} launches into {out}; left out by memory: {skipped or 'none'}",
          flush=True)
    with open(out / "points.csv", "w", newline="") as f:
        csv.DictWriter(f, FIELDS).writeheader()
    status = 0
    if args.membw and "pycollective" in CONTENDERS and (ROOT / "src").exists():
        status |= measure_floors(args, out)
        # kept in the plan: the launches' JSON is not committed with a report
        meta["floors"] = {str(n): rate for n, rate in floors_of(out).items()}
        (out / PLAN).write_text(json.dumps(meta, indent=1))
    for i, (r, n, g, key) in enumerate(launches, 1):
        c = CONTENDERS[key]
        base = f"{i:03d}_r{r}_N{n}_{key}_{fmt_count(g[0])}-{fmt_count(g[-1])}"
        json_path, log_path = out / "launches" / f"{base}.json", out / "launches" / f"{base}.log"
        argv_, extra, limit = command(c, n, g, args, json_path)
        record(out, argv_, extra)
        need = n * g[-1] * 4 * BUFFERS
        idle, others = wait_quiet(args.wait, args.idle)
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        base_row = dict(round=r, launch=i, contender=key, nranks=n, idle_pct=f"{idle:.0f}",
                        others=others, started_utc=started)
        if need > MEMORY_SHARE * meminfo("MemAvailable") / 0.8:
            rows = [dict(base_row, series="", note=f"not launched: {need / 2**30:.1f} GiB needed, "
                         f"{meminfo('MemAvailable') / 2**30:.1f} GiB available")]
            status = 1
        else:
            t0 = time.monotonic()
            rc = launch(argv_, extra, limit, log_path)
            took = time.monotonic() - t0
            try:
                measured, library = rows_of(c, json_path, g)
                rows = [dict(base_row, series=s, count=cnt, time_s=repr(t), iters=it,
                             ok=int(ok), wrong=w, pick=pick, library=library,
                             note=note)
                        for s, cnt, t, it, ok, w, pick, note in measured]
                if rc != 0:
                    status = 1
                    rows.append(dict(base_row, series="", note=f"exit status {rc}, see {log_path.name}"))
            except (OSError, ValueError, KeyError) as exc:
                status = 1
                rows = [dict(base_row, series="", note=f"exit status {rc}, no result ({exc}); "
                             f"see launches/{log_path.name}")]
            shown = [row for row in rows if row.get("series") in (key, f"{key}:auto")]
            print(f"[{i}/{len(launches)}] round {r} N={n} {key:<20} idle {idle:3.0f}% "
                  f"{took:5.1f}s  " + "  ".join(
                      f"{fmt_count(row['count'])}:{fmt_time(float(row['time_s']))}"
                      f"{'' if row['ok'] else ' WRONG'}" for row in shown)
                  + "".join(f"  {row['note']}" for row in rows if not row.get("series")),
                  flush=True)
        with open(out / "points.csv", "a", newline="") as f:
            csv.DictWriter(f, FIELDS).writerows(rows)
    meta["ended_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    (out / PLAN).write_text(json.dumps(meta, indent=1))
    if args.profiles:
        status |= measure_barriers(args, out)
    if args.profiles and "pycollective" in args.contenders and (ROOT / "src").exists():
        status |= profile_gaps(args, out)
        meta["profiled_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        (out / PLAN).write_text(json.dumps(meta, indent=1))
    print(report(out))
    return status


if __name__ == "__main__":
    sys.exit(main())
