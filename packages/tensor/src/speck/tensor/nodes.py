"""The graph leaves a Tensor is made from, below tensor.py so that the modules defining Tensor's methods can build
them without importing tensor.py: dtype coercion of user arguments, constants, the lazy iota, host data (numpy
arrays, nested lists, files) copied into or mapped as a buffer, a copy to another device, and the counter that
gives every clone its own tag."""

from __future__ import annotations

import itertools
import pathlib
from typing import Any

import numpy as np

from speck.codegen.numeric import storage_np
from speck.tensor.device import file_backed
from speck.tensor.errors import (
    TensorDTypeError,
    TensorFileNotFoundError,
    TensorOverflowError,
    TensorTypeError,
    TensorValueError,
)
from speck.tensor.realize import get_buffer
from speck.tensor.schedule import host_arrays, max_dim, new_buffer_uop
from speck.uop import DType, Ops, UOp, dtypes, sint, to_dtype
from speck.uop.dtype import PtrDType, cast_value
from speck.uop.errors import UnknownDTypeError

_NP_TO_DT: dict[Any, DType] = {
    np.dtype(np.bool_): dtypes.bool, np.dtype(np.int8): dtypes.int8, np.dtype(np.uint8): dtypes.uint8,
    np.dtype(np.int16): dtypes.int16, np.dtype(np.uint16): dtypes.uint16, np.dtype(np.int32): dtypes.int32,
    np.dtype(np.uint32): dtypes.uint32, np.dtype(np.int64): dtypes.int64, np.dtype(np.uint64): dtypes.uint64,
    np.dtype(np.float16): dtypes.float16, np.dtype(np.float32): dtypes.float32, np.dtype(np.float64): dtypes.float64,
}  # fmt: skip

# a fresh tag per clone keeps two clones of one tensor from sharing a buffer (pickling takes a new one on load)
_clone_counter = itertools.count()


def _dt(x: DType | str | None, weak_ok: bool = False) -> DType | None:
    """A dtype argument (DType, name, numpy type or dtype) as the DType a tensor can have; None stays None. Weak
    dtypes only where `weak_ok` (casts, Python scalars): storage needs a width."""
    if x is None:
        return None
    if isinstance(x, type) and issubclass(x, np.generic):
        x = np.dtype(x)
    if isinstance(x, np.dtype):
        if x not in _NP_TO_DT:
            raise TensorDTypeError(f"numpy dtype {x} has no speck equivalent; use a numeric or bool dtype")
        x = _NP_TO_DT[x]
    try:
        d = to_dtype(x)
    except UnknownDTypeError as e:
        raise TensorDTypeError(str(e)) from None
    if isinstance(d, PtrDType) or d.count != 1:  # (a pointer or vector dtype failed deep in codegen, or a KeyError)
        elem = d.base.scalar() if isinstance(d, PtrDType) else d.scalar()  # (a pointer's scalar is a pointer)
        raise TensorDTypeError(f"a tensor's dtype is a scalar dtype, got {d}; use its element type, {elem}, and a "
                               "shape")  # fmt: skip
    if d == dtypes.void or (d.is_weak and not weak_ok):
        raise TensorValueError(f"tensors with storage can't have dtype {d}; use a concrete dtype such as float32 or "
                               "int32")  # fmt: skip
    return d


def _iota_uop(n: sint, device: str) -> UOp:
    """A lazy [0, 1, ..., n-1]: an IOTA marker the scheduler lowers straight to the dimension's index (no memory, no
    reduce), reshaped to give it a shape. int32, or int64 when n - 1 is beyond int32 (never a wrapped position)."""
    dt = dtypes.int32 if max_dim(n) - 1 <= dtypes.max(dtypes.int32) else dtypes.int64
    return UOp(Ops.NOOP, dt, (UOp(Ops.DEVICE, arg=device),), "iota").reshape((n,))


