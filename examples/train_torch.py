"""torch DDP on CPUs, gradients averaged by Gloo or by pycollective's hook, side by side.

    scripts/run_mpi.sh 4 examples/train_torch.py                     # MLP 64-128-128-10
    scripts/run_mpi.sh 4 examples/train_torch.py --hidden 1024,1024  # 4.5 MB of gradients
    scripts/run_mpi.sh 4 examples/train_torch.py --compress fp16     # also the fp16 hook
    scripts/run_mpi.sh 4 examples/train_torch.py --blocking          # also overlap=False

A torch user's change is two lines (:func:`make_ddp`)::

    state = pycollective.torch.HookState(MPI.COMM_WORLD)
    ddp.register_comm_hook(state, pycollective.torch.allreduce_hook)

The script trains a small MLP on scikit-learn's digits (bundled, no
download) with ``DistributedDataParallel`` over a Gloo process group (set up
from the MPI ranks by ``pycollective.torch.init_process_group``), twice from
the same initial model on the same batches, step by step: once with DDP's
own averaging (Gloo's allreduce), once with pycollective's hook.  Each step
every rank takes its shard of the global batch (``pycollective.partition``)
and its loss is scaled by N / batch so that DDP's mean over ranks is the
gradient of the mean loss over the global batch, however it is split.

It checks and prints:
* the two loss curves agree within ``--tolerance`` (largest difference of
  the global mean loss over all steps; only the order of float32 sums
  differs, and the differences grow slowly along the training);
* after training, each model's parameters are bitwise identical on every
  rank (a digest of every parameter byte, gathered);
* test accuracy of both models;
* time per training step: "compute" is the same step without any gradient
  averaging (DDP's ``no_sync``), "communication" is the step's time beyond
  that, i.e. what averaging adds that backward did not hide.  Modes take
  turns (``--rounds`` rounds of ``--steps`` steps each, the slowest rank's
  time per round; the lower quartile of the rounds printed).
"""

import argparse
import contextlib
import copy
import hashlib
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel as DDP

import pycollective
import pycollective.torch as pctorch
from pycollective.bench._timing import lower_quartile, rounds

HOOKS = {"none": pctorch.allreduce_hook, "fp16": pctorch.fp16_compress_hook,
         "bf16": pctorch.bf16_compress_hook}


def make_ddp(model, comm, hook=None, algorithm="auto", overlap=True):
    """DDP on the default (Gloo) group; with ``hook``, averaging through pycollective."""
    ddp = DDP(model)
    if hook is not None:
        state = pctorch.HookState(comm, algorithm=algorithm, overlap=overlap)
        ddp.register_comm_hook(state, HOOKS[hook])
    return ddp


def load_digits(seed=0, test_fraction=0.2):
    """Digits as float32 tensors, the same train/test split on every rank."""
    from sklearn.datasets import load_digits as sk_digits
    data = sk_digits()
    order = np.random.default_rng(seed).permutation(len(data.target))
    ntest = int(len(order) * test_fraction)
    x = torch.from_numpy((data.data / 16.0).astype(np.float32))
    y = torch.from_numpy(data.target.astype(np.int64))
    test, train = torch.from_numpy(order[:ntest]), torch.from_numpy(order[ntest:])
    return x[train], y[train], x[test], y[test]


def mlp(hidden, seed):
    torch.manual_seed(seed)
    sizes = [64, *hidden, 10]
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class Trainer:
    """One DDP model and its optimizer; ``step`` trains on this rank's shard of a batch."""

    def __init__(self, ddp, lr):
        self.ddp = ddp
        self.opt = torch.optim.Adam(ddp.parameters(), lr=lr)

    def step(self, x, y, scale, sync=True):
        self.opt.zero_grad(set_to_none=False)
        # DDP decides in forward whether backward averages: no_sync must hold both
        with contextlib.nullcontext() if sync else self.ddp.no_sync():
            loss = torch.nn.functional.cross_entropy(self.ddp(x), y, reduction="sum")
            (loss * scale).backward()
        self.opt.step()
        return float(loss.detach())

    def accuracy(self, x, y):
        with torch.no_grad():
            return float((self.ddp.module(x).argmax(1) == y).float().mean())

    def digest(self):
        h = hashlib.sha256()
        for p in self.ddp.module.parameters():
            h.update(p.detach().numpy().tobytes())
        return h.hexdigest()


