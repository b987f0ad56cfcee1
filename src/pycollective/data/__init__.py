"""What the data is and how it combines; no MPI state, no per-communicator state.

``buffers`` reads a call's buffer arguments (the buffer protocol, DLPack,
mpi4py's buffer specifications, which datatypes and ops pycollective serves);
``ops`` the op names and the MPI op map; ``kernels`` the compiled reduction
kernel of each (op, dtype); ``partition`` how M elements split into N chunks.

May import: ``_errors`` and third-party packages only.
"""
