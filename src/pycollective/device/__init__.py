"""Device (CUDA, ROCm) buffers: classified before any MPI call, staged through pinned host memory.

The MPI library a plain ``pip install`` brings (the MPICH or Open MPI
wheel) is not built to take device pointers: handed one, it crashes the
job.  pycollective therefore never hands a device pointer to an MPI library
that did not say it takes one (:mod:`._aware`: ``PYCOLLECTIVE_GPU_AWARE``,
else a ``cuda`` kind in MPI 4.1's ``mpi_memory_alloc_kinds``, agreed across
ranks).  Otherwise device buffers are copied through a pool of pinned host
buffers (:mod:`._pool`) into pycollective's own host algorithms, allreduce
in overlapping chunks (:mod:`._pipeline`), by the library that made the
array (:mod:`._backends`: torch, CuPy, numba; :mod:`.fake` for tests).

The parts here: ``_aware``, ``_backends``, ``_pool``, ``_pipeline``,
``fake`` (the tests' device).  Which memory a buffer is and the error for
one that cannot be staged live with the buffers
(:mod:`pycollective.data.buffers._classify`, ``_device_error``); where the
public functions and the drop-in call in lives with them
(:mod:`pycollective.collectives.device`, :mod:`pycollective.comm.device`).

May import: ``runtime``, ``data``, ``_errors``.
"""
