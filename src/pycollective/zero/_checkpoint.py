"""Checkpoints of a sharded optimizer: one file per rank, the world size recorded.

``save(opt, prefix)`` writes ``{prefix}.rank{r}-of-{N}.npz`` on every rank:
this rank's float32 master weights and optimizer state (its shard, or
everything at stage 0), the inner optimizer's scalars, the loss scaler, and
what the layout depends on (world size, stage, precision, layer sizes).
The working parameters are not saved: they are the master weights rounded
to the working precision, and are rebuilt on load (allgathered at stages 1
and 2).

``load(opt, prefix)`` checks all of that before touching anything; any
problem on any rank -- a missing file, a checkpoint written by another
number of ranks, another stage, precision or model -- raises the same
``ValueError`` on every rank, naming each rank's problem.  A shard belongs to
a world size, so resuming on another number of ranks is refused, not
guessed.
"""

import glob
import json
import os
import re

import numpy as np

from ._optimizer import state_arrays

__all__ = ["save", "load", "checkpoint_path"]

FORMAT = 1


def checkpoint_path(prefix, rank, nranks):
    """The file rank ``rank`` of ``nranks`` writes for ``prefix``."""
    return f"{os.fspath(prefix)}.rank{rank}-of-{nranks}.npz"


def _layout(opt):
    return {"world_size": opt.nranks, "stage": opt.stage, "precision": opt.precision,
            "layers": [layer.size for layer in opt.layers], "format": FORMAT}


def _agree(opt, error, what):
    """Raise on every rank if any rank has an error (one small gather, not counted)."""
    errors = opt.comms.comm.allgather(error)
    bad = [f"rank {r}: {e}" for r, e in enumerate(errors) if e]
    if bad:
        raise ValueError(f"{what} failed: " + "; ".join(bad))


def save(opt, prefix):
    """Write this rank's shard of ``opt`` (collective; returns this rank's file).

    Raises:
        ValueError: on every rank, if any rank could not write its file.
    """
    path = checkpoint_path(prefix, opt.rank, opt.nranks)
    arrays = {"master": opt.master}
    for name, values in state_arrays(opt.inner).items():
        for i, a in enumerate(values):
            arrays[f"state.{name}.{i}"] = a
    scalars = {name: getattr(opt.inner, name) for name in getattr(opt.inner, "SCALARS", ())}
    meta = dict(_layout(opt), rank=opt.rank, scalars=scalars, scaler=opt.scaler.state())
    error = None
    try:
        tmp = path + ".tmp.npz"
        np.savez(tmp, meta=np.array(json.dumps(meta)), **arrays)
        os.replace(tmp, path)
    except OSError as exc:
        error = f"cannot write {path}: {exc.strerror or exc}"
    _agree(opt, error, "checkpoint save")
    return path


def _recorded_sizes(prefix):
    pattern = re.compile(re.escape(os.path.basename(os.fspath(prefix))) + r"\.rank\d+-of-(\d+)\.npz$")
    found = {int(m.group(1)) for f in glob.glob(f"{glob.escape(os.fspath(prefix))}.rank*-of-*.npz")
             if (m := pattern.search(os.path.basename(f)))}
    return sorted(found)


def _read(opt, prefix):
    """(meta, arrays) of this rank's file, or raise ValueError saying what is wrong."""
    path = checkpoint_path(prefix, opt.rank, opt.nranks)
    if not os.path.exists(path):
        sizes = _recorded_sizes(prefix)
        if sizes and opt.nranks not in sizes:
            raise ValueError(f"the checkpoint {prefix} was written by "
                             f"{' or '.join(map(str, sizes))} ranks; this run has {opt.nranks} "
                             "(a shard belongs to its world size: resume on as many ranks)")
        raise ValueError(f"no checkpoint file {path}")
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data["meta"]))
        arrays = {k: data[k] for k in data.files if k != "meta"}
    want = _layout(opt)
    for key in ("world_size", "format", "stage", "precision", "layers"):
        if meta.get(key) != want[key]:
            raise ValueError(f"{path} has {key} {meta.get(key)!r}, this run has {want[key]!r}")
    if meta.get("rank") != opt.rank:
        raise ValueError(f"{path} holds rank {meta.get('rank')}'s shard")
    if arrays["master"].shape != opt.master.shape or arrays["master"].dtype != opt.master.dtype:
        raise ValueError(f"{path}: master weights of shape {arrays['master'].shape} "
                         f"{arrays['master'].dtype}, expected {opt.master.shape} float32")
    for name, values in state_arrays(opt.inner).items():
        for i, a in enumerate(values):
            got = arrays.get(f"state.{name}.{i}")
            if got is None or got.shape != a.shape:
                raise ValueError(f"{path}: optimizer state {name}[{i}] missing or misshapen")
    return meta, arrays


def load(opt, prefix):
    """Restore ``opt`` from the files :func:`save` wrote (collective).

    Raises:
        ValueError: on every rank, when any rank's file is missing or does not
            fit this run (world size, stage, precision, layers); nothing is
            changed then.
    """
    meta = arrays = error = None
    try:
        meta, arrays = _read(opt, prefix)
    except (OSError, ValueError, KeyError) as exc:
        error = str(exc)
    _agree(opt, error, "checkpoint load")
    opt.master[...] = arrays["master"]
    for name, values in state_arrays(opt.inner).items():
        for i, a in enumerate(values):
            a[...] = arrays[f"state.{name}.{i}"]
    for name, value in meta["scalars"].items():
        setattr(opt.inner, name, value)
    opt.scaler.load(meta["scaler"])
    opt.rebuild_working(counted=False)
