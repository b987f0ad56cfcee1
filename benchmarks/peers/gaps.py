"""The report's missed targets, profiled in the same run: what each gap is made of.

compare.py judges every row against the targets of issue 12.  For the rows
that miss one, :func:`plan` lists profile launches, compare.py runs them
right after the rounds (in the MPICH environment, where "pycollective best"
ran, except the peers' own), :func:`collect` keeps what they measured in
``profiles.txt`` (JSON; committed with the report, so ``compare.py --report
DIR`` remakes the section), and :func:`section` writes the report's "What
the gaps are made of".  Four profiles, one launch per N and algorithm or
peer:

* **cpu** (``benchmarks/peers/cpu_time.py``), every gap size: our best
  algorithm there and MPICH's own ``Allreduce`` taking turns, calls back to
  back with wall time against CPU time summed over the ranks, and one call
  at a time after a ``Barrier`` as the report times them.  ``busy`` = CPU /
  (cores x wall): well below 100 % means cores stood idle while ranks waited
  for others; ``CPU / floor`` = that CPU over the CPU the memory floor needs
  at one core's copy rate: how much work beyond the floor's traffic the
  cores did, a yielding wait's included; ``sys`` = the kernel's share of it
  (``process_vm_readv``, page faults, futex and yield calls).
* **phases** (``python -m pycollective.bench breakdown``), gap sizes above 4
  KiB where the best is ``shm``: each step of the call replayed with a clock
  between the steps; the syncs' share is time a rank waited for the others
  (where ranks outnumber cores, for ranks that were not running).  From 4 KiB
  to 1 MiB the real call is one compiled step, so the replay's Python
  steps cost more than the call; the shares still say where the waiting is.
* **pieces** (``python -m pycollective.bench latency shm``), gap sizes up to
  1e3 elements: the pieces of a 1-element call from Python (fast-path
  lookup, the algorithm, its flag barrier) beside MPICH's own call from
  Python, each in a loop of its own.
* **starts** (``benchmarks/peers/starts.py`` in the fastest peer's
  environment), gap sizes below 1e6 where that peer is an MPI library: the
  peer's own calls back to back and one after a Barrier, beside ours from
  the cpu profile.  Where ours are faster back to back, the gap is in
  starting after a Barrier, which the report's loop times for everyone.

And without a launch: where a target asks for a lead over the fastest peer,
that peer's time over the memory floor (a 1.2x lead over a peer at 1.0x the
floor would need ours at 0.83x of it: below what memory allows, unless the
data stay in cache).
"""

import json
from pathlib import Path

PROFILES = "profiles.txt"  # JSON (not *.json: benchmarks/results ignores those)
REPLICATE_BYTES = 4096     # shm's small path: one sync, no phases (bench breakdown refuses it)
SMALL = 1000               # gap sizes up to this many elements also get the pieces
BULK = 10 ** 5             # from here a call's CPU is compared with the floor's
BIG = 10 ** 6              # below this, the fastest peer's own starts are timed
CPU_BUDGET = 0.3           # seconds of calls per size and contender in cpu_time.py
HERE = Path(__file__).resolve().parent
CPU_TIME = HERE / "cpu_time.py"
STARTS = HERE / "starts.py"
MPI_PEERS = ("mpich", "openmpi", "impi")  # the peers starts.py can run (Gloo reduces in place)


def gap_points(rows, found):
    """[(row, [gap texts])] for the rows with a missed target other than ``auto``'s
    (auto's gap is its choice, which the same-run table already shows)."""
    by_point = {}
    for n, c, what, verdict in found:
        if verdict.startswith("gap") and not what.startswith("auto"):
            by_point.setdefault((n, c), []).append(f"{what.split(' (')[0]}: {verdict[5:]}")
    return [(r, by_point[(r["n"], r["c"])]) for r in rows if (r["n"], r["c"]) in by_point
            and r["algo"]]


def plan(rows, found):
    """The profile launches the gaps need: [dict(kind, n, counts, algorithm, name, env)];
    ``env``: the environment the launch runs in (compare.py's contender key)."""
    items = []
    points = gap_points(rows, found)
    for n in sorted({r["n"] for r, _ in points}):
        here = [r for r, _ in points if r["n"] == n]
        for algo in sorted({r["algo"] for r in here}):
            counts = sorted(r["c"] for r in here if r["algo"] == algo)
            items.append(dict(kind="cpu", n=n, counts=counts, algorithm=algo,
                              name=f"gaps_cpu_{algo}_N{n}", env="pycollective"))
        phases = sorted(r["c"] for r in here if r["algo"] == "shm"
                        and r["c"] * 4 > REPLICATE_BYTES)
        if phases:
            items.append(dict(kind="phases", n=n, counts=phases, algorithm="shm",
                              name=f"gaps_phases_N{n}", env="pycollective"))
        small = sorted(r["c"] for r in here if r["c"] <= SMALL)
        if small:
            items.append(dict(kind="pieces", n=n, counts=small, algorithm="shm",
                              name=f"gaps_pieces_N{n}", env="pycollective"))
        for peer in MPI_PEERS:
            counts = sorted(r["c"] for r in here if r["c"] < BIG and r["fastest"] == peer)
            if counts:
                items.append(dict(kind="starts", n=n, counts=counts, algorithm=peer,
                                  name=f"gaps_starts_{peer}_N{n}", env=peer))
    return items


