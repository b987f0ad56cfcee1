"""Serial tests of pycollective.training: argument checks, broadcast buckets, checksums, and the
optimizer wrapper's accumulation logic on one rank (``MPI.COMM_SELF``).

The multi-rank behaviour (root's bytes everywhere, mismatches named on
every rank, averaging equal to a hand-written allreduce) is in
tests/mpi/training/test_training.py.
"""

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective import DistributedOptimizer, broadcast_parameters, check_replicas
from pycollective.training.optimizer import ALIGN, broadcast_plan, checksum

SELF = MPI.COMM_SELF


class SGD:
    """The example's optimizer protocol: ``step(params, grads)`` updates in place."""

    def __init__(self, lr):
        self.lr = lr

    def step(self, params, grads):
        for p, g in zip(params, grads):
            p -= self.lr * g


class Counting(pycollective.Comm):
    """pycollective's drop-in on one rank, counting the reductions it is asked for."""

    def __init__(self, *args, **kwargs):
        self.reductions = 0

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        self.reductions += 1
        return super().Allreduce(sendbuf, recvbuf, op)

    def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        self.reductions += 1
        return super().Iallreduce(sendbuf, recvbuf, op)


def _params(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float64) for s in [(5, 3), (3,), (3, 2), (2,)]]


def _grads(params, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(p.shape) for p in params]


# --- broadcast buckets --------------------------------------------------------------------------