def _from_numpy(arr: np.ndarray, dt: DType, device: str, wrap: bool = False) -> UOp:
    """A realized BUFFER holding arr (copied in now), viewed with arr's shape. `wrap`: arr (of dt's numpy type) is
    kept by reference and copied in when the buffer's storage is made (schedule.host_arrays), as tinygrad's
    Tensor(ndarray) wraps the array until realized; a file-backed device still takes it now."""
    size = int(arr.size)
    buf = new_buffer_uop(device, size, dt)
    if wrap and size and not file_backed(device):
        host_arrays[buf] = arr
    elif size:
        b = get_buffer(buf)
        if file_backed(device):  # (a file is mapped read-only until something writes it)
            b.make_writable()
        b.copyin(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))
    return buf.reshape(arr.shape) if arr.shape != (size,) else buf


def copy_uop(u: UOp, dst: str, src: str) -> UOp:
    """u (on device src) on device dst: the node itself when it is already there, else a COPY."""
    return u if dst == src else UOp(Ops.COPY, u.dtype, (u, UOp(Ops.DEVICE, arg=dst)), dst)


def _const_uop(value: int | float | bool, dtype: DType, device: str) -> UOp:
    """A 0-d constant of dtype on device (a weak dtype keeps the Python value exactly, converted to its kind)."""
    v = cast_value(value, dtype) if not dtype.is_weak else (int(value) if dtype is dtypes.weakint else float(value))
    return UOp(Ops.CONST, dtype, (UOp(Ops.DEVICE, arg=device),), v)


MAX_NEST = 64  # numpy's limit on dims
MAX_NESTED_NUMBERS = 2**31  # 16 GiB of list pointers alone: more is a nest that shares its sublists


def _nest_budget(data: Any) -> tuple[int, int]:
    """(lists, numbers) a rectangular nest shaped like data's first elements holds (a 0-d array or scalar counts as a
    number; the walk along first elements stops at MAX_NEST, where the nest is refused anyway)."""
    lists, width, x = 0, 1, data
    for _ in range(MAX_NEST + 1):
        if isinstance(x, np.ndarray) and x.ndim:
            return lists + width, width * x.size
        if not isinstance(x, (list, tuple)):
            return lists + 1, width
        lists += width
        width *= len(x)
        if not x:
            return lists, 0
        x = x[0]
    return lists, width