def argv(item, json_path):
    """What follows ``scripts/run_mpi.sh N`` for one profile launch."""
    counts = [str(c) for c in item["counts"]]
    if item["kind"] == "cpu":
        return [str(CPU_TIME), "--count", *counts, "--algorithm", item["algorithm"],
                "--budget", repr(CPU_BUDGET), "--json", str(json_path)]
    if item["kind"] == "starts":
        return [str(STARTS), "mpi", "--counts", *counts, "--json", str(json_path)]
    if item["kind"] == "phases":
        return ["-m", "pycollective.bench", "breakdown", "--M", *counts, "--quiet",
                "--json", str(json_path)]
    return ["-m", "pycollective.bench", "latency", "shm", "--M", *counts, "--piece-time",
            "0.05", "--quiet", "--json", str(json_path)]


def collect(items, json_of):
    """What the launches measured, trimmed to what the section uses:
    {kind: {N: ...}}, from ``json_of(item)`` (the launch's JSON path)."""
    got = {"cpu": {}, "phases": {}, "pieces": {}, "starts": {}}
    for item in items:
        try:
            data = json.loads(Path(json_of(item)).read_text())
        except (OSError, ValueError):
            continue
        n = str(item["n"])
        if item["kind"] == "cpu":
            got["cpu"].setdefault(n, {}).update(
                {f"{row['name']}:{row['count']}": row for row in data["rows"]},
                copy_rate=data["copy_rate"], cores=data["cores"])
        elif item["kind"] == "starts":
            got["starts"].setdefault(n, {}).update(
                {f"{item['algorithm']}:{row['count']}": row for row in data["rows"]})
        elif item["kind"] == "phases":
            got["phases"][n] = [{k: m[k] for k in ("count", "path", "phase", "time", "share",
                                                   "used", "wrong")}
                                for m in data["measurements"]]
        else:
            got["pieces"][n] = [{k: m[k] for k in ("name", "within", "time")}
                                for m in data["measurements"] if m.get("kind") == "piece"]
    return got


def _us(t):
    return f"{t * 1e6:.3g} µs" if t < 1e-3 else f"{t * 1e3:.3g} ms"


def _sync_share(phases, count):
    """The syncs' share of the phases of the path the call takes at ``count``, or None."""
    used = [p for p in phases if p["count"] == count and p["path"] != "call" and p["used"]]
    total = sum(p["time"] for p in used)
    if total <= 0:
        return None
    return sum(p["time"] for p in used if "sync" in p["phase"]) / total


def _reading(r, gaps, cpu, native, syncs, peer_floor, pieces, peer_starts, peer_label):
    """What the numbers say, one clause per finding (only what they show)."""
    said = []
    if peer_floor is not None and any("1.2x faster" in g for g in gaps) \
            and peer_floor < 1.2 * 1.25:
        said.append(f"the fastest peer ran at {peer_floor:.2f}x the floor, so a 1.2x lead needs "
                    f"ours at {peer_floor / 1.2:.2f}x of it")
    if cpu:
        alone, together = cpu["wall"], cpu.get("after_barrier")
        if peer_starts:
            theirs = peer_starts["back_to_back"]
            said.append(f"back to back ours took {_us(alone)}, {peer_label}'s {_us(theirs)}"
                        + (": the gap is in starting after a Barrier" if alone <= theirs
                           else ""))
        elif together and together > 1.3 * alone:
            said.append(f"one call after a Barrier took {_us(together)}, back to back "
                        f"{_us(alone)}: starting together costs the difference")
        if cpu["busy"] < 0.9:
            said.append(f"cores idle {1 - cpu['busy']:.0%} of the wall even back to back")
        if cpu["cpu_floor"] > 1.25 and r["c"] >= BULK:
            work = (f"the cores did {cpu['cpu_floor']:.2f}x the floor's CPU work"
                    + (f" (MPICH's own call {native['cpu_floor']:.2f}x)" if native else ""))
            if _sys_share(cpu) >= 0.4:
                work += f", {_sys_share(cpu):.0%} of it in the kernel"
            said.append(work)
    if syncs is not None and syncs >= 0.5:
        said.append(f"syncs are {syncs:.0%} of shm's phases"
                    + (": waiting ranks yield their core to ranks with work"
                       if cpu and cpu["busy"] >= 0.9 else ""))
    if pieces and r["c"] <= SMALL:
        t = {p["name"]: p["time"] for p in pieces}
        try:
            said.append(f"a 1-element call from Python: ours "
                        f"{_us(t['allreduce(shm), agreement off'])} (fast-path lookup "
                        f"{_us(t['fast-path lookup, out of place'])}, the algorithm "
                        f"{_us(t['shm algorithm alone'])}, of which its flag barrier "
                        f"{_us(t['flag barrier'])}), MPICH's own {_us(t['native comm.Allreduce'])}")
        except KeyError:
            pass
    return "; ".join(said) if said else "-"


