"""pycollective.torch and torch.profiler: hook calls and collectives are named ranges.

Needs torch (CI's torch suite installs the CPU wheel); without it these skip.
"""

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective import timeline
from _tensors import torch_or_reason

torch, _no_torch = torch_or_reason()
pytestmark = [pytest.mark.skipif(torch is None, reason=str(_no_torch)),
              pytest.mark.mpi(min_size=2)]

if torch is not None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import pycollective.torch as pctorch


def _names(prof):
    return [e.name for e in prof.events()]


def test_hook_calls_and_collectives_are_record_function_ranges():
    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)
    if not dist.is_initialized():
        pctorch.init_process_group(comm)
    state = pctorch.HookState(comm, "ring", overlap=False)
    ddp = DDP(torch.nn.Linear(64, 8), bucket_cap_mb=1)
    ddp.register_comm_hook(state, pctorch.allreduce_hook)
    x = torch.from_numpy(np.arange(10, dtype=np.float32) + comm.rank)
    with torch.profiler.profile() as prof:
        for _ in range(2):
            ddp.zero_grad()
            ddp(torch.ones(4, 64)).sum().backward()
        pycollective.allreduce(MPI.IN_PLACE, x, algorithm="ring")
    names = _names(prof)
    assert any(n.startswith("pycollective.torch.allreduce_hook bucket ") for n in names), names
    assert names.count("pycollective.allreduce") >= 3  # two steps' buckets, and the direct call
    assert np.array_equal(x.numpy(), np.arange(10, dtype=np.float32) * comm.size
                          + sum(range(comm.size)))
    # Outside the profiler, nothing is recorded and nothing is in the way.
    assert not timeline.ACTIVE.outside()
    with torch.profiler.profile() as quiet:
        pass
    assert "pycollective.allreduce" not in _names(quiet)
