"""The runtimes that copy device memory: the library that made the array does its copies.

A :class:`Backend` knows one library's streams, events, pinned host memory
and asynchronous copies; :func:`wrap` binds a device buffer to the backend
of the library that made it (torch tensors: torch; CuPy arrays: CuPy;
numba device arrays and other ``__cuda_array_interface__`` objects: numba;
an object carrying ``__pycollective_device_backend__``: that backend, which
is how the fake device of the tests plugs in).  A DLPack device object of
another library goes through torch's or CuPy's ``from_dlpack`` (zero copy).

Copies are always between a pinned host buffer of the pool (:mod:`._pool`)
and a byte range of the device buffer, on a side stream of the backend, so
that they run while the host reduces and while the caller's stream goes
on.  Ordering with the caller's stream is by events: the side stream waits
for an event recorded on the caller's stream when the call starts, and the
caller's stream waits for the last copy back before the call returns.
"""

import threading
from typing import NamedTuple

import numpy as np

from ..data.buffers._classify import STAGEABLE, Kind, device_name, read_cai
from ..data.buffers._device_error import DeviceMemoryError


class Pinned(NamedTuple):
    """A pinned host buffer: ``array`` (numpy bytes) and the library's own handle of it."""

    array: np.ndarray
    native: object
    backend: object


class DeviceBuffer(NamedTuple):
    """One device buffer bound to its backend (no copy, no synchronization yet)."""

    obj: object
    backend: "Backend"
    flat: object          # the library's flat byte view of the buffer (or its pointer)
    nbytes: int
    dtype: np.dtype       # element type as numpy names it (bfloat16: ml_dtypes')
    device: object        # the library's device (a key for side streams)
    name: str

    @property
    def count(self) -> int:
        return self.nbytes // self.dtype.itemsize if self.dtype.itemsize else 0


class Backend:
    """One library's way of copying; subclasses fill in the methods."""

    name = "?"

    def __init__(self):
        self._streams = {}
        self._lock = threading.Lock()

    def device_key(self, buf):
        """What side streams are per (the buffer's device)."""
        return buf.device

    def side_stream(self, buf, role):
        """A stream of this backend's own on ``buf``'s device for ``role`` ("d2h", "h2d")."""
        device = self.device_key(buf)
        key = (device, role)
        with self._lock:
            stream = self._streams.get(key)
            if stream is None:
                stream = self._streams[key] = self.new_stream(device)
        return stream

    # Each backend: bind(obj, name) -> DeviceBuffer; new_stream(device);
    # caller_stream(buf); event(); record(event, stream); wait(stream, event);
    # synchronize(event); pinned(nbytes) -> Pinned; d2h(pinned, offset,
    # buf, start, nbytes, stream); h2d(buf, start, pinned, offset, nbytes, stream).


def _not_contiguous(name, library, detail):
    return DeviceMemoryError(f"{name} is a non-contiguous {library} device array ({detail}); "
                             "pycollective stages device memory through host memory in byte "
                             "ranges and needs it contiguous: pass a contiguous array "
                             "(e.g. .contiguous() / ascontiguousarray)")


# --- torch ----------------------------------------------------------------------------------

