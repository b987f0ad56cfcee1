"""Smoke runs of the benchmark scripts that stay in benchmarks/, so that a refactor cannot break them silently.

Each runs at 2 ranks on tiny sizes (what they measure is not judged here,
only that every step runs and writes what it says).  benchmarks/peers/ has
its own tests (test_peers.py); the report generator is tested in
tests/bench/.
"""

import os
import shutil
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


def _env(**extra):
    path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    return dict(os.environ, PYTHON=sys.executable, PYTHONPATH=path, PYCOLLECTIVE_TIMEOUT="300",
                **extra)


def _two_ranks(script, *args):
    """``script`` (under benchmarks/) at 2 ranks through scripts/run_mpi.sh; its output,
    once it exited 0."""
    proc = subprocess.run([str(ROOT / "scripts" / "run_mpi.sh"), "2", str(BENCH / script),
                           *args], cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-5000:]
    return output


def _run(script, env, timeout=500):
    proc = subprocess.run(["bash", str(script)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def test_run_sweep_writes_its_report(tmp_path):
    out = tmp_path / "sweep"
    status, output = _run(BENCH / "run_sweep.sh", _env(
        NS="2", MAXCOUNT="100", FACTOR="10", ITERS="3", WARMUP="1", BUDGET="0.2", CALIBRATE="0",
        PLOT="0", ALGOS="ring auto", OUT=str(out)))
    assert status == 0, output[-5000:]
    for name in ("commands.txt", "sweep_N2.txt", "sweep_N2.json", "report.md"):
        assert (out / name).is_file(), (name, output[-3000:])
    report = (out / "report.md").read_text()
    assert "ring" in report and "auto" in report
    assert "pycollective.bench ring auto" in (out / "commands.txt").read_text()


def test_run_speed_runs_every_study(tmp_path):
    out = tmp_path / "speed"
    status, output = _run(BENCH / "run_speed.sh", _env(
        NS="2", LARGE_M="1e3", SMALL_M="1", SEGMENT_M="1e3", BREAKDOWN_M="1e4",
        MEMBW_BYTES="1M", WAIT="0", OUT=str(out)))
    assert status == 0, output[-5000:]
    studies = sorted(p.name.split("_", 1)[1] for p in out.glob("*_N2.json"))
    assert studies == ["allreduce_N2.json", "breakdown_N2.json", "latency_N2.json",
                       "membw_N2.json", "segments_N2.json"], (studies, output[-3000:])
    assert (out / "speed.txt").read_text().strip()


def test_run_multihost_runs_the_sweep_once_per_link(tmp_path):
    # The emulated hosts need root and network namespaces; here the sweep it
    # calls is a stand-in that records what it was given.
    shutil.copy(BENCH / "run_multihost.sh", tmp_path)
    record = tmp_path / "calls.txt"
    (tmp_path / "run_sweep.sh").write_text(
        f'#!/usr/bin/env bash\necho "$LINK|$OUT|$HOSTS|$MAXCOUNT" >> {record}\n')
    (tmp_path / "run_sweep.sh").chmod(0o755)
    status, output = _run(tmp_path / "run_multihost.sh",
                          _env(LINKS="--rate=1gbit --delay=25us"), timeout=60)
    assert status == 0, output
    calls = [line.split("|") for line in record.read_text().splitlines()]
    assert [c[0] for c in calls] == ["--rate 1gbit", "--delay 25us"]
    assert calls[0][1].endswith("-hosts-rate-1gbit") and calls[1][1].endswith("-hosts-delay-25us")
    assert all(c[2] == "2x2 2x4" and c[3] == "1e7" for c in calls)


def test_gpu_check_dry_run_passes_on_the_fake_device(tmp_path):
    """benchmarks/gpu/run.sh with --fake: the GPU check's driver, workers and summary on
    CPUs (host memory standing for CUDA memory), every result checked."""
    out = tmp_path / "gpu"
    proc = subprocess.run(["bash", str(BENCH / "gpu" / "run.sh"), str(out), "--fake"], cwd=ROOT,
                          env=_env(), capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-5000:]
    summary = (out / "summary.md").read_text()
    assert "wrong results: 0, crashes: 0" in summary, summary


def test_rsag_comparison_runs_both_steps(tmp_path):
    """benchmarks/shm/rsag.py: the new step against the older ones in one launch, checked."""
    output = _two_ranks("shm/rsag.py", "--count", "1e3", "--rounds", "1", "--calls", "5")
    assert "1e3" in output or "1000" in output, output[-3000:]


def test_regions_comparison_runs_both_settings():
    """benchmarks/shm/regions.py: two slot regions against four in one launch, checked."""
    output = _two_ranks("shm/regions.py", "--count", "1e4", "--rounds", "2", "--calls", "5")
    assert re.search(r"count +10000: two regions +\S+, four +\S+, four / two \S+", output), \
        output[-3000:]


def test_stores_comparison_runs_every_kind():
    """benchmarks/shm/stores.py: plain, non-temporal and chosen stores in one launch, checked."""
    output = _two_ranks("shm/stores.py", "--count", "3e4", "--batches", "1", "--megabytes", "0.5")
    assert re.search(r"count=\s+30000 .*non-temporal/plain .*chosen/plain .*all right", output), \
        output[-3000:]


def test_dropin_overhead_times_every_way():
    """benchmarks/dropin/overhead.py: the drop-in, the public function and the native call."""
    output = _two_ranks("dropin/overhead.py", "--count", "1e3", "--batches", "1", "--calls", "5")
    assert re.search(r"^\s+1000(\s+\S+us){4}\s+\S+\s+\S+$", output, re.M), output[-3000:]


def test_entry_comparison_times_every_way_of_a_repeated_call():
    """benchmarks/shm/entry.py: the call entered in compiled code, booked in Python, the
    public function, the lookup and the native call, in one launch, checked."""
    output = _two_ranks("shm/entry.py", "--count", "1e3", "--batches", "1", "--calls", "8")
    assert "M = 1000 float32, N = 2, 1 batches, wrong results: 0" in output, output[-3000:]
    for name in ("public", "entered", "booked in Python", "lookup", "native"):
        assert re.search(rf"^  {name} +\S+ us +\S+ us$", output, re.M), output[-3000:]


def test_loop_times_a_repeated_call_and_checks_it():
    """benchmarks/shm/loop.py: back-to-back calls, the lowest and median round, checked."""
    output = _two_ranks("shm/loop.py", "--count", "1e3", "17", "--rounds", "2", "--calls", "5")
    for count in (1000, 17):
        assert re.search(rf"^N = 2 M = {count} shm: lowest \S+ us, median \S+ us per call, "
                         r"right$", output, re.M), output[-3000:]


def test_ways_comparison_runs_every_way(tmp_path):
    """benchmarks/shm/ways.py: slots, single copy and the chosen way in one launch, checked."""
    output = _two_ranks("shm/ways.py", "--count", "1.1e6", "--rounds", "1", "--calls", "2")
    assert re.search(r"^\s+1100000(\s+\S+){5}$", output, re.M), output[-3000:]


def test_sizes_comparison_times_each_count_and_checks_it():
    """benchmarks/shm/sizes.py: a count below and one above DOUBLE_LIMIT, checked."""
    output = _two_ranks("shm/sizes.py", "--count", "1000", "1.1e6", "--rounds", "1",
                        "--calls", "2", "--warm", "2")
    assert re.search(r"^\s+1100000\s+4296\.9 KiB\s+\S+\s+\| \S+ us/KiB$", output, re.M), \
        output[-3000:]
    assert "wrong results: 0" in output, output[-3000:]


def test_probe_stores_times_the_measurement_with_each_kind():
    """benchmarks/shm/probe_stores.py: the measurement's shm calls, chosen and pinned."""
    output = _two_ranks("shm/probe_stores.py", "--passes", "1")
    for name in ("chosen", "plain", "non-temporal"):
        assert re.search(rf"^\s+0\s+{name}(\s+[0-9.]+){{4}}\s+\S+$", output, re.M), \
            output[-3000:]


def test_auto_score_writes_its_summary(tmp_path):
    """benchmarks/auto/score.sh at 2 ranks with a tiny budget: one launch and the summary."""
    out = tmp_path / "score"
    proc = subprocess.run(["bash", str(BENCH / "auto" / "score.sh"), str(out), "2", "2"],
                          cwd=ROOT, env=_env(XDG_CACHE_HOME=str(tmp_path / "cache")),
                          capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-5000:] + (out / "score_N2.txt").read_text()[-3000:]
    assert (out / "summary.md").is_file() and (out / "score_N2.json").is_file(), output[-3000:]


def test_counting_benchmark_writes_its_counts(tmp_path):
    """benchmarks/shm/count.py: one size at 2 ranks, a few calls; the JSON has every field,
    and at N = 2 every step reads exactly the other rank's whole vector."""
    import json
    out = tmp_path / "count.json"
    output = _two_ranks("shm/count.py", "--count", "1e3", "--rounds", "2", "--calls", "5",
                        "--json", str(out))
    report = json.loads(out.read_text())
    assert report["ranks"] == 2 and len(report["rows"]) == 1, report
    row = report["rows"][0]
    assert set(report["fields"]) <= set(row), set(report["fields"]) - set(row)
    assert row["count"] == 1000 and row["bytes"] == 4000
    assert row["step"] in ("rsag", "small", "mid"), row["step"]
    assert row["syncs"] in (1.0, 2.0) and row["checked"] >= 2 * 4, row
    assert row["remote_read_bytes"] == 4000 and row["remote_read_lines"] >= 4000 // 64, row
    assert row["remote_meta_lines"] >= 1 and row["shared_write_lines"] >= 4000 // 64, row
    assert row["wall_us"] > 0 and row["step_us"] > 0 and row["call_us"] >= row["step_us"], row
    assert set(row["ctx_switches"]) == {"voluntary", "involuntary"}
    assert row["syscalls"] is None or all(v >= 0 for v in row["syscalls"].values()), row
