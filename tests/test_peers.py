"""benchmarks/peers: the data and its check, the launch plan, and the report's arithmetic.

No MPI here: the launches themselves are what `benchmarks/peers/run.sh` runs.
"""

import csv
import json
import os
import subprocess
import importlib.util
import time
from pathlib import Path

import numpy as np
import pytest

from pycollective.bench._allreduce import sweep_counts

PEERS = Path(__file__).resolve().parents[1] / "benchmarks" / "peers"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"peers_{name}", PEERS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


point = _load("point")
compare = _load("compare")
gaps = _load("gaps")


@pytest.mark.parametrize("count", [0, 1, 17, point.BLOCK + 3])
@pytest.mark.parametrize("nranks", [1, 2, 3, 8])
def test_reference_is_the_sum_of_every_ranks_input(count, nranks):
    total = np.zeros(count, np.float64)
    for rank in range(nranks):
        x = np.empty(count, np.float32)
        point.fill_input(x, rank)
        total += x
    assert np.array_equal(point.reference(count, nranks), total)


def test_inputs_differ_by_rank_and_index():
    x0, x1 = np.empty(1000, np.float32), np.empty(1000, np.float32)
    point.fill_input(x0, 0)
    point.fill_input(x1, 1)
    assert len(np.unique(x0)) > 20 and np.count_nonzero(x0 != x1) > 800
    # No short period for a misplaced chunk to hide in.
    assert all(np.count_nonzero(x1[k:] != x1[:-k]) > 0.8 * (1000 - k) for k in (1, 2, 8, 100))


def test_wrong_elements_catches_shifts_gaps_and_nans():
    ref = point.reference(1000, 4)
    assert point.wrong_elements(ref.copy(), ref) == (0, 0.0)
    shifted = np.roll(ref, 100)
    assert point.wrong_elements(shifted, ref)[0] > 800
    gap = ref.copy()
    gap[500:] = np.nan  # a result never written
    n, err = point.wrong_elements(gap, ref)
    assert n == 500 and err == float("inf")
    missing_rank = ref.copy()
    x = np.empty(1000, np.float32)
    point.fill_input(x, 3)
    missing_rank -= x
    assert point.wrong_elements(missing_rank, ref)[0] > 800


def test_plan_rotates_the_contenders_and_caps_by_memory():
    counts = [10 ** k for k in range(9)]
    launches, skipped = compare.plan([2, 8], counts, 2, 3, ["a", "b", "c"], total=24 * 2 ** 30)
    assert skipped == [(8, 10 ** 8)]  # 8 ranks x 8 buffers x 400 MB > 60 % of 24 GiB
    assert {g for _, n, g, _ in launches if n == 2} == {(1, 10, 100), (1000, 10 ** 4, 10 ** 5),
                                                         (10 ** 6, 10 ** 7, 10 ** 8)}
    assert max(g[-1] for _, n, g, _ in launches if n == 8) == 10 ** 7
    firsts = [launches[i][3] for i in range(0, len(launches), 3)]
    assert {firsts.count(k) for k in "abc"} == {4}  # 12 groups: each goes first 4 times
    assert all(sorted(k for *_, k in launches[i:i + 3]) == ["a", "b", "c"]
               for i in range(0, len(launches), 3))


@pytest.mark.parametrize("group", [[1], [1, 10, 100], [1000, 10 ** 4, 10 ** 5], [10 ** 6, 10 ** 8],
                                   [1, 32, 1000]])
def test_bench_sweeps_exactly_the_group(group):
    args = compare.bench_counts_args(group)
    if args[0] == "--M":
        assert [int(args[1])] == group
    else:
        lo, hi, f = int(args[1]), int(args[3]), float(args[5])
        assert sweep_counts(lo, hi, f) == group


def test_a_group_no_sweep_can_make_is_refused():
    assert compare.bench_counts_args([1, 10, 1000]) is None


