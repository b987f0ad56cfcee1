"""pycollective.zero on one rank: the optimizer's bookkeeping, loss scaling, checkpoints."""

import os

import numpy as np
import pytest
from mpi4py import MPI

from pycollective import zero
from pycollective.model.ledger import memory_per_rank

SELF = MPI.COMM_SELF
MODEL = zero.MLP([12, 8, 5])


def _data(n=32, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 12)).astype(np.float32), rng.integers(0, 5, n)


def _train(opt, steps=4):
    x, y = _data()
    for i in range(steps):
        MODEL.train_step(opt, x[i::steps], y[i::steps], 8)
    return opt


def test_scaler_halves_on_overflow_and_grows_after_good_runs():
    s = zero.LossScaler(8.0, interval=2)
    s.update(True)
    assert (s.scale, s.skipped) == (4.0, 1)
    s.update(False)
    s.update(False)
    assert s.scale == 8.0
    fixed = zero.scaler_for("bf16")
    fixed.update(True)
    assert fixed.scale == 1.0 and fixed.skipped == 1
    assert zero.scaler_for("fp16").scale == 2.0 ** 15
    with pytest.raises(ValueError, match="precision"):
        zero.working_dtype("fp8")


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_stages_agree_bitwise_and_hold_the_lecture_bytes(precision):
    masters = []
    for stage in range(4):
        opt = _train(zero.ZeroOptimizer(MODEL.init(0), MODEL.layers, SELF, stage=stage,
                                        precision=precision, compress="bf16"))
        masters.append(opt.master_params())
        mem = opt.memory()
        w = opt.dtype.itemsize
        want = memory_per_rank(stage, MODEL.count, 1, working_bytes=w)
        assert mem["params"] == want["params"] and mem["optimizer"] == want["optimizer"]
        # Gradients are kept in the wire dtype once sharded (stages 2, 3): 2 bytes here.
        assert mem["grads"] == (want["grads"] if stage < 2 else 2 * MODEL.count)
        assert opt.comms.traffic.elements == 0  # one rank sends nothing
    assert all(np.array_equal(m, masters[0]) for m in masters[1:])


def test_bad_arguments():
    with pytest.raises(ValueError, match="stage"):
        zero.ZeroOptimizer(MODEL.init(0), MODEL.layers, SELF, stage=4)
    with pytest.raises(ValueError, match="cover tensors"):
        zero.ZeroOptimizer(MODEL.init(0), [[0], [2, 3]], SELF)
    with pytest.raises(ValueError, match="unknown compression"):
        zero.ZeroOptimizer(MODEL.init(0), MODEL.layers, SELF, compress="int4")
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="buckets_in_flight"):
            zero.ZeroOptimizer(MODEL.init(0), MODEL.layers, SELF, stage=2, buckets_in_flight=bad)


def test_overflow_skips_the_step_and_keeps_the_weights():
    opt = zero.ZeroOptimizer(MODEL.init(0), MODEL.layers, SELF, stage=3, precision="fp16",
                             scaler=zero.LossScaler(2.0 ** 20))
    before = opt.master_params()
    x, y = _data()
    x[0, 0] = 1e30  # float16 inf in the activations, then in the gradients
    _, applied = MODEL.train_step(opt, x, y, 32)
    assert not applied and opt.scale == 2.0 ** 19
    assert np.array_equal(opt.master_params(), before)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_checkpoint_round_trip_and_refusals(tmp_path, stage):
    prefix = tmp_path / "ckpt"

    def make(**kw):
        return zero.ZeroOptimizer(MODEL.init(0), MODEL.layers, SELF, stage=stage,
                                  precision="fp16", **kw)
    opt = _train(make(), 2)
    path = zero.save(opt, prefix)
    assert path == f"{prefix}.rank0-of-1.npz" and os.path.exists(path)
    again = make()
    zero.load(again, prefix)
    assert np.array_equal(again.master_params(), opt.master_params())
    assert again.inner.t == 2 and again.scale == opt.scale
    _train(opt, 2)
    _train(again, 2)
    assert np.array_equal(again.master_params(), opt.master_params())
    other = zero.ZeroOptimizer(MODEL.init(0), MODEL.layers, SELF, stage=stage, precision="bf16")
    with pytest.raises(ValueError, match="precision 'fp16', this run has 'bf16'"):
        zero.load(other, prefix)
    os.rename(path, f"{prefix}.rank0-of-4.npz")
    with pytest.raises(ValueError, match="written by 4 ranks; this run has 1"):
        zero.load(make(), prefix)
    with pytest.raises(ValueError, match="no checkpoint file"):
        zero.load(make(), tmp_path / "nothing")
