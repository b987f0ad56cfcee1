"""Data-parallel training of a numpy MLP on scikit-learn's digits, in the mpi4py style.

    scripts/run_mpi.sh 4 examples/train_mlp.py                      # pycollective, auto
    scripts/run_mpi.sh 4 examples/train_mlp.py --allreduce native   # plain mpi4py
    scripts/run_mpi.sh 4 examples/train_mlp.py --allreduce ring --compare

The one line that picks the communicator is in :func:`make_comm`::

    comm = MPI.COMM_WORLD if name == "native" else pycollective.Comm(MPI.COMM_WORLD, algorithm=name)

Each rank initialises its model from its own seed (``--seed`` + rank), and
``pycollective.broadcast_parameters`` then gives every rank rank 0's
parameters: the replicas start identical because of the broadcast, not
because of equal seeds.  Each step, every rank takes its shard of the global
batch (shards from ``pycollective.partition``), computes the gradient of
(sum of its samples' losses) / (global batch size) into the views of a
``pycollective.DistributedOptimizer``, which sums the gradients over the
ranks in buckets (``Allreduce`` on ``comm``) and runs the optimizer, so the
update uses exactly the gradient of the mean loss over the global batch,
however the batch is split.

What the script checks, after every step:
* all ranks hold bitwise-identical parameters (``pycollective.check_replicas``:
  a checksum of every parameter byte, gathered from all ranks; a mismatch
  stops the run naming the ranks and arrays);
* the parameters track a single-process model trained on the same global
  batches from rank 0's initial parameters (run on every rank alongside):
  the largest difference, relative to the largest parameter, must stay below
  ``--tolerance`` (default 1e-4 for float32, 1e-10 for float64; only the
  order of the floating-point sums differs).

``--compare`` then times four ways of reducing the same gradients on the
same model: one allreduce per tensor; 25 MiB buckets after the backward pass;
small buckets (about one per layer) after the backward pass; and the same
small buckets each started during the backward pass as soon as its layers'
gradients are ready (overlap), and prints the two speed-ups.

Mixed precision and ZeRO (the lecture's sections 2.4-2.5), through
``pycollective.zero``::

    scripts/run_mpi.sh 4 examples/train_mlp.py --zero 2 --precision fp16 --compress none
    scripts/run_mpi.sh 4 examples/train_mlp.py --zero 3 --precision bf16 --compress bf16
    scripts/run_mpi.sh 4 examples/train_mlp.py --accuracy-table

``--zero 0`` is plain data parallelism through the same optimizer (each
layer's gradients allreduced); 1, 2, 3 shard the optimizer state, then the
gradients, then the parameters.  ``--precision`` is the dtype of the working
parameters and gradients (float32 master weights and Adam state either
way; fp16 with dynamic loss scaling), ``--compress`` the dtype gradients
travel as.  After every step the script checks that every rank's gathered
parameters are bitwise identical; in fp32 it also tracks the single-process
model within ``--tolerance``, as above.  ``--accuracy-table`` trains every
stage x precision x compression and prints the final test accuracies.
"""

import argparse
import os
import sys
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one BLAS thread per rank: ranks are the parallelism

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import pycollective  # noqa: E402
from pycollective import DistributedOptimizer, broadcast_parameters, check_replicas  # noqa: E402
from pycollective import partition, zero  # noqa: E402
from pycollective.zero import Adam  # noqa: E402,F401  (the numpy Adam ZeRO wraps)

TOLERANCE = {"float32": 1e-4, "float64": 1e-10}


def make_comm(name, base=None):
    """The one-line swap: the native communicator or pycollective's drop-in."""
    base = MPI.COMM_WORLD if base is None else base
    return base if name == "native" else pycollective.Comm(base, algorithm=name)


# --- data and model ----------------------------------------------------------------

