"""A fake device for tests and dry runs: host memory that pretends to be CUDA memory.

:class:`FakeDeviceArray` reports a CUDA device through ``__dlpack_device__``
(or, with ``via="cai"``, through ``__cuda_array_interface__``), so
pycollective classifies it as device memory; its bytes live in a numpy array
that only :class:`FakeBackend` touches.  Two things make it a spy:

* ``__dlpack__`` never exports (an MPI library given the object would take
  its pointer that way) and counts the attempt in :data:`LEAKS`; a read of
  ``__cuda_array_interface__`` that is not pycollective's own classification
  is counted there too.  A test that ends with ``LEAKS`` empty has shown
  that no device pointer reached MPI.
* Streams run lazily: a copy or a "kernel" enqueued on a :class:`FakeStream`
  runs only when something waits for it (an event synchronized, or a stream
  that waits on an event reaching it).  A pipeline that reads a host buffer
  before synchronizing its copy, or returns before the caller's stream
  waits for the copy back, sees stale bytes, and the test's check fails.
"""

import itertools
import threading

import numpy as np

from ._backends import Backend, DeviceBuffer, Pinned
from ..data.buffers._classify import KDL_CUDA, reading_cai

LEAKS = []          # (what, object id) of every device pointer offered outside pycollective
_lock = threading.RLock()


class FakeEvent:
    def __init__(self):
        self.stream, self.mark = None, 0

    def done(self):
        return self.stream is None or self.stream.ran >= self.mark


class FakeStream:
    """A queue of operations that run in order, only when someone waits for them."""

    _ids = itertools.count()

    def __init__(self, name="stream"):
        self.name = f"{name}{next(self._ids)}"
        self.ops, self.queued, self.ran = [], 0, 0

    def enqueue(self, fn):
        with _lock:
            self.ops.append(fn)
            self.queued += 1

    def run_until(self, mark):
        with _lock:
            while self.ran < mark:
                fn = self.ops.pop(0)
                self.ran += 1
                fn()

    def synchronize(self):
        self.run_until(self.queued)


class _FakeArray:
    """Pretend CUDA memory of ``data``'s shape and dtype (a copy of ``data``)."""

    def __init__(self, data, stream=None, contiguous=True):
        self._data = np.array(data, copy=True)
        self._contiguous = contiguous
        self.stream = stream if stream is not None else DEFAULT_STREAM
        self.__pycollective_device_backend__ = BACKEND

    @property
    def shape(self):
        return self._data.shape

    @property
    def dtype(self):
        return self._data.dtype

    @property
    def size(self):
        return self._data.size

    # what the tests use: "kernels" on the array's stream
    def write(self, values, stream=None):
        """Enqueue a kernel that writes ``values`` (runs when the stream is waited for)."""
        values = np.array(values, self._data.dtype, copy=True).reshape(self._data.shape)
        (stream or self.stream).enqueue(lambda: np.copyto(self._data, values))

    def read(self, stream=None):
        """The contents as the array's stream sees them: that stream synchronized first."""
        (stream or self.stream).synchronize()
        return self._data.copy()


class FakeDeviceArray(_FakeArray):
    """Fake CUDA memory seen through DLPack (device type 2, as torch and CuPy report it)."""

    def __dlpack_device__(self):
        return (KDL_CUDA, 0)

    def __dlpack__(self, *args, **kwargs):
        LEAKS.append(("__dlpack__", id(self)))
        raise BufferError("fake device memory cannot be exported")


class FakeCAIArray(_FakeArray):
    """Fake CUDA memory seen through ``__cuda_array_interface__`` (as numba arrays are)."""

    @property
    def __cuda_array_interface__(self):
        if not reading_cai():
            LEAKS.append(("__cuda_array_interface__", id(self)))
        # A pointer nothing may dereference: the fake memory is not at it.
        return {"version": 3, "shape": self._data.shape, "typestr": self._data.dtype.str,
                "data": (0xDEAD0000, False), "strides": None, "stream": None}


def fake_array(data, via="dlpack", **kwargs):
    """A fake device array of ``data`` seen through ``via`` ("dlpack" or "cai")."""
    return (FakeDeviceArray if via == "dlpack" else FakeCAIArray)(data, **kwargs)


class FakeBackend(Backend):
    """Host copies on lazy streams (see the module docstring)."""

    name = "fake"

    def bind(self, obj, name):
        from ..data.buffers._device_error import DeviceMemoryError
        if not obj._contiguous:
            raise DeviceMemoryError(f"{name} is a non-contiguous fake device array; "
                                    "pycollective needs it contiguous")
        flat = obj._data.reshape(-1).view(np.uint8)
        return DeviceBuffer(obj, self, flat, flat.size, obj._data.dtype, 0, name)

    def caller_stream(self, buf):
        return buf.obj.stream

    def new_stream(self, device):
        return FakeStream("side")

    def event(self):
        return FakeEvent()

    def record(self, event, stream):
        with _lock:
            stream.enqueue(lambda: None)
            event.stream, event.mark = stream, stream.queued

    def wait(self, stream, event):
        target, mark = event.stream, event.mark
        stream.enqueue(lambda: target.run_until(mark) if target is not None else None)

    def synchronize(self, event):
        if event.stream is not None:
            event.stream.run_until(event.mark)

    def pinned(self, nbytes):
        a = np.empty(nbytes, np.uint8)
        return Pinned(a, a, self)

    def d2h(self, pinned, offset, buf, start, nbytes, stream):
        dst, src = pinned.array[offset:offset + nbytes], buf.flat[start:start + nbytes]
        stream.enqueue(lambda: np.copyto(dst, src))

    def h2d(self, buf, start, pinned, offset, nbytes, stream):
        dst, src = buf.flat[start:start + nbytes], pinned.array[offset:offset + nbytes]
        stream.enqueue(lambda: np.copyto(dst, src))


BACKEND = FakeBackend()
DEFAULT_STREAM = FakeStream("default")
