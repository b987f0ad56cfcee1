"""The training example (examples/train_mlp.py) through the one-line swap.

For the native communicator and every registered algorithm (and "auto"),
on sub-communicators of 1, 2 and 4 ranks cut from the world: train a few
epochs and require a final test accuracy above 90 %.  ``train`` itself checks,
after every step, that all ranks hold bitwise-identical parameters and that
they stay within the stated tolerance of single-process training on the
same global batches (it raises otherwise); with one rank the two are the
same computation and must agree exactly.
"""

import importlib.util
from pathlib import Path

import pytest
from mpi4py import MPI

import pycollective

pytest.importorskip("sklearn")  # the `examples` extra

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("train_mlp", ROOT / "examples" / "train_mlp.py")
train_mlp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train_mlp)

NAMES = ["native", *pycollective.algorithms()]
if "auto" not in NAMES:
    NAMES.append("auto")


@pytest.fixture(scope="module")
def groups():
    """[(k, sub-communicator or COMM_NULL)] for k = 1, 2, 4 (as far as the world allows)."""
    world = MPI.COMM_WORLD
    size, rank = world.Get_size(), world.Get_rank()
    made = []
    for k in (1, 2, 4):
        if k > size:
            continue
        ngroups = size // k
        color = rank // k if rank < ngroups * k else MPI.UNDEFINED
        made.append((k, world.Split(color, rank)))
    yield made
    for _, sub in made:
        if sub != MPI.COMM_NULL:
            sub.Free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name", NAMES)
def test_trains_above_90_percent_with_1_2_4_ranks(groups, name):
    for k, sub in groups:
        if sub == MPI.COMM_NULL:
            continue
        comm = train_mlp.make_comm(name, sub)
        assert isinstance(comm, pycollective.Comm) == (name != "native")
        result = train_mlp.train(comm, epochs=2, batch_size=128, hidden=(32,), lr=0.05,
                                 mode="overlap")
        assert result["accuracy"] > 0.9, (name, k, result["history"])
        assert result["steps"] == 2 * (1437 // 128)
        if k == 1:
            assert result["max_deviation"] == 0.0, (name, result["max_deviation"])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", ["tensor", "bucket", "overlap"])
def test_reduction_modes_and_sgd_float64(groups, mode):
    """Per-tensor, bucketed and overlapped reductions give the same training (float64, SGD)."""
    k, sub = groups[-1]
    if sub == MPI.COMM_NULL:
        return
    comm = train_mlp.make_comm("ring", sub)
    result = train_mlp.train(comm, epochs=3, hidden=(32,), lr=0.5, optimizer="sgd",
                             mode=mode, cap_bytes=4096, dtype="float64")
    assert result["accuracy"] > 0.9, (mode, result["history"])
    assert result["nbuckets"] == (4 if mode == "tensor" else 2)


@pytest.mark.mpi(min_size=2)
def test_command_line_with_compare(capsys):
    result = train_mlp.main(["--allreduce", "tree", "--epochs", "2", "--hidden", "32",
                             "--compare", "--compare-steps", "3"])
    assert result["accuracy"] > 0.85
    if MPI.COMM_WORLD.Get_rank() == 0:
        out = capsys.readouterr().out
        assert "parameters bitwise identical" in out and "speed-up of bucketing" in out
