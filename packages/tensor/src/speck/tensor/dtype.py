"""The dtype namespace a tinygrad user imports (`from tinygrad.dtype import dtypes, DType, least_upper_dtype`):
speck.uop's dtypes plus the numpy (and, for code that compares with torch, torch) conversions."""

from __future__ import annotations

import functools
import importlib
import math
from typing import Any

import numpy as np

from speck.tensor.errors import TensorKeyError, TensorValueError
from speck.uop.dtype import (
    CONCRETE_SCALARS,
    DEFAULT_FLOAT,
    DEFAULT_INT,
    FP8_FORMATS,
    AddrSpace,
    ConstType,
    DType,
    Invalid,
    InvalidType,
    PtrDType,
    _fp8_bits,
    _fp8_from_bits,
    can_lossless_cast,
    dtypes,
    float_to_bf16,
    float_to_fp16,
    from_storage_scalar,
    least_upper_dtype,
    least_upper_float,
    storage_fmt_for_dtype,
    strong_dtype,
    sum_acc_dtype,
    to_dtype,
    to_storage_scalar,
    truncate,
    truncate_bf16,
    truncate_fp16,
    weak_dtype,
)

DTypeLike = DType | str
# tinygrad's older name for the same question: can every value of the first dtype be represented in the second
can_safe_cast = can_lossless_cast

# every storage dtype by each of its attribute names on `dtypes` (aliases included; no weak types, no void)
DTYPES_DICT: dict[str, DType] = {k: v for k, v in dtypes.fields().items() if not v.is_weak and v != dtypes.void}
# a dtype's C-like name -> the attribute its repr shows
INVERSE_DTYPES_DICT: dict[str, str] = {v.name: v.short_name for v in DTYPES_DICT.values()}


def _to_np_dtype(dtype: DType) -> type | None:
    """The numpy scalar type with dtype's layout, or None where numpy has none (bfloat16, fp8)."""
    return None if dtype.fmt is None else np.dtype(dtype.fmt).type


def _from_np_dtype(npdtype: Any) -> DType:
    """The speck dtype of a numpy dtype (by name); KeyError for kinds speck has not (complex, str, object...)."""
    name = np.dtype(npdtype).name
    if name not in DTYPES_DICT:
        raise TensorKeyError(f"numpy dtype {name!r} has no speck equivalent; use one of {', '.join(DTYPES_DICT)}")
    return DTYPES_DICT[name]


# torch's attribute for the dtypes numpy has no name for (the others are spelled as numpy spells them)
_TORCH_NAMES = {dtypes.bfloat16: "bfloat16", dtypes.fp8e4m3: "float8_e4m3fn", dtypes.fp8e5m2: "float8_e5m2",
                dtypes.fp8e4m3fnuz: "float8_e4m3fnuz", dtypes.fp8e5m2fnuz: "float8_e5m2fnuz"}  # fmt: skip


def _to_torch_dtype(dtype: DType) -> Any:
    """The torch dtype with dtype's layout, or None where torch (this version) has none. torch is imported here, on
    first use: it is never a dependency of speck."""
    torch = importlib.import_module("torch")
    if dtype not in CONCRETE_SCALARS:
        return None
    name = _TORCH_NAMES[dtype] if dtype in _TORCH_NAMES else np.dtype(dtype.fmt).name
    return getattr(torch, name, None)


def _from_torch_dtype(torch_dtype: Any) -> DType:
    """The speck dtype of a torch dtype (the inverse of `_to_torch_dtype`); KeyError for those speck has not."""
    for dt in CONCRETE_SCALARS:
        if _to_torch_dtype(dt) == torch_dtype:
            return dt
    raise TensorKeyError(f"torch dtype {torch_dtype} has no speck equivalent")


class ImageDType(PtrDType):
    """tinygrad's dtype of a texture (an image of `shape`, float16 or float32 texels) on GPUs with image units. No
    speck device has textures, so no buffer or kernel ever has this dtype; it exists so code can ask
    `isinstance(dt, ImageDType)` (always False for speck's dtypes). Made with `imagef(shape)` / `imageh(shape)`."""

    __slots__ = ("shape",)
    shape: tuple[int, ...]

    def __init__(self, base: DType, shape: tuple[int, ...]) -> None:
        super().__init__(base, AddrSpace.GLOBAL, 1, math.prod(shape))
        object.__setattr__(self, "shape", tuple(shape))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_image, (self.base, self.shape))

    def __repr__(self) -> str:
        return f"dtypes.{'imageh' if self.base == dtypes.float16 else 'imagef'}({self.shape})"


@functools.cache
def _image(base: DType, shape: tuple[int, ...]) -> ImageDType:
    return ImageDType(base, shape)


def imagef(shape: tuple[int, ...]) -> ImageDType:
    """The float32 image dtype of `shape` (see ImageDType: no speck device computes with it)."""
    return _image(dtypes.float32, tuple(shape))


def imageh(shape: tuple[int, ...]) -> ImageDType:
    """The float16 image dtype of `shape` (see ImageDType: no speck device computes with it)."""
    return _image(dtypes.float16, tuple(shape))


def _fp8_format(dtype: DType) -> Any:
    if dtype not in FP8_FORMATS:
        raise TensorValueError(f"{dtype} is not an fp8 dtype; use one of {', '.join(str(d) for d in FP8_FORMATS)}")
    return FP8_FORMATS[dtype]


def float_to_fp8(x: float, dtype: DType) -> int:
    """The fp8 bit pattern (0..255) of x rounded to the nearest `dtype` value (saturating where the format has no
    infinity)."""
    return _fp8_bits(float(x), _fp8_format(dtype))


def fp8_to_float(x: int, dtype: DType) -> float:
    """The value an fp8 bit pattern (0..255) of `dtype` stands for."""
    return _fp8_from_bits(int(x) & 0xFF, _fp8_format(dtype))


__all__ = [
    "DEFAULT_FLOAT", "DEFAULT_INT", "DTYPES_DICT", "INVERSE_DTYPES_DICT", "AddrSpace", "ConstType", "DType",
    "DTypeLike", "ImageDType", "Invalid", "InvalidType", "PtrDType", "_from_np_dtype", "_from_torch_dtype",
    "_to_np_dtype", "_to_torch_dtype", "can_lossless_cast", "can_safe_cast", "dtypes",
    "float_to_bf16", "float_to_fp16", "float_to_fp8", "fp8_to_float", "from_storage_scalar", "imagef", "imageh",
    "storage_fmt_for_dtype", "strong_dtype", "to_storage_scalar", "truncate_bf16", "truncate_fp16", "weak_dtype",
    "least_upper_dtype", "least_upper_float", "sum_acc_dtype", "to_dtype", "truncate",
]  # fmt: skip
