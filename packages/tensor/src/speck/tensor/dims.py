"""Dimension helpers shared by the Tensor modules."""

from __future__ import annotations

from typing import Any

from speck.uop import UOp


def as_int(x: Any) -> int:
    """A dim as a Python int; a clear error for a symbolic dim where the operation needs a concrete size."""
    if isinstance(x, UOp):
        raise RuntimeError(f"this operation needs a concrete size, got the symbolic dim {x.render()}; bind it first")
    return int(x)