def batches(ntrain, batch_size, steps, comm, seed):
    """This rank's sample indices of ``steps`` global batches (same plan on every rank)."""
    offset, length = pycollective.partition(batch_size, comm.Get_size(), comm.Get_rank())
    rng = np.random.default_rng(seed)
    plan = []
    while len(plan) < steps:
        order = rng.permutation(ntrain)
        for start in range(0, ntrain - batch_size + 1, batch_size):
            plan.append(torch.from_numpy(order[start + offset:start + offset + length]))
    return plan[:steps]


def identical(comm, digest):
    return len(set(comm.allgather(digest))) == 1


def train(comm, *, epochs=10, batch_size=64, hidden=(128, 128), lr=2e-3, compress=None,
          algorithm="auto", blocking=False, seed=0, steps=20, rounds_=9, tolerance=1e-3,
          out=None):
    """Train with Gloo and with the hook(s) in lock step, then time them.

    Returns:
        dict: ``losses`` {mode: [global mean loss per step]}, ``max_loss_diff``
        {mode: largest |loss - Gloo's loss|}, ``accuracy`` {mode: test
        accuracy}, ``identical`` {mode: bool}, ``times`` {mode: seconds per
        step} (with "compute"), ``grad_bytes``.

    Raises:
        RuntimeError: on every rank, if a mode's parameters differ across
            ranks or its losses leave the tolerance.
    """
    size = comm.Get_size()
    xtr, ytr, xte, yte = load_digits(seed)
    base = mlp(hidden, seed)
    grad_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    modes = {"gloo": (None, True), "pycollective": ("none", True)}
    if blocking:
        modes["pycollective blocking"] = ("none", False)
    if compress not in (None, "none"):
        modes[f"pycollective {compress}"] = (compress, True)
    trainers = {m: Trainer(make_ddp(copy.deepcopy(base), comm, hook, algorithm, overlap), lr)
                for m, (hook, overlap) in modes.items()}
    per_epoch = len(ytr) // batch_size
    plan = batches(len(ytr), batch_size, epochs * per_epoch, comm, seed)
    scale = size / batch_size  # DDP averages over ranks: the mean loss of the global batch
    local = {m: [] for m in modes}
    for idx in plan:
        for m, t in trainers.items():
            local[m].append(t.step(xtr[idx], ytr[idx], scale))
    losses = {m: np.array(comm.allreduce(np.array(v)), np.float64) / batch_size
              for m, v in local.items()}
    result = {
        "losses": {m: v.tolist() for m, v in losses.items()},
        "max_loss_diff": {m: float(np.abs(v - losses["gloo"]).max()) for m, v in losses.items()},
        "accuracy": {m: t.accuracy(xte, yte) for m, t in trainers.items()},
        "identical": {m: identical(comm, t.digest()) for m, t in trainers.items()},
        "grad_bytes": grad_bytes, "steps": len(plan),
    }
    result["times"] = time_steps(comm, trainers, xtr, ytr, batch_size, steps, rounds_, seed)
    result["rounds"], result["timed_steps"] = rounds_, steps
    if comm.Get_rank() == 0:
        report(comm, result, hidden, batch_size, tolerance, out or sys.stdout)
    wrong = [m for m, same in result["identical"].items() if not same]
    far = {m: d for m, d in result["max_loss_diff"].items()
           if d > tolerance * (100 if modes[m][0] not in (None, "none") else 1)}
    if wrong or far:
        raise RuntimeError(f"parameters differ across ranks: {wrong}; losses beyond the "
                           f"tolerance {tolerance}: {far}")
    return result