def _sys_share(cpu):
    return cpu["sys"] / max(cpu["user"] + cpu["sys"], 1e-12)


def section(profiles, rows, found, floor_time, fmt_count=lambda c: f"{c:g}", labels=None):
    """The report's lines: one table row per gap point, then the pieces of small calls
    (``labels``: the peers' names by contender key, for the text)."""
    labels = labels or {}
    points = gap_points(rows, found)
    if not points:
        return []
    if not profiles:
        return ["", "## What the gaps are made of", "",
                "Not profiled in this run (`--no-profiles`, or the launches failed)."]
    lines = ["", "## What the gaps are made of", "",
             "Measured right after the rounds, one launch per N and profile "
             "(`benchmarks/peers/gaps.py` says how; the launches are in commands.txt). "
             "*back to back*: our best algorithm's time per call in a loop "
             "(`benchmarks/peers/cpu_time.py`); *after a Barrier*: one call at a time, as the "
             "report times them. *busy*: CPU time summed over ranks / (cores × wall), back to "
             "back. *CPU / floor*: that CPU time over the CPU time the memory floor's traffic "
             "needs at one core's copy rate (shown from 1e5 elements; below, calls are "
             "overhead). *sys*: the kernel's share of the CPU time. *syncs*: the waits' share "
             "of shm's phases (`bench breakdown`). *fastest peer*: its own calls back to back "
             "and after a Barrier (`benchmarks/peers/starts.py`, below 1e6). *peer / floor*: "
             "the fastest peer's time over the floor.", "",
             "| N | M | missed | ours here: back to back, after a Barrier (algorithm) | busy | "
             "CPU / floor | sys | MPICH's own: busy, CPU / floor | syncs | fastest peer: back "
             "to back, after a Barrier | peer / floor | what it says |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r, gaps in points:
        n, c = r["n"], r["c"]
        cpu_n = profiles.get("cpu", {}).get(str(n), {})
        cpu = cpu_n.get(f"{r['algo']}:{c}")
        native = cpu_n.get(f"native:{c}")
        syncs = _sync_share(profiles.get("phases", {}).get(str(n), []), c)
        floor = floor_time(n, c)
        fastest = r["peers"][r["fastest"]]["time"] if r["fastest"] else None
        peer_floor = fastest / floor if floor and fastest and c >= 10 ** 6 else None
        starts = profiles.get("starts", {}).get(str(n), {}).get(f"{r['fastest']}:{c}")
        label = labels.get(r["fastest"], r["fastest"])
        bulk = c >= BULK
        cells = [
            "; ".join(gaps),
            (f"{_us(cpu['wall'])}, {_us(cpu['after_barrier'])} ({r['algo']})" if cpu
             else f"- ({r['algo']})"),
            f"{cpu['busy']:.0%}" if cpu else "-",
            f"{cpu['cpu_floor']:.2f}" if cpu and bulk else "-",
            f"{_sys_share(cpu):.0%}" if cpu else "-",
            (f"{native['busy']:.0%}" + (f", {native['cpu_floor']:.2f}" if bulk else "")
             if native else "-"),
            f"{syncs:.0%}" if syncs is not None else "-",
            (f"{label}: {_us(starts['back_to_back'])}, {_us(starts['after_barrier'])}"
             if starts else "-"),
            f"{peer_floor:.2f}" if peer_floor is not None else "-",
            _reading(r, gaps, cpu, native, syncs, peer_floor,
                     profiles.get("pieces", {}).get(str(n)), starts, label)]
        lines.append(f"| {n} | {fmt_count(c)} | " + " | ".join(cells) + " |")
    pieces = profiles.get("pieces", {})
    if pieces:
        lines += ["", "The pieces of a 1-element `shm` call from Python, each timed in a loop of "
                  "its own (`bench latency`; they need not add up to the call):", "",
                  "| N | piece | part of | time |", "|---|---|---|---|"]
        for n in sorted(pieces, key=int):
            for p in pieces[n]:
                lines.append(f"| {n} | {p['name']} | {p['within'] or '-'} | {_us(p['time'])} |")
    return lines
