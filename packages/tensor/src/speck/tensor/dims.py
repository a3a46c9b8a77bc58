"""Dimension helpers shared by the Tensor modules."""

from __future__ import annotations

from typing import Any

from speck.tensor.errors import TensorValueError
from speck.uop import UOp


def argfix(*x: Any) -> tuple[Any, ...]:
    """Accept f(1, 2), f((1, 2)) and f([1, 2]) alike -> (1, 2)."""
    if x and isinstance(x[0], (tuple, list)):
        if len(x) != 1:
            raise TensorValueError(f"bad arguments {x}: pass either one sequence or separate values")
        return tuple(x[0])
    return tuple(x)


def as_int(x: Any) -> int:
    """A dim as a Python int; a clear error for a symbolic dim where the operation needs a concrete size."""
    if isinstance(x, UOp):
        raise TensorValueError(
            f"this operation needs a concrete size, got the symbolic dim {x.render()}; bind it first"
        )
    return int(x)
