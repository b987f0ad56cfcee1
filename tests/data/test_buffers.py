"""Reading buffer arguments (pycollective.data.buffers) as mpi4py reads them, on one process.

DLPack tensors are viewed in place (writes show in the producer's memory),
with their strides and read-only flag checked; legacy and versioned
capsules; element types numpy cannot name become raw bytes; device memory
is recognised, not read; buffer specifications and vector layouts give
mpi4py's counts, displacements and errors; the fallback decisions depend
only on op and datatype.
"""

import array
import ctypes
import gc
import importlib.util
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from pycollective.data import buffers as B

_spec = importlib.util.spec_from_file_location(
    "_tensors", Path(__file__).parents[1] / "mpi" / "_tensors.py")
_tensors = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_tensors)
DLPackOnly, LegacyDLPack, FakeDevice = _tensors.DLPackOnly, _tensors.LegacyDLPack, _tensors.FakeDevice


@pytest.mark.parametrize("kind", [DLPackOnly, LegacyDLPack])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8", "int16", "int32",
                                   "int64", "uint8", "uint64", "bool", "complex64",
                                   "complex128"])
def test_dlpack_is_viewed_in_place(kind, dtype):
    a = (np.arange(6) % 3).astype(dtype)
    view = B.memory(kind(a), "recvbuf", writable=True)
    assert view.dtype == a.dtype and view.shape == (6,)
    assert view.__array_interface__["data"][0] == a.__array_interface__["data"][0]
    view[1] = view[2]
    assert a[1] == a[2]  # the same memory
    del view
    gc.collect()
    assert a.sum() >= 0  # the producer's array outlives the view


def test_dlpack_shapes_orders_and_sizes():
    c = np.arange(12.0).reshape(3, 4)
    assert np.array_equal(B.memory(DLPackOnly(c), "x", True), np.arange(12.0))
    f = np.asfortranarray(c)  # Fortran order: viewed in memory order, like the buffer protocol
    assert np.array_equal(B.memory(DLPackOnly(f), "x", True), f.reshape(-1, order="A"))
    assert B.memory(DLPackOnly(np.zeros(0)), "x", True).size == 0
    assert B.memory(DLPackOnly(np.zeros((1, 5))[:, ::1]), "x", True).size == 5


def test_dlpack_strides_and_read_only_give_mpi4py_errors():
    with pytest.raises(BufferError, match="not contiguous"):
        B.memory(DLPackOnly(np.arange(10.0)[::2]), "sendbuf", False)
    with pytest.raises(ValueError, match="not contiguous"):  # also a ValueError, for agreement
        B.memory(DLPackOnly(np.zeros((4, 4))[:, :2]), "sendbuf", False)
    ro = np.arange(3.0)
    ro.flags.writeable = False
    assert np.array_equal(B.memory(DLPackOnly(ro), "sendbuf", False), ro)
    with pytest.raises(BufferError, match="read-only"):
        B.memory(DLPackOnly(ro), "recvbuf", True)


def test_a_producer_that_cannot_export_raises_a_value_error_too():
    with pytest.raises(ValueError, match="sendbuf: .*IEEE"):  # numpy will not export it
        B.memory(DLPackOnly(np.zeros(3, np.longdouble)), "sendbuf", False)


class _Bfloat16:
    """A legacy DLPack producer of bfloat16 (type code 4), which numpy has no name for."""

    _new = ctypes.pythonapi.PyCapsule_New
    _new.restype, _new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p,
                                                      ctypes.c_void_p]

    def __init__(self, count):
        self.data = np.arange(count, dtype=np.uint16)
        self.shape = (ctypes.c_int64 * 1)(count)
        self.managed = B._DLManaged()
        t = self.managed.dl_tensor
        t.data, t.ndim, t.shape = self.data.ctypes.data, 1, self.shape
        t.device.device_type, t.dtype.code, t.dtype.bits, t.dtype.lanes = 1, 4, 16, 1

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, stream=None):  # no destructor: self keeps the struct alive
        return self._new(ctypes.addressof(self.managed), b"dltensor", None)


def test_raw_bytes_for_element_types_numpy_cannot_name():
    producer = _Bfloat16(5)
    view = B.memory(producer, "sendbuf", False)
    assert view.dtype == B.RAW and view.size == 10  # 5 elements of 2 bytes
    assert view.view(np.uint16).tolist() == [0, 1, 2, 3, 4]


def test_buffer_protocol_objects():
    a = array.array("d", [1.0, 2.0])
    view = B.memory(a, "recvbuf", True)
    view[0] = 5.0
    assert a[0] == 5.0 and view.dtype == np.float64
    assert B.memory(bytearray(3), "x", True).dtype == np.uint8
    with pytest.raises(BufferError, match="read-only"):
        B.memory(b"abc", "recvbuf", True)
    assert B.memory(memoryview(b"abc"), "sendbuf", False).tobytes() == b"abc"
    with pytest.raises(TypeError, match="must be a numpy array or a buffer"):
        B.memory([1.0, 2.0], "sendbuf", False)
    err = ValueError("unreadable")
    with pytest.raises(ValueError, match="unreadable"):
        B.memory(B.Invalid(err), "sendbuf", False)