def _from_nested(data: Any, tensor_type: type) -> tuple[np.ndarray, DType]:
    """A nested list/tuple of Python scalars as a numpy array plus the dtype tinygrad infers for it (a tensor_type
    element is refused: Tensor.stack builds from tensors)."""
    flat: list[Any] = []
    # a rectangular nest has the shape its first elements give; one holding more lists or numbers than that is
    # ragged (numpy refuses it below), so the walk stops there: a list holding itself, or one that shares its
    # sublists 2**60 ways, would otherwise never end
    max_lists, max_flat = _nest_budget(data)
    if max(max_flat, max_lists) > MAX_NESTED_NUMBERS:  # (only a nest sharing its sublists claims this many)
        raise TensorValueError(f"can't make a Tensor from a nested sequence of {max_flat} numbers in {max_lists} "
                               f"lists (more than {MAX_NESTED_NUMBERS}); build large tensors from a numpy array or "
                               "with Tensor.full")  # fmt: skip
    stack: list[tuple[Any, int]] = [(data, 0)]
    lists = 0
    while stack:
        seq, depth = stack.pop()
        lists += 1
        if depth >= MAX_NEST or lists > max_lists or len(flat) > max_flat:
            raise TensorValueError(
                "can't make a Tensor from this nested sequence: it is ragged, nested more than "
                f"{MAX_NEST} deep (numpy's limit on dims) or holds itself; give a rectangular nest of numbers"
            )
        for x in seq:
            if isinstance(x, (list, tuple)):
                stack.append((x, depth + 1))
            elif isinstance(x, np.ndarray):  # its values, so that their kind counts (arrays of ints read as bools)
                v = x.tolist()
                stack.append((v, depth + 1)) if isinstance(v, list) else flat.append(v)
            elif isinstance(x, tensor_type):
                raise TensorTypeError("can't build a Tensor from a list containing Tensors; use Tensor.stack")
            elif isinstance(x, (bool, int, float, np.bool_, np.number)):
                flat.append(x)
            else:  # numpy would make strings or objects of these, torch refuses them
                raise TensorTypeError(f"can't make a Tensor from a sequence holding {type(x).__name__} {x!r:.40}; "
                                      "expected numbers or bools, in (nested) lists or tuples")  # fmt: skip
    if any(isinstance(x, float) or isinstance(x, np.floating) for x in flat):
        dt = dtypes.default_float
    elif any(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) for x in flat):
        dt = dtypes.default_int
    elif flat:
        dt = dtypes.bool
    else:
        dt = dtypes.default_float
    try:
        arr = np.array(data, dtype=np.float64 if dtypes.is_float(dt) else (np.int64 if dtypes.is_int(dt) else np.bool_))
    except OverflowError as e:
        if dtypes.is_int(dt) and all(0 <= int(x) < 2**64 for x in flat):  # beyond int64 but non-negative: uint64
            return np.array(data, dtype=np.uint64), dtypes.uint64
        raise TensorOverflowError(f"can't make a Tensor from this nested sequence: an int is beyond int64 ({e}); "
                                  "give its values as floats or split them") from None  # fmt: skip
    except ValueError as e:
        raise TensorValueError(f"can't make a Tensor from this nested sequence: {e}") from None
    if dtypes.is_int(dt) and arr.size and (int(arr.min()) < dtypes.min(dt) or int(arr.max()) > dtypes.max(dt)):
        dt = dtypes.int64  # ints beyond the default int make an int64 tensor (as numpy and torch do), never wrap
    return arr, dt


def _np_cast(arr: np.ndarray, dt: DType) -> np.ndarray:
    with np.errstate(all="ignore"):
        target = storage_np(dt)
        if arr.dtype == target:
            return arr
        if np.issubdtype(arr.dtype, np.floating) and np.issubdtype(np.dtype(target), np.integer):
            return _float_to_int(arr, target)
        return arr.astype(target)  # (int -> int wraps like a C cast)


def _float_to_int(arr: np.ndarray, target: Any) -> np.ndarray:
    """float -> int on the host as `cast()` does on the devices and in constant folding (speck.uop.dtype.cast_value):
    NaN and +-inf are 0, the rest truncate toward zero and wrap to the width. numpy's astype gives INT_MIN for all
    of those, so `Tensor([nan], dtype=int32)` and `Tensor([nan]).cast(int32)` differed."""
    a = np.trunc(arr.astype(np.float64))
    a = np.fmod(np.where(np.isfinite(a), a, 0.0), 2.0**64)  # (fmod is exact: the value mod 2**64, its sign kept)
    a = np.where(a >= 2.0**63, a - 2.0**64, np.where(a < -(2.0**63), a + 2.0**64, a))  # into int64's range, exactly
    return a.astype(np.int64).astype(target)  # (int64 -> narrower or unsigned wraps)


_UINT_OF_SIZE = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}


def _disk_tensor(path: pathlib.Path, dt: DType) -> UOp:
    """A 1-d DISK tensor over the file at path: its bytes as dt (size // itemsize elements), read when used. The
    file is mapped now: it reads the file that was there, even if the path is removed or replaced before the first
    read (mapped then, a removed file was created again, empty, and read as zeros)."""
    p = path.resolve()
    if not p.is_file():
        raise TensorFileNotFoundError(f"Tensor(pathlib.Path): {p} is not a file")
    buf = new_buffer_uop(f"DISK:{p}", p.stat().st_size // dt.itemsize, dt)
    get_buffer(buf).ensure_allocated()
    return buf