def time_steps(comm, trainers, xtr, ytr, batch_size, steps, reps, seed):
    """{mode: seconds per step (lower quartile of the rounds, slowest rank)}.

    "compute" is the same step without averaging.  Other jobs on a shared
    machine only ever add time, in bursts: the lower quartile of the rounds
    leaves the bursts out without trusting one lucky round.
    """
    plan = batches(len(ytr), batch_size, steps, comm, seed + 1)
    scale = comm.Get_size() / batch_size
    idle = copy.deepcopy(trainers["gloo"].ddp.module)  # its own replica: no_sync lets it drift
    compute = Trainer(DDP(idle), trainers["gloo"].opt.defaults["lr"])

    def run(trainer, sync=True):
        def go():
            for idx in plan:
                trainer.step(xtr[idx], ytr[idx], scale, sync)
        return go

    calls = {"compute": run(compute, sync=False)}
    calls.update({m: run(t) for m, t in trainers.items()})
    for go in calls.values():
        go()  # warm-up: first calls compile kernels and choose algorithms
    worst = rounds(comm, calls, reps)
    return {m: lower_quartile(t) / steps for m, t in worst.items()}


def report(comm, result, hidden, batch_size, tolerance, out):
    size = comm.Get_size()
    w = out.write
    w(f"{size} ranks, MLP 64-{'-'.join(map(str, hidden))}-10, "
      f"{result['grad_bytes'] / 1e6:.2f} MB of float32 gradients, global batch {batch_size}, "
      f"{result['steps']} steps (torch {torch.__version__}, {MPI.Get_library_version().splitlines()[0].strip()})\n")
    times = result["times"]
    compute = times["compute"]
    w(f"{'mode':<21} {'final loss':>10} {'max |dloss|':>11} {'test acc':>8} {'replicas':>9} "
      f"{'step ms':>8} {'compute ms':>10} {'comm ms':>8}\n")
    for m in result["losses"]:
        same = "identical" if result["identical"][m] else "DIFFER"
        w(f"{m:<21} {result['losses'][m][-1]:>10.4f} {result['max_loss_diff'][m]:>11.2e} "
          f"{result['accuracy'][m]:>8.3f} {same:>9} {times[m] * 1e3:>8.2f} {compute * 1e3:>10.2f} "
          f"{(times[m] - compute) * 1e3:>8.2f}\n")
    gloo_comm = times["gloo"] - compute
    pc_comm = times["pycollective"] - compute
    ratio = f"{gloo_comm / pc_comm:.1f}x" if pc_comm > 0 and gloo_comm > 0 else \
        "not measurable (a step within the compute time's noise)"
    w(f"step time gloo/pycollective: {times['gloo'] / times['pycollective']:.2f}x; "
      f"communication gloo/pycollective: {ratio} (loss tolerance {tolerance:g}; "
      f"lower quartile of {result['rounds']} rounds of {result['timed_steps']} steps)\n")
    out.flush()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64, help="global batch, split over the ranks")
    p.add_argument("--hidden", default="128,128", help="hidden layer widths")
    p.add_argument("--lr", type=float, default=2e-3, help="Adam's learning rate")
    p.add_argument("--algorithm", default="auto", help="pycollective's allreduce algorithm")
    p.add_argument("--compress", choices=sorted(HOOKS), default="none",
                   help="also train with the fp16 or bf16 compressed hook")
    p.add_argument("--blocking", action="store_true",
                   help="also train with HookState(overlap=False): every bucket reduced in the hook")
    p.add_argument("--steps", type=int, default=20, help="steps per timing round")
    p.add_argument("--rounds", type=int, default=9, help="timing rounds (modes take turns)")
    p.add_argument("--tolerance", type=float, default=1e-3,
                   help="largest |loss difference| from Gloo's (x100 for compressed hooks)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)  # ranks are the parallelism; 2 cores here
    comm = MPI.COMM_WORLD
    if not dist.is_initialized():
        pctorch.init_process_group(comm)
    t0 = time.perf_counter()
    result = train(comm, epochs=args.epochs, batch_size=args.batch_size,
                   hidden=tuple(int(h) for h in args.hidden.split(",")), lr=args.lr,
                   compress=args.compress, algorithm=args.algorithm,
                   blocking=args.blocking, seed=args.seed,
                   steps=args.steps, rounds_=args.rounds, tolerance=args.tolerance)
    if comm.Get_rank() == 0:
        print(f"done in {time.perf_counter() - t0:.1f} s")
    return result


if __name__ == "__main__":
    main()