def test_groups_are_sweeps_the_bench_can_make():
    assert compare.groups([1, 1000, 10 ** 5, 10 ** 7, 10 ** 8], 3) == [
        (1, 1000), (10 ** 5, 10 ** 7), (10 ** 8,)]  # 1, 1e3, 1e5 is no geometric sweep
    assert compare.groups([1, 10, 100, 1000], 2) == [(1, 10), (100, 1000)]


def _points(tmp_path, rows):
    with open(tmp_path / "points.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, compare.FIELDS)
        writer.writeheader()
        for i, (rnd, series, n, c, t, ok) in enumerate(rows):
            writer.writerow(dict(round=rnd, launch=i, contender=series.split(":")[0], series=series,
                                 nranks=n, count=c, time_s=repr(t), iters=5, ok=int(ok), wrong=0,
                                 pick="shm" if series.endswith(":auto") else "",
                                 library="MPICH Version: 5.0.2", idle_pct="90", others=0,
                                 started_utc="", note=""))


def test_median_over_rounds_counts_only_right_results(tmp_path):
    _points(tmp_path, [
        (1, "mpich", 2, 10, 3.0, True), (2, "mpich", 2, 10, 1.0, True),
        (3, "mpich", 2, 10, 2.0, True), (4, "mpich", 2, 10, 0.1, False),  # wrong: not counted
        (1, "pycollective:shm", 2, 10, 0.5, True), (1, "pycollective:ring", 2, 10, 0.7, True),
        (1, "pycollective:auto", 2, 10, 0.6, True), (1, "pycollective:native", 2, 10, 0.1, True),
        (1, "gloo", 2, 10, 9.0, False)])
    summary, _ = compare.aggregate(compare.read_points(tmp_path / "points.csv"))
    mpich = summary[("mpich", 2, 10)]
    assert (mpich["time"], mpich["rounds"], mpich["failed"]) == (2.0, 3, 1)
    assert mpich["spread"] == pytest.approx(1.0)
    assert summary[("gloo", 2, 10)]["time"] is None
    assert compare.best_of_ours(summary, 2, 10)[0] == "shm"  # native and auto are not ours
    text = compare.report(tmp_path).read_text()
    assert "| 2 | 1e1 | 500 ms (shm) | 600 ms (shm) | - | **2 s** |" in text  # no alone launch
    assert "| ✗ | 0.25 | 1.20 |" in text  # Gloo never right; ours / fastest peer; auto / best


def _judged(tmp_path, nranks, traffic):
    """The report's rows from points.csv and their verdicts, with one membw launch of
    ``nranks`` ranks that moved ``traffic`` GB/s each."""
    launches = tmp_path / "launches"
    launches.mkdir()
    (launches / f"membw_N{nranks}.json").write_text(json.dumps({"measurements": [
        {"name": "together", "nranks": nranks, "traffic": traffic}]}))
    summary, libraries = compare.aggregate(compare.read_points(tmp_path / "points.csv"))
    rows, _ = compare.lines_of(summary, libraries)
    return rows, compare.verdicts(rows, compare.floors_of(tmp_path))


def test_targets_are_judged_by_size_class_with_the_memory_floor(tmp_path):
    big, mid, small = 10 ** 7, 10 ** 5, 10 ** 3
    _points(tmp_path, [
        (1, "pycollective:shm", 4, big, 0.040, True), (1, "pycollective:auto", 4, big, 0.046, True),
        (1, "impi", 4, big, 0.050, True),                 # 0.8: met (≤ 1/1.2)
        (1, "pycollective:shm", 4, mid, 2e-4, True), (1, "openmpi", 4, mid, 1e-4, True),
        (1, "pycollective:shm", 4, small, 30e-6, True), (1, "mpich", 4, small, 40e-6, True),
        (1, "impi", 4, small, 10e-6, True)])              # N = 4 small: Open MPI and Intel MPI
    # 3 x 4e7 B at 4 GB/s per rank: a 30 ms floor, so 40 ms is 1.33x (a gap)
    rows, verdicts = _judged(tmp_path, 4, 4.0)
    found = {(c, what.split(" (")[0]): v for n, c, what, v in verdicts}
    assert found[(big, "≥ 1.2x faster than the fastest peer")] == "met: 0.80"
    assert found[(big, "within 1.25x of the memory floor")].startswith("gap: 1.33")
    assert found[(big, "auto within 10 % of our best")].startswith("gap: 1.15")
    assert found[(mid, "at least as fast as the fastest peer")].startswith("gap: 2.00")
    assert found[(small, "within 1.25x of the faster of Open MPI and Intel MPI")] == \
        "gap: 3.00 (target 1.25)"  # MPICH is faster than ours, but not a rival at this size
    assert "1 of 5 met." in compare.report(tmp_path).read_text()
    # Two ranks moved 20 GB/s together where four moved 16: the cores can do 20, so the
    # floor of four ranks is 4 x 3 x 4e7 B / 20 GB/s = 24 ms, and 40 ms is 1.67x.
    (tmp_path / "launches" / "membw_N2.json").write_text(json.dumps({"measurements": [
        {"name": "together", "nranks": 2, "traffic": 10.0}]}))
    found = {(c, what.split(" (")[0]): v
             for n, c, what, v in compare.verdicts(rows, compare.floors_of(tmp_path))}
    assert found[(big, "within 1.25x of the memory floor")].startswith("gap: 1.67")


def _judged_again(tmp_path):
    summary, libraries = compare.aggregate(compare.read_points(tmp_path / "points.csv"))
    rows, _ = compare.lines_of(summary, libraries)
    return rows, compare.verdicts(rows, compare.floors_of(tmp_path))


def test_the_peers_targets_judge_auto_in_a_launch_of_its_own(tmp_path):
    """Each peer runs alone in its launches; so does ``pycollective-alone`` (auto only).
    Where it ran, the peers' targets and the ratio column judge its time, not the best of
    the launch whose cases take turns (each call after the others' calls); auto / best
    stays within that launch."""
    mid = 10 ** 5
    _points(tmp_path, [
        (1, "pycollective:shm", 2, mid, 60e-6, True), (1, "pycollective:auto", 2, mid, 62e-6, True),
        (1, "pycollective-alone:auto", 2, mid, 45e-6, True), (1, "impi", 2, mid, 50e-6, True)])
    rows, verdicts = _judged(tmp_path, 2, 4.0)
    found = {(c, what.split(" (")[0]): v for n, c, what, v in verdicts}
    assert found[(mid, "at least as fast as the fastest peer")] == "met: 0.90"
    assert found[(mid, "auto within 10 % of our best")] == "met: 1.03"
    text = compare.report(tmp_path).read_text()
    assert "| 2 | 1e5 | 60 µs (shm) | 62 µs (shm) | 45 µs (shm) | - | - | **50 µs** | - | 0.90 | 1.03 |" \
        in text, text
    # the alone launch runs auto only
    argv, _, _ = compare.command(compare.CONTENDERS["pycollective-alone"], 2, [mid],
                                 compare.parse(["--venvs", str(tmp_path)]), tmp_path / "x.json")
    assert argv[argv.index("--algorithms") + 1:] == ["auto"]

    # the memory floor judges the same time as the peers' targets
    big = 10 ** 6
    _points(tmp_path, [
        (1, "pycollective:shm", 2, big, 0.050, True), (1, "pycollective:auto", 2, big, 0.050, True),
        (1, "pycollective-alone:auto", 2, big, 0.040, True), (1, "impi", 2, big, 0.045, True)])
    rows, verdicts = _judged_again(tmp_path)
    found = {(c, what.split(" (")[0]): v for n, c, what, v in verdicts}
    # 3 x 4e6 B at 4 GB/s per rank: a 3 ms floor
    assert found[(big, "within 1.25x of the memory floor")] == "gap: 13.33 (target 1.25)"


def _gap_run(tmp_path):
    """N = 4: a large gap (shm, at the floor's rate a peer nearly reaches), a mid gap (shm),
    a small gap where the best is tree, and a point whose only miss is auto's."""
    big, mid, small, fine = 10 ** 7, 10 ** 5, 10 ** 3, 10 ** 4
    _points(tmp_path, [
        (1, "pycollective:shm", 4, big, 0.050, True), (1, "impi", 4, big, 0.033, True),
        (1, "pycollective:shm", 4, mid, 2e-4, True), (1, "impi", 4, mid, 1e-4, True),
        (1, "pycollective:tree", 4, small, 60e-6, True), (1, "openmpi", 4, small, 40e-6, True),
        (1, "pycollective:shm", 4, fine, 10e-6, True), (1, "pycollective:auto", 4, fine, 20e-6, True),
        (1, "impi", 4, fine, 30e-6, True)])
    # 4 x 3 x 4e7 B at 16 GB/s together: a 30 ms floor; Intel MPI's 33 ms is 1.1x of it
    return _judged(tmp_path, 4, 4.0)


def test_the_gaps_get_the_profiles_that_apply_to_them(tmp_path):
    rows, found = _gap_run(tmp_path)
    items = {(i["kind"], i["algorithm"]): i["counts"] for i in gaps.plan(rows, found)}
    # every gap point its algorithm's CPU profile; auto's miss alone is no gap to profile
    assert items[("cpu", "shm")] == [10 ** 5, 10 ** 7] and items[("cpu", "tree")] == [10 ** 3]
    # phases only where the best is shm and takes the sliced path; pieces for small calls
    assert items[("phases", "shm")] == [10 ** 5, 10 ** 7]
    assert items[("pieces", "shm")] == [10 ** 3]
    # the fastest peer's own starts below 1e6, in its own environment
    assert items[("starts", "impi")] == [10 ** 5] and items[("starts", "openmpi")] == [10 ** 3]
    assert len(items) == 6
    envs = {i["name"]: i["env"] for i in gaps.plan(rows, found)}
    assert envs["gaps_starts_impi_N4"] == "impi" and envs["gaps_cpu_shm_N4"] == "pycollective"
    cpu = next(i for i in gaps.plan(rows, found) if i["kind"] == "cpu" and i["algorithm"] == "shm")
    argv = gaps.argv(cpu, tmp_path / "x.json")
    assert argv[0].endswith("benchmarks/peers/cpu_time.py") and argv[argv.index("--count") + 1:
                                                                  argv.index("--algorithm")] == \
        ["100000", "10000000"]


def test_the_gaps_section_says_what_the_profiles_measured(tmp_path):
    rows, found = _gap_run(tmp_path)
    items = gaps.plan(rows, found)
    paths = {}
    for item in items:  # what the launches would have written
        paths[item["name"]] = path = tmp_path / f"{item['name']}.json"
        if item["kind"] == "cpu":
            rows_ = [dict(count=c, name=name, calls=15, wall=w, after_barrier=a, user=u, sys=s_,
                          vcsw=0, ivcsw=0, busy=b, cpu_floor=f)
                     for c, name, w, a, u, s_, b, f in [
                         (10 ** 7, "shm", 0.050, 0.048, 0.030, 0.060, 0.9, 1.5),
                         (10 ** 7, "native", 0.060, 0.060, 0.040, 0.080, 1.0, 2.0),
                         (10 ** 5, "shm", 1e-4, 2e-4, 1e-4, 1e-5, 0.7, 1.1)]
                     if item["algorithm"] == "shm"]
            path.write_text(json.dumps(dict(copy_rate=2e10, cores=2, rows=rows_)))
        elif item["kind"] == "phases":
            path.write_text(json.dumps({"measurements": [
                dict(count=10 ** 5, path="window", phase=ph, time=t, share=None, used=True,
                     wrong=0) for ph, t in [("copy-in", 1.0), ("sync", 3.0), ("copy-out", 1.0),
                                            ("sync", 5.0)]] + [
                dict(count=10 ** 5, path="single-copy", phase="sync", time=99.0, share=None,
                     used=False, wrong=0)]}))
        elif item["kind"] == "starts" and item["algorithm"] == "impi":
            path.write_text(json.dumps(dict(rows=[
                dict(count=10 ** 5, back_to_back=150e-6, after_barrier=160e-6)])))
        # the pieces and Open MPI's starts launches "failed": no file
    profiles = gaps.collect(items, lambda item: paths[item["name"]])
    rates = compare.floors_of(tmp_path)
    labels = {"impi": "Intel MPI 2021.19.0", "mpich": "MPICH 5.0.2"}
    text = "\n".join(gaps.section(profiles, rows, found,
                                  lambda n, c: compare.floor_time(rates, n, c),
                                  compare.fmt_count, labels))
    line = {c: next(l for l in text.splitlines() if l.startswith(f"| 4 | {c} |"))
            for c in ("1e7", "1e5", "1e3")}
    # the peer ran at 1.1x the floor: a 1.2x lead needs ours at 0.92x of it
    assert "the fastest peer ran at 1.10x the floor" in line["1e7"] and "0.92x" in line["1e7"]
    assert "1.50x the floor's CPU work (MPICH's own call 2.00x), 67% of it in the kernel" \
        in line["1e7"]
    # the syncs' share counts only the path the call takes: (3 + 5) / 10
    assert "| 80% |" in line["1e5"] and "cores idle 30% of the wall" in line["1e5"]
    # back to back ours (100 µs) beat Intel MPI's (150 µs): the gap is the start
    assert "| Intel MPI 2021.19.0: 150 µs, 160 µs |" in line["1e5"]
    assert "back to back ours took 100 µs, Intel MPI 2021.19.0's 150 µs: the gap is in " \
        "starting after a Barrier" in line["1e5"]
    # without the peer's starts, ours alone: after a Barrier against back to back
    text = "\n".join(gaps.section(dict(profiles, starts={}), rows, found,
                                  lambda n, c: compare.floor_time(rates, n, c),
                                  compare.fmt_count))
    assert "one call after a Barrier took 200 µs, back to back 100 µs" in text
    assert "(tree) | - |" in line["1e3"] and line["1e3"].endswith("| - |")  # nothing measured
    assert "| 1e4 |" not in text  # auto's miss alone
    assert "The pieces" not in text
    assert gaps.section(None, rows, found, lambda n, c: None)[-1].startswith("Not profiled")


def test_the_floors_rate_is_the_best_of_as_many_ranks_or_fewer():
    """All ranks together, per N: the highest total of N or fewer ranks (a machine whose
    cores are shared moves more with fewer ranks), never one of more ranks."""
    rates = {2: 10e9, 4: 6e9, 8: 2e9}  # per rank: 20, 24 and 16 GB/s together
    assert [compare.machine_rate(rates, n) for n in (2, 4, 8)] == [20e9, 24e9, 24e9]
    assert compare.machine_rate(rates, 3) is None  # no launch of 3 ranks: no floor
    assert compare.floor_time(rates, 8, 10 ** 7) == pytest.approx(8 * 3 * 4e7 / 24e9)


@pytest.mark.parametrize("text, short", [
    ("MPICH Version: 5.0.2", "MPICH 5.0.2"),
    ("Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11",
     "Open MPI 5.0.11"),
    ("Intel(R) MPI Library 2021.19.0 for Linux* OS", "Intel MPI 2021.19.0"),
    ("torch 2.13.0+cpu Gloo", "torch Gloo 2.13.0+cpu")])
def test_library_names(text, short):
    assert compare.short_library(text) == short


class _Settling(point.Backend):
    """A one-rank backend that settles after ``after`` calls (as auto decides a size)."""

    rank, nranks = 0, 1

    def __init__(self, after):
        self.after, self.calls = after, 0

    def buffers(self, x):
        self.x, self.out = x, np.empty_like(x)

    def prepare(self):
        self.out.fill(np.nan)

    def barrier(self):
        pass

    def call(self):
        self.calls += 1
        self.out[...] = self.x

    def result(self):
        return self.out

    def input_intact(self):
        return True

    def settled(self):
        return self.calls >= self.after

    def pick(self):
        return "shm" if self.settled() else ""

    def reduce(self, values, op):
        return np.asarray(values, np.float64)


@pytest.mark.parametrize("after, settling", [(0, 0), (2, 2), (7, 7), (10 ** 6, point.SETTLE_CALLS)])
def test_a_size_is_timed_once_the_backend_settled(after, settling):
    """auto's tuning trials are not timed: checked calls until the backend says it settled
    (bounded), then the warm-up calls (the first settled call makes auto's plan), then
    the timed ones; the row says how many and what auto picked."""
    be = _Settling(after)
    row = point.measure(be, 5, iters=4, warmup=2, budget=None, min_iters=1)
    assert row["settling"] == settling
    assert be.calls == settling + 2 + 4
    assert row["wrong"] == 0 and len(row["times"]) == 4
    assert row["pick"] == ("shm" if after <= settling else "")


class _Clock:
    """The time the loop reads, moved by the fake backends alone: the tests judge how the
    loop uses times, and a real clock on a shared 2-core machine made them flaky (CI of
    2026-12-02: a 1 ms / 4 ms drift measured a ratio of 1.57 where 1 was meant)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now

    def __getattr__(self, name):  # the rest of the time module, as it is
        return getattr(time, name)


@pytest.fixture
def clock(monkeypatch):
    fake = _Clock()
    monkeypatch.setattr(point, "time", fake)
    return fake


class _SlowFirst(_Settling):
    """A backend whose first call at a size takes 0.2 s (it builds state), the rest 1 us."""

    def __init__(self, clock):
        super().__init__(0)
        self.clock = clock

    def call(self):
        self.clock.now += 0.2 if self.calls == 0 else 1e-6
        super().call()


def test_the_budget_is_judged_from_the_fastest_warm_up_call(clock):
    """A slow first call (state built at a new size) must not cut the repetitions of a
    fast one: with a 0.5 s budget the mean of two warm-up calls (0.1 s) allowed 5."""
    be = _SlowFirst(clock)
    row = point.measure(be, 5, iters=40, warmup=2, budget=0.5, min_iters=3)
    assert row["iters"] == 40 and be.calls == 2 + 40


class _Drifting(_Settling):
    """Two cases of the same call on a machine that turns slow halfway through the
    launch (as the shared VMs do): every call from the ``slow_from``-th on takes 4 ms,
    those before 1 ms."""

    def __init__(self, slow_from, clock):
        super().__init__(0)
        self.slow_from, self.case, self.order, self.clock = slow_from, None, [], clock

    def select(self, case):
        self.case = case

    def call(self):
        self.clock.now += 0.004 if self.calls >= self.slow_from else 0.001
        self.order.append(self.case)
        super().call()


def test_cases_take_turns_so_a_drifting_machine_hits_them_alike(clock):
    """pycollective's algorithms are timed repetition by repetition in rotated order (each
    timed call after an untimed one of its own), not one after another: two identical
    cases must come out alike even when the machine slows down halfway (one after
    another, one would be 4x the other)."""
    be = _Drifting(2 * 2 + 20, clock)  # the warm-ups, then half the repetitions
    rows = point.measure_cases(be, 5, ["a", "b"], iters=10, warmup=2, budget=None, min_iters=1)
    assert [r["algorithm"] for r in rows] == ["a", "b"]
    assert [r["iters"] for r in rows] == [10, 10] and all(r["wrong"] == 0 for r in rows)
    timed = be.order[4:]
    reps = [timed[i:i + 4] for i in range(0, len(timed), 4)]
    assert all(r in (list("aabb"), list("bbaa")) for r in reps)  # each timed after its own
    assert {r[0] for r in reps} == {"a", "b"}  # neither always goes first
    ratio = rows[1]["time"] / rows[0]["time"]
    assert ratio == pytest.approx(1.0), ratio  # one after another: 4


def test_the_order_of_cases_changes_from_repetition_to_repetition():
    """Each case follows each other case (and goes first) in some repetitions, and every
    rank draws the same order: a rotation kept each case behind the same other one."""
    n = 8
    orders = [point.turns(n, k) for k in range(100)]
    assert all(sorted(o) == list(range(n)) for o in orders)
    assert orders == [point.turns(n, k) for k in range(100)]  # the same on every rank
    before = {(o[i - 1], o[i]) for o in orders for i in range(1, n)}
    assert len(before) == n * (n - 1)  # every ordered pair of cases occurs
    assert {o[0] for o in orders} == set(range(n))


def test_the_report_says_how_ranks_sit_on_the_cpus():
    assert compare.placement(16, 16).startswith("N = 16: dedicated CPUs, not oversubscribed (1 CPU")
    assert "(8 CPUs per rank)" in compare.placement(2, 16)
    assert compare.placement(8, 2) == "N = 8: oversubscribed, 4 ranks per CPU (0.25 CPU per rank)"


def test_the_device_script_gives_the_comparison_arguments_it_accepts(tmp_path):
    """benchmarks/device/run.sh's comparison, as compare.py parses it: every size of every N,
    one rank per core up to 16, and the three MPI libraries beside ours (auto alone too)."""
    script = Path(compare.ROOT) / "benchmarks" / "device" / "run.sh"
    env = dict(os.environ, PLAN_ONLY="1", OUT=str(tmp_path))
    argv = subprocess.run(["bash", str(script)], env=env, check=True, capture_output=True,
                          text=True).stdout.splitlines()
    args = compare.parse(argv)
    assert args.ns == [2, 4, 8, 16] and args.counts == [10 ** k for k in range(3, 8)]
    assert args.contenders == ["pycollective", "pycollective-alone", "mpich", "openmpi", "impi"]
    assert args.shared == [] and not args.profiles and args.out.startswith(str(tmp_path))
    assert not (tmp_path / "res").exists()  # a plan only: nothing run, nothing written


def test_the_report_shows_the_barriers_every_call_is_timed_after(tmp_path):
    """barrier_skew.py's rows (one launch per N and library) become the report's table,
    ours by name, the MPI libraries by their short names; no file, no section."""
    assert compare.barriers_section(tmp_path) == []
    rows = [dict(barrier="MPICH Version:      5.0.2", nranks=2, spread_us=0.93, p90_us=1.1,
                 back_to_back_us=2.2, after=None, after_us=None, env="mpich"),
            dict(barrier="pycollective.barrier", nranks=2, spread_us=0.03, p90_us=0.05,
                 back_to_back_us=2.1, after=None, after_us=None, env="mpich"),
            dict(barrier="Intel(R) MPI Library 2021.19.0 for Linux* OS", nranks=2,
                 spread_us=0.07, p90_us=0.09, back_to_back_us=0.24, after=None,
                 after_us=None, env="impi")]
    (tmp_path / compare.BARRIERS).write_text(json.dumps(rows))
    lines = compare.barriers_section(tmp_path)
    table = [line for line in lines if line.startswith("| 2 |")]
    assert table == ["| 2 | Intel MPI 2021.19.0 | 0.07 µs | 0.09 µs | 0.24 µs |",
                     "| 2 | MPICH 5.0.2 | 0.93 µs | 1.10 µs | 2.20 µs |",
                     "| 2 | pycollective.barrier | 0.03 µs | 0.05 µs | 2.10 µs |"]
