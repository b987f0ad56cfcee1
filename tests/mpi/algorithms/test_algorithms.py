"""What is specific to the fast algorithms (test_allreduce.py sweeps them all anyway).

* hierarchical on emulated nodes of equal and unequal sizes (2 and 4 "nodes"),
  and a layout that differs across ranks failing everywhere;
* ring_pipelined with segment sizes from one element to larger than a chunk;
* shm window reuse and growth across calls of different sizes, alternating
  the two-region small path and the one-region large path.
"""

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective.runtime import env as _env_settings
from pycollective.runtime.context import get_context
from pycollective.algorithms import hierarchical, ring_pipelined
from pycollective.algorithms.shm import allreduce as shm
from pycollective.node.group import DOUBLE_LIMIT
from _data import check_allreduce as _check, env as _env

OPS = ["sum", "prod", "max", "min"]


def _layouts(world_size):
    """Emulated node layouts for W ranks: 2 nodes (equal and unequal), 4 nodes."""
    w = world_size
    out = {f"2 nodes, {-(-w // 2)} per node": str(-(-w // 2)), f"2 nodes 1,{w - 1}": f"1,{w - 1}"}
    if w >= 3:
        out[f"2 nodes {w - 1},1"] = f"{w - 1},1"
        out[f"3 nodes 1,{w - 2},1"] = f"1,{w - 2},1"
    if w == 4:
        out["4 nodes of 1"] = "1"
    if w >= 5:
        sizes = [1, 2, 1, 1] if w == 5 else [1, 2, w - 5, 2]
        out["4 nodes " + ",".join(map(str, sizes))] = ",".join(map(str, sizes))
    return out


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("label", list(_layouts(MPI.COMM_WORLD.Get_size())))
def test_hierarchical_emulated_nodes(label):
    world = MPI.COMM_WORLD
    text = _layouts(world.Get_size())[label]
    failures = []
    with _env(hierarchical.ENV, text):
        comm = world.Dup()  # a fresh communicator picks up the layout
        try:
            for dtype in ("float32", "int64", "float16"):
                for op in OPS:
                    for count in (0, 1, 7, 1000, 10007):
                        _check(comm, "hierarchical", dtype, op, count, failures, label)
            # Above the 64 KiB inter-node switch and the one-region limit (DOUBLE_LIMIT).
            for count in (40_000, 1_100_007):
                _check(comm, "hierarchical", "float32", "sum", count, failures, label)
            # The layout really took effect.
            state = get_context(comm).peek(hierarchical._STATE)
            sizes = hierarchical._parse_layout(text, world.Get_size())
            starts = np.cumsum([0] + sizes)
            node = int(np.searchsorted(starts, world.Get_rank(), side="right")) - 1
            assert state.node.size == sizes[node], (state.node.size, sizes, node)
            if state.leader:
                assert state.inter.size == len(sizes)
        finally:
            comm.Free()
    assert not failures, f"{len(failures)} failures: " + "; ".join(failures[:5])


@pytest.mark.mpi(min_size=2)
def test_hierarchical_layout_must_agree_and_fit():
    world = MPI.COMM_WORLD
    x = np.arange(10, dtype=np.float64)
    out = np.empty_like(x)
    with _env(hierarchical.ENV, "1" if world.Get_rank() == 0 else "2"):
        comm = world.Dup()
        with pytest.raises(ValueError, match="differs across ranks"):
            pycollective.allreduce(x, out, comm=comm, algorithm="hierarchical")
        comm.Free()
    with _env(hierarchical.ENV, f"1,{world.Get_size()}"):  # one rank too many
        comm = world.Dup()
        with pytest.raises(ValueError, match="add up to"):
            pycollective.allreduce(x, out, comm=comm, algorithm="hierarchical")
        comm.Free()
    with _env(hierarchical.ENV, "0"):
        comm = world.Dup()
        with pytest.raises(ValueError, match="positive"):
            pycollective.allreduce(x, out, comm=comm, algorithm="hierarchical")
        comm.Free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("segment", [1, 4, 12, 4096, 1 << 20])
def test_ring_pipelined_segment_sizes(layouts, segment):
    previous = ring_pipelined.set_segment_bytes(segment)
    failures = []
    try:
        assert ring_pipelined.get_segment_bytes() == segment
        for label, comm in layouts:
            n = comm.Get_size()
            # Segments of a few bytes make one message per element or two: a few
            # hundred elements already give every chunk many segments and a short
            # last one, and thousands would cost minutes at 8 ranks.
            counts = (1, n + 1, 97, 1000, 4099) if segment >= 4096 else (1, n + 1, 97, 301)
            for dtype in ("float32", "float64", "int32", "float16"):
                for count in counts:
                    _check(comm, "ring_pipelined", dtype, "sum", count, failures,
                           f"{label} seg={segment}")
            if segment >= 4096:
                _check(comm, "ring_pipelined", "float32", "max", 700_001, failures, label)
    finally:
        ring_pipelined.set_segment_bytes(previous)
    assert not failures, f"{len(failures)} failures: " + "; ".join(failures[:5])


def test_ring_pipelined_rejects_bad_segment():
    with pytest.raises(ValueError):
        ring_pipelined.set_segment_bytes(0)


@pytest.mark.mpi(min_size=2)
def test_shm_window_reuse_and_growth():
    # Sizes in bytes cross the replicate (4 KiB) and two-region (DOUBLE_LIMIT, 4 MiB)
    # limits both ways, so growth, reuse and the sync before a one-region
    # call after a two-region one are all exercised.  Single-copy reads are
    # off (they would take the large calls), so every call uses the window.
    world = MPI.COMM_WORLD
    half = world.Split(world.Get_rank() % 2, world.Get_rank())
    comms = [("world", world.Dup()), ("half", half)]
    try:
        with _env(_env_settings.SHM_CMA.name, "0"):  # read on each comm's first shm call
            _window_plan(comms)
    finally:
        for _, comm in comms:
            comm.Free()


def _window_plan(layouts):
    plan = [("float32", 10), ("float64", 1000), ("float32", 100), ("float32", 300_000),
            ("int64", 5), ("float32", 200_000), ("float64", 600_000), ("int32", 3),
            ("float32", 1_000_003), ("int64", 50_000), ("float16", 33), ("float32", 999)]
    failures = []
    for label, comm in layouts:
        if comm.Get_size() == 1:
            continue
        capacity = 0
        for step, (dtype, count) in enumerate(plan):
            op = OPS[step % 4] if count < 100_000 else "sum"
            before = get_context(comm).peek(shm._STATE)
            win_before = before.node.segment if before is not None else None
            _check(comm, "shm", dtype, op, count, failures, f"{label} step {step}")
            node = get_context(comm).peek(shm._STATE).node
            nbytes = count * np.dtype(dtype).itemsize
            need = 2 * nbytes if nbytes <= (1 << 20) else nbytes
            assert node.capacity >= need and node.capacity >= capacity
            if need <= capacity:
                assert node.segment is win_before, f"{label} step {step}: segment reallocated"
            capacity = node.capacity
    assert not failures, f"{len(failures)} failures: " + "; ".join(failures[:5])


@pytest.mark.mpi(min_size=2)
def test_shm_many_small_calls_back_to_back():
    """The two alternating regions: a fast rank may start call k+1 while others read call k."""
    comm = MPI.COMM_WORLD
    n, r = comm.Get_size(), comm.Get_rank()
    results = []
    for i in range(200):
        count = 1 + (i * 37) % 2000  # replicate path (<= 512) and sliced two-region path
        x = (np.arange(count, dtype=np.int64) * (i + 1) + r * 1000 + i)
        out = np.empty_like(x)
        pycollective.allreduce(x, out, comm=comm, algorithm="shm")
        results.append(out)
    for i, out in enumerate(results):
        count = out.size
        expected = sum(np.arange(count, dtype=np.int64) * (i + 1) + q * 1000 + i for q in range(n))
        assert np.array_equal(out, expected), f"call {i}"


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("cma", ["1", "0"])
def test_shm_large_paths(cma, monkeypatch):
    """Above DOUBLE_LIMIT (4 MiB): the slots' whole-slot path (cma=0, and with cma=1 up to
    shm.SINGLE_COPY_BYTES) and, above that, single-copy reads of the others'
    buffers (cma=1, where the system allows it; where every rank has a core, each
    size's second call takes the other way, see shm.ways); in place included, where a
    rank >= 2 must not overwrite its own operand before reading it."""
    world = MPI.COMM_WORLD
    failures = []
    calls = []  # (bytes, 1 if it took the single copy else 0) of each call above 4 MiB
    sizes = []
    slots, single_copy = shm.shm_allreduce_on, shm.cma_allreduce_on
    monkeypatch.setattr(shm, "shm_allreduce_on",
                        lambda node, src, dst, *a: calls.append((dst.nbytes, 0))
                        or slots(node, src, dst, *a))
    monkeypatch.setattr(shm, "cma_allreduce_on",
                        lambda cross, src, dst, *a: calls.append((dst.nbytes, 1))
                        or single_copy(cross, src, dst, *a))
    with _env(_env_settings.SHM_CMA.name, cma):
        comm = world.Dup()
        try:
            # 4.4-5.6 MB per rank between DOUBLE_LIMIT and SINGLE_COPY_BYTES; 8.8 and 12 MB
            # above it
            for dtype, op, count in (("float32", "sum", 1_100_007), ("int64", "max", 1_100_003),
                                     ("float16", "sum", 2_300_001), ("float64", "prod", 524_289),
                                     ("int32", "sum", 1_200_001), ("int64", "sum", 700_001),
                                     ("float64", "sum", 1_500_007)):
                _check(comm, "shm", dtype, op, count, failures, f"cma={cma}")
                sizes.append(count * np.dtype(dtype).itemsize)
            assert all(n > DOUBLE_LIMIT for n in sizes), sizes
            state = get_context(comm).peek(shm._STATE)
            if cma == "0":
                assert state.cross is None
            large = {8 * 1_100_003, 8 * 1_500_007}  # the sizes above SINGLE_COPY_BYTES
            single = [nbytes for nbytes, way in calls if way]
            if state.cross is None:
                assert single == [], calls
            elif state.node.group.barrier.wakes:  # ranks outnumber cores: by size only
                assert sorted(single) == sorted(2 * list(large)), calls
            else:
                # each size's first call (of two, out of and in place) takes the single copy
                # above SINGLE_COPY_BYTES, the slots below; the second the other (shm.ways)
                assert calls == [(n, int(n in large) ^ second) for n in sizes
                                 for second in (0, 1)], calls
        finally:
            comm.Free()
    assert not failures, f"{len(failures)} failures: " + "; ".join(failures[:5])
