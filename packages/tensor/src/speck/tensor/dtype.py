"""The dtype namespace a tinygrad user imports (`from tinygrad.dtype import dtypes, DType, least_upper_dtype`):
speck.uop's dtypes plus the numpy conversions speck.tensor uses."""

from __future__ import annotations

from typing import Any

import numpy as np

from speck.uop.dtype import (
    DEFAULT_FLOAT,
    DEFAULT_INT,
    FP8_FORMATS,
    AddrSpace,
    ConstType,
    DType,
    PtrDType,
    _fp8_bits,
    _fp8_from_bits,
    can_lossless_cast,
    dtypes,
    least_upper_dtype,
    least_upper_float,
    sum_acc_dtype,
    to_dtype,
    truncate,
)

# every named dtype, by its canonical name (no aliases, no weak or void)
DTYPES_DICT: dict[str, DType] = {
    k: v for k, v in dtypes.fields().items() if k == v.name and not v.is_weak and v != dtypes.void
}
INVERSE_DTYPES_DICT: dict[str, str] = {v.name: k for k, v in DTYPES_DICT.items()}


def _to_np_dtype(dtype: DType) -> type | None:
    """The numpy scalar type with dtype's layout, or None where numpy has none (bfloat16, fp8)."""
    return None if dtype.fmt is None else np.dtype(dtype.fmt).type


def _from_np_dtype(npdtype: Any) -> DType:
    """The speck dtype of a numpy dtype (by name); KeyError for kinds speck has not (complex, str, object...)."""
    name = np.dtype(npdtype).name
    if name not in DTYPES_DICT:
        raise KeyError(f"numpy dtype {name!r} has no speck equivalent; use one of {', '.join(DTYPES_DICT)}")
    return DTYPES_DICT[name]


def _fp8_format(dtype: DType) -> Any:
    if dtype not in FP8_FORMATS:
        raise ValueError(f"{dtype} is not an fp8 dtype; use one of {', '.join(str(d) for d in FP8_FORMATS)}")
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
    "PtrDType", "_from_np_dtype", "_to_np_dtype", "can_lossless_cast", "dtypes", "float_to_fp8", "fp8_to_float",
    "least_upper_dtype", "least_upper_float", "sum_acc_dtype", "to_dtype", "truncate",
]  # fmt: skip
