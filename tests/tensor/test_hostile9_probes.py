"""Hostile round 9. Probes that found a silent wrong result or data lost without a word:

* `arange` of ints past int64 wrapped (arange(2**62, 2**63 + 1, 2**61) ended at -2**63); it is uint64 when every
  value is >= 0 (as Tensor([2**63]) is), else a TensorOverflowError. A negative step with an unsigned dtype
  (arange(10, 0, -1, dtype=uint8), which torch makes) was refused naming the literal -1.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import Tensor, dtypes
from speck.tensor.errors import TensorOverflowError


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
