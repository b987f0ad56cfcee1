"""Node-local shared memory: what the shared-memory algorithms and the agreement step stand on.

``segment`` memory every rank of a node maps; ``atomics`` fences and counters
in it (numba intrinsics); ``barrier`` the counters' barrier; ``views`` arrays
at raw addresses in compiled code; ``group`` the node group, its slots and MAX
board; ``cma`` reading a peer's memory by address; ``arrays`` the arrays
``shared_empty`` allocates and where each rank's buffers lie in them.

May import: ``data``, ``runtime``, ``timeline``, ``_errors``.
"""
