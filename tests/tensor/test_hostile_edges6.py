"""Hostile inputs that gave a silently wrong or backend-dependent result: a bool whose bytes are not 0/1 - in a
safetensors entry read lazily, a raw file viewed as bool, a pickle stream or from_blob memory - which CLANG and X86
kernels used as it is (`sum` gave 258, `logical_not` True); `maximum`/`max` of 0.0 and -0.0, whose sign differed
between the PYTHON backend and the compiled ones; a DISK tensor whose file shrank before its first read. Every backend
now agrees: a nonzero bool byte is True (numpy's `np.frombuffer(b, bool)`; from_blob's memory, read in place, must
hold 0/1), MAX follows one documented rule (`b if b > a or b is NaN else a`: NaN propagates, of two equal operands
the first wins), and the shrunken file is an error that says to load it again."""

from __future__ import annotations

import json
import math
import pathlib
import pickle
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.hcq.errors import HCQError
from speck.tensor import Tensor, dtypes
from speck.tensor.errors import TensorDTypeError, TensorValueError
from speck.tensor.nn.state import safe_load

BACKENDS = ["CPU", pytest.param("CPU:CLANG", marks=pytest.mark.c_backend), "CPU:X86", "PYTHON"]

ODD_BOOL_BYTES = bytes([2, 0, 255, 1, 0, 128, 1, 7])
ASCII_BOOL_BYTES = bytes([2, 0, 127, 1, 0, 64, 1, 7])


def _bool_file(path: pathlib.Path, data: bytes) -> pathlib.Path:
    js = json.dumps({"b": {"dtype": "BOOL", "shape": [len(data)], "data_offsets": [0, len(data)]}}).encode()
    path.write_bytes(struct.pack("<Q", len(js)) + js + data)
    return path


@pytest.mark.parametrize("device", BACKENDS)
def test_a_files_bool_bytes_other_than_0_1_read_as_numpy_reads_them(tmp_path: pathlib.Path, device: str) -> None:
    ref = np.frombuffer(ODD_BOOL_BYTES, bool)
    path = _bool_file(tmp_path / "b.safetensors", ODD_BOOL_BYTES)
    t = safe_load(path)["b"]
    assert str(t.device).startswith("DISK")
    x = t.to(device)
    assert x.tolist() == ref.tolist()
    assert x.logical_not().tolist() == (~ref).tolist()
    assert x.sum().item() == int(ref.sum())
    assert x.cast(dtypes.uint8).tolist() == ref.astype(np.uint8).tolist()
    assert [int(v) for v in x.cast(dtypes.int32).tolist()] == ref.astype(np.int32).tolist()
    assert (x == True).tolist() == ref.tolist()  # noqa: E712
    assert x.where(1, 0).tolist() == ref.astype(np.int64).tolist()
    assert x.bitcast(dtypes.uint8).tolist() == ref.view(np.uint8).astype(bool).astype(np.uint8).tolist()
    assert t[1:7].to(device).logical_not().tolist() == (~ref[1:7]).tolist()  # a contiguous view of the file
    assert (t.to(device) & Tensor(np.ones(len(ref), bool), device=device)).tolist() == ref.tolist()


@pytest.mark.parametrize("device", BACKENDS)
def test_a_strided_view_of_a_files_bool_bytes(tmp_path: pathlib.Path, device: str) -> None:
    ref = np.frombuffer(ODD_BOOL_BYTES, bool)
    t = safe_load(_bool_file(tmp_path / "b.safetensors", ODD_BOOL_BYTES))["b"]
    assert t[::2].to(device).logical_not().tolist() == (~ref[::2]).tolist()
    assert t.reshape(2, 4).T.to(device).sum(0).tolist() == ref.reshape(2, 4).T.sum(0).tolist()


def test_a_files_0_1_bool_bytes_are_copied_as_they_are(tmp_path: pathlib.Path) -> None:
    ref = np.array([1, 0, 0, 1, 1], np.uint8)
    t = safe_load(_bool_file(tmp_path / "b.safetensors", ref.tobytes()))["b"]
    assert t.to("CPU:X86").bitcast(dtypes.uint8).tolist() == ref.tolist()