class TorchBackend(Backend):
    name = "torch"

    def __init__(self):
        super().__init__()
        import torch
        self.torch = torch
        self.dtypes = {torch.float16: np.float16, torch.float32: np.float32,
                       torch.float64: np.float64, torch.int8: np.int8, torch.int16: np.int16,
                       torch.int32: np.int32, torch.int64: np.int64, torch.uint8: np.uint8,
                       torch.bool: np.bool_, torch.complex64: np.complex64,
                       torch.complex128: np.complex128}
        from ..data.kernels import bfloat16
        self.dtypes[torch.bfloat16] = bfloat16()

    def bind(self, obj, name):
        torch = self.torch
        t = obj.detach()
        if t.dtype not in self.dtypes:
            raise DeviceMemoryError(f"{name}: torch dtype {t.dtype} has no numpy equivalent "
                                    "to reduce on the host")
        if t.is_contiguous():
            flat = t.reshape(-1)
        elif t.dim() > 1 and t.permute(*reversed(range(t.dim()))).is_contiguous():
            flat = t.permute(*reversed(range(t.dim()))).reshape(-1)  # Fortran order
        else:
            raise _not_contiguous(name, "torch", f"shape {tuple(t.shape)}, strides {t.stride()}")
        flat = flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8,
                                                                      device=t.device)
        return DeviceBuffer(obj, self, flat, t.numel() * t.element_size(),
                            np.dtype(self.dtypes[t.dtype]), t.device, name)

    def new_stream(self, device):
        return self.torch.cuda.Stream(device=device)

    def caller_stream(self, buf):
        return self.torch.cuda.current_stream(buf.device)

    def event(self):
        return self.torch.cuda.Event()

    def record(self, event, stream):
        event.record(stream)

    def wait(self, stream, event):
        stream.wait_event(event)

    def synchronize(self, event):
        event.synchronize()

    def pinned(self, nbytes):
        t = self.torch.empty(max(nbytes, 1), dtype=self.torch.uint8, pin_memory=True)
        return Pinned(t.numpy()[:nbytes], t, self)

    def d2h(self, pinned, offset, buf, start, nbytes, stream):
        with self.torch.cuda.stream(stream):
            pinned.native[offset:offset + nbytes].copy_(buf.flat[start:start + nbytes],
                                                        non_blocking=True)

    def h2d(self, buf, start, pinned, offset, nbytes, stream):
        with self.torch.cuda.stream(stream):
            buf.flat[start:start + nbytes].copy_(pinned.native[offset:offset + nbytes],
                                                 non_blocking=True)


# --- CuPy -----------------------------------------------------------------------------------

class CupyBackend(Backend):
    name = "cupy"

    def __init__(self):
        super().__init__()
        import cupy
        self.cupy = cupy

    def bind(self, obj, name):
        a = self.cupy.asarray(obj)
        if not (a.flags.c_contiguous or a.flags.f_contiguous):
            raise _not_contiguous(name, "CuPy", f"shape {a.shape}, strides {a.strides}")
        return DeviceBuffer(obj, self, a.data.ptr if a.size else 0, int(a.nbytes),
                            np.dtype(a.dtype), a.device, name)

    def device_key(self, buf):
        return buf.device.id  # CuPy's Device objects cannot be dictionary keys

    def new_stream(self, device):
        with self.cupy.cuda.Device(device):
            return self.cupy.cuda.Stream(non_blocking=True)

    def caller_stream(self, buf):
        with buf.device:
            return self.cupy.cuda.get_current_stream()

    def event(self):
        return self.cupy.cuda.Event(disable_timing=True)

    def record(self, event, stream):
        event.record(stream)

    def wait(self, stream, event):
        stream.wait_event(event)

    def synchronize(self, event):
        event.synchronize()

    def pinned(self, nbytes):
        mem = self.cupy.cuda.alloc_pinned_memory(max(nbytes, 1))
        return Pinned(np.frombuffer(mem, np.uint8, nbytes), mem, self)

    def _copy(self, dst, src, nbytes, kind, stream, device):
        if nbytes:
            with device:
                self.cupy.cuda.runtime.memcpyAsync(dst, src, nbytes, kind, stream.ptr)

    def d2h(self, pinned, offset, buf, start, nbytes, stream):
        self._copy(pinned.array.ctypes.data + offset, buf.flat + start, nbytes,
                   self.cupy.cuda.runtime.memcpyDeviceToHost, stream, buf.device)

    def h2d(self, buf, start, pinned, offset, nbytes, stream):
        self._copy(buf.flat + start, pinned.array.ctypes.data + offset, nbytes,
                   self.cupy.cuda.runtime.memcpyHostToDevice, stream, buf.device)


# --- numba (and any other __cuda_array_interface__ object) ----------------------------------

