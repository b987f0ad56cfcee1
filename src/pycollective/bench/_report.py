"""The allreduce command's reports: text tables (nccl-tests layout), the auto score, the plot.

Every table's header line is a comment (``#``) and its data lines are
indented, so the output stays a valid nccl-tests-like log.
"""

from ._table import fmt_num, format_table

__all__ = ["t_us", "single_table", "sweep_tables", "auto_score", "score_table", "plot"]


def t_us(seconds):
    """Seconds as microseconds with 4 significant figures; ``-`` for None."""
    return fmt_num(seconds * 1e6, 4) if seconds is not None else "-"


def _err_pct(row):
    pred, t = row.get("pred"), row["time"]
    if not pred or not t > 0:  # no prediction, or none for an empty vector
        return "-"
    return f"{100.0 * (pred / t - 1):+.0f}"


def _name(r):
    return f"auto->{r['auto']}" if r["name"] == "auto" and r.get("auto") else r["name"]


def single_table(rows):
    """Phase-1 table: one line per (mode, algorithm), native in its own columns."""
    cols = [
        ("algorithm", _name),
        ("N", lambda r: str(r["nranks"])),
        ("M", lambda r: str(r["count"])),
        ("dtype", lambda r: r["dtype"]),
        ("op", lambda r: r["op"]),
        ("mode", lambda r: "ip" if r["inplace"] else "oop"),
        ("iters", lambda r: str(r["iters"])),
        ("time(us)", lambda r: t_us(r["time"])),
        ("algbw", lambda r: fmt_num(r["algbw"])),
        ("busbw", lambda r: fmt_num(r["busbw"])),
        ("native(us)", lambda r: t_us(r["native_time"])),
        ("native bw", lambda r: fmt_num(r["native_busbw"])),
        ("ratio", lambda r: fmt_num(r["ratio"])),
    ]
    if any(r.get("pred") is not None for r in rows):
        cols += [("model(us)", lambda r: t_us(r.get("pred_bare"))),
                 ("pred(us)", lambda r: t_us(r.get("pred"))), ("err%", _err_pct)]
    if any("tune_calls" in r for r in rows):
        cols += [("tune", lambda r: str(r["tune_calls"]) if "tune_calls" in r else "-"),
                 ("tune cost(us)", lambda r: t_us(r.get("tune_cost")))]
    cols += [
        ("#wrong", lambda r: str(r["wrong"])),
        ("maxerr", lambda r: fmt_num(r["maxerr"])),
        ("same", lambda r: "yes" if r["identical"] else "NO"),
        ("input", lambda r: "ok" if r["input_intact"] else "CHANGED"),
    ]
    return format_table(cols, rows, prefix="# ")


def sweep_tables(rows, names, modes):
    """nccl-tests layout: one table per algorithm (and native), one line per size."""
    out = []
    by = {(r["name"], r["count"], r["inplace"]): r for r in rows}
    counts = sorted({r["count"] for r in rows})
    with_pred = any(r.get("pred") is not None for r in rows)
    for name in ["native"] + names:
        lines = []
        for c in counts:
            lines.append([by.get((name, c, m)) for m in modes])
        first = lambda ln: next(r for r in ln if r is not None)  # noqa: E731
        cols = [
            ("size(B)", lambda ln: str(first(ln)["bytes"])),
            ("count", lambda ln: str(first(ln)["count"])),
            ("type", lambda ln: first(ln)["dtype"]),
            ("redop", lambda ln: first(ln)["op"]),
        ]
        for k, m in enumerate(modes):
            tag = "ip" if m else "oop"
            cols += [
                (f"{tag} time(us)", lambda ln, k=k: t_us(ln[k]["time"])),
                (f"{tag} algbw", lambda ln, k=k: fmt_num(ln[k]["algbw"])),
                (f"{tag} busbw", lambda ln, k=k: fmt_num(ln[k]["busbw"])),
                (f"{tag} #wrong", lambda ln, k=k: str(ln[k]["wrong"]) if name != "native" else "-"),
            ]
        if with_pred and name != "native":
            cols += [("model(us)", lambda ln: t_us(ln[0].get("pred_bare"))),
                     ("pred(us)", lambda ln: t_us(ln[0].get("pred"))),
                     ("err%", lambda ln: _err_pct(ln[0]))]
        if name == "auto":  # what deciding cost, apart from the timed repetitions
            cols += [("tune", lambda ln: str(sum(r.get("tune_calls", 0) for r in ln))),
                     ("tune cost(us)", lambda ln: t_us(sum(r.get("tune_cost", 0.0) for r in ln)))]
        problems = [r for ln in lines for r in ln if not (r["identical"] and r["input_intact"])]
        note = ""
        if problems:
            note = (f"\n#  !! {len(problems)} runs with replicas that differ across ranks "
                    "or a modified send buffer")
        n = lines[0][0]["nranks"]
        out.append(f"# {name}  (N={n}, times are medians of the max over ranks)\n"
                   + format_table(cols, lines, prefix="# ") + note)
    return "\n\n".join(out)


