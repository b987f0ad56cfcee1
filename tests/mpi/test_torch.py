"""pycollective.torch: DDP's buckets averaged through pycollective equal Gloo's, errors raise.

Needs torch (CI's third step, .ci/torch-suite, installs the CPU wheel);
without it every test here skips and says so.  Gloo's own allreduce is the
reference: a float32 bucket must lie, element by element, within the
rounding bound of any summation order (tests/mpi/_data.py) of the exact
mean -- Gloo's result too -- so the two differ by at most twice that bound;
integer buckets (summed) are bitwise equal; compressed buckets stay within
the compressor's stated bound.  Bucket sizes 1, odd (1001) and 25 MB, through
a hand-made bucket (both the helper-thread path and the last-bucket path)
and through DDP itself.
"""

import importlib.util
import types
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from _data import bitwise_equal, random_values, replicas_identical, rounding_bound
from _tensors import torch_or_reason

torch, _no_torch = torch_or_reason()
pytestmark = pytest.mark.skipif(torch is None, reason=str(_no_torch))

if torch is not None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import pycollective.torch as pctorch

ROOT = Path(__file__).resolve().parents[2]
COUNTS = [1, 1001, 25 * 2**20 // 4]  # elements: 1, odd, 25 MiB of float32


@pytest.fixture(scope="module")
def world():
    """COMM_WORLD, with torch.distributed's default (Gloo) group on the same ranks."""
    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)  # ranks outnumber the cores in the suite
    if not dist.is_initialized():
        pctorch.init_process_group(comm)
    assert dist.get_world_size() == comm.Get_size() and dist.get_rank() == comm.Get_rank()
    return comm


def _bucket(tensor, last):
    """What the hooks read of DDP's GradBucket."""
    return types.SimpleNamespace(buffer=lambda: tensor, is_last=lambda: last)


def _mean_and_bound(n, count, seed=0):
    """Every rank's data, the exact mean of the divided data (float64) and its bound."""
    everyone = [random_values(q, count, np.float32, "sum", seed) for q in range(n)]
    divided = [(torch.from_numpy(x) / n).numpy() for x in everyone]  # as the hooks divide
    exact, bound = rounding_bound(divided, "sum", np.float32)
    return everyone, exact, bound


def _within(got, exact, bound):
    """Number of elements of ``got`` farther than ``bound`` from ``exact``."""
    return int(np.count_nonzero(np.abs(np.asarray(got, np.float64) - exact) > bound))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("last", [False, True], ids=["helper", "last-bucket"])
def test_allreduce_hook_equals_gloo(world, count, last):
    n, r = world.Get_size(), world.Get_rank()
    everyone, exact, bound = _mean_and_bound(n, count)
    gloo = torch.from_numpy(everyone[r].copy()).div_(n)
    dist.all_reduce(gloo)
    mine = torch.from_numpy(everyone[r].copy())
    address = mine.data_ptr()
    state = pctorch.HookState(world)
    got = pctorch.allreduce_hook(state, _bucket(mine, last)).wait()
    assert got is mine and mine.data_ptr() == address  # averaged in place
    assert _within(gloo, exact, bound) == 0  # the reference itself
    assert _within(mine, exact, bound) == 0
    assert np.all(np.abs(mine.numpy().astype(np.float64) - gloo.numpy()) <= 2 * bound)
    assert replicas_identical(world, mine.numpy())


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64] if torch is not None else [])
@pytest.mark.parametrize("count", COUNTS[:2])
def test_summing_integer_buckets_is_exact(world, dtype, count):
    r = world.Get_rank()
    values = torch.from_numpy((np.arange(count) * 7919 + r * 104729) % 1000003 - 500000)
    values = values.to(dtype)
    gloo = values.clone()
    dist.all_reduce(gloo)
    state = pctorch.HookState(world, average=False)
    for last in (False, True):
        mine = values.clone()
        pctorch.allreduce_hook(state, _bucket(mine, last)).wait()
        assert bitwise_equal(mine.numpy(), gloo.numpy())


@pytest.mark.mpi(min_size=2)
def test_averaging_an_integer_bucket_raises_on_every_rank(world):
    state = pctorch.HookState(world)
    future = pctorch.allreduce_hook(state, _bucket(torch.arange(5), False))
    with pytest.raises(RuntimeError, match="average=False"):
        future.wait()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("compress", ["fp16", "bf16"])
@pytest.mark.parametrize("count", COUNTS[:2])
def test_compressed_hooks_stay_within_the_compressors_bound(world, compress, count):
    n, r = world.Get_size(), world.Get_rank()
    everyone = [random_values(q, count, np.float32, "sum") for q in range(n)]
    stack = np.array(everyone, np.float64)
    mean = stack.sum(axis=0) / n
    bound = pctorch._MEANS[compress].error_bound(np.abs(stack).sum(axis=0), n)
    hook = {"fp16": pctorch.fp16_compress_hook, "bf16": pctorch.bf16_compress_hook}[compress]
    state = pctorch.HookState(world)
    for last in (False, True):
        mine = torch.from_numpy(everyone[r].copy())
        assert hook(state, _bucket(mine, last)).wait() is mine
        assert mine.dtype == torch.float32
        assert _within(mine, mean, bound) == 0, compress
        assert replicas_identical(world, mine.numpy())


