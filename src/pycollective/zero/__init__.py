"""Mixed-precision training with ZeRO stages 0-3 on pycollective's collectives.

The lecture's second half (sections 2.4-2.5, table 3, example 4.5) as
library pieces a training script uses:

==================  ==========================================================
``ZeroOptimizer``   sharded mixed-precision optimizer, stages 0 (plain data
                    parallelism) to 3, around an element-wise optimizer
``Adam``            the numpy Adam it wraps by default
``LossScaler``      dynamic loss scaling, overflow agreed across ranks
``MLP``             a ReLU MLP whose forward/backward use the optimizer's
                    per-layer hooks (gather before use, reduce when ready)
``save``/``load``   checkpoints of the sharded state, one file per rank
==================  ==========================================================

``python -m pycollective.zero --ledger`` prints the ledger (run it under
``scripts/run_mpi.sh 8``), ``--overlap`` times stage 2 with and without its
reduce-scatters overlapping the backward.  The collectives it uses live in ``_comms``
(one place, counted); the formulas in :mod:`pycollective.model.ledger`; the
measured ledger in :mod:`pycollective.bench._zero_ledger`.

May import: ``comm``, ``collectives``, ``model``, ``data``, ``compression``,
``_errors`` (its command line also ``bench``).  Nothing else in the library
imports this package.
"""

from ._checkpoint import checkpoint_path, load, save
from ._mlp import MLP
from ._optimizer import Adam, ZeroOptimizer
from ._precision import PRECISIONS, LossScaler, scaler_for, working_dtype

__all__ = ["ZeroOptimizer", "Adam", "LossScaler", "MLP", "save", "load", "checkpoint_path",
           "PRECISIONS", "scaler_for", "working_dtype"]
