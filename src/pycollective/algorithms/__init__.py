"""Algorithms of every collective; importing this package registers each of them."""

from . import ring, tree, butterfly, ps, naive  # noqa: F401  (registration order)
from . import ring_pipelined, rabenseifner, shm, hierarchical  # noqa: F401
from . import reduce_scatter, allgather, bcast, reduce  # noqa: F401  (the other collectives)
