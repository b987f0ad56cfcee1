"""Turn the JSON files of a sweep into a Markdown report.

    python benchmarks/report.py benchmarks/results/<stamp>

Reads every ``sweep_N*.json`` written by ``python -m pycollective.bench
--json`` in the directory (and ``commands.txt`` and the outputs of
single-size runs, ``single_*.txt``, if present), and writes ``report.md`` beside them: the machine and software,
the calibration, the auto score (per N and overall), and for each N a
matrix of median times (out of place and in place) with the measured
fastest algorithm in bold and the model's choice marked, followed by the
plot that ``--plot`` drew.  The numbers are the JSON's, unrounded in the
JSON; the report rounds them for reading.
"""

import glob
import json
import os
import sys


def _us(t):
    if t is None:
        return "-"
    us = t * 1e6
    return f"{us:.0f}" if us >= 100 else f"{us:.1f}"


def _matrix(rows, names, inplace):
    sel = [r for r in rows if r["inplace"] == inplace]
    if not sel:
        return ""
    counts = sorted({r["count"] for r in sel})
    by = {(r["name"], r["count"]): r for r in sel}
    algos = [n for n in names if n not in ("native", "auto")]
    cols = ["native"] + algos + (["auto"] if any(r["name"] == "auto" for r in sel) else [])
    head = "| M (elements) | bytes | " + " | ".join(cols) + " | fastest | model's choice |"
    lines = [head, "|" + "---|" * (len(cols) + 4)]
    for c in counts:
        times = {n: by[(n, c)]["time"] for n in algos if (n, c) in by}
        fastest = min(times, key=times.get) if times else None
        pick = next((by[(n, c)].get("auto") for n in algos if (n, c) in by), None)
        cells = []
        for n in cols:
            r = by.get((n, c))
            cell = _us(r["time"]) if r else "-"
            if n == fastest:
                cell = f"**{cell}**"
            if n == pick:
                cell += " †"
            if r and (r["wrong"] or not r["identical"] or not r["input_intact"]):
                cell += " ✗"
            cells.append(cell)
        ok = ""
        if pick in times and fastest:
            ok = " ✓" if times[pick] <= 1.1 * times[fastest] else f" ({times[pick] / times[fastest]:.2f}×)"
        nbytes = by[(cols[0], c)]["bytes"] if (cols[0], c) in by else ""
        lines.append(f"| {c} | {nbytes} | " + " | ".join(cells) + f" | {fastest} | {pick}{ok} |")
    return "\n".join(lines)


def _calibration(cal, directory):
    if not cal:
        return "none (the model was not available)"
    keys = ("alpha", "beta", "gamma")
    vals = ", ".join(f"{k} = {cal[k]:.3g}" for k in keys if k in cal)
    source = str(cal.get("source"))
    if os.path.isfile(source) and os.path.samefile(os.path.dirname(source) or ".", directory):
        source = os.path.basename(source) + " (in this directory)"
    return f"{vals}; from {source}"


def build(directory):
    """Write ``report.md`` for the sweep in ``directory``; return its path."""
    files = sorted(glob.glob(os.path.join(directory, "sweep_N*.json")),
                   key=lambda p: int(p.rsplit("_N", 1)[1].split(".")[0]))
    if not files:
        raise SystemExit(f"no sweep_N*.json in {directory}")
    runs = []
    for path in files:
        with open(path) as f:
            runs.append(json.load(f))
    env = runs[0]["environment"]
    finished = ", ".join(f"N={r['measurements'][0]['nranks']} {r['environment']['time_utc']}"
                         for r in runs if r["measurements"])
    out = [f"# Allreduce sweep {os.path.basename(os.path.abspath(directory))}", "",
           f"Finished: {finished}.", ""]
    cmd_file = os.path.join(directory, "commands.txt")
    if os.path.exists(cmd_file):
        with open(cmd_file) as f:
            out += ["Made by:", "", "```", f.read().strip(), "```", ""]
    v = env["versions"]
    out += [
        f"- machine: {env['hostname']}, {env['cpu_count']} CPUs, {env['platform']}",
        f"- MPI: {env['mpi_library']} (MPI {env['mpi_standard']}); mpi4py {v.get('mpi4py')}, "
        f"numpy {v.get('numpy')}, numba {v.get('numba')}, Python {v.get('python')}, "
        f"pycollective {v.get('pycollective')}",
        "- times: median over repetitions of the slowest rank's time per call, "
        "in µs; every repetition of every algorithm checked bit for bit against native "
        "`MPI_Allreduce` on exact data",
        "",
    ]
    total_hits = total_points = 0
    wrong = bad = 0
    summary = ["| N | points | auto within 10 % of fastest | score | calibration |", "|---|---|---|---|---|"]
    sections = []
    for run in runs:
        rows = run["measurements"]
        n = rows[0]["nranks"]
        score = run["auto_score"]
        total_hits += score["hits"]
        total_points += score["scored"]
        wrong += sum(r["wrong"] for r in rows)
        bad += sum(1 for r in rows if not (r["identical"] and r["input_intact"]))
        pct = f"{100 * score['score']:.0f} %" if score["score"] is not None else "n/a"
        summary.append(f"| {n} | {score['scored']} | {score['hits']} | {pct} | "
                       f"{_calibration(run.get('calibration'), directory)} |")
        names = []
        for r in rows:
            if r["name"] not in names:
                names.append(r["name"])
        sec = [f"## N = {n}", ""]
        for inplace, label in ((False, "out of place"), (True, "in place")):
            m = _matrix(rows, names, inplace)
            if m:
                sec += [f"Median time per call (µs), {label}, {rows[0]['dtype']} {rows[0]['op']}. "
                        "**bold**: measured fastest of the pycollective algorithms; †: the model's "
                        "choice (what `algorithm=\"auto\"` runs; the `auto` column times it "
                        "as called); ✓: choice within 10 % of the fastest; ✗: a failed check.",
                        "", m, ""]
        png = f"busbw_N{n}.png"
        if os.path.exists(os.path.join(directory, png)):
            sec += [f"![busbw against message size, N = {n}]({png})", ""]
        sections.append("\n".join(sec))
    overall = (f"{total_hits}/{total_points} = {100 * total_hits / total_points:.0f} %"
               if total_points else "n/a")
    out += ["## Auto score", "",
            "A point (N, M, in/out of place) scores when the model's choice is the measured "
            "fastest pycollective algorithm or within 10 % of its time.", "",
            *summary, "", f"**Overall: {overall}.**", "",
            f"Checks: {wrong} wrong elements and {bad} runs with differing replicas or a "
            "modified input, over every measurement of the sweep.", ""]
    singles = sorted(glob.glob(os.path.join(directory, "single_*.txt")))
    if singles:
        out += ["## Single-size runs", ""]
    for path in singles:
        with open(path) as f:
            out += ["```", f.read().strip(), "```", ""]
    out += sections
    path = os.path.join(directory, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(out).rstrip() + "\n")
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python benchmarks/report.py RESULTS_DIRECTORY")
    print(build(sys.argv[1]))
