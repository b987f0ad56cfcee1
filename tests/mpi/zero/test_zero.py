"""ZeRO stages, mixed precision and compressed gradients on 1-4 ranks (pycollective.zero).

Sub-communicators of 1, 2, 3 and 4 ranks are cut from the world (3: shards
of unequal length), so the launches at 2, 3, 4 and 8 ranks together cover
every size (the training of every combination runs once per size over the
launches, see :func:`_trained_here`).  On each: every stage x precision x compression trains the
digits MLP of examples/train_mlp.py (which checks after every step that
the gathered parameters are bitwise identical on all ranks, and in fp32
tracks single-process training); stages 1-3 must end with bitwise the
master weights of stage 0; every combination must pass 90 % test accuracy.  Checkpoints round-trip at every stage and precision, and a
checkpoint refuses another world size on every rank.
"""

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from pycollective import zero
from pycollective.model.ledger import (collectives_per_iteration, memory_per_rank, ring_sent,
                                       traffic_per_rank)
from pycollective.bench import _zero_ledger as _ledger

pytest.importorskip("sklearn")  # the `examples` extra

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("train_mlp", ROOT / "examples" / "train_mlp.py")
train_mlp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train_mlp)

PRECISIONS = ["fp32", "fp16", "bf16"]
COMPRESS = [None, "fp16", "bf16"]


@pytest.fixture(scope="module")
def groups():
    """[(k, sub-communicator or COMM_NULL)] for k = 1, 2, 3, 4 (as far as the world allows)."""
    world = MPI.COMM_WORLD
    size, rank = world.Get_size(), world.Get_rank()
    made = []
    for k in (1, 2, 3, 4):
        if k > size:
            continue
        ngroups = size // k
        color = rank // k if rank < ngroups * k else MPI.UNDEFINED
        made.append((k, world.Split(color, rank)))
    yield made
    for _, sub in made:
        if sub != MPI.COMM_NULL:
            sub.Free()


@pytest.fixture(scope="module")
def shared_dir():
    """A directory every rank sees (rank 0 makes it)."""
    world = MPI.COMM_WORLD
    path = tempfile.mkdtemp(prefix="pycollective-zero-") if world.Get_rank() == 0 else None
    path = world.bcast(path, root=0)
    yield path
    world.Barrier()
    if world.Get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)


def _trained_here(k):
    """Whether this launch trains groups of k ranks: each k once over the suite's launches.

    Training all 36 combinations is the slow part, so groups of 1 and 2 train
    in the 2-rank launch, groups of 3 in the 3-rank one, 4 in the 4-rank one
    (which use the cores best), and the 8-rank launch trains none.
    """
    size = MPI.COMM_WORLD.Get_size()
    return k == size or (size == 2 and k == 1)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("compress", COMPRESS, ids=str)
