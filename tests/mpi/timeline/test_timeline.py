"""pycollective.timeline on a real job: the trace file, its clock alignment, its summary.

One recording (module fixture) runs a mix of collectives on every rank --
allreduce by several algorithms at sizes that take each of shm's ways, a
sub-communicator, bcast, reduce_scatter, a nonblocking call on the drop-in's
helper thread -- and rank 0 checks the file it wrote.
"""

import collections
import json
import os
import tempfile

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective import timeline
from pycollective.timeline import _summary, _writer
from _data import exact_reduce, exact_values

LARGE = 300_000  # float32 elements: 1.2 MB, above shm's 1 MiB (its Python steps)
# The phases directly under a large call cover at least this share of its span
# in the best-covered call (the rest: argument checks and the Python between
# phases, which no hook marks; a rank that other jobs deschedule loses time there too).
COVERED = 0.75
SLACK_US = 0.01  # rounding of ts and dur to 1 ns in the file, a few times over

pytestmark = pytest.mark.mpi(min_size=2)


@pytest.fixture(scope="module")
def trace():
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    folder = comm.bcast(tempfile.mkdtemp(prefix="pycollective-timeline-") if rank == 0 else None)
    path = os.path.join(folder, "trace.json")
    timeline.start(path)
    # A communicator of its own: on one shared with earlier tests, shm's calls could take
    # the path of shared_empty allocations, whose phases cover less of a call.
    work = comm.Dup()
    try:
        for algorithm in ("ring", "shm", "tree", "auto"):
            for count in (1, 1000, LARGE):
                x = exact_values(rank, count, "float32", "sum")
                expected = exact_reduce([exact_values(q, count, "float32", "sum")
                                         for q in range(size)], "sum", "float32")
                for _ in range(3):  # the full path, then the repeated call's
                    out = np.empty_like(x)
                    pycollective.allreduce(x, out, "sum", algorithm=algorithm, comm=work)
                    assert np.array_equal(out, expected)  # recording changes no result
        half = comm.Split(rank % 2, rank)
        pycollective.allreduce(MPI.IN_PLACE, np.ones(10), comm=half, algorithm="ring")
        half.Free()
        buf = np.arange(100, dtype=np.int64) if rank == 0 else np.zeros(100, np.int64)
        pycollective.bcast(buf, root=0)
        assert np.array_equal(buf, np.arange(100))
        mine = np.empty(pycollective.partition(1000, size, rank)[1], np.float64)
        pycollective.reduce_scatter(np.ones(1000), mine)
        assert np.all(mine == size)
        request = pycollective.Comm(comm).Iallreduce(MPI.IN_PLACE, np.ones(64, np.float32))
        request.Wait()
    finally:
        written = timeline.stop()
        work.Free()
    # (off again; with pycollective.torch in use, its profiler ranges stay on)
    assert written == path and not isinstance(timeline.ACTIVE, timeline.Recorder)
    doc = None
    if rank == 0:
        with open(path) as f:
            doc = json.load(f)
    yield doc
    comm.Barrier()
    if rank == 0:
        os.remove(path)
        os.rmdir(folder)


def _tracks(doc):
    tracks = collections.defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] in "Xi":
            tracks[(e["pid"], e["tid"])].append(e)
    for events in tracks.values():
        events.sort(key=lambda e: (e["ts"], e.get("cat") != "call", e["args"].get("depth", 0)))
    return tracks


