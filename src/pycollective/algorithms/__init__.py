"""Algorithms of every collective; importing this package registers each of them.

One module per allreduce algorithm (``run(ctx, src, dst, kernel)``, its cost
beside its code) and one per family of the other collectives
(``reduce_scatter``, ``allgather``, ``bcast``, ``reduce``); ``_p2p`` their
point-to-point helpers; ``shm/`` the shared-memory ones and their compiled
steps.

May import: ``node``, ``runtime``, ``data``, ``timeline``, ``_errors``.  Only the call path's
``api`` and ``options`` import this package (to register them), never a module
of it.
"""

from . import ring, tree, butterfly, ps, naive  # noqa: F401  (registration order)
from . import ring_pipelined, rabenseifner, shm, hierarchical  # noqa: F401
from . import reduce_scatter, allgather, bcast, reduce  # noqa: F401  (the other collectives)
