"""Allreduce algorithms; importing this package registers each of them."""

from . import ring, tree, butterfly, ps, naive  # noqa: F401  (registration order)
from . import ring_pipelined, rabenseifner, shm, hierarchical  # noqa: F401
