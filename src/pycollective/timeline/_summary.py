"""What a trace says without a viewer: per collective and algorithm, where the time went.

A *call* here is one call on every rank: the call events of all ranks
with the same communicator and call number.  For each (collective,
algorithm) the summary gives:

* calls, and the time per call (median, p99): a call's time is its
  slowest rank's span, from that rank's entry to its return;
* late: the share of the ranks' time spent before the last rank arrived,
  i.e. for each call and rank, the last rank's start minus this rank's
  start (on the aligned clock), over the sum of the ranks' spans; and which
  ranks arrived last most often;
* the shares of the ranks' time in each phase category directly under the
  call (agreement, wait, reduce, copy; a wait inside the agreement counts
  as agreement; "step": an algorithm's compiled step, which does its
  agreement, copies and reduction in one call, shm's below 1 MiB), and the
  rest ("other": argument checks, Python between the phases, the
  algorithm's work no hook marks).

:func:`per_rank` gives each rank's time per category, which ``--plot`` draws.
"""

import collections
import json

CATEGORIES = ("agreement", "wait", "reduce", "copy", "step")


def load(path):
    with open(path) as f:
        return json.load(f)


def calls_of(doc, skip=0):
    """``{(collective, algorithm): {(comm, number): {rank: call}}}`` with each call's
    ``start``, ``dur`` and ``phases`` (category -> µs, direct children only); ``skip``:
    leave out each communicator's first calls (its setup, the kernels' compilation)."""
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    by_track = collections.defaultdict(list)
    for e in events:
        by_track[(e["pid"], e["tid"])].append(e)
    out = collections.defaultdict(lambda: collections.defaultdict(dict))
    for (rank, _), track in by_track.items():
        track.sort(key=lambda e: (e["ts"], e["cat"] != "call"))
        current = None
        for e in track:
            if e["cat"] == "call":
                args = e["args"]
                current = {"start": e["ts"], "dur": e["dur"], "phases": {}}
                what = e["name"].split(" ")[0]
                key = (args.get("comm", "?"), args.get("number", id(current)))
                if args.get("number", skip + 1) > skip:
                    out[(what, args.get("algorithm", "?"))][key][rank] = current
            elif current is not None and e["args"].get("depth") == 1:
                phases = current["phases"]
                phases[e["cat"]] = phases.get(e["cat"], 0.0) + e["dur"]
    return out


def _percentile(values, q):
    values = sorted(values)
    if not values:
        return float("nan")
    at = q * (len(values) - 1)
    lo = int(at)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (at - lo)


def summarize(doc, skip=0):
    """One row per (collective, algorithm): see the module docstring.  Times in µs."""
    rows = []
    for (what, algo), calls in sorted(calls_of(doc, skip).items()):
        times, total, late, phases = [], 0.0, 0.0, dict.fromkeys(CATEGORIES, 0.0)
        last = collections.Counter()
        for ranks in calls.values():
            times.append(max(c["dur"] for c in ranks.values()))
            arrival = max(c["start"] for c in ranks.values())
            if len(ranks) > 1:
                last[max(ranks, key=lambda r: ranks[r]["start"])] += 1
            for c in ranks.values():
                total += c["dur"]
                late += arrival - c["start"]
                for cat in CATEGORIES:
                    phases[cat] += c["phases"].get(cat, 0.0)
        share = {cat: v / total if total else 0.0 for cat, v in phases.items()}
        share["other"] = max(0.0, 1.0 - sum(share.values()))
        rows.append({"collective": what, "algorithm": algo, "calls": len(times),
                     "median_us": _percentile(times, 0.5), "p99_us": _percentile(times, 0.99),
                     "late_share": late / total if total else 0.0,
                     "last_ranks": last.most_common(3), "shares": share})
    return rows


def per_rank(doc, skip=0):
    """``{rank: {category or "other": µs}}`` summed over every call."""
    out = {}
    for calls in calls_of(doc, skip).values():
        for ranks in calls.values():
            for rank, c in ranks.items():
                mine = out.setdefault(rank, dict.fromkeys(CATEGORIES + ("other",), 0.0))
                for cat in CATEGORIES:
                    mine[cat] += c["phases"].get(cat, 0.0)
                mine["other"] += max(0.0, c["dur"] - sum(c["phases"].values()))
    return dict(sorted(out.items()))


def _us(t):
    return f"{t / 1000:.2f} ms" if t >= 1000 else f"{t:.1f} us"


def table(doc, skip=0):
    """The summary as text lines."""
    meta = doc.get("otherData", {})
    lines = [f"# {meta.get('ranks', '?')} ranks; clock offsets (ns, to rank 0's): "
             f"{meta.get('clock_offsets_ns')}"]
    if meta.get("missing_ranks"):
        lines.append(f"# ranks missing from the trace: {meta['missing_ranks']}")
    header = ("collective", "algorithm", "calls", "median", "p99", "late", "last ranks (calls)",
              *CATEGORIES, "other")
    rows = [header]
    if skip:
        lines.append(f"# leaving out the first {skip} calls on each communicator")
    for r in summarize(doc, skip):
        rows.append((r["collective"], r["algorithm"], str(r["calls"]), _us(r["median_us"]),
                     _us(r["p99_us"]), f"{r['late_share']:.0%}",
                     " ".join(f"{q}({n})" for q, n in r["last_ranks"]) or "-",
                     *(f"{r['shares'][c]:.0%}" for c in CATEGORIES + ("other",))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    counts = collections.Counter(e["name"] for e in doc["traceEvents"] if e.get("ph") == "i")
    if counts:
        lines.append("# instants: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    return lines


def plot(doc, out, skip=0):
    """Draw each rank's time in each phase (stacked bars) into the image ``out``."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise SystemExit("--plot needs matplotlib: pip install 'pycollective[plot]'") from exc
    ranks = per_rank(doc, skip)
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.45 * len(ranks)), dpi=100)
    left = [0.0] * len(ranks)
    labels = [f"rank {r}" for r in ranks]
    colors = {"agreement": "#4c72b0", "wait": "#dd8452", "reduce": "#55a868",
              "copy": "#8172b3", "step": "#937860", "other": "#c7c7c7"}
    for cat in CATEGORIES + ("other",):
        widths = [ranks[r][cat] / 1000 for r in ranks]
        ax.barh(labels, widths, left=left, color=colors[cat], label=cat)
        left = [a + b for a, b in zip(left, widths)]
    ax.invert_yaxis()
    ax.set_xlabel("time in collectives (ms), by phase")
    ax.legend(ncol=6, fontsize="small", loc="lower center", bbox_to_anchor=(0.5, 1.0),
              frameon=False)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
