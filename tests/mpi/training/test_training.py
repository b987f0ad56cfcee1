"""pycollective.training on several ranks.

* broadcast_parameters: every rank ends with the root's bytes, for many
  arrays (0 bytes, 1, primes, a few MB; mixed dtypes; strided; list and
  dict; several roots; small and default buckets), each rank starting from
  data of its own.
* check_replicas: one flipped bit on one rank is found and named (rank and
  array); identical NaNs pass.
* Mismatched arguments (another parameter list, a non-array) raise on every
  rank naming the rank, and the communicator stays usable.
* DistributedOptimizer: bitwise the hand-written allreduce, divide, step;
  accumulation over no_sync and backward_passes_per_step equals one step on
  the summed gradients.
"""

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective import (DistributedOptimizer, ReplicaMismatch, broadcast_parameters,
                          check_replicas)
from pycollective import compression
from pycollective.zero import Adam

WORLD = MPI.COMM_WORLD

# (name, elements, dtype): empty, tiny, primes, about 3 MB, several dtypes
SPECS = [("empty", 0, np.float32), ("one", 1, np.float64), ("p7", 7, np.int8),
         ("p13", 13, np.float16), ("p1009", 1009, np.int64), ("p65537", 65537, np.float32),
         ("big", 3 * 2 ** 20 // 8 + 5, np.float64), ("c", 31, np.complex128),
         ("flags", 17, np.bool_), ("p3", 3, np.uint16)]


def _data(rank, seed=0):
    """Arrays that differ on every rank and at every index (the bytes themselves are random)."""
    rng = np.random.default_rng([seed, rank])
    out = {}
    for name, count, dtype in SPECS:
        raw = rng.integers(0, 256, count * np.dtype(dtype).itemsize, dtype=np.uint8)
        out[name] = raw.view(dtype).copy()
    out["matrix"] = rng.standard_normal((37, 11)).astype(np.float32)
    out["strided"] = rng.standard_normal(50)[::3]  # not contiguous: packed and unpacked
    return out


def _same_bytes(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _raises_everywhere(comm, error, match, fn):
    """``fn()`` must raise ``error`` matching ``match`` on this rank (so on every rank)."""
    with pytest.raises(error, match=match):
        fn()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("cap", [0, 4096, None])
def test_broadcast_gives_every_rank_the_roots_bytes(cap):
    size, rank = WORLD.Get_size(), WORLD.Get_rank()
    kwargs = {} if cap is None else {"cap_bytes": cap}
    for root in sorted({0, size - 1, size // 2}):
        as_dict = _data(rank, seed=root)
        as_list = list(_data(rank, seed=root + 100).values())
        strided_base = as_dict["strided"].base
        total = broadcast_parameters(as_dict, root=root, comm=WORLD, **kwargs)
        broadcast_parameters(as_list, root=root, comm=WORLD, **kwargs)
        want_dict, want_list = _data(root, seed=root), list(_data(root, seed=root + 100).values())
        for name, want in want_dict.items():
            assert _same_bytes(as_dict[name], want), (root, cap, name)
        for i, want in enumerate(want_list):
            assert _same_bytes(as_list[i], want), (root, cap, i)
        assert as_dict["strided"].base is strided_base  # written in place
        assert len(set(WORLD.allgather(total))) == 1


@pytest.mark.mpi(min_size=2)
def test_broadcast_through_the_drop_in_and_a_named_algorithm():
    comm = pycollective.Comm(WORLD, algorithm="ring")
    rank, last = WORLD.Get_rank(), WORLD.Get_size() - 1
    arrays = [np.full(n, rank, np.float32) for n in (3, 100003, 1)]
    broadcast_parameters(arrays, root=last, comm=comm, cap_bytes=1024, algorithm="chain")
    assert all((a == last).all() for a in arrays)


@pytest.mark.mpi(min_size=2)
def test_check_replicas_names_a_single_flipped_bit():
    size, rank = WORLD.Get_size(), WORLD.Get_rank()
    names = list(_data(0))
    for victim in sorted({0, size - 1}):
        for target in ("p1009", "big", "strided"):
            arrays = _data(0)
            if rank == victim:
                flat = arrays[target].view(np.uint8) if target != "strided" else None
                if flat is None:
                    arrays[target][4] = np.nextafter(arrays[target][4], np.inf)
                else:
                    flat[len(flat) // 3] ^= 1 << (victim % 8)
            with pytest.raises(ReplicaMismatch) as info:
                check_replicas(arrays, comm=WORLD)
            # With two ranks neither is the majority: the one unlike rank 0 is named.
            named = victim if size > 2 else 1
            assert info.value.ranks == (named,)
            assert info.value.arrays == {named: [target]}
            assert f"rank {named}: arrays ['{target}']" in str(info.value)
        as_list = list(_data(0).values())
        if rank == victim:
            as_list[1][0] = -as_list[1][0]
        with pytest.raises(ReplicaMismatch) as info:
            check_replicas(as_list, comm=WORLD)
        assert info.value.arrays == {victim if size > 2 else 1: [names.index("one")]}


@pytest.mark.mpi(min_size=2)
def test_check_replicas_passes_identical_nans_and_catches_other_nan_bits():
    rank = WORLD.Get_rank()
    nans = [np.full(9, np.nan), np.float32([np.nan, -np.inf, 0.0, -0.0])]
    total = check_replicas(nans, comm=WORLD)
    assert len(set(WORLD.allgather(total))) == 1
    if rank == WORLD.Get_size() - 1:
        nans[0].view(np.uint64)[8] |= 1  # still a NaN, other bits
    with pytest.raises(ReplicaMismatch):
        check_replicas(nans, comm=WORLD)


@pytest.mark.mpi(min_size=2)
def test_mismatched_parameter_lists_raise_on_every_rank_naming_the_rank():
    size, rank = WORLD.Get_size(), WORLD.Get_rank()
    odd = size - 1

    class SGD:
        def step(self, params, grads):
            pass

    def params(extra=False, shape=(4, 3)):
        out = {"w": np.zeros(shape, np.float32), "b": np.zeros(3, np.float32)}
        if extra:
            out["w2"] = np.zeros(5, np.float32)
        return out

    variants = {
        "one more array": params(extra=rank == odd),
        "another shape": params(shape=(3, 4) if rank == odd else (4, 3)),
        "another order": dict(reversed(params().items())) if rank == odd else params(),
    }
    calls = {"broadcast_parameters": lambda p: broadcast_parameters(p, comm=WORLD),
             "check_replicas": lambda p: check_replicas(p, comm=WORLD),
             "DistributedOptimizer": lambda p: DistributedOptimizer(SGD(), p, WORLD)}
    for label, p in variants.items():
        for what, call in calls.items():
            with pytest.raises(ValueError, match=f"{what}: .*rank {odd} has"):
                call(p)
    # a rank whose argument is not an array: its own error there, named everywhere else
    bad = [np.zeros(3)] if rank != odd else [object()]
    with pytest.raises(TypeError if rank == odd else ValueError,
                       match="buffer" if rank == odd else f"invalid arguments on rank {odd}"):
        broadcast_parameters(bad, comm=WORLD)
    # the communicator is still usable
    good = [np.full(3, rank, np.float64)]
    broadcast_parameters(good, root=odd, comm=WORLD)
    assert (good[0] == odd).all()


# --- the optimizer wrapper ---------------------------------------------------------------------

SHAPES = [(13, 7), (7,), (7, 5), (5,), (0,)]


def _grads(rank, seed, exact):
    rng = np.random.default_rng([seed, rank])
    if exact:  # small integers: every sum is exact, whatever the order
        return [rng.integers(-50, 50, s).astype(np.float32) for s in SHAPES]
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def _start():
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def _backward(opt, grads):
    """What a backward pass does: write each gradient, last first, and report it."""
    for i in reversed(range(len(grads))):
        opt.grads[i][...] = grads[i]
        opt.ready(i)


def _by_hand(comm, params, optimizer, grads, **kw):
    """The hand-written data-parallel step: allreduce each gradient, divide by N, step."""
    reduced = []
    for g in grads:
        out = np.empty_like(g)
        pycollective.allreduce(g, out, MPI.SUM, comm=comm, **kw)
        out /= comm.Get_size()
        reduced.append(out)
    optimizer.step(params, reduced)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("overlap", [True, False])
def test_optimizer_equals_allreduce_average_step_bitwise(overlap):
    rank = WORLD.Get_rank()
    # exact data through the default buckets (any summation order gives these bits)
    params, ref = _start(), _start()
    opt = DistributedOptimizer(Adam(params, 1e-2), params, pycollective.Comm(WORLD),
                               overlap=overlap)
    ref_opt = Adam(ref, 1e-2)
    for step in range(3):
        grads = _grads(rank, step, exact=True)
        _backward(opt, grads)
        assert opt.step() is True
        _by_hand(WORLD, ref, ref_opt, grads)
        assert all(np.array_equal(p, q) for p, q in zip(params, ref)), step
    check_replicas(params, comm=WORLD)
    # rounding data, one bucket per tensor, the same algorithm and compression as by hand
    # (a compressor object for the wrapper: ranks must agree on it by name, not by address)
    for kw in ({"algorithm": "ring"}, {"algorithm": "tree", "compress": "bf16"}):
        params, ref = _start(), _start()
        comm = pycollective.Comm(WORLD, algorithm=kw["algorithm"])
        opt = DistributedOptimizer(Adam(params, 1e-2), params, comm, cap_bytes=0,
                                   overlap=overlap,
                                   compress=kw.get("compress") and compression.BF16)
        ref_opt = Adam(ref, 1e-2)
        for step in range(2):
            grads = _grads(rank, 10 + step, exact=False)
            _backward(opt, grads)
            opt.step()
            _by_hand(WORLD, ref, ref_opt, grads, **kw)
            assert all(np.array_equal(p, q) for p, q in zip(params, ref)), (kw, step)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("how", ["no_sync", "backward_passes_per_step"])
def test_accumulation_equals_one_step_on_the_summed_gradients(how):
    rank, k = WORLD.Get_rank(), 3
    # a named algorithm: "auto" may time several in turn, and rounding differs between them
    comm = pycollective.Comm(WORLD, algorithm="ring")
    params, ref = _start(), _start()
    kw = {"backward_passes_per_step": k} if how != "no_sync" else {}
    opt = DistributedOptimizer(Adam(params, 1e-2), params, comm, **kw)
    ref_opt = DistributedOptimizer(Adam(ref, 1e-2), ref, comm)
    for step in range(2):
        micro = [_grads(rank, 100 * step + j, exact=False) for j in range(k)]
        if how == "no_sync":
            with opt.no_sync():
                for g in micro[:-1]:
                    _backward(opt, g)
                    assert opt.step() is False
        else:
            for g in micro[:-1]:
                _backward(opt, g)
                assert opt.step() is False
        assert all(np.array_equal(p, q) for p, q in zip(params, ref))  # not stepped yet
        _backward(opt, micro[-1])
        assert opt.step() is True
        summed = [g.copy() for g in micro[0]]
        for g in micro[1:]:
            for s, x in zip(summed, g):
                s += x
        _backward(ref_opt, summed)
        ref_opt.step()
        assert all(np.array_equal(p, q) for p, q in zip(params, ref)), step
    check_replicas(params, comm=WORLD)