def auto_score(rows, names, within=0.10):
    """Score the model's choice against the measurements.

    For every (N, count, dtype, op, mode) where at least two algorithms were
    measured and the row carries ``auto`` (the model's pick), the point scores
    when the pick's measured time is at most ``(1 + within)`` times the
    fastest measured algorithm's.  Native MPI is not a candidate.

    Returns:
        ``dict(points=[...], scored=int, hits=int, score=float or None)``.
    """
    groups = {}
    for r in rows:
        if r["name"] in names:
            groups.setdefault((r["nranks"], r["count"], r["dtype"], r["op"], r["inplace"]),
                              []).append(r)
    tuned = {(r["nranks"], r["count"], r["dtype"], r["op"], r["inplace"]): r
             for r in rows if r["name"] == "auto"}
    points = []
    for key, grp in sorted(groups.items()):
        pick = grp[0].get("auto")
        if pick is None or len(grp) < 2:
            continue
        times = {r["name"]: r["time"] for r in grp}
        fastest = min(times, key=times.get)
        auto_row = tuned.get(key, {})
        entry = dict(nranks=key[0], count=key[1], dtype=key[2], op=key[3], inplace=key[4],
                     fastest=fastest, fastest_time=times[fastest], auto=pick,
                     auto_time=times.get(pick), tune_calls=auto_row.get("tune_calls"),
                     tune_cost=auto_row.get("tune_cost"))
        entry["hit"] = bool(entry["auto_time"] is not None
                            and entry["auto_time"] <= (1 + within) * times[fastest])
        points.append(entry)
    hits = sum(p["hit"] for p in points)
    return dict(points=points, scored=len(points), hits=hits, within=within,
                score=(hits / len(points)) if points else None)


def score_table(score):
    cols = [
        ("N", lambda p: str(p["nranks"])),
        ("count", lambda p: str(p["count"])),
        ("mode", lambda p: "ip" if p["inplace"] else "oop"),
        ("fastest", lambda p: p["fastest"]),
        ("time(us)", lambda p: t_us(p["fastest_time"])),
        ("auto", lambda p: p["auto"]),
        ("auto(us)", lambda p: t_us(p["auto_time"])),
        ("ok", lambda p: "yes" if p["hit"] else "no"),
    ]
    if any(p.get("tune_calls") is not None for p in score["points"]):
        cols += [("tune", lambda p: "-" if p.get("tune_calls") is None else str(p["tune_calls"])),
                 ("tune cost(us)", lambda p: t_us(p.get("tune_cost")))]
    text = format_table(cols, score["points"], prefix="# ")
    if score["score"] is not None:
        text += (f"\n# auto score: {score['hits']}/{score['scored']} = "
                 f"{100 * score['score']:.0f}% of points where "
                 f"{score.get('choice', 'the choice')} is the fastest or within "
                 f"{100 * score['within']:.0f}% of it")
    return text


def plot(rows, names, path, title):
    """Draw busbw against message size, measured points and predicted lines.

    Args:
        rows: measurement dicts (from :func:`pycollective.bench.main`).
        names: algorithms to draw (native is always drawn).
        path: output image file.
        title: the figure title.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5.5))
    colors = plt.get_cmap("tab20").colors[::2] + plt.get_cmap("tab20").colors[1::2]
    # Out of place only when there is any (in place looks alike and would
    # double the lines); in place when that is all there is.
    modes = [False] if any(not r["inplace"] for r in rows) else [True]
    for k, name in enumerate(["native"] + names):
        color = "black" if name == "native" else colors[(k - 1) % len(colors)]
        for inplace, marker in ((False, "o"), (True, "s")):
            if inplace not in modes:
                continue
            sel = sorted((r for r in rows if r["name"] == name and r["inplace"] == inplace
                          and r["bytes"] > 0), key=lambda r: r["bytes"])
            if not sel:
                continue
            label = f"{name}{' (in place)' if inplace else ''}"
            ax.plot([r["bytes"] for r in sel], [r["busbw"] for r in sel], marker=marker,
                    linestyle=":" if inplace else "-", color=color, label=label,
                    fillstyle="none" if inplace else "full", markersize=4)
            pred = [(r["bytes"], r["pred_busbw"]) for r in sel if r.get("pred_busbw")]
            if pred and name != "auto":  # auto's prediction is its pick's line
                ax.plot(*zip(*pred), linestyle="--", color=color, alpha=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("message size per rank (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