def test_every_stage_trains_and_matches_stage_0_bitwise(groups, precision, compress):
    if not any(_trained_here(k) for k, _ in groups):
        pytest.skip("groups of 1-4 ranks train in the 2-, 3- and 4-rank launches")
    for k, sub in groups:
        if sub == MPI.COMM_NULL or not _trained_here(k):
            continue
        master0 = None
        for stage in range(4):
            r = train_mlp.train_zero(sub, stage=stage, precision=precision, compress=compress,
                                     epochs=2, batch_size=128, hidden=(32,), lr=0.05)
            assert r["accuracy"] > 0.9, (k, stage, precision, compress, r["history"])
            assert r["steps"] == 2 * (1437 // 128)
            if master0 is None:
                master0 = r["master"]
            else:  # the same reductions in the same order: bitwise the same weights
                assert np.array_equal(r["master"], master0), (k, stage, precision, compress)
            if k == 1 and precision == "fp32" and compress is None:
                assert r["max_deviation"] == 0.0


def _batches(n, batch_size, rank, size, seed=3):
    rng = np.random.default_rng(seed)
    offset, length = train_mlp.partition(batch_size, size, rank)
    return [rng.choice(1437, batch_size, replace=False)[offset:offset + length]
            for _ in range(n)]


def _steps(model, opt, data, batches, batch_size):
    x, y = data
    for idx in batches:
        model.train_step(opt, x[idx], y[idx], batch_size)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_checkpoint_round_trip(groups, shared_dir, stage, precision):
    """save after 3 steps, 2 more; load into a fresh optimizer, the same 2: bitwise equal."""
    xtr, ytr, _, _ = train_mlp.load_data("float32")
    model = zero.MLP([64, 16, 10])
    world = MPI.COMM_WORLD
    for k, sub in groups:
        if sub == MPI.COMM_NULL:
            continue
        group = world.Get_rank() // k
        prefix = os.path.join(shared_dir, f"ckpt-s{stage}-{precision}-n{k}-g{group}")
        batches = _batches(5, 64, sub.Get_rank(), k)

        def make():
            return zero.ZeroOptimizer(model.init(1), model.layers, sub, stage=stage,
                                      precision=precision, compress="bf16",
                                      scaler=zero.LossScaler(2.0 ** 10, interval=2)
                                      if precision == "fp16" else None)
        opt = make()
        _steps(model, opt, (xtr, ytr), batches[:3], 64)
        zero.save(opt, prefix)
        _steps(model, opt, (xtr, ytr), batches[3:], 64)
        again = make()
        zero.load(again, prefix)
        _steps(model, again, (xtr, ytr), batches[3:], 64)
        assert np.array_equal(again.master_params(), opt.master_params()), (k, stage)
        assert again.scale == opt.scale
        assert again.inner.t == opt.inner.t == 5
        for a, b in zip(again.full_params(), opt.full_params()):
            assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.mpi(min_size=2)
def test_checkpoint_refuses_another_world_size_on_every_rank(shared_dir):
    world = MPI.COMM_WORLD
    model = zero.MLP([8, 4])
    prefix = os.path.join(shared_dir, "world")
    opt = zero.ZeroOptimizer(model.init(0), model.layers, world, stage=2, precision="fp16")
    zero.save(opt, prefix)
    # Every rank alone: the files were written by the world's size.
    alone = zero.ZeroOptimizer(model.init(0), model.layers, MPI.COMM_SELF, stage=2,
                               precision="fp16")
    with pytest.raises(ValueError, match=f"written by {world.Get_size()} ranks; this run has 1"):
        zero.load(alone, prefix)
    # The same world, another stage: refused on every rank, nothing loaded.
    other = zero.ZeroOptimizer(model.init(5), model.layers, world, stage=1, precision="fp16")
    before = other.master.copy()
    with pytest.raises(ValueError, match="stage 2, this run has 1"):
        zero.load(other, prefix)
    assert np.array_equal(other.master, before)
    # One rank's file missing: every rank raises, naming it.
    world.Barrier()
    if world.Get_rank() == 0:
        os.remove(zero.checkpoint_path(prefix, world.Get_size() - 1, world.Get_size()))
    world.Barrier()
    with pytest.raises(ValueError, match=f"rank {world.Get_size() - 1}: no checkpoint file"):
        zero.load(opt, prefix)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_one_ranks_overflow_skips_the_step_everywhere(stage):
    world = MPI.COMM_WORLD
    model = zero.MLP([6, 5, 3])
    opt = zero.ZeroOptimizer(model.init(0), model.layers, world, stage=stage, precision="fp16",
                             scaler=zero.LossScaler(2.0 ** 12))
    before = opt.master_params()
    for i in reversed(range(len(model.layers))):
        for g in opt.grads(i):
            g[...] = 0.5
            if world.Get_rank() == world.Get_size() - 1 and i == 0:
                g.flat[0] = np.inf
        opt.grads_ready(i)
    assert opt.step() is False
    assert opt.scale == 2.0 ** 11 and opt.scaler.skipped == 1
    assert np.array_equal(opt.master_params(), before)
    for i in reversed(range(len(model.layers))):
        for g in opt.grads(i):
            g[...] = 0.5
        opt.grads_ready(i)
    assert opt.step() is True
    assert not np.array_equal(opt.master_params(), before)


@pytest.mark.mpi(min_size=2)
def test_ledger_agrees_with_the_lecture():
    """Bytes held and elements sent, counted, against 20M, ... and 2M(N-1)/N, 3M(N-1)/N."""
    world = MPI.COMM_WORLD
    sizes = sorted({1, world.Get_size()})
    # Calibrating each group takes about a second at 2 ranks (more oversubscribed): once.
    rows = _ledger.measure(world, 4000, sizes=sizes, calibrate=world.Get_size() == 2, steps=1,
                           reps=1)
    assert [(r["nranks"], r["stage"]) for r in rows] == [(n, s) for n in sizes for s in range(4)]
    for r in rows:
        n, m, stage = r["nranks"], r["count"], r["stage"]
        assert r["formula"] == memory_per_rank(stage, m, n)["total"]
        # Rank 0 holds the longest chunks: at most one element per layer above M/N,
        # for each of the 2-byte working copies and the 16 bytes of float32 state.
        assert 0 <= r["total"] - r["formula"] <= 20 * len(r["layers"]), r
        # Sent: exactly the ring schedules of the calls the step made (largest
        # over ranks), the one-element overflow agreement included ...
        calls = collectives_per_iteration(stage, r["layers"]) + [("allreduce", 1)]
        assert r["sent"] == max(sum(ring_sent(c, size, n, rank) for c, size in calls)
                                for rank in range(n)), r
        # ... which is the lecture's 2M(N-1)/N or 3M(N-1)/N up to chunk rounding.
        assert abs(r["sent"] - traffic_per_rank(stage, m, n)) <= 3 * len(r["layers"]) + 2, r
        assert r["calls"] == len(calls) if n > 1 else True
        if n > 1:  # the calls replayed and priced are the step's
            assert sorted((c, size) for c, size, _ in r["call_log"]) == sorted(calls)
            assert r["comm_s"] > 0 and r["predicted_s"] > 0 and r["step_s"] >= r["in_step_s"]
            assert 0 < r["fixed_predicted_s"] < r["predicted_s"] and r["fixed_s"] > 0
            calibrated = r["params_source"].startswith("measured on the group")
            assert calibrated == (world.Get_size() == 2), r["params_source"]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_counted_traffic_is_what_the_library_sends(monkeypatch, stage):
    """The ledger's count (from the ring's schedule) against the bytes the algorithms hand
    to MPI, caught at their point-to-point helpers, on both threads."""
    import threading

    from pycollective.algorithms import allgather, reduce_scatter, ring
    world = MPI.COMM_WORLD
    sent, lock = [0], threading.Lock()

    def counting(fn, which):
        def wrapper(comm, buf, *args):
            if comm.Get_size() == world.Get_size():  # not the test's other communicators
                with lock:
                    sent[0] += buf.nbytes
            return fn(comm, buf, *args)
        return wrapper
    for module, name in ((ring, "sendrecv"), (reduce_scatter, "isend"), (allgather, "isend")):
        monkeypatch.setattr(module, name, counting(getattr(module, name), name))
    model = zero.MLP([30, 17, 9])
    opt = zero.ZeroOptimizer(model.init(0), model.layers, world, stage=stage, precision="fp16",
                             compress="fp16")
    x = np.random.default_rng(world.Get_rank()).standard_normal((4, 30)).astype(np.float32)
    y = np.arange(4) % 9
    model.train_step(opt, x, y, 4 * world.Get_size())  # warm-up: contexts, the helper
    sent[0], opt.comms.traffic = 0, type(opt.comms.traffic)()
    model.train_step(opt, x, y, 4 * world.Get_size())
    assert sent[0] == opt.comms.traffic.bytes > 0, (sent[0], opt.comms.traffic)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("stage, limit, compress", [(2, 1, None), (2, 2, None), (3, 1, None),
                                                     (3, 2, None), (2, 2, "bf16")])
def test_gradient_reduce_scatters_overlap_backward_and_stay_bounded(monkeypatch, stage, limit,
                                                                    compress):
    """Started during backward (pycollective's ring, on the drop-in's helper thread),
    completed before the update, at most ``limit`` buckets alive; the weights are stage 0's.
    bfloat16 on the wire too (the drop-in names it with a datatype of its own)."""
    import threading

    from pycollective.algorithms import reduce_scatter
    world = MPI.COMM_WORLD
    ran = []
    real = reduce_scatter.ring_reduce_scatter

    def spy(ctx, src, out, kernel, bounds, seg, tag):
        if ctx.size == world.Get_size():
            ran.append((tag, threading.current_thread() is threading.main_thread()))
        return real(ctx, src, out, kernel, bounds, seg, tag)
    monkeypatch.setattr(reduce_scatter, "ring_reduce_scatter", spy)
    model = zero.MLP([7, 33, 20, 13, 5])  # 5 layers whose sizes N does not divide
    xtr, ytr, _, _ = train_mlp.load_data("float32")
    batches = _batches(3, 32, world.Get_rank(), world.Get_size())
    data = (xtr[:, :7], ytr % 5)
    opt = zero.ZeroOptimizer(model.init(2), model.layers, world, stage=stage,
                             buckets_in_flight=limit, compress=compress)
    base = zero.ZeroOptimizer(model.init(2), model.layers, world, stage=0, compress=compress)
    _steps(model, base, data, batches, 32)
    layer_bytes = max(layer.size for layer in opt.layers) * 4
    started = []
    real_start = opt.comms.start_reduce_scatter

    def start(buf, out):
        pending = real_start(buf, out)
        started.append((pending.request is not None, len(opt._pending) + 1))
        return pending
    opt.comms.start_reduce_scatter = start
    _steps(model, opt, data, batches, 32)
    assert np.array_equal(opt.master_params(), base.master_params())
    assert not opt._pending and opt._transient == 0
    assert max(alive for _, alive in started) <= limit
    # Buckets, and at stage 3 the one layer gathered for its backward.
    assert opt.peak_transient <= (limit + (stage == 3)) * layer_bytes
    overlapped = MPI.Query_thread() >= MPI.THREAD_MULTIPLE
    assert all(nonblocking == overlapped for nonblocking, _ in started)
    # Every reduce-scatter of the 3 steps ran the library's ring: on the helper thread
    # when overlapped, on the main thread (stage 0's order either way) otherwise.
    assert ran == [(reduce_scatter.TAG_RING, not overlapped)] * 3 * len(model.layers), ran
