"""Device buffers without a GPU: classification, the GPU-aware decision, the spy, the errors.

The fake device (:mod:`pycollective.device.fake`) reports CUDA memory
through DLPack or ``__cuda_array_interface__`` and records any attempt to
take its pointer other than pycollective's own classification
(``fake.LEAKS``): every test here ends with no leak unless it asked for the
native path.  Its streams run lazily, so a copy not waited for, or a result
not ordered before the caller's stream, reads stale bytes.  On one process
(``MPI.COMM_SELF`` and the world of a serial run); tests/mpi/device/test_device.py
runs the same paths on 2-4 ranks.
"""

import numpy as np
import pytest
from mpi4py import MPI

import pycollective
from pycollective.data.buffers import DeviceMemory, device_reason, memory
from pycollective.data.buffers import _classify
from pycollective.device import _aware, _pipeline, _pool, fake
from pycollective.device._backends import wrap

SELF = MPI.COMM_SELF


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    """No leak left from a test; the GPU-aware decision re-read from the environment."""
    monkeypatch.delenv("PYCOLLECTIVE_GPU_AWARE", raising=False)
    _aware.forget()
    fake.LEAKS.clear()
    yield
    _aware.forget()
    fake.LEAKS.clear()
    _pool.clear()


class Device:
    """Any DLPack device type, for classification only."""

    def __init__(self, device_type):
        self.device_type = device_type

    def __dlpack__(self, *args, **kwargs):
        fake.LEAKS.append(("__dlpack__", id(self)))
        raise BufferError("not exportable")

    def __dlpack_device__(self):
        return (self.device_type, 0)


# --- classification ----------------------------------------------------------------------------

@pytest.mark.parametrize("device_type, host", [(2, False), (10, False), (4, False),
                                                (14, False), (3, True), (11, True), (13, True)])
def test_dlpack_device_types_are_classified(device_type, host):
    kind = _classify.classify(Device(device_type))
    assert kind.host is host and kind.via == "dlpack"
    assert kind.stageable is (device_type in (2, 10))
    assert (device_reason(Device(device_type)) is None) is host


def test_cpu_and_plain_buffers_are_not_device_memory():
    assert _classify.classify(Device(1)) is None
    assert _classify.classify(np.zeros(3)) is None
    assert device_reason(np.zeros(3), bytearray(4), MPI.IN_PLACE, None) is None


def test_cai_without_a_driver_to_ask_is_device_memory():
    # No CUDA driver here: a CAI pointer cannot be shown to be host memory.
    kind = _classify.classify(fake.fake_array(np.zeros(3), via="cai"))
    assert kind is not None and not kind.host and kind.via == "cai"
    with pytest.raises(DeviceMemory):
        memory(fake.fake_array(np.zeros(3), via="cai"), "buf", False)
    assert not fake.LEAKS


def test_cai_of_pinned_memory_is_read_in_place(monkeypatch):
    backing = np.arange(6, dtype=np.float32)

    class Pinned:
        __cuda_array_interface__ = {"version": 3, "shape": (6,), "typestr": "<f4",
                                    "data": (backing.ctypes.data, False), "strides": None}

    monkeypatch.setattr(_classify, "cuda_pointer_is_host", lambda ptr: ptr == backing.ctypes.data)
    view = memory(Pinned(), "buf", True)
    assert view.dtype == np.float32 and np.array_equal(view, backing)
    view[0] = 42
    assert backing[0] == 42  # the same memory, not a copy


# --- the GPU-aware decision --------------------------------------------------------------------

@pytest.mark.parametrize("value, kinds, expect", [
    ("0", "mpi,system,cuda", False), ("1", "mpi,system", True), ("auto", "mpi,system", False),
    (None, "mpi,system", False), ("auto", "mpi,system,cuda:device,cuda:host", True),
    ("auto", "", False), ("auto", "system,rocm", True)])
def test_the_setting_wins_then_memory_kinds(monkeypatch, value, kinds, expect):
    if value is not None:
        monkeypatch.setenv("PYCOLLECTIVE_GPU_AWARE", value)
    monkeypatch.setattr(_aware, "memory_kinds", lambda: kinds)
    _aware.forget()
    yes, why = _aware.local_decision()
    assert yes is expect and "PYCOLLECTIVE_GPU_AWARE" in why


def test_this_mpi_library_does_not_take_device_pointers():
    # The MPICH wheel lists no cuda kind: with the default setting, staged.
    assert "cuda" not in _aware.memory_kinds()
    assert _aware.gpu_aware(SELF) is False


def test_agreement_on_one_rank_follows_the_setting(monkeypatch):
    monkeypatch.setenv("PYCOLLECTIVE_GPU_AWARE", "1")
    assert _aware.gpu_aware(MPI.COMM_SELF.Dup()) is True


# --- the spy: no device pointer reaches MPI -------------------------------------------------

@pytest.mark.parametrize("via", ["dlpack", "cai"])
def test_staged_calls_never_offer_the_pointer(via):
    x = fake.fake_array(np.arange(5, dtype=np.float32), via=via)
    out = fake.fake_array(np.zeros(5, np.float32), via=via)
    pycollective.allreduce(x, out, comm=SELF)
    pycollective.allreduce(MPI.IN_PLACE, x, comm=SELF)
    drop = pycollective.Comm(SELF)
    drop.Allreduce(x, out)
    drop.Iallreduce(MPI.IN_PLACE, out).Wait()
    drop.Bcast(x)
    drop.Allgather([x, MPI.FLOAT], out)
    assert np.array_equal(out.read(), np.arange(5, dtype=np.float32))
    assert fake.LEAKS == []


