"""Buffers of every layout numpy makes, handed to the USB GPU's copies: a Fortran-order array (contiguous, but
memoryview.cast reads only C order) and an array with a 0 in its shape reached cast() and came back as a raw
TypeError ("casts are restricted to C-contiguous views", "cannot cast view with zeros in shape"). Now a
Fortran-order buffer is a UsbGpuValueError saying to copy it, an empty one copies nothing, and the session stays
usable; C-ordered arrays of any dtype and dims copy their raw bytes (differential against numpy's tobytes)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from speck.usbgpu.api import UsbGpu
from speck.usbgpu.errors import UsbGpuTypeError, UsbGpuValueError


@pytest.fixture(scope="module")
def gpu() -> UsbGpu:
    with UsbGpu.open(sim=True) as g:
        yield g  # type: ignore[misc]


def test_a_fortran_order_array_is_a_named_error_and_the_session_stays_usable(gpu: UsbGpu) -> None:
    a = np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    buf = gpu.alloc(a.nbytes)
    with pytest.raises(UsbGpuValueError, match="C-contiguous"):
        gpu.copyin(buf, a)
    with pytest.raises(UsbGpuValueError, match="C-contiguous"):
        gpu.copyout(np.asfortranarray(np.zeros((2, 3), dtype=np.float32)), buf)
    gpu.copyin(buf, np.ascontiguousarray(a))  # (what the message says to do)
    out = np.zeros((2, 3), dtype=np.float32)
    gpu.copyout(out, buf)
    np.testing.assert_array_equal(out, a)
    gpu.free(buf)


@pytest.mark.parametrize("shape", [(0,), (2, 0), (0, 3, 4)])
def test_an_empty_array_of_any_shape_copies_nothing(gpu: UsbGpu, shape: tuple[int, ...]) -> None:
    buf = gpu.alloc(16)
    gpu.copyin(buf, b"0123456789abcdef")
    gpu.copyin(buf, np.zeros(shape, dtype=np.float32), 4)
    gpu.copyout(np.zeros(shape, dtype=np.int16), buf, 16)
    back = bytearray(16)
    gpu.copyout(back, buf)
    assert back == b"0123456789abcdef"
    gpu.free(buf)


@settings(max_examples=25, deadline=None)
@given(a=hnp.arrays(st.sampled_from([np.uint8, np.int16, np.float32, np.float64, np.complex64, np.bool_]),
                    hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=5)))  # fmt: skip
def test_any_c_ordered_array_copies_its_raw_bytes(gpu: UsbGpu, a: np.ndarray) -> None:
    buf = gpu.alloc(a.nbytes)
    gpu.copyin(buf, a)
    out = np.empty_like(a)
    gpu.copyout(out, buf)
    assert out.tobytes() == a.tobytes()
    gpu.free(buf)


@pytest.mark.parametrize("dtype", [object, [("a", "i4"), ("b", "O")]], ids=["object", "struct_with_object"])
def test_a_buffer_of_python_objects_is_refused_both_ways(gpu: UsbGpu, dtype: object) -> None:
    # copyout wrote raw VRAM bytes over the array's object pointers (a crash at its next use); copyin copied the
    # pointers' values as data
    buf = gpu.alloc(64)
    gpu.copyin(buf, bytes(range(64)))
    a = np.zeros(2, dtype=dtype)
    with pytest.raises(UsbGpuTypeError, match="Python objects"):
        gpu.copyout(a, buf)
    with pytest.raises(UsbGpuTypeError, match="Python objects"):
        gpu.copyin(buf, a)
    assert a.tolist() == np.zeros(2, dtype=dtype).tolist()  # (untouched, and still usable)
    back = bytearray(64)
    gpu.copyout(back, buf)
    assert back == bytes(range(64))
    gpu.free(buf)