class NumbaBackend(Backend):
    name = "numba"

    def __init__(self):
        super().__init__()
        from numba import cuda
        self.cuda = cuda

    def bind(self, obj, name):
        cuda = self.cuda
        if hasattr(obj, "copy_to_host") and hasattr(obj, "view"):
            d = obj  # numba's own device array
        else:
            try:  # no synchronization: the staged call orders itself by events
                d = cuda.as_cuda_array(obj, sync=False)
            except TypeError:
                d = cuda.as_cuda_array(obj)
        if d.size == 0:
            flat = None
        elif d.is_c_contiguous():
            flat = d.reshape(d.size).view(np.uint8)
        elif d.is_f_contiguous():
            flat = d.reshape(d.size, order="F").view(np.uint8)
        else:
            raise _not_contiguous(name, "numba", f"shape {d.shape}, strides {d.strides}")
        cai = read_cai(obj) or {}
        return DeviceBuffer(obj, self, flat, int(d.size) * d.dtype.itemsize, np.dtype(d.dtype),
                            (0, cai.get("stream", getattr(d, "stream", 0))), name)

    def device_key(self, buf):
        return 0  # numba's current context

    def new_stream(self, device):
        return self.cuda.stream()

    def caller_stream(self, buf):
        # CAI v3 names the stream the producer works on (1: legacy default,
        # 2: per-thread default); a numba array its own stream (0: default).
        stream = buf.device[1]
        cuda = self.cuda
        if isinstance(stream, int):
            if stream == 0 or stream is None:
                return cuda.default_stream()
            if stream == 1:
                return cuda.legacy_default_stream()
            if stream == 2:
                return cuda.per_thread_default_stream()
            return cuda.external_stream(stream)
        return stream if stream else cuda.default_stream()

    def event(self):
        return self.cuda.event(timing=False)

    def record(self, event, stream):
        event.record(stream)

    def wait(self, stream, event):
        event.wait(stream)

    def synchronize(self, event):
        event.synchronize()

    def pinned(self, nbytes):
        a = self.cuda.pinned_array(max(nbytes, 1), dtype=np.uint8)
        return Pinned(a[:nbytes], a, self)

    def d2h(self, pinned, offset, buf, start, nbytes, stream):
        if nbytes:
            buf.flat[start:start + nbytes].copy_to_host(
                pinned.array[offset:offset + nbytes], stream=stream)

    def h2d(self, buf, start, pinned, offset, nbytes, stream):
        if nbytes:
            buf.flat[start:start + nbytes].copy_to_device(
                pinned.array[offset:offset + nbytes], stream=stream)


# --- choosing one ---------------------------------------------------------------------------

_FACTORIES = {"torch": TorchBackend, "cupy": CupyBackend, "numba": NumbaBackend}
_made = {}
_made_lock = threading.Lock()


def backend(name) -> Backend:
    """The (one per process) backend of library ``name``; ImportError if it is missing."""
    with _made_lock:
        found = _made.get(name)
        if found is None:
            found = _made[name] = _FACTORIES[name]()
        return found


def _library(obj) -> str:
    return type(obj).__module__.split(".", 1)[0]


def _unstageable(name, kind, why, setting):
    from ._aware import library_name
    return DeviceMemoryError(
        f"{name} is {kind.describe()} and cannot be staged through host memory: {why}. "
        f"The MPI library ({library_name()}) was not declared to take device pointers "
        f"({setting}), so pycollective will not hand it one; set PYCOLLECTIVE_GPU_AWARE=1 only "
        "if it is CUDA-aware")


def wrap(obj, kind: Kind, name, setting) -> DeviceBuffer:
    """``obj`` (a device buffer of :class:`Kind` ``kind``) bound to its library's backend.

    Raises:
        DeviceMemoryError: an unknown device type, a library without a
            runtime to copy with, a non-contiguous array.
    """
    if not kind.stageable:
        raise _unstageable(name, kind, f"pycollective can stage only "
                           f"{' and '.join(device_name(t) for t in STAGEABLE)} device memory",
                           setting)
    custom = getattr(obj, "__pycollective_device_backend__", None)
    if custom is not None:
        return custom.bind(obj, name)
    library = _library(obj)
    candidates = [library] if library in _FACTORIES else (
        ["numba", "cupy"] if kind.via == "cai" else ["torch", "cupy"])
    errors = []
    for lib in candidates:
        try:
            be = backend(lib)
            if lib != library and kind.via == "dlpack":
                target = be.torch.from_dlpack(obj) if lib == "torch" else \
                    be.cupy.from_dlpack(obj)
                return be.bind(target, name)._replace(obj=obj)
            return be.bind(obj, name)
        except DeviceMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001  (ImportError, no CUDA driver, ...)
            errors.append(f"{lib}: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
    raise _unstageable(name, kind, "no runtime to copy it with ("
                       + "; ".join(errors or [f"no backend for {library}"]) + ")", setting)