def test_device_memory_is_recognised_not_read():
    host = np.arange(4.0)
    with pytest.raises(B.DeviceMemory, match="__cuda_array_interface__"):
        B.memory(FakeDevice(host), "sendbuf", False)

    class OnGpu(DLPackOnly):
        def __dlpack_device__(self):
            return (2, 0)  # kDLCUDA

        def __dlpack__(self, **kwargs):
            raise AssertionError("device memory must not be asked for a capsule")

    with pytest.raises(B.DeviceMemory, match="DLPack device type 2"):
        B.memory(OnGpu(host), "sendbuf", False)
    assert B.device_reason(host, MPI.IN_PLACE, None) is None
    assert "__cuda_array_interface__" in B.device_reason(host, FakeDevice(host))
    assert "device type 2" in B.device_reason([OnGpu(host), MPI.DOUBLE])
    assert B.device_reason(DLPackOnly(host), bytearray(2)) is None


def test_specs_like_mpi4py():
    x = np.arange(10, dtype=np.float64)
    assert B.parse(x) == B.Spec(x)
    assert B.parse([x, MPI.DOUBLE]) == B.Spec(x, datatype=MPI.DOUBLE)
    assert B.parse([x, 3]) == B.Spec(x, 3)
    assert B.parse([x, (3, 2), "d"]) == B.Spec(x, 3, 2, "d")
    assert B.parse([x, 3, 2, MPI.DOUBLE]) == B.Spec(x, 3, 2, MPI.DOUBLE)
    assert B.parse(DLPackOnly(x)).buf.array is x
    with pytest.raises(ValueError, match="2 to 4 items"):
        B.parse([x])
    with pytest.raises(TypeError, match="expecting buffer"):
        B.parse(3.5)
    assert B.parse([x, [3, 2]]) == B.Spec(x, 3, 2)  # a list pair: (count, displ)
    assert B.parse([x, [3, 2]], vector=True) == B.Spec(x, [3, 2])  # a list: the counts
    spec = B.parse([x, (3, 2), MPI.DOUBLE])
    mem = B.spec_memory(spec, "recvbuf", True)
    assert np.array_equal(B.spec_array(spec, mem, np.dtype("d"), "recvbuf"), [2.0, 3.0, 4.0])
    # Blocks: an explicit count is per block, an inferred one must divide.
    spec = B.parse([x, 2, MPI.DOUBLE])
    assert B.spec_array(spec, mem, np.dtype("d"), "recvbuf", blocks=4).size == 8
    with pytest.raises(ValueError, match="multiple of required number of blocks"):
        B.spec_array(B.parse(x), mem, np.dtype("d"), "recvbuf", blocks=3)
    with pytest.raises(ValueError, match="needs"):
        B.spec_array(B.parse([x, 11, "d"]), mem, np.dtype("d"), "recvbuf")


def test_vector_layouts_like_mpi4py():
    x = np.zeros(10)
    layout = B.vector_layout

    def parse_vector(msg):
        return B.parse(msg, vector=True)
    assert layout(parse_vector(x), x, 8, 3, "r") == ([4, 3, 3], [0, 4, 7])
    assert layout(parse_vector([x, 2]), x, 8, 3, "r") == ([2, 2, 2], [0, 2, 4])
    assert layout(parse_vector([x, ([1, 2, 3], None)]), x, 8, 3, "r") == ([1, 2, 3], [0, 1, 3])
    assert layout(parse_vector([x, ([1, 2, 3], 3)]), x, 8, 3, "r") == ([1, 2, 3], [0, 3, 6])
    assert layout(parse_vector([x, [3, 1, 1], [5, 0, 9], "d"]), x, 8, 3, "r") == \
        ([3, 1, 1], [5, 0, 9])
    with pytest.raises(ValueError, match="outside the buffer"):
        layout(parse_vector([x, [3, 1, 2], [5, 0, 9], "d"]), x, 8, 3, "r")
    with pytest.raises(ValueError, match="expecting 3"):
        layout(parse_vector([x, [1, 1]]), x, 8, 3, "r")


@pytest.mark.parametrize("datatype, kernel", [
    (MPI.FLOAT, True), (MPI.INT64_T, True), (MPI.UNSIGNED_CHAR, True),
    (MPI.BYTE, False), (MPI.PACKED, False), (MPI.C_BOOL, False), (MPI.C_DOUBLE_COMPLEX, False),
    (MPI.LONG_DOUBLE, False), (MPI.DOUBLE_INT, False)])
def test_which_datatypes_are_reduced_and_moved(datatype, kernel):
    dtype, reason = B.reduction_dtype(datatype)
    assert (dtype is not None) == kernel and (reason is None) == kernel
    size, why = B.movable(datatype)
    holes = datatype == MPI.DOUBLE_INT  # 12 bytes of data in an extent of 16
    assert (size is None) == holes and (why is None) != holes


def test_derived_datatypes_without_holes_are_moved():
    pair = MPI.INT.Create_contiguous(2).Commit()
    strided = MPI.INT.Create_vector(2, 1, 2).Commit()
    try:
        assert B.movable(pair) == (8, None)
        assert B.movable(strided)[0] is None
        assert B.reduction_dtype(pair) == (None, "derived datatype")
    finally:
        pair.Free()
        strided.Free()


def test_op_reasons():
    assert B.op_reason(MPI.SUM) == ("sum", None)
    assert B.op_reason("max") == ("max", None)
    assert B.op_reason(MPI.LAND)[1] == "op MPI.LAND is not implemented by pycollective"
    op = MPI.Op.Create(lambda a, b, t: None, commute=True)
    try:
        assert B.op_reason(op) == (None, "user-defined op")
    finally:
        op.Free()