# ---------------- MAX: NaN, infinities, signed zeros ----------------
SPECIAL = [0.0, -0.0, math.nan, math.inf, -math.inf, 1.0, -1.0, 5e-45]
ROWS, COLS = 4, 6


def _bits(a: np.ndarray) -> list[int]:
    """float values as bit patterns, every NaN as one pattern (NaN payloads are not specified)."""
    a = np.asarray(a)
    return np.where(np.isnan(a), a.dtype.type(np.nan), a).view(f"u{a.dtype.itemsize}").tolist()


def _max_rule(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The documented MAX: b if b > a or b is NaN, else a (of two equal operands, the first)."""
    return np.where((b > a) | np.isnan(b), b, a)


def _min_rule(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """minimum is -MAX(-a, -b): NaN propagates, of two equal operands the first."""
    return -_max_rule(-a, -b)


grids = st.lists(st.sampled_from(SPECIAL), min_size=ROWS * COLS, max_size=ROWS * COLS).map(
    lambda v: np.array(v, np.float32).reshape(ROWS, COLS)
)


@pytest.mark.parametrize("device", BACKENDS)
@pytest.mark.parametrize("np_dt", [np.float32, np.float16, np.float64])
@settings(max_examples=15)
@given(a=grids, b=grids)
def test_maximum_minimum_follow_one_rule_on_every_backend(device: str, np_dt: Any, a: np.ndarray,
                                                          b: np.ndarray) -> None:  # fmt: skip
    a, b = a.astype(np_dt), b.astype(np_dt)
    A, B = Tensor(a, device=device), Tensor(b, device=device)
    mx, mn = A.maximum(B).numpy(), A.minimum(B).numpy()
    # numpy agrees on every value and on where NaN is; of 0.0 and -0.0 numpy picks the second operand
    np.testing.assert_array_equal(mx, np.maximum(a, b))
    np.testing.assert_array_equal(mn, np.minimum(a, b))
    assert _bits(mx) == _bits(_max_rule(a, b))
    assert _bits(mn) == _bits(_min_rule(a, b))


@pytest.mark.parametrize("device", BACKENDS)
@settings(max_examples=15)
@given(a=grids)
def test_max_min_reductions_match_numpy_on_every_backend(device: str, a: np.ndarray) -> None:
    A = Tensor(a, device=device)
    for axis in (0, 1, None):
        np.testing.assert_array_equal(A.max(axis).numpy(), np.max(a, axis))
        np.testing.assert_array_equal(A.min(axis).numpy(), np.min(a, axis))


@pytest.mark.parametrize("device", BACKENDS)
def test_max_of_signed_zeros_takes_the_first_operand_on_every_backend(device: str) -> None:
    a = np.array([0.0, -0.0, 0.0, -0.0], np.float32)
    b = np.array([-0.0, 0.0, 0.0, -0.0], np.float32)
    A, B = Tensor(a, device=device), Tensor(b, device=device)
    assert np.signbit(A.maximum(B).numpy()).tolist() == [False, True, False, True]
    assert np.signbit(A.minimum(B).numpy()).tolist() == [False, True, False, True]
    assert np.signbit(Tensor(np.stack([a, b], 1), device=device).max(1).numpy()).tolist() == [False, True, False, True]


@pytest.mark.parametrize("device", BACKENDS)
def test_from_blob_of_bool_memory_holding_other_bytes_is_refused(device: str) -> None:
    mem = np.frombuffer(ODD_BOOL_BYTES, np.uint8).copy()
    with pytest.raises(TensorValueError, match=r"byte 2 at offset 0 \(4 bytes other than 0/1\).*dtype=dtypes.uint8"):
        Tensor.from_blob(mem.ctypes.data, (len(mem),), dtype=dtypes.bool, device=device)
    # what the message suggests reads it as numpy does; memory of 0/1 bytes is taken as it is
    ref = np.frombuffer(ODD_BOOL_BYTES, bool)
    as_u8 = Tensor.from_blob(mem.ctypes.data, (len(mem),), dtype=dtypes.uint8, device=device) != 0
    assert as_u8.logical_not().tolist() == (~ref).tolist()
    ok = ref.astype(np.uint8)
    t = Tensor.from_blob(ok.ctypes.data, (len(ok),), dtype=dtypes.bool, device=device)
    assert t.logical_not().tolist() == (~ref).tolist() and t.sum().item() == int(ref.sum())


@pytest.mark.parametrize("device", BACKENDS)
@pytest.mark.parametrize("protocol", [2, 5])
def test_a_pickle_streams_bool_bytes_other_than_0_1_unpickle_as_numpy_reads_them(device: str, protocol: int) -> None:
    # (bytes below 128: protocol 2 writes the buffer as a latin-1 string, whose UTF-8 would hide 255 from the splice)
    ref = np.frombuffer(ASCII_BOOL_BYTES, bool)
    stream = pickle.dumps(Tensor(ref.astype(np.uint8).astype(bool), device=device).realize(), protocol=protocol)
    at = stream.find(ref.astype(np.uint8).tobytes())
    assert at >= 0 and stream.count(ref.astype(np.uint8).tobytes()) == 1
    t = pickle.loads(stream[:at] + ASCII_BOOL_BYTES + stream[at + len(ASCII_BOOL_BYTES) :])
    assert t.logical_not().tolist() == (~ref).tolist() and t.sum().item() == int(ref.sum())
    assert t.bitcast(dtypes.uint8).tolist() == ref.astype(np.uint8).tolist()


@pytest.mark.parametrize("device", BACKENDS)
def test_a_files_bytes_viewed_as_bool_read_as_numpy_reads_them(tmp_path: pathlib.Path, device: str) -> None:
    ref = np.frombuffer(ODD_BOOL_BYTES, bool)
    (path := tmp_path / "raw.bin").write_bytes(ODD_BOOL_BYTES)
    assert Tensor(path).bitcast(dtypes.bool).to(device).logical_not().tolist() == (~ref).tolist()
    assert Tensor(path, dtype=dtypes.bool).to(device).sum().item() == int(ref.sum())


def test_a_file_truncated_before_its_disk_tensor_is_first_read_says_to_load_it_again(tmp_path: pathlib.Path) -> None:
    (path := tmp_path / "w.bin").write_bytes(np.arange(256, dtype=np.float32).tobytes())
    t = Tensor(path, dtype=dtypes.float32)
    with open(path, "r+b") as f:
        f.truncate(100)
    for read in (lambda: t.to("CPU").numpy(), t.numpy, lambda: t[10:20].tolist()):
        # (Tensor(path) maps the file when made: the truncation is found by the mapping's size check)
        with pytest.raises(HCQError, match=r"shrank to 100 bytes since it was mapped .*load it again"):
            read()
    assert path.stat().st_size == 100  # (reading never extends the file)
    path.write_bytes(np.arange(256, dtype=np.float32).tobytes())
    np.testing.assert_array_equal(Tensor(path, dtype=dtypes.float32)[10:20].numpy(), np.arange(10, 20))


@pytest.mark.parametrize(
    ("dt", "elem"),
    [(dtypes.float.vec(4), "dtypes.float"), (dtypes.float.ptr(), "dtypes.float"), (dtypes.int8.ptr(16), "dtypes.char"),
     (dtypes.half.vec(2).ptr(), "dtypes.half")],
)  # fmt: skip
def test_a_vector_or_pointer_dtype_names_the_element_type_to_use(dt: Any, elem: str) -> None:
    for make in (lambda: Tensor.empty(4, dtype=dt), lambda: Tensor([1.0]).cast(dt), lambda: Tensor([1.0]).bitcast(dt)):
        with pytest.raises(TensorDTypeError, match=rf"got .*; use its element type, {elem}, and a shape"):
            make()
