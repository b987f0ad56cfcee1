"""Chrome trace event JSON from every rank's recording, written by rank 0.

Each rank turns its snapshot into trace events with its clock offset
applied (times on rank 0's clock, in microseconds since rank 0 started
recording): a process per rank ("rank 3"), a thread per recording thread
(the caller's, the nonblocking helper's), an "X" event per call and per
phase, an "i" event per instant.  :func:`gather` sends every rank's events
to rank 0 with a deadline; rank 0 writes the file and tells the others it
is written, so that none leaves (and, after an exception, aborts the job)
before.  A rank that cannot be part of a gather -- an exception ends the
job, rank 0 does not answer -- writes its own events to ``PATH.rankN.json``
(:func:`write_part`), and :func:`merge` joins such parts into ``PATH``.
"""

import glob
import json
import os
import pickle
import time

import numpy as np
from mpi4py import MPI

from . import _clock

TAG = 0x7E3  # on the recorder's own duplicate of COMM_WORLD


def events(rank, snapshot, offset, origin, now_ns=None):
    """This rank's trace events: times are ``(t + offset - origin) / 1000`` µs."""
    shift = offset - origin
    out = [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
            "args": {"name": f"rank {rank}"}},
           {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
            "args": {"sort_index": rank}}]

    def us(t):
        return round((t + shift) / 1000, 3)

    for tid, (_, name, calls, instants) in enumerate(snapshot):
        out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                    "args": {"name": f"rank {rank} {name}"}})
        for t0, t1, what, info, phases, points, dropped in calls:
            args = {k: _plain(v) for k, v in info.items()}  # (a dtype is named when written)
            args["rank"] = rank
            if dropped:
                args["phases dropped"] = dropped
            out.append({"ph": "X", "cat": "call", "name": call_name(what, info), "pid": rank,
                        "tid": tid, "ts": us(t0), "dur": round((t1 - t0) / 1000, 3),
                        "args": args})
            # Phases in start order; a parent (opened first) before its children.
            for s0, s1, phase, category, depth in sorted(phases, key=lambda p: (p[0], p[4])):
                out.append({"ph": "X", "cat": category, "name": phase, "pid": rank, "tid": tid,
                            "ts": us(s0), "dur": round((s1 - s0) / 1000, 3),
                            "args": {"depth": depth}})
            out += _instants(rank, tid, points, us)
        out += _instants(rank, tid, instants, us)
    return out


def _instants(rank, tid, points, us):
    return [{"ph": "i", "s": "t", "cat": "instant", "name": name, "pid": rank, "tid": tid,
             "ts": us(t), "args": {k: _plain(v) for k, v in args.items()}}
            for t, name, args in points]


def _plain(value):
    return value if isinstance(value, (int, float, str, bool, type(None))) else str(value)


def call_name(what, info):
    """``allreduce ring 1000 x float32``: collective, algorithm, size and dtype."""
    parts = [what, info.get("algorithm", "?")]
    if "count" in info:
        parts.append(f"{info['count']} x {info.get('dtype', '?')}")
    return " ".join(str(p) for p in parts)


def document(parts, meta):
    """The trace file's object: events of every rank, and what the reader needs to know."""
    trace = [e for part in parts for e in part]
    return {"traceEvents": trace, "displayTimeUnit": "ns", "otherData": meta}


def write(path, doc):
    """Write ``doc`` to ``path`` whole (a temporary file renamed: never half a file)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    os.replace(tmp, path)


def part_path(path, rank):
    return f"{path}.rank{rank}.json"


def write_part(path, rank, part, meta):
    write(part_path(path, rank), document([part], dict(meta, part_of=path, rank=rank)))


def _wait(requests, deadline):
    return _clock.wait(requests, deadline, poll=1e-4)  # files are large: no need to spin
    return True


def gather(comm, path, part, meta, limit_s):
    """Rank 0 writes every rank's ``part`` to ``path``; True where the file is written
    (on rank 0: with every rank's part; elsewhere: rank 0 said it is written)."""
    deadline = time.monotonic() + limit_s
    rank, size = comm.Get_rank(), comm.Get_size()
    if rank != 0:
        data = np.frombuffer(pickle.dumps((part, meta)), np.uint8)
        length = np.array([data.size], np.int64)
        done = np.zeros(1, np.int64)
        return (_wait([comm.Isend(length, 0, TAG)], deadline)
                and _wait([comm.Isend(data, 0, TAG + 1)], deadline)
                and _wait([comm.Irecv(done, 0, TAG + 2)], deadline) and bool(done[0]))
    parts, metas, missing = [part], {0: meta}, []
    for q in range(1, size):
        length = np.zeros(1, np.int64)
        if not _wait([comm.Irecv(length, q, TAG)], deadline):
            missing.append(q)
            continue
        data = np.empty(int(length[0]), np.uint8)
        if not _wait([comm.Irecv(data, q, TAG + 1)], deadline):
            missing.append(q)
            continue
        their_part, metas[q] = pickle.loads(data.tobytes())
        parts.append(their_part)
    write(path, document(parts, _merged_meta(metas, size, missing)))
    for q in range(1, size):
        if q not in missing:
            _wait([comm.Isend(np.ones(1, np.int64), q, TAG + 2)], deadline)
    for old in glob.glob(part_path(path, "*")):
        os.remove(old)  # an earlier failed run's parts: this file supersedes them
    return True


def _merged_meta(metas, size, missing):
    first = metas[min(metas)]
    return {"pycollective_timeline": 1, "ranks": size, "clock": first.get("clock"),
            "capacity": first.get("capacity"),
            "clock_offsets_ns": {str(q): m.get("offset") for q, m in sorted(metas.items())},
            "clock_offset_errors_ns": {str(q): m.get("offset_error")
                                       for q, m in sorted(metas.items())},
            "calls_dropped": {str(q): m.get("dropped", 0) for q, m in sorted(metas.items())},
            "missing_ranks": missing}


def merge(path):
    """Join the ``PATH.rankN.json`` parts that ranks wrote into ``PATH``; the ranks found."""
    parts, metas = [], {}
    for name in sorted(glob.glob(part_path(path, "*"))):
        with open(name) as f:
            doc = json.load(f)
        meta = doc.get("otherData", {})
        metas[int(meta["rank"])] = meta
        parts.append(doc["traceEvents"])
    if not parts:
        raise FileNotFoundError(f"no parts {part_path(path, '*')} to merge")
    size = max(int(m.get("size", 0)) for m in metas.values())
    size = max(size, max(metas) + 1)
    write(path, document(parts, _merged_meta(metas, size, sorted(set(range(size)) - set(metas)))))
    return sorted(metas)
