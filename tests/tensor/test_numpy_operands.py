"""numpy values on the left of a Tensor operator, and numpy reading a Tensor: the result is a Tensor computed like the
same op with the operands swapped (numpy hands the operator back), and np.asarray gives the values: never an object
array of 0-d Tensors (what numpy builds from an object it can index but does not know)."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.tensor import Tensor
from speck.tensor.errors import TensorValueError

OPS: list[Callable[[Any, Any], Any]] = [operator.add, operator.sub, operator.mul, operator.truediv, operator.lt,
                                        operator.eq, operator.pow, operator.gt]  # fmt: skip


@pytest.mark.parametrize("op", OPS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("left", [np.float32(1.5), np.int64(3), np.float64(-2.0), np.array([0.5, 2.0], np.float32)],
                         ids=["f32", "i64", "f64", "array"])  # fmt: skip
def test_numpy_value_on_the_left_gives_a_tensor(op: Callable[[Any, Any], Any], left: Any) -> None:
    x = np.array([1.0, 4.0], np.float32)
    got = op(left, Tensor(x))
    assert isinstance(got, Tensor)
    np.testing.assert_allclose(got.numpy(), op(left, x), rtol=1e-6)


def test_numpy_ufunc_called_on_a_tensor_is_refused_clearly() -> None:
    with pytest.raises(TypeError, match="ufunc"):
        np.add(np.ones(2), Tensor([1.0, 2.0]))


@given(st.lists(st.floats(-1e3, 1e3, width=32), min_size=0, max_size=6))
def test_asarray_gives_the_values(vals: list[float]) -> None:
    t = Tensor(np.array(vals, np.float32))
    got = np.asarray(t)
    assert got.dtype == np.float32 and got.shape == (len(vals),)
    np.testing.assert_array_equal(got, np.array(vals, np.float32))
    np.testing.assert_array_equal(np.array(t, dtype=np.float64), np.array(vals, np.float64))


def test_asarray_of_a_0d_tensor_and_a_stack_of_tensors() -> None:
    assert np.asarray(Tensor(3.0)).shape == () and float(np.asarray(Tensor(3.0))) == 3.0
    np.testing.assert_array_equal(np.stack([Tensor([1, 2]), Tensor([3, 4])]), [[1, 2], [3, 4]])


def test_asarray_without_a_copy_is_refused() -> None:
    with pytest.raises(TensorValueError, match="copy=False"):
        np.asarray(Tensor([1.0]), copy=False)
