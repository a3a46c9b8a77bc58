"""The little speck.hcq needs to know about dtypes: a buffer has an itemsize and (when it has one) a struct format
character. Anything with `.itemsize` and `.fmt` (speck.uop's dtypes) or anything numpy understands is accepted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class DTypeInfo:
    """itemsize in bytes, struct format character (None when the type has none, e.g. bfloat16), and a name."""

    itemsize: int
    fmt: str | None
    name: str

    def numpy(self) -> np.dtype[Any]:
        """The numpy dtype with the same layout; raises TypeError when there is none."""
        if self.fmt is None:
            raise TypeError(f"dtype {self.name} has no numpy equivalent (no struct format); view it as bytes instead")
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
    if hasattr(dtype, "itemsize") and hasattr(dtype, "fmt"):
        info = DTypeInfo(int(dtype.itemsize), dtype.fmt or None, str(getattr(dtype, "name", dtype)))
    else:
        try:
            nd = np.dtype(dtype)
        except TypeError:
            raise TypeError(
                f"expected a dtype (an object with .itemsize and .fmt, or a numpy dtype), got {dtype!r}"
            ) from None
        if nd.fields is not None or nd.subdtype is not None or nd.itemsize == 0:
            raise TypeError(f"expected a scalar dtype, got the structured/unsized numpy dtype {nd}")
        info = DTypeInfo(nd.itemsize, nd.char if nd.char != "?" else "?", nd.name)
    try:
        _cache[dtype] = info
    except TypeError:
        pass
    return info


UINT8 = DTypeInfo(1, "B", "uint8")