def test_the_spy_sees_the_native_path(monkeypatch):
    # With the setting at 1 the device object goes to MPI: mpi4py asks for
    # its DLPack capsule, which the spy records (and refuses).  So a test
    # above with no leak shows the staged path really kept it from MPI.
    monkeypatch.setenv("PYCOLLECTIVE_GPU_AWARE", "1")
    x = fake.fake_array(np.arange(5, dtype=np.float32))
    with pytest.raises(BufferError):
        pycollective.allreduce(MPI.IN_PLACE, x, comm=MPI.COMM_SELF.Dup())
    assert fake.LEAKS and fake.LEAKS[0][0] == "__dlpack__"


# --- the errors ------------------------------------------------------------------------------

def test_unknown_device_type_is_a_typed_error_naming_library_and_setting():
    with pytest.raises(pycollective.DeviceMemoryError) as info:
        pycollective.allreduce(MPI.IN_PLACE, Device(4), comm=SELF)
    message = str(info.value)
    assert "OpenCL" in message and "PYCOLLECTIVE_GPU_AWARE" in message
    assert _aware.library_name() in message
    assert isinstance(info.value, ValueError) and isinstance(info.value, BufferError)
    assert not [leak for leak in fake.LEAKS if leak[1] == id(info)]


def test_non_contiguous_device_array_is_refused_before_any_copy():
    x = fake.fake_array(np.zeros(4, np.float32), contiguous=False)
    with pytest.raises(pycollective.DeviceMemoryError, match="non-contiguous"):
        pycollective.allreduce(MPI.IN_PLACE, x, comm=SELF)
    with pytest.raises(pycollective.DeviceMemoryError, match="non-contiguous"):
        pycollective.Comm(SELF).Allreduce(MPI.IN_PLACE, x)
    with pytest.raises(pycollective.DeviceMemoryError, match="non-contiguous"):
        pycollective.Comm(SELF).Ibcast(x)
    with pytest.raises(ValueError, match="non-contiguous"):
        pycollective.check_replicas([x], comm=SELF)


def test_no_runtime_to_copy_with(monkeypatch):
    from pycollective.device import _backends

    def missing(name):
        raise ImportError(f"no {name} here")
    monkeypatch.setattr(_backends, "backend", missing)
    with pytest.raises(pycollective.DeviceMemoryError, match="no runtime to copy it with"):
        pycollective.bcast(Device(2), comm=SELF)


# --- the pipeline's chunks ---------------------------------------------------------------------

@pytest.mark.parametrize("count", [0, 1, 2, 15, 16, 17, 1000, 10007])
def test_chunks_cover_the_count_evenly_and_depend_on_count_only(count):
    bounds = _pipeline.chunk_bounds(count, 4, target=64)
    assert sum(b - a for a, b in bounds) == count
    assert all(b0[1] == b1[0] for b0, b1 in zip(bounds, bounds[1:]))
    if bounds:
        lengths = [b - a for a, b in bounds]
        assert max(lengths) <= 16 and max(lengths) - min(lengths) <= 1
    assert bounds == _pipeline.chunk_bounds(count, 4, target=64)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "uint8", "float16"])
@pytest.mark.parametrize("count", [0, 1, 33, 257])
def test_stale_data_would_be_seen(monkeypatch, dtype, count):
    """A kernel still pending on the caller's stream must be in the result."""
    monkeypatch.setenv("PYCOLLECTIVE_GPU_CHUNK_BYTES", "64")
    values = (np.arange(count) % 50).astype(dtype)
    x = fake.fake_array(np.zeros(count, dtype))
    x.write(values)  # enqueued, not run: only an event on the caller's stream orders it
    out = fake.fake_array(np.full(count, 7, dtype))
    pycollective.allreduce(x, out, comm=SELF)
    assert np.array_equal(out.read(), values)
    assert np.array_equal(x.read(), values)  # the send buffer is not modified


def test_a_pipeline_that_does_not_wait_is_caught(monkeypatch):
    """The fake streams catch a copy read before it ran (the checks above can fail)."""
    monkeypatch.setenv("PYCOLLECTIVE_GPU_CHUNK_BYTES", "64")
    monkeypatch.setattr(fake.FakeBackend, "synchronize", lambda self, event: None)
    x = fake.fake_array(np.zeros(40, np.float32))
    x.write(np.arange(40))
    pycollective.allreduce(MPI.IN_PLACE, x, comm=SELF)
    assert not np.array_equal(x._data, np.arange(40, dtype=np.float32))


def test_pinned_buffers_are_reused():
    be = fake.BACKEND
    first = _pool.take(be, 1000)
    _pool.give(first)
    again = _pool.take(be, 900)
    assert again is first
    _pool.give(again)


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
def test_every_op_and_dtype_on_one_rank(monkeypatch, op):
    from pycollective.data.kernels import SUPPORTED_DTYPES
    monkeypatch.setenv("PYCOLLECTIVE_GPU_CHUNK_BYTES", "40")
    for dtype in SUPPORTED_DTYPES:
        values = (np.arange(97) % 7 + 1).astype(dtype)
        x = fake.fake_array(np.zeros(97, dtype), via="cai")
        x.write(values)
        out = fake.fake_array(np.zeros(97, dtype))
        pycollective.allreduce(x, out, op, comm=SELF)
        pycollective.allreduce(MPI.IN_PLACE, x, op, comm=SELF)
        assert out.read().tobytes() == values.tobytes(), dtype
        assert x.read().tobytes() == values.tobytes(), dtype


def test_a_bad_setting_says_so(monkeypatch):
    monkeypatch.setenv("PYCOLLECTIVE_GPU_AWARE", "maybe")
    _aware.forget()
    with pytest.raises(ValueError, match="PYCOLLECTIVE_GPU_AWARE='maybe'"):
        _aware.local_decision()