def test_trace_is_chrome_trace_json_with_one_process_per_rank(trace):
    if trace is None:
        return
    size = MPI.COMM_WORLD.Get_size()
    events = trace["traceEvents"]
    assert isinstance(events, list) and trace["otherData"]["ranks"] == size
    for e in events:
        assert e["ph"] in ("X", "i", "M") and isinstance(e["name"], str)
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert e["dur"] >= 0 and isinstance(e["ts"], float)
        if e["ph"] == "i":
            assert e["s"] == "t"
    names = {e["pid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r: f"rank {r}" for r in range(size)}
    calls = [e for e in events if e["ph"] == "X" and e["cat"] == "call"]
    assert {e["pid"] for e in calls} == set(range(size))
    threads = {(e["pid"], e["args"]["name"]) for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    for r in range(size):  # the caller's thread, and the helper of the nonblocking call
        assert (r, f"rank {r} MainThread") in threads
        assert (r, f"rank {r} pycollective-nonblocking") in threads
    # Each call named by collective, algorithm, count and dtype.
    assert any(e["name"] == f"allreduce ring {LARGE} x float32" for e in calls)
    assert any(e["name"] == "allreduce shm 1 x float32" for e in calls)
    assert any(e["name"].startswith("bcast ") and e["args"]["dtype"] == "bytes" for e in calls)
    assert any(e["name"].startswith("reduce_scatter ") for e in calls)
    # (a call on a one-rank communicator moves nothing and runs no algorithm)
    assert all(e["args"]["algorithm"] not in ("?", "auto") for e in calls if "comm" in e["args"])
    # every (comm, call number) of the world communicator appears once per rank
    name = f"world ranks 0-{size - 1} #1"  # the same on every rank
    world = collections.Counter((e["pid"], e["args"]["number"]) for e in calls
                                if e["args"].get("comm") == name)
    assert len(world) >= size * 36
    assert set(world.values()) == {1}
    # the nonblocking call's hand-over, on the caller's thread
    queued = [e for e in events if e["ph"] == "i" and e["name"] == "nonblocking call queued"]
    assert {e["pid"] for e in queued} == set(range(size))


def test_spans_nest_and_follow_each_other(trace):
    if trace is None:
        return
    for (pid, tid), events in _tracks(trace).items():
        call, open_phases, last_end, numbers = None, [], -1.0, collections.defaultdict(int)
        for e in events:
            if e["ph"] == "i":
                continue
            end = e["ts"] + e["dur"]
            if e["cat"] == "call":
                assert e["ts"] >= last_end - SLACK_US, f"calls overlap on rank {pid}: {e}"
                comm = e["args"].get("comm")
                if comm is not None:  # (one-rank communicators number no calls)
                    assert e["args"]["number"] > numbers[comm]  # numbers go up with time
                    numbers[comm] = e["args"]["number"]
                call, open_phases, last_end = e, [], end
                continue
            assert call is not None, f"a phase outside any call: {e}"
            assert call["ts"] - SLACK_US <= e["ts"] and end <= last_end + SLACK_US, (call, e)
            depth = e["args"]["depth"]
            open_phases = [p for p in open_phases if p["args"]["depth"] < depth]
            if depth > 1:  # inside the phase above it
                parent = open_phases[-1]
                assert parent["args"]["depth"] == depth - 1
                assert parent["ts"] - SLACK_US <= e["ts"]
                assert end <= parent["ts"] + parent["dur"] + SLACK_US
            open_phases.append(e)


def test_phases_sum_to_the_call_within_the_slack(trace):
    if trace is None:
        return
    covered = []
    for events in _tracks(trace).values():
        call, total = None, 0.0
        for e in events + [None]:
            if e is None or e["cat"] == "call":
                if call is not None:
                    assert total <= call["dur"] + SLACK_US * 10, (call, total)
                    if call["args"].get("count") == LARGE:
                        covered.append(total / call["dur"])
                call, total = e, 0.0
            elif e["ph"] == "X" and e["args"]["depth"] == 1:
                total += e["dur"]
    # The phases cover most of a large call where the rank ran undisturbed; where other
    # jobs take the cores, descheduled time between phases is in no phase, so the test
    # asks it of the best-covered large call (of 3 repeats x 4 algorithms), not the median.
    assert covered and max(covered) >= COVERED, sorted(covered)
    # each large call has what its algorithm does: waits and reductions, copies for shm
    cats = collections.defaultdict(set)
    for events in _tracks(trace).values():
        call = None
        for e in events:
            if e.get("cat") == "call":
                call = e
            elif e["ph"] == "X" and call["args"].get("count") == LARGE:
                cats[call["args"]["algorithm"]].add(e["cat"])
    assert {"reduce", "agreement"} <= cats["ring"] and "wait" in cats["ring"] | cats["tree"]
    assert {"copy", "reduce"} <= cats["shm"]


def test_clock_offsets_are_stated_and_applied(trace):
    if trace is None:
        return
    size = MPI.COMM_WORLD.Get_size()
    meta = trace["otherData"]
    offsets, errors = meta["clock_offsets_ns"], meta["clock_offset_errors_ns"]
    assert set(offsets) == {str(r) for r in range(size)} and offsets["0"] == 0
    assert all(isinstance(errors[str(r)], int) and errors[str(r)] >= 0 for r in range(size))
    # An allreduce cannot end on any rank before every rank has started it: on the
    # aligned clock, within the offsets' error bounds.
    bound = max(errors.values()) / 1000 * 2 + SLACK_US
    by_call = collections.defaultdict(dict)
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e["cat"] == "call" and e["name"].startswith("allreduce") \
                and e["args"].get("comm") == f"world ranks 0-{size - 1} #1" and e["tid"] == 0:
            by_call[e["args"]["number"]][e["pid"]] = e
    assert by_call
    for number, ranks in by_call.items():
        assert len(ranks) == size
        first_end = min(e["ts"] + e["dur"] for e in ranks.values())
        last_start = max(e["ts"] for e in ranks.values())
        assert first_end >= last_start - bound, (number, first_end, last_start, bound)


def test_writer_applies_each_ranks_offset():
    call = (1_000_000, 3_000_000, "allreduce", {"algorithm": "ring", "count": 4,
                                                "dtype": "float32"},
            [(1_500_000, 2_000_000, "wait", "wait", 1)], [(2_500_000, "error", {"x": 1})], 0)
    snapshot = [(7, "MainThread", [call], [])]
    shifted = _writer.events(2, snapshot, 250_000, 0)
    plain = _writer.events(2, snapshot, 0, 0)
    timed = [(a, b) for a, b in zip(shifted, plain) if "ts" in a]
    assert len(timed) == 3 and all(abs(a["ts"] - b["ts"] - 250.0) < 1e-9 for a, b in timed)
    assert shifted[3]["name"] == "allreduce ring 4 x float32" and shifted[3]["dur"] == 2000.0


def test_summary_agrees_with_the_trace(trace):
    if trace is None:
        return
    rows = {(r["collective"], r["algorithm"]): r for r in _summary.summarize(trace)}
    # Recount from the raw events: calls, and the slowest rank's time per call.
    spans = collections.defaultdict(lambda: collections.defaultdict(list))
    starts = collections.defaultdict(lambda: collections.defaultdict(dict))
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e["cat"] == "call":
            key = (e["name"].split()[0], e["args"].get("algorithm", "?"))
            call = (e["args"].get("comm", "?"), e["args"].get("number", id(e)))
            spans[key][call].append(e["dur"])
            starts[key][call][e["pid"]] = e["ts"]
    assert set(rows) == set(spans)
    for key, calls in spans.items():
        row = rows[key]
        assert row["calls"] == len(calls)
        slowest = sorted(max(d) for d in calls.values())
        assert row["median_us"] == pytest.approx(np.median(slowest))
        assert row["p99_us"] == pytest.approx(np.percentile(slowest, 99))
        lasts = collections.Counter(max(s, key=s.get) for s in starts[key].values() if len(s) > 1)
        if lasts:
            assert row["last_ranks"][0][1] == max(lasts.values())
        shares = row["shares"]
        assert sum(shares.values()) == pytest.approx(1.0) and min(shares.values()) >= 0
    # The per-rank totals (what --plot draws) add up to the ranks' time in calls.
    per_rank = _summary.per_rank(trace)
    for r, parts in per_rank.items():
        spent = sum(e["dur"] for e in trace["traceEvents"]
                    if e["ph"] == "X" and e["cat"] == "call" and e["pid"] == r)
        assert sum(parts.values()) == pytest.approx(spent, rel=1e-6)
    lines = _summary.table(trace)
    assert any(line.split()[:2] == ["allreduce", "ring"] for line in lines)


def test_off_leaves_nothing_behind():
    assert not isinstance(timeline.ACTIVE, timeline.Recorder)
    x = np.ones(8)
    pycollective.allreduce(MPI.IN_PLACE, x, algorithm="ring")  # no recorder, nothing raised
    assert np.all(x == MPI.COMM_WORLD.Get_size())
