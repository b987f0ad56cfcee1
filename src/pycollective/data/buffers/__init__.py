"""What a buffer argument is: the one place that reads the objects collectives are given.

pycollective's public functions and its drop-in :class:`~pycollective.Comm`
accept what mpi4py accepts, read by the same rules, in the same order:

1. The buffer protocol (numpy arrays, ``array.array``, ``bytearray``,
   ``memoryview``, ...).  The memory must be contiguous (C or Fortran order)
   and, for a receive buffer, writable.
2. DLPack (``__dlpack__`` and ``__dlpack_device__``: torch and JAX CPU
   tensors, numpy, mpi4py's own test wrappers), for objects without the
   buffer protocol, and for those whose buffer is not contiguous (as mpi4py
   does, so a strided numpy array gets DLPack's "not contiguous" error).
   On the CPU the tensor is viewed in place, never copied.  As mpi4py does,
   the producer is asked for a versioned capsule
   (``__dlpack__(max_version=(1, 0), copy=False)``) and, if it does not
   take those arguments, for a legacy one; the capsule is read without being
   consumed and stays alive as long as the view (through the array's
   ``base``), so the producer frees the tensor when the view goes.  Why not
   ``np.from_dlpack``: it consumes the capsule and calls the producer's
   deleter when the array dies, which crashes with producers whose capsule
   frees the tensor itself (mpi4py's test wrappers do); reading it the
   way mpi4py does is safe with both kinds.  Strides are checked (C or F
   contiguous, as mpi4py's ``dlpack_is_contig``); a read-only tensor (flag
   of a versioned capsule) cannot be a receive buffer.
3. Pinned (CUDA host) and managed memory is read in place like host
   memory.  Device memory -- ``__cuda_array_interface__`` the CUDA driver
   does not call host memory, or a CUDA or ROCm DLPack device -- cannot be
   read by the CPU: :class:`DeviceMemory` is raised with a one-line reason
   (which memory is which: :mod:`pycollective.data.buffers._classify`).  The
   collectives find device buffers before they get here and stage them
   through host memory, or hand them to an MPI library that takes device
   pointers (:mod:`pycollective.device`).

mpi4py's buffer *specifications* (``[buf, datatype]``, ``[buf, count,
datatype]``, ``[buf, (count, displ), datatype]``, ``[buf, count, displ,
datatype]``, and for vector collectives ``[buf, counts, displs, datatype]``)
are parsed here too (:func:`parse`, :func:`vector_layout`), with mpi4py's
errors; so is the decision whether pycollective can serve an (op, datatype)
or must fall back (:func:`op_reason`, :func:`reduction_dtype`,
:func:`movable`), which depends only on arguments MPI requires to match on
every rank.

Errors: ``TypeError`` for what is not a buffer, :class:`BufferSpecError`
(both a ``BufferError``, as mpi4py raises, and a ``ValueError``, as the
agreement step carries) for memory that cannot be used as asked.  An
:class:`Invalid` wrapping an error stands for an argument that could not be
read at all: passed to a collective in its place, it raises that error in the
collective's local checks, so the agreement step reports it on every rank.

The parts: ``_common`` (errors, :class:`Invalid`, :data:`RAW`), ``_dlpack``,
``_memory`` (any buffer: :func:`memory`, :func:`flat`, :func:`device_reason`;
:func:`as_they_are`, the repeated calls' test of two numpy arrays),
``_specs`` (mpi4py's buffer specifications), ``_datatypes`` (the ops and
datatypes served, and the log of fallbacks).  Import names from here.

Layer 0: no communicator and no MPI call beyond datatype queries.
"""

from ._common import RAW, BufferSpecError, DeviceMemory, Fallback, Invalid, is_in_place
from ._datatypes import _logged, forget_logged, log_fallback, movable, op_reason, reduction_dtype                    # tests read it)
from ._dlpack import _DLManaged, _DLManagedVersioned  # noqa: F401  (tests build capsules)
from ._memory import as_they_are, device_reason, flat, memory
from ._specs import Spec, parse, spec_array, spec_datatype, spec_memory, vector_layout

__all__ = ["BufferSpecError", "Fallback", "DeviceMemory", "Invalid", "memory", "flat",
           "device_reason", "Spec", "parse", "spec_datatype", "spec_memory", "spec_array",
           "vector_layout", "op_reason", "reduction_dtype", "movable", "log_fallback",
           "forget_logged", "is_in_place", "RAW", "as_they_are"]
