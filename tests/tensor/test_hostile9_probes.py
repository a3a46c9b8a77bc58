"""Hostile round 9. Probes that found a silent wrong result or data lost without a word:

* `arange` of ints past int64 wrapped (arange(2**62, 2**63 + 1, 2**61) ended at -2**63); it is uint64 when every
  value is >= 0 (as Tensor([2**63]) is), else a TensorOverflowError. A negative step with an unsigned dtype
  (arange(10, 0, -1, dtype=uint8), which torch makes) was refused naming the literal -1.
* `conv_transpose2d` took any output_padding: a negative one silently cropped the output, one at or past the stride
  and dilation added rows no input reaches (torch refuses both); a weight whose input channels don't split into the
  groups was the regrouping reshape's "can't reshape shape ...". Both are now TensorValueErrors naming the argument.
* `Tensor(pathlib.Path)` mapped its file at the first read: a file removed before it was created again, empty, and
  read as zeros; one replaced read the new file. The file is now mapped when the tensor is made (as safe_load does).
* `Tensor(memoryview)` read any memoryview as raw bytes: a float32 one of shape (2, 3) became 24 uint8s. A memoryview
  of another format than bytes, or of several dims, now holds its values in its shape (numpy's reading); a flat
  byte one is still bytes that `dtype=` reinterprets.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import Tensor, dtypes
from speck.tensor.errors import TensorOverflowError, TensorValueError


@pytest.mark.parametrize("args", [(2**62, 2**63 + 10, 2**61), (2**63 - 2, 2**63 + 2), (2**64 - 3, 2**64),
                                  (2**63 + 5, 2**63, -2), (2**64 - 1, 2**63, -(2**61))])  # fmt: skip
def test_an_int_arange_past_int64_of_values_ge_0_is_uint64_and_exact(args: tuple[int, ...]) -> None:
    t = Tensor.arange(*args)
    assert t.dtype == dtypes.uint64 and t.tolist() == list(range(*args))


@pytest.mark.parametrize(
    "args", [(-1, 2**63 + 10, 2**62 + 2), (2**63, -(2**62) - 1, -(2**62)), (-(2**63) - 1, 0, 2**62)]
)
def test_an_int_arange_no_int_dtype_holds_is_an_overflow_error(args: tuple[int, ...]) -> None:
    with pytest.raises(TensorOverflowError, match=r"no int dtype holds .*split the range or pass float bounds"):
        Tensor.arange(*args)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 255), st.integers(0, 255), st.integers(-40, -1),
       st.sampled_from([dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64]))  # fmt: skip
def test_an_unsigned_arange_counts_down_like_numpy(start: int, stop: int, step: int, dt: Any) -> None:
    want = np.arange(start, stop, step, dtype=np.int64)
    assert Tensor.arange(start, stop, step, dtype=dt).tolist() == want.tolist()


BAD_OUTPUT_PADDING = [dict(output_padding=-1), dict(stride=2, output_padding=2),
                      dict(stride=(2, 1), output_padding=(1, 1)), dict(dilation=2, output_padding=(0, 2))]  # fmt: skip


@pytest.mark.parametrize("kw", BAD_OUTPUT_PADDING)
def test_conv_transpose_output_padding_must_be_below_stride_or_dilation(kw: dict[str, Any]) -> None:
    x, w = Tensor.ones(1, 2, 4, 4), Tensor.ones(2, 3, 3, 3)
    with pytest.raises(TensorValueError, match=r"output_padding .* must be >= 0 and below the stride"):
        x.conv_transpose2d(w, **kw)


@pytest.mark.parametrize("stride, dilation, op", [(2, 1, 1), (3, 1, 2), (1, 2, 1), ((2, 1), 1, (1, 0))])
def test_conv_transpose_output_padding_in_range_adds_that_many_rows(stride: Any, dilation: int, op: Any) -> None:
    rng = np.random.default_rng(0)
    x, w = (
        Tensor(rng.standard_normal((1, 2, 4, 4), dtype=np.float32)),
        Tensor(rng.standard_normal((2, 3, 3, 3), dtype=np.float32)),
    )
    base = x.conv_transpose2d(w, stride=stride, dilation=dilation).numpy()
    out = x.conv_transpose2d(w, stride=stride, dilation=dilation, output_padding=op).numpy()
    ops = op if isinstance(op, tuple) else (op, op)
    assert out.shape[2:] == (base.shape[2] + ops[0], base.shape[3] + ops[1])
    # the added rows and columns get no input (no bias here): zeros; the rest is the plain result
    np.testing.assert_allclose(out[:, :, : base.shape[2], : base.shape[3]], base, rtol=1e-5, atol=1e-5)
    assert not out[:, :, base.shape[2] :].any() and not out[:, :, :, base.shape[3] :].any()


def test_conv_transpose_weight_channels_must_split_into_the_groups() -> None:
    with pytest.raises(TensorValueError, match=r"weight \(3, 4, 3, 3\) has 3 input channels, .* groups=2"):
        Tensor.ones(1, 3, 8, 8).conv_transpose2d(Tensor.ones(3, 4, 3, 3), groups=2)


def test_a_path_tensor_reads_the_file_it_was_made_from(tmp_path: pathlib.Path) -> None:
    # the file was mapped at the first read: removed before it, the path was created again, empty, and read as
    # zeros (leaving a new file behind); replaced, the new file's bytes were read
    want = np.arange(4, dtype=np.float32)
    (path := tmp_path / "w.bin").write_bytes(want.tobytes())
    removed = Tensor(path, dtype=dtypes.float32)
    path.unlink()
    np.testing.assert_array_equal(removed.numpy(), want)
    assert not path.exists()
    path.write_bytes(want.tobytes())
    replaced = Tensor(path, dtype=dtypes.float32)
    (new := tmp_path / "new.bin").write_bytes(np.full(4, 7, dtype=np.float32).tobytes())
    new.replace(path)
    np.testing.assert_array_equal(replaced.to("CPU").numpy(), want)
    np.testing.assert_array_equal(Tensor(path, dtype=dtypes.float32).numpy(), np.full(4, 7, dtype=np.float32))


MEMORYVIEWS = [
    np.arange(4, dtype=np.float32),
    np.arange(6, dtype=np.float32).reshape(2, 3),
    np.arange(6, dtype=np.uint8).reshape(3, 2),
    np.array([-1, 2, -128], dtype=np.int8),
    np.array([True, False]),
    np.arange(12, dtype=np.int16)[::3],
    np.arange(3, dtype=np.float64),
]


@pytest.mark.parametrize("arr", MEMORYVIEWS, ids=lambda a: f"{a.dtype}{a.shape}")
def test_a_typed_memoryview_holds_values_as_numpy_reads_them(arr: np.ndarray) -> None:
    # a float32 memoryview of shape (2, 3) was read as its 24 raw bytes (uint8, flat)
    t = Tensor(memoryview(arr))
    want = np.asarray(memoryview(arr))
    assert t.shape == want.shape and t.numpy().dtype == want.dtype
    np.testing.assert_array_equal(t.numpy(), want)


def test_a_flat_byte_memoryview_is_bytes_reinterpreted_by_dtype() -> None:
    raw = np.array([1.5, -2.0], dtype=np.float32).tobytes()
    assert Tensor(memoryview(raw)).tolist() == list(raw)
    assert Tensor(memoryview(bytearray(raw)), dtype=dtypes.float32).tolist() == [1.5, -2.0]
