"""What kind of memory a buffer is, read from ``__dlpack_device__`` or ``__cuda_array_interface__``.

No MPI call and no copy: this runs before anything else on every buffer
that is neither a numpy array nor a buffer-protocol object.

* DLPack device types (dlpack.h): CPU (1), CUDA host / pinned (3), ROCm host
  (11) and CUDA managed (13) memory can be read by the CPU: host path.
  CUDA (2) and ROCm (10) device memory are device buffers, staged through
  host memory unless the MPI library takes device pointers.  Any other
  device type (OpenCL, Vulkan, Metal, oneAPI, ...) is a device buffer
  pycollective cannot stage: a :class:`DeviceMemoryError` before any
  message.
* ``__cuda_array_interface__`` (CAI) does not say which kind of memory its
  pointer is: the CUDA driver is asked (``cuPointerGetAttribute``); pinned
  host and managed memory take the host path, anything else -- and any
  pointer when no driver can be asked -- is device memory (the safe side:
  a device buffer is staged, never handed to MPI).
"""

import ctypes
import threading
from typing import NamedTuple, Optional

import numpy as np

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_ROCM, KDL_ROCM_HOST, KDL_CUDA_MANAGED = 1, 2, 3, 10, 11, 13
HOST_DEVICES = frozenset((KDL_CPU, KDL_CUDA_HOST, KDL_ROCM_HOST, KDL_CUDA_MANAGED))
STAGEABLE = {KDL_CUDA: "cuda", KDL_ROCM: "rocm"}
_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDA host", 4: "OpenCL", 7: "Vulkan", 8: "Metal", 9: "VPI",
          10: "ROCm", 11: "ROCm host", 12: "ext_dev", 13: "CUDA managed", 14: "oneAPI",
          15: "WebGPU", 16: "Hexagon", 17: "MAIA"}


def device_name(device_type: int) -> str:
    return _NAMES.get(device_type, f"device type {device_type}")


class Kind(NamedTuple):
    """A buffer that is not plain host memory, as classified."""

    device_type: int     # DLPack device type (CAI device memory: KDL_CUDA)
    device_id: int
    via: str             # "dlpack" or "cai"
    host: bool           # the CPU can read it (pinned, managed): the host path

    @property
    def stageable(self) -> bool:
        return not self.host and self.device_type in STAGEABLE

    def describe(self) -> str:
        if self.via == "dlpack":
            return f"{device_name(self.device_type)} memory (DLPack device type {self.device_type})"
        return f"{device_name(self.device_type)} memory (__cuda_array_interface__)"


# --- reading __cuda_array_interface__ -------------------------------------------------------
# The fake device arrays of the tests count reads of their CAI made outside
# pycollective's own (which is how mpi4py would take the pointer).
_reading = threading.local()


def reading_cai() -> bool:
    """True while pycollective itself reads a ``__cuda_array_interface__``."""
    return getattr(_reading, "depth", 0) > 0


def read_cai(obj) -> Optional[dict]:
    """``obj.__cuda_array_interface__``, or None when it has none."""
    _reading.depth = getattr(_reading, "depth", 0) + 1
    try:
        return getattr(obj, "__cuda_array_interface__", None)
    finally:
        _reading.depth -= 1


# --- asking the CUDA driver what a pointer is ------------------------------------------------
_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, _CU_POINTER_ATTRIBUTE_IS_MANAGED = 2, 8
_CU_MEMORYTYPE_HOST = 1
_driver = None
_driver_lock = threading.Lock()


def _libcuda():
    global _driver
    with _driver_lock:
        if _driver is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
                lib.cuPointerGetAttribute.restype = ctypes.c_int
                lib.cuPointerGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int,
                                                      ctypes.c_uint64]
                _driver = lib
            except (OSError, AttributeError):
                _driver = False
    return _driver or None


def cuda_pointer_is_host(ptr: int) -> bool:
    """True when the CUDA driver says ``ptr`` is pinned host or managed memory."""
    lib = _libcuda()
    if lib is None or not ptr:
        return False
    managed = ctypes.c_uint(0)
    if lib.cuPointerGetAttribute(ctypes.byref(managed), _CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                 ptr) == 0 and managed.value:
        return True
    kind = ctypes.c_uint(0)
    return lib.cuPointerGetAttribute(ctypes.byref(kind), _CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                     ptr) == 0 and kind.value == _CU_MEMORYTYPE_HOST


def _dlpack_device(obj):
    try:
        obj.__dlpack__  # noqa: B018  (only its presence)
        device = obj.__dlpack_device__
    except AttributeError:
        return None
    dtype, did = device()
    return int(dtype), int(did)


def classify(obj) -> Optional[Kind]:
    """The :class:`Kind` of a DLPack or CAI object; None for anything else (host buffers)."""
    found = _dlpack_device(obj)
    if found is not None:
        dtype, did = found
        if dtype == KDL_CPU:
            return None
        return Kind(dtype, did, "dlpack", dtype in HOST_DEVICES)
    cai = read_cai(obj)
    if cai is None:
        return None
    ptr = int(cai.get("data", (0,))[0] or 0)
    return Kind(KDL_CUDA, 0, "cai", cuda_pointer_is_host(ptr))