class _Rows(torch.nn.Module if torch is not None else object):
    """Parameters of the given sizes; the loss makes each one's gradient ``data[i]``."""

    def __init__(self, counts):
        super().__init__()
        self.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(c)) for c in counts)

    def forward(self, data):
        return sum((w * d).sum() for w, d in zip(self.weights, data))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("algorithm, overlap", [("auto", True), ("ring", False)])
def test_ddp_gradients_through_the_hook_equal_gloos(world, algorithm, overlap):
    """Real DDP, buckets of 1 MiB: the large parameter alone, the two small together."""
    n, r = world.Get_size(), world.Get_rank()
    data = []
    for i, count in enumerate(COUNTS):
        everyone, exact, bound = _mean_and_bound(n, count, seed=i)
        data.append((torch.from_numpy(everyone[r]), exact, bound))
    inputs = [d for d, _, _ in data]
    grads = {}
    for how in ("gloo", "hook"):
        ddp = DDP(_Rows(COUNTS), bucket_cap_mb=1)
        if how == "hook":
            state = pctorch.HookState(world, algorithm, overlap=overlap)
            ddp.register_comm_hook(state, pctorch.allreduce_hook)
        for _ in range(2):  # DDP rebuilds its buckets after the first step
            ddp.zero_grad()
            ddp(inputs).backward()
        grads[how] = [w.grad.numpy().copy() for w in ddp.module.weights]
    for (_, exact, bound), gloo, hook in zip(data, grads["gloo"], grads["hook"]):
        # DDP without a hook scales by 1/N while copying into its buckets, as the hook divides
        assert _within(gloo, exact, 2 * bound) == 0
        assert _within(hook, exact, bound) == 0
        assert replicas_identical(world, hook)


@pytest.mark.mpi(min_size=2)
def test_a_count_mismatch_fails_every_ranks_future(world):
    state = pctorch.HookState(world)
    count = 5 if world.Get_rank() == 0 else 6
    for last in (False, True):
        future = pctorch.allreduce_hook(state, _bucket(torch.ones(count), last))
        with pytest.raises(RuntimeError, match="ranks disagree on count"):
            future.wait()
    # the communicator stays usable: the disagreement was found before data moved
    ones = torch.ones(3)
    pctorch.allreduce_hook(state, _bucket(ones, False)).wait()
    assert ones.tolist() == [1.0, 1.0, 1.0]


@pytest.mark.mpi(min_size=2)
def test_ddp_raises_the_hooks_error_from_backward(world):
    """Ranks that name different algorithms: backward raises on every rank, no hang."""
    model = DDP(torch.nn.Linear(8, 4))
    odd = world.Get_rank() % 2
    model.register_comm_hook(pctorch.HookState(world, algorithm="tree" if odd else "ring"),
                             pctorch.allreduce_hook)
    with pytest.raises(RuntimeError, match="ranks disagree on algorithm"):
        model(torch.randn(3, 8)).sum().backward()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("last", [False, True], ids=["helper", "last-bucket"])
def test_a_rank_that_never_comes_times_the_others_out(world, last):
    comm = world.Dup()  # left broken on the ranks that waited; never freed
    state = pctorch.HookState(comm)
    for both in (False, True):  # every rank sets up the communicator and its helper
        pctorch.allreduce_hook(state, _bucket(torch.ones(10), both)).wait()
    previous = pycollective.set_timeout(2.0)
    try:
        if world.Get_rank() != 0:
            future = pctorch.allreduce_hook(state, _bucket(torch.ones(10), last))
            with pytest.raises(RuntimeError, match="CollectiveTimeout"):
                future.wait()
    finally:
        pycollective.set_timeout(previous)
        world.Barrier()


def test_the_state_must_be_a_hook_state(world):
    with pytest.raises(TypeError, match="HookState"):
        pctorch.allreduce_hook(world, _bucket(torch.ones(2), True))


def _example():
    pytest.importorskip("sklearn")
    spec = importlib.util.spec_from_file_location("train_torch", ROOT / "examples" / "train_torch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.mpi(min_size=2)
def test_the_example_trains_above_90_percent_both_ways(world, capsys):
    example = _example()
    result = example.main(["--epochs", "3", "--hidden", "64", "--lr", "0.01", "--steps", "2",
                           "--rounds", "1"])
    assert result["accuracy"]["gloo"] > 0.9 and result["accuracy"]["pycollective"] > 0.9, result
    assert all(result["identical"].values())
    assert result["max_loss_diff"]["pycollective"] <= 1e-3
    assert result["steps"] == 3 * (1437 // 64)
    if world.Get_rank() == 0:
        out = capsys.readouterr().out
        assert "pycollective" in out and "identical" in out and "comm ms" in out
