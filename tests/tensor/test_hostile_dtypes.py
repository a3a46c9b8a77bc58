"""Hostile round 4, dtype arguments: a pointer or vector DType (dtypes.float32.ptr(), .vec(4)) given where a tensor's
dtype belongs was a bare KeyError (zeros, full), an error deep in codegen (ProgramFormError, UnsupportedOpError),
or silently made a tensor of that dtype (arange, empty); zeros(dtype='') silently meant the default float. Each
is now a TensorDTypeError; names, numpy types and numpy dtypes keep working."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from speck.tensor import Tensor, dtypes
from speck.tensor.errors import TensorDTypeError, TensorError

TAKERS: dict[str, Callable[[Any], Tensor]] = {
    "Tensor": lambda d: Tensor([1, 2], dtype=d),
    "cast": lambda d: Tensor([1, 2]).cast(d),
    "bitcast": lambda d: Tensor([1, 2]).bitcast(d),
    "zeros": lambda d: Tensor.zeros(2, dtype=d),
    "ones": lambda d: Tensor.ones(2, dtype=d),
    "full": lambda d: Tensor.full((2,), 1, dtype=d),
    "empty": lambda d: Tensor.empty(2, dtype=d),
    "arange": lambda d: Tensor.arange(3, dtype=d),
    "rand": lambda d: Tensor.rand(2, dtype=d),
    "sum": lambda d: Tensor([1, 2]).sum(dtype=d),
}
JUNK: dict[str, Any] = {
    "ptr": dtypes.float32.ptr(),
    "vec": dtypes.float32.vec(4),
    "int_vec": dtypes.int32.vec(2),
    "empty_name": "",
    "unknown_name": "bogus",
    "python_type": float,
    "number": 3,
    "list": [dtypes.float32],
    "complex_numpy": np.complex64,
    "object_numpy": np.dtype("O"),
}


@pytest.mark.parametrize("junk", sorted(JUNK))
@pytest.mark.parametrize("taker", sorted(TAKERS))
def test_a_dtype_that_no_tensor_can_have_is_refused(taker: str, junk: str) -> None:
    with pytest.raises(TensorError) as ei:
        TAKERS[taker](JUNK[junk]).realize()
    assert isinstance(ei.value, (TypeError, ValueError, AttributeError)), type(ei.value)
    if junk in ("ptr", "vec", "int_vec"):
        assert isinstance(ei.value, TensorDTypeError) and "scalar dtype" in str(ei.value)


GOOD: list[tuple[Any, type]] = [
    ("float32", np.float32),
    ("FLOAT32", np.float32),
    ("half", np.float16),
    (np.float16, np.float16),
    (np.dtype("int16"), np.int16),
    (dtypes.uint8, np.uint8),
]


@pytest.mark.parametrize("good, want", GOOD, ids=repr)
def test_names_and_numpy_dtypes_still_name_dtypes(good: Any, want: type) -> None:
    for taker in ("Tensor", "cast", "zeros", "full", "arange"):
        assert TAKERS[taker](good).numpy().dtype == want, taker
