"""Buffer objects of the kinds training scripts pass, for the tests (no torch needed).

* :class:`DLPackOnly`: a numpy array seen only through DLPack (no buffer
  protocol), as a torch or JAX CPU tensor is.
* :class:`LegacyDLPack`: the same from a producer older than DLPack 1.0
  (``__dlpack__`` takes no ``max_version``: an unversioned capsule).
* :class:`FakeDevice`: host memory announced as device memory through
  ``__cuda_array_interface__`` (mpi4py's own tests do the same): pycollective
  must hand it to the MPI library, which here reads it as host memory.
* :func:`torch_or_reason`: the torch module, or why it cannot be used.
"""

import numpy as np


class DLPackOnly:
    """``array`` through ``__dlpack__``/``__dlpack_device__`` only."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


class LegacyDLPack(DLPackOnly):
    """A producer of DLPack < 1.0: an unversioned capsule, no read-only flag."""

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__(stream=stream)


class FakeDevice:
    """``array``'s host memory behind ``__cuda_array_interface__``."""

    def __init__(self, array):
        self.array = array
        self.__cuda_array_interface__ = {
            "version": 3, "shape": array.shape, "typestr": array.dtype.str, "strides": None,
            "data": (array.__array_interface__["data"][0], not array.flags.writeable)}


def torch_or_reason():
    """``(torch, None)`` or ``(None, reason)``."""
    try:
        import torch
    except ImportError:
        return None, "torch is not installed (pip install torch; CPU wheels suffice)"
    return torch, None


def as_kind(kind, values):
    """``(object to pass, numpy view of the same memory)`` for a copy of ``values``."""
    a = np.array(values, copy=True)
    if kind == "numpy":
        return a, a
    if kind == "dlpack":
        return DLPackOnly(a), a
    if kind == "legacy-dlpack":
        return LegacyDLPack(a), a
    if kind == "torch":
        torch, reason = torch_or_reason()
        assert torch is not None, reason
        t = torch.from_numpy(a)
        return t, t.numpy()
    raise ValueError(kind)
