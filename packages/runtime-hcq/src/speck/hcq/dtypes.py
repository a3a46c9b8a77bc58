"""The little speck.hcq needs to know about dtypes: a buffer has an itemsize, (when it has one) a struct format
character, and the numpy dtype its memory reads as. Anything with `.itemsize` and `.fmt` (speck.uop's dtypes) or
anything numpy understands is accepted; for speck.uop's dtypes the numpy dtype comes from speck.codegen's storage
table (`speck.codegen.numeric.storage_np`: bfloat16 and fp8 read as their bit patterns)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from speck.codegen.numeric import storage_np
from speck.hcq.errors import HCQTypeError
from speck.uop import DType, PtrDType


@dataclass(frozen=True)
class DTypeInfo:
    """itemsize in bytes, struct format character (None when the type has none, e.g. bfloat16), a name, and the numpy
    dtype the memory is stored as (None: the one of `fmt`)."""

    itemsize: int
    fmt: str | None
    name: str
    storage: np.dtype[Any] | None = field(default=None, compare=False)

    def numpy(self) -> np.dtype[Any]:
        """The numpy dtype a buffer of this type is stored as; raises TypeError when there is none."""
        if self.storage is not None:
            return self.storage
        if self.fmt is None:
            raise HCQTypeError(
                f"dtype {self.name} has no numpy equivalent (no struct format); view it as bytes instead"
            )
        return np.dtype(self.fmt)


_cache: dict[Any, DTypeInfo] = {}


def dtype_info(dtype: Any) -> DTypeInfo:
    """Normalize a dtype-like (an object with .itemsize and .fmt, a numpy dtype or scalar type, or a struct format
    string) to a DTypeInfo. Raises TypeError naming what was given."""
    try:
        return _cache[dtype]
    except (KeyError, TypeError):
        pass
    info: DTypeInfo
    if isinstance(dtype, DTypeInfo):
        return dtype
    if isinstance(dtype, DType) and not isinstance(dtype, PtrDType) and dtype.count == 1 and not dtype.is_weak:
        storage = np.dtype(storage_np(dtype)) if dtype.itemsize else None
        # numpy's name ("float32") where the type has a struct format; DType.name is the C spelling ("float")
        name = np.dtype(dtype.fmt).name if dtype.fmt else dtype.short_name
        info = DTypeInfo(dtype.itemsize, dtype.fmt or None, name, storage)
    elif hasattr(dtype, "itemsize") and hasattr(dtype, "fmt"):
        info = DTypeInfo(int(dtype.itemsize), dtype.fmt or None, str(getattr(dtype, "name", dtype)))
    else:
        try:
            nd = np.dtype(dtype)
        except TypeError:
            raise HCQTypeError(
                f"expected a dtype (an object with .itemsize and .fmt, or a numpy dtype), got {dtype!r}"
            ) from None
        if nd.fields is not None or nd.subdtype is not None or nd.itemsize == 0:
            raise HCQTypeError(f"expected a scalar dtype, got the structured/unsized numpy dtype {nd}")
        if nd.kind not in "biufc":  # (an object buffer's bytes read back as PyObject pointers; str/void/datetime)
            raise HCQTypeError(f"expected a numeric or bool dtype, got the numpy dtype {nd} (kind {nd.kind!r}); "
                               "buffers hold numbers")  # fmt: skip
        info = DTypeInfo(nd.itemsize, nd.char if nd.char != "?" else "?", nd.name)
    try:
        _cache[dtype] = info
    except TypeError:
        pass
    return info


UINT8 = DTypeInfo(1, "B", "uint8")