def load_data(dtype, seed=0, test_fraction=0.2):
    """Digits (1797 8x8 images, bundled with scikit-learn), split the same way on every rank."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = (digits.data / 16.0).astype(dtype)
    y = digits.target.astype(np.int64)
    perm = np.random.default_rng(seed).permutation(len(y))
    ntest = int(len(y) * test_fraction)
    test, train = perm[:ntest], perm[ntest:]
    return x[train], y[train], x[test], y[test]


def init_params(sizes, dtype, seed):
    """[W1, b1, W2, b2, ...] with He initialisation from ``seed``."""
    return zero.MLP(sizes).init(seed, dtype)


def forward(params, x):
    """Activations (inputs of each layer) and pre-activations, then logits."""
    acts, pres = [x], []
    h = x
    nlayers = len(params) // 2
    for layer in range(nlayers):
        z = h @ params[2 * layer] + params[2 * layer + 1]
        pres.append(z)
        h = np.maximum(z, 0) if layer < nlayers - 1 else z
        if layer < nlayers - 1:
            acts.append(h)
    return acts, pres, h


def loss_and_delta(logits, y, scale):
    """Sum of cross-entropy losses, and d(scale * sum)/d(logits)."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    expz = np.exp(shifted)
    total = expz.sum(axis=1, keepdims=True)
    logp = shifted - np.log(total)
    loss = -logp[np.arange(len(y)), y].sum()
    delta = expz / total
    delta[np.arange(len(y)), y] -= 1
    return float(loss), delta * logits.dtype.type(scale)


def backward(params, acts, pres, delta, grads, ready=None):
    """Write gradients into ``grads`` (last layer first), calling ``ready(i)`` as each is done."""
    nlayers = len(params) // 2
    for layer in reversed(range(nlayers)):
        w, b = 2 * layer, 2 * layer + 1
        np.sum(delta, axis=0, out=grads[b])
        if ready is not None:
            ready(b)
        np.matmul(acts[layer].T, delta, out=grads[w])
        if ready is not None:
            ready(w)
        if layer:
            delta = (delta @ params[w].T) * (pres[layer - 1] > 0)


class SGD:
    """Plain mini-batch SGD: p -= lr * g."""

    def __init__(self, params, lr):
        self.lr = lr

    def step(self, params, grads):
        for p, g in zip(params, grads):
            p -= self.lr * g


OPTIMIZERS = {"adam": Adam, "sgd": SGD}


def accuracy(params, x, y):
    return float((forward(params, x)[2].argmax(axis=1) == y).mean())


class Reference:
    """The single-process model trained alongside on the whole global batch, for comparison."""

    def __init__(self, sizes, dtype, seed, optimizer, lr, tolerance):
        self.params = init_params(sizes, dtype, seed)
        self.opt = OPTIMIZERS[optimizer](self.params, lr)
        self.grads = [np.empty_like(p) for p in self.params]
        self.tolerance, self.max_dev = tolerance, 0.0

    def step(self, x, y, batch_size):
        acts, pres, logits = forward(self.params, x)
        _, delta = loss_and_delta(logits, y, 1.0 / batch_size)
        backward(self.params, acts, pres, delta, self.grads)
        self.opt.step(self.params, self.grads)

    def check(self, params, step_no, what="parameters"):
        """Raise if ``params`` (same layout) are more than ``tolerance`` (relative) away."""
        scale = max(float(np.abs(p).max()) for p in self.params)
        dev = max(float(np.abs(np.reshape(p, q.shape) - q).max())
                  for p, q in zip(params, self.params)) / scale
        self.max_dev = max(self.max_dev, dev)
        if dev > self.tolerance:
            raise RuntimeError(f"step {step_no}: {what} are {dev:.3g} (relative) away "
                               f"from single-process training, above {self.tolerance:g}")


# --- one data-parallel step ---------------------------------------------------------

def step(params, opt, x, y, batch_size, mode):
    """Forward, backward and reduction of one shard, then the update.

    ``opt`` is a :class:`pycollective.DistributedOptimizer`: the backward
    pass writes the gradients into ``opt.grads``; in "overlap" mode it also
    reports each one ready, so a bucket's allreduce starts while the earlier
    layers are still being differentiated.  Returns (loss sum, compute s, comm s).
    """
    t0 = time.perf_counter()
    acts, pres, logits = forward(params, x)
    loss, delta = loss_and_delta(logits, y, 1.0 / batch_size)
    t_comm = 0.0
    if mode == "overlap":
        def ready(i):
            nonlocal t_comm
            t = time.perf_counter()
            opt.ready(i)
            t_comm += time.perf_counter() - t
        backward(params, acts, pres, delta, opt.grads, ready)
    else:
        backward(params, acts, pres, delta, opt.grads)
    t = time.perf_counter()
    opt.synchronize()
    t_comm += time.perf_counter() - t
    opt.step()
    return loss, time.perf_counter() - t0 - t_comm, t_comm


