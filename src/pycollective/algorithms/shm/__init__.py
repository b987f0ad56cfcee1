"""The "shm" algorithms: every rank of one node reduces through shared memory.

``allreduce`` is the registered allreduce "shm" (its three paths by size: the
replicated small path, the slot path, the single-copy path); ``small`` and
``mid`` are its compiled steps (numba) and ``steps`` their Python side (the
prepared calls a repeated call reuses; ``stores`` picks their copy-in's kind of
stores; ``rsag`` and ``rsag_steps`` the step for ranks with cores of their own, whose
repeated calls ``books`` numbers and books inside the compiled step); ``common`` is the
node state the "shm"
reduce-scatter, allgather, bcast and reduce share.

May import: ``data``, ``runtime``, ``node``, ``timeline``, ``_errors``.  Importing the
package registers the allreduce.
"""

from . import allreduce  # noqa: F401  (registers "shm")