@pytest.mark.parametrize("cap", [0, 1, 100, 4096, 1 << 20])
def test_broadcast_plan_covers_every_array_in_order_within_the_cap(cap):
    rng = np.random.default_rng(cap)
    nbytes = [0, 1, 7, 64, 65, 4096, 5000, 3, 0, 1 << 21] + list(rng.integers(0, 3000, 20))
    plan = broadcast_plan(nbytes, cap)
    assert [i for b in plan for i in b.members] == list(range(len(nbytes)))
    for b in plan:
        assert all(off % ALIGN == 0 for off in b.offsets)
        ends = [off + nbytes[i] for i, off in zip(b.members, b.offsets)]
        assert all(end <= nxt for end, nxt in zip(ends, b.offsets[1:]))  # no overlap
        assert b.nbytes == ends[-1]
        if len(b.members) > 1:
            assert b.offsets[-1] + -(-nbytes[b.members[-1]] // ALIGN) * ALIGN <= cap
    if cap == 0:
        assert len(plan) == len(nbytes)


def test_broadcast_plan_fills_buckets_greedily():
    plan = broadcast_plan([100, 100, 100, 300, 10], 256)
    assert [b.members for b in plan] == [[0, 1], [2], [3], [4]]
    assert plan[0].offsets == [0, 128] and plan[0].nbytes == 228
    with pytest.raises(ValueError, match="cap_bytes"):
        broadcast_plan([1], -1)


def test_broadcast_on_one_rank_keeps_arrays_and_returns_their_checksum():
    arrays = {"w": np.arange(12.0).reshape(3, 4), "b": np.float32([np.nan, 1, -0.0]),
              "strided": np.arange(20, dtype=np.int16)[::3]}
    before = {k: v.copy() for k, v in arrays.items()}
    total = broadcast_parameters(arrays, comm=SELF, cap_bytes=64)
    for k in arrays:
        assert arrays[k].tobytes() == before[k].tobytes()
    assert total == check_replicas(arrays, comm=SELF)
    assert broadcast_parameters(arrays, comm=SELF, check=False) is None


@pytest.mark.parametrize("bad, error, match", [
    (np.arange(3.0), TypeError, "list or a dict"),
    (5, TypeError, "list or a dict"),
    (["not an array"], TypeError, "buffer"),
])
def test_arguments_that_are_not_arrays_are_refused(bad, error, match):
    with pytest.raises(error, match=match):
        broadcast_parameters(bad, comm=SELF)
    with pytest.raises(error, match=match):
        check_replicas(bad, comm=SELF)


def test_bad_root_and_cap_are_refused():
    with pytest.raises(ValueError, match="root"):
        broadcast_parameters([np.zeros(3)], root=1, comm=SELF)
    with pytest.raises(ValueError, match="root"):
        broadcast_parameters([np.zeros(3)], root="0", comm=SELF)
    with pytest.raises(ValueError, match="cap_bytes"):
        broadcast_parameters([np.zeros(3)], comm=SELF, cap_bytes=-1)


# --- checksums ------------------------------------------------------------------------------------

def test_checksum_sees_every_bit_dtype_and_shape():
    a = np.arange(1000, dtype=np.float32)
    base = checksum(a)
    flipped = a.copy()
    flipped.view(np.uint32)[417] ^= 1 << 9
    assert checksum(flipped) != base
    assert checksum(a.view(np.int32)) != base
    assert checksum(a.reshape(10, 100)) != base
    assert checksum(a.copy()) == base
    assert checksum(np.asfortranarray(a.reshape(10, 100))) == checksum(a.reshape(10, 100))


def test_checksum_compares_nans_by_their_bits():
    quiet = np.float64([np.nan, 1.0])
    payload = quiet.copy()
    payload.view(np.uint64)[0] |= 1  # another NaN
    assert np.isnan(payload[0])
    assert checksum(quiet) == checksum(quiet.copy())
    assert checksum(payload) != checksum(quiet)


# --- the optimizer wrapper on one rank ------------------------------------------------------------

def test_optimizer_arguments_are_checked():
    params = _params()
    with pytest.raises(TypeError, match="step"):
        DistributedOptimizer(object(), params, SELF)
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        DistributedOptimizer(SGD(0.1), params, SELF, backward_passes_per_step=0)
    with pytest.raises(ValueError, match="several dtypes"):
        DistributedOptimizer(SGD(0.1), [np.zeros(2), np.zeros(2, np.float32)], SELF)
    with pytest.raises(TypeError, match="numpy"):
        DistributedOptimizer(SGD(0.1), [bytearray(8)], SELF)
    frozen = np.zeros(3)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        DistributedOptimizer(SGD(0.1), [frozen], SELF)
    opt = DistributedOptimizer(SGD(0.1), params, SELF)
    with pytest.raises(KeyError):
        opt.ready(len(params))
    with pytest.raises(KeyError):
        opt.ready("w")
    opt.ready(1)
    with pytest.raises(ValueError, match="twice"):
        opt.ready(1)


def _train(opt, passes, seed):
    """Write each pass's gradients into ``opt.grads`` (last first, reported ready); step."""
    applied = []
    for k in range(passes):
        grads = _grads(opt.params, seed + k)
        for i in reversed(range(len(grads))):
            opt.grads[i][...] = grads[i]
            opt.ready(i)
        applied.append(opt.step())
    return applied


def test_step_applies_the_gradients_on_one_rank():
    params, expected = _params(), _params()
    opt = DistributedOptimizer(SGD(0.5), params, SELF)
    assert _train(opt, 1, seed=7) == [True]
    SGD(0.5).step(expected, _grads(expected, 7))
    assert all(np.array_equal(p, q) for p, q in zip(params, expected))


@pytest.mark.parametrize("how", ["no_sync", "passes"])
def test_accumulated_passes_equal_one_step_on_the_summed_gradients(how):
    k = 3
    params, expected = _params(), _params()
    comm = Counting(SELF)
    if how == "no_sync":
        opt = DistributedOptimizer(SGD(0.25), params, comm, cap_bytes=0)
        with opt.no_sync():
            assert _train(opt, k - 1, seed=10) == [False] * (k - 1)
        assert comm.reductions == 0
        assert all(np.array_equal(p, q) for p, q in zip(params, expected))  # untouched
        assert _train(opt, 1, seed=10 + k - 1) == [True]
    else:
        opt = DistributedOptimizer(SGD(0.25), params, comm, cap_bytes=0,
                                   backward_passes_per_step=k)
        assert _train(opt, k, seed=10) == [False] * (k - 1) + [True]
    assert comm.reductions == len(params)  # one bucket per tensor, reduced once
    summed = _grads(expected, 10)
    for j in range(1, k):
        for s, g in zip(summed, _grads(expected, 10 + j)):
            s += g
    SGD(0.25).step(expected, summed)
    assert all(np.array_equal(p, q) for p, q in zip(params, expected))
    # and the next pass starts afresh
    assert _train(opt, k if how == "passes" else 1, seed=99)[-1] is True


def test_dict_params_grads_by_name_and_synchronize_before_step():
    params = dict(zip(["w1", "b1", "w2", "b2"], _params()))
    expected = [p.copy() for p in params.values()]
    opt = DistributedOptimizer(SGD(1.0), params, SELF, overlap=False)
    assert list(opt.grads) == list(params)
    grads = _grads(expected, 3)
    for name, g in zip(params, grads):
        opt.grads[name][...] = g
    opt.ready("b2")
    reduced = opt.synchronize()
    assert all(np.array_equal(reduced[n], g) for n, g in zip(params, grads))
    reduced["w1"] *= 0  # e.g. clipping, between synchronize and step
    grads[0] *= 0
    assert opt.step() is True
    SGD(1.0).step(expected, grads)
    assert all(np.array_equal(p, q) for p, q in zip(params.values(), expected))
    with opt.no_sync():
        with pytest.raises(RuntimeError, match="only accumulates"):
            opt.synchronize()


def test_zero_grad_and_empty_parameter_list():
    params = _params()
    opt = DistributedOptimizer(SGD(1.0), params, SELF)
    for g in opt.grads:
        g[...] = 1
    opt.zero_grad()
    assert all(not g.any() for g in opt.grads)
    empty = DistributedOptimizer(SGD(1.0), [], SELF)
    assert empty.step() is True and empty.grads == []