def make_optimizer(comm, params, optimizer, lr, mode, cap_bytes):
    """The optimizer wrapped to sum the gradients over the ranks in ``mode``'s buckets."""
    if mode == "tensor":  # one allreduce per tensor: the unbucketed baseline
        cap_bytes = 0
    # average=False: each rank already divided by the global batch size, so
    # the sum is the exact mean gradient whatever the shard sizes are.
    return DistributedOptimizer(OPTIMIZERS[optimizer](params, lr), params, comm,
                                average=False, cap_bytes=cap_bytes,
                                overlap=(mode == "overlap"))


def train(comm, *, epochs=10, batch_size=64, hidden=(64, 64), lr=0.01, optimizer="adam",
          mode="bucket", cap_bytes=pycollective.training.bucketing.DEFAULT_CAP_BYTES,
          dtype="float32", seed=0, reference=True, tolerance=None, out=None):
    """Train on ``comm``; return a summary dict (checks raise RuntimeError on failure).

    Args:
        comm: the communicator (native or ``pycollective.Comm``).
        epochs, batch_size, hidden, lr, optimizer, seed: the usual.
        mode: "tensor", "bucket" or "overlap" (see the module docstring).
        cap_bytes: bucket cap.
        dtype: "float32" or "float64".
        reference: also train the single-process model and compare every step.
        tolerance: largest allowed relative difference from the reference.
        out: a file to print per-epoch lines to (rank 0 only), or None.

    Returns:
        dict with ``history`` (per epoch: loss, test accuracy, compute s,
        comm s), ``accuracy``, ``max_deviation``, ``steps``.

    Raises:
        RuntimeError: parameters differ between ranks, or drift from the
            single-process reference beyond ``tolerance``.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    tolerance = TOLERANCE[dtype] if tolerance is None else tolerance
    xtr, ytr, xte, yte = load_data(dtype)
    sizes = [xtr.shape[1], *hidden, 10]
    # Every rank draws its own initial parameters; the broadcast makes rank 0's
    # everyone's (the single-process reference starts from those too).
    params = init_params(sizes, dtype, seed + rank)
    broadcast_parameters(params, root=0, comm=comm)
    opt = make_optimizer(comm, params, optimizer, lr, mode, cap_bytes)
    ref = Reference(sizes, dtype, seed, optimizer, lr, tolerance) if reference else None
    order_rng, nbatches, offset, length = batch_plan(len(ytr), batch_size, comm, seed)
    history, steps = [], 0
    if out is not None and rank == 0:
        print(f"# {size} rank(s), allreduce={_label(comm)}, mode={mode}, {opt.nbuckets} "
              f"bucket(s), model {sizes}, {optimizer} lr={lr}, global batch {batch_size}, "
              f"{dtype}, tolerance vs single process {tolerance:g}", file=out)
        print(f"{'epoch':>5} {'loss':>8} {'test acc':>8} {'compute s':>9} {'comm s':>8} "
              f"{'max rel dev':>11}", file=out)
    warm_up(comm, params, mode, cap_bytes)
    for epoch in range(epochs):
        perm = order_rng.permutation(len(ytr))  # same on every rank: same seed
        loss_sum, t_compute, t_comm = 0.0, 0.0, 0.0
        for b in range(nbatches):
            batch = perm[b * batch_size:(b + 1) * batch_size]
            mine = batch[offset:offset + length]
            loss, tc, tm = step(params, opt, xtr[mine], ytr[mine], batch_size, mode)
            loss_sum += loss
            t_compute += tc
            t_comm += tm
            steps += 1
            # Check, not assume: every rank holds the very same bytes.
            check_replicas(params, comm=comm)
            if ref is not None:
                ref.step(xtr[batch], ytr[batch], batch_size)
                ref.check(params, steps)
        loss_mean = comm.allreduce(loss_sum) / (nbatches * batch_size)
        acc = accuracy(params, xte, yte)
        t_compute = comm.allreduce(t_compute, op=MPI.MAX)
        t_comm = comm.allreduce(t_comm, op=MPI.MAX)
        history.append(dict(epoch=epoch + 1, loss=loss_mean, accuracy=acc,
                            compute=t_compute, comm=t_comm))
        if out is not None and rank == 0:
            dev_text = f"{ref.max_dev:11.2e}" if ref else f"{'-':>11}"
            print(f"{epoch + 1:5d} {loss_mean:8.4f} {acc:8.4f} {t_compute:9.3f} {t_comm:8.3f} "
                  f"{dev_text}", file=out)
    return dict(history=history, accuracy=history[-1]["accuracy"] if history else None,
                max_deviation=ref.max_dev if ref else 0.0, steps=steps,
                nbuckets=opt.nbuckets)


# --- mixed precision and ZeRO --------------------------------------------------------------

def batch_plan(ntrain, batch_size, comm, seed):
    """(batch order generator, batches per epoch, this rank's offset and length in a batch).

    The generator has the same seed on every rank, so every rank draws the
    same global batches; ``pycollective.partition`` splits each over the ranks.
    """
    offset, length = partition(batch_size, comm.Get_size(), comm.Get_rank())
    return np.random.default_rng(seed + 1), ntrain // batch_size, offset, length


def warm_up(comm, params, mode, cap_bytes):
    """One reduction, not timed, on throw-away copies: a communicator's first reduction
    creates the library's private communicators (and helper thread) and compiles kernels."""
    copies = [np.zeros_like(p) for p in params]
    make_optimizer(comm, copies, "sgd", 0.0, mode, cap_bytes).step()


def train_zero(comm, *, stage=0, precision="fp32", compress=None, epochs=10, batch_size=64,
               hidden=(64, 64), lr=0.01, seed=0, reference=True, tolerance=None, out=None,
               steps=None):
    """Train through ``pycollective.zero.ZeroOptimizer``; return a summary dict.

    Args:
        comm: the communicator (a plain mpi4py one: ZeRO calls the library's
            collectives itself).
        stage: ZeRO stage 0 (plain data parallelism), 1, 2 or 3.
        precision: "fp32", "fp16" or "bf16" working parameters and gradients.
        compress: None, "fp16" or "bf16": the dtype gradients travel as.
        reference: in fp32, also train the single-process model (this
            script's float32 code) and compare the master weights every step.
        tolerance: largest relative difference from it (default 1e-4).
        steps: stop after this many steps (None: all epochs).

    Returns:
        dict with ``history``, ``accuracy``, ``steps``, ``skipped`` (steps
        skipped for overflow), ``max_deviation``, ``master`` (the float32
        master weights, gathered), ``memory`` and ``traffic`` (this rank's).

    Raises:
        RuntimeError: gathered parameters differ between ranks, or fp32
            training drifts from the single-process reference.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    tolerance = TOLERANCE["float32"] if tolerance is None else tolerance
    xtr, ytr, xte, yte = load_data("float32")
    sizes = [xtr.shape[1], *hidden, 10]
    model = zero.MLP(sizes)
    opt = zero.ZeroOptimizer(model.init(seed), model.layers, comm, stage=stage,
                             precision=precision, compress=compress,
                             optimizer=lambda ps: Adam(ps, lr))
    ref = None
    if reference and precision == "fp32" and compress is None:
        ref = Reference(sizes, "float32", seed, "adam", lr, tolerance)
    order_rng, nbatches, offset, length = batch_plan(len(ytr), batch_size, comm, seed)
    history, nsteps, skipped = [], 0, 0
    if out is not None and rank == 0:
        print(f"# {size} rank(s), ZeRO stage {stage}, precision {precision}, gradients travel "
              f"as {compress or precision}, model {sizes} ({model.count} parameters), adam "
              f"lr={lr}, global batch {batch_size}", file=out)
        print(f"{'epoch':>5} {'loss':>8} {'test acc':>8} {'skipped':>7} {'loss scale':>10} "
              f"{'max rel dev':>11}", file=out)
    for epoch in range(epochs):
        perm = order_rng.permutation(len(ytr))
        loss_sum = 0.0
        for b in range(nbatches):
            if steps is not None and nsteps >= steps:
                break
            batch = perm[b * batch_size:(b + 1) * batch_size]
            mine = batch[offset:offset + length]
            loss, applied = model.train_step(opt, xtr[mine], ytr[mine], batch_size)
            loss_sum += loss
            skipped += not applied
            nsteps += 1
            check_replicas(opt.full_params(), comm=comm)
            if ref is not None:
                ref.step(xtr[batch], ytr[batch], batch_size)
                ends = np.cumsum([p.size for p in ref.params])[:-1]
                ref.check(np.split(opt.master_params(), ends), nsteps, "master weights")
        acc = float((model.predict(opt.full_params(), xte) == yte).mean())
        history.append(dict(epoch=epoch + 1, loss=comm.allreduce(loss_sum) / (nbatches * batch_size),
                            accuracy=acc, skipped=skipped, scale=opt.scale))
        if out is not None and rank == 0:
            h = history[-1]
            dev_text = f"{ref.max_dev:11.2e}" if ref else f"{'-':>11}"
            print(f"{h['epoch']:5d} {h['loss']:8.4f} {acc:8.4f} {skipped:7d} {opt.scale:10g} "
                  f"{dev_text}", file=out)
    return dict(history=history, accuracy=history[-1]["accuracy"] if history else None,
                steps=nsteps, skipped=skipped, max_deviation=ref.max_dev if ref else 0.0,
                master=opt.master_params(), memory=opt.memory(),
                traffic=opt.comms.traffic.elements)


PRECISION_CHOICES = ("fp32", "fp16", "bf16")
COMPRESS_CHOICES = ("none", "fp16", "bf16")


def accuracy_table(comm, *, epochs=3, batch_size=64, hidden=(64, 64), lr=0.01, seed=0, out=None):
    """Final test accuracy of every stage x precision x compression; returns ``{key: acc}``.

    Also checks that, for each precision and compression, stages 1-3 end
    with bitwise the master weights of stage 0 (the same reductions in the
    same order); raises RuntimeError otherwise.
    """
    results = {}
    load_before = os.getloadavg()[0]
    for precision in PRECISION_CHOICES:
        for compress in COMPRESS_CHOICES:
            master0 = None
            for stage in range(4):
                r = train_zero(comm, stage=stage, precision=precision,
                               compress=None if compress == "none" else compress, epochs=epochs,
                               batch_size=batch_size, hidden=hidden, lr=lr, seed=seed,
                               reference=False)
                if master0 is None:
                    master0 = r["master"]
                elif not np.array_equal(master0, r["master"]):
                    raise RuntimeError(f"stage {stage} {precision}/{compress}: master weights "
                                       "differ from stage 0's")
                results[(stage, precision, compress)] = (r["accuracy"], r["skipped"])
    if out is not None and comm.Get_rank() == 0:
        print(f"# test accuracy after {epochs} epochs on {comm.Get_size()} rank(s), model "
              f"[64, {', '.join(map(str, hidden))}, 10], global batch {batch_size}, adam lr={lr} "
              "(steps skipped for overflow in brackets); stages 1-3 end with bitwise the "
              "master weights of stage 0", file=out)
        print(f"# finished {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, "
              f"load average (1 min) {load_before:.2f} before, {os.getloadavg()[0]:.2f} after",
              file=out)
        header = "| --precision | --compress | " + " | ".join(
            f"stage {s}" for s in range(4)) + " |"
        print(header + "\n|" + "---|" * 6, file=out)
        for precision in PRECISION_CHOICES:
            for compress in COMPRESS_CHOICES:
                cells = [f"{results[(s, precision, compress)][0]:.4f}"
                         + (f" ({results[(s, precision, compress)][1]})"
                            if results[(s, precision, compress)][1] else "")
                         for s in range(4)]
                print(f"| {precision} | {compress} | " + " | ".join(cells) + " |", file=out)
    return results


def _label(comm):
    if isinstance(comm, pycollective.Comm):
        return comm.algorithm or "default"
    return "native"


# --- bucketing and overlap comparison ---------------------------------------------------

def compare(comm, *, steps=50, batch_size=64, hidden=(64, 64), dtype="float32",
            cap_bytes=pycollective.training.bucketing.DEFAULT_CAP_BYTES, seed=0, repeats=3):
    """Time one training step with four ways of reducing the gradients.

    "tensor": one allreduce per tensor; "bucket": buckets of ``cap_bytes``
    after the backward pass; "small buckets": buckets no larger than the
    largest tensor (about one per layer), after the backward pass;
    "overlap": the same small buckets, each started during the backward pass
    as soon as its layers' gradients are ready.  Same model, data and steps
    for each, interleaved over ``repeats`` rounds; a round's time is the
    slowest rank's.

    Returns:
        ({label: median seconds per step}, {label: median seconds per step
        spent in the bucket calls, i.e. communication not hidden behind
        compute}, {label: buckets per step}, small cap).
    """
    xtr, ytr, _, _ = load_data(dtype)
    sizes = [xtr.shape[1], *hidden, 10]
    base = init_params(sizes, dtype, seed)
    small = max(p.nbytes for p in base)
    variants = {"tensor": ("tensor", 0), "bucket": ("bucket", cap_bytes),
                "small buckets": ("bucket", small), "overlap": ("overlap", small)}
    rank, size = comm.Get_rank(), comm.Get_size()
    offset, length = partition(batch_size, size, rank)
    rng = np.random.default_rng(seed)
    batches = [rng.choice(len(ytr), batch_size, replace=False)[offset:offset + length]
               for _ in range(steps)]
    times = {label: [] for label in variants}
    exposed = {label: [] for label in variants}
    nb = {}
    for _ in range(repeats):
        for label, (mode, cap) in variants.items():
            params = [p.copy() for p in base]
            opt = make_optimizer(comm, params, "adam", 1e-3, mode, cap)
            nb[label] = opt.nbuckets
            step(params, opt, xtr[batches[0]], ytr[batches[0]], batch_size, mode)
            comm.Barrier()
            t0 = time.perf_counter()
            waited = 0.0
            for idx in batches:
                waited += step(params, opt, xtr[idx], ytr[idx], batch_size, mode)[2]
            elapsed = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            times[label].append(elapsed / steps)
            exposed[label].append(comm.allreduce(waited, op=MPI.MAX) / steps)
    median = {k: float(np.median(t)) for k, t in times.items()}
    return median, {k: float(np.median(t)) for k, t in exposed.items()}, nb, small


# --- command line -------------------------------------------------------------------------

def parse_args(argv=None):
    choices = ["native", *pycollective.algorithms()]
    if "auto" not in choices:
        choices.append("auto")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--allreduce", default="auto", choices=choices,
                   help="native: MPI.COMM_WORLD itself; otherwise pycollective.Comm "
                        "with this algorithm")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64, help="global batch, split over the ranks")
    p.add_argument("--hidden", default="64,64", help="hidden layer widths")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adam")
    p.add_argument("--mode", choices=["tensor", "bucket", "overlap"], default="bucket",
                   help="one allreduce per tensor / per bucket after backward / "
                        "per bucket during backward")
    p.add_argument("--bucket-mb", type=float, default=25.0,
                   help="bucket cap in MiB (DDP's default)")
    p.add_argument("--dtype", choices=sorted(TOLERANCE), default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-reference", action="store_true",
                   help="skip the single-process reference model and its comparison")
    p.add_argument("--tolerance", type=float, default=None,
                   help="allowed relative difference from single-process training "
                        "(default: 1e-4 float32, 1e-10 float64)")
    p.add_argument("--compare", action="store_true",
                   help="also time per-tensor vs bucketed vs overlapped reduction")
    p.add_argument("--compare-steps", type=int, default=50)
    p.add_argument("--compare-hidden", default=None,
                   help="hidden widths for --compare (default: --hidden)")
    z = p.add_argument_group("mixed precision and ZeRO (pycollective.zero)")
    z.add_argument("--zero", type=int, choices=[0, 1, 2, 3], default=None,
                   help="train through the sharded optimizer at this ZeRO stage (0: plain data "
                        "parallelism); implied (stage 0) by --precision or --compress")
    z.add_argument("--precision", choices=PRECISION_CHOICES, default=None,
                   help="working parameters and gradients (default fp32)")
    z.add_argument("--compress", choices=COMPRESS_CHOICES, default=None,
                   help="what gradients travel as (default: none, their own dtype)")
    z.add_argument("--accuracy-table", action="store_true",
                   help="train every stage x precision x compression and print the accuracies")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    hidden = tuple(int(h) for h in args.hidden.split(",") if h)
    if args.accuracy_table:
        comm = MPI.COMM_WORLD
        out = sys.stdout if comm.Get_rank() == 0 else None
        return accuracy_table(comm, epochs=args.epochs, batch_size=args.batch_size,
                              hidden=hidden, lr=args.lr, seed=args.seed, out=out)
    if args.zero is not None or args.precision or args.compress:
        comm = MPI.COMM_WORLD
        out = sys.stdout if comm.Get_rank() == 0 else None
        compress = None if args.compress in (None, "none") else args.compress
        result = train_zero(comm, stage=args.zero or 0, precision=args.precision or "fp32",
                            compress=compress, epochs=args.epochs, batch_size=args.batch_size,
                            hidden=hidden, lr=args.lr, seed=args.seed,
                            reference=not args.no_reference, tolerance=args.tolerance, out=out)
        if out:
            mem = result["memory"]
            print(f"final test accuracy {result['accuracy']:.4f}; {result['steps']} steps, "
                  f"{result['skipped']} skipped for overflow; gathered parameters bitwise "
                  f"identical on all {comm.Get_size()} rank(s) after every step; rank 0 holds "
                  f"{mem['params']} B parameters, {mem['grads']} B gradients, "
                  f"{mem['optimizer']} B optimizer state", file=out)
        return result
    comm = make_comm(args.allreduce)
    out = sys.stdout if comm.Get_rank() == 0 else None
    result = train(comm, epochs=args.epochs, batch_size=args.batch_size, hidden=hidden,
                   lr=args.lr, optimizer=args.optimizer, mode=args.mode,
                   cap_bytes=int(args.bucket_mb * 2 ** 20), dtype=args.dtype, seed=args.seed,
                   reference=not args.no_reference, tolerance=args.tolerance, out=out)
    if out:
        h = result["history"]
        comp, comm_s = sum(e["compute"] for e in h), sum(e["comm"] for e in h)
        print(f"final test accuracy {result['accuracy']:.4f}; {result['steps']} steps; "
              f"parameters bitwise identical on all {comm.Get_size()} rank(s) after every step; "
              + ("max relative deviation from single-process training "
                 f"{result['max_deviation']:.2e}; " if not args.no_reference else "")
              + f"time: compute {comp:.3f} s, communication {comm_s:.3f} s", file=out)
    if args.compare:
        chidden = tuple(int(h) for h in (args.compare_hidden or args.hidden).split(",") if h)
        times, exposed, nb, small = compare(comm, steps=args.compare_steps,
                                            batch_size=args.batch_size, hidden=chidden,
                                            dtype=args.dtype,
                                            cap_bytes=int(args.bucket_mb * 2 ** 20))
        if out:
            print(f"# compare: model [64, {', '.join(map(str, chidden))}, 10], global batch "
                  f"{args.batch_size}, {args.compare_steps} steps x 3 rounds, median time per step "
                  f"(slowest rank); buckets of {args.bucket_mb:g} MiB, small buckets of "
                  f"{small / 2 ** 10:.0f} KiB", file=out)
            labels = {"tensor": "one allreduce per tensor",
                      "bucket": "buckets after backward",
                      "small buckets": "small buckets after backward",
                      "overlap": "small buckets during backward"}
            print(f"{'':30s} {'allreduces':>10s} {'ms/step':>9s} {'of which comm':>13s}", file=out)
            for key, label in labels.items():
                print(f"{label:30s} {nb[key]:10d} {times[key] * 1e3:9.3f} "
                      f"{exposed[key] * 1e3:13.3f}", file=out)
            print(f"speed-up of bucketing over one allreduce per tensor: "
                  f"{times['tensor'] / times['bucket']:.2f}x; of starting each bucket during "
                  f"backward over waiting for the whole backward (same small buckets): "
                  f"{times['small buckets'] / times['overlap']:.2f}x", file=out)
    return result


if __name__ == "__main__":
    main()
