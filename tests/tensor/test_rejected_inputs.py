"""Arguments numpy and torch reject are rejected here too, with an error that says what was expected and what was
found: no silently wrong result, no bare ZeroDivisionError, no reshape error from deep inside the op."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from speck.tensor import Tensor, dtypes
from speck.tensor.errors import TensorError


def _rejected(fn: Callable[[], Any], cls: type[BaseException], *words: str) -> str:
    with pytest.raises(cls) as ei:
        out = fn()
        if isinstance(out, Tensor):
            out.realize()
    msg = str(ei.value)
    assert isinstance(ei.value, TensorError), f"{type(ei.value).__name__}: {msg}"
    assert "reshape" not in msg and not isinstance(ei.value, ZeroDivisionError), msg
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    return msg


@pytest.mark.parametrize("data", [["a", "b"], [1, "b"], [[1.0], ["x"]], [None, 1], [b"x"], [{"a": 1}]])
def test_a_tensor_of_non_numbers_is_a_type_error(data: Any) -> None:
    _rejected(lambda: Tensor(data), TypeError, "expected numbers")


def test_numbers_of_every_kind_still_make_tensors() -> None:
    assert Tensor([np.float32(1.5), 2, True]).tolist() == [1.5, 2.0, 1.0]
    assert Tensor([np.array([1, 2], np.int32), np.array([3, 4], np.int32)]).tolist() == [[1, 2], [3, 4]]
    assert Tensor([[True, False]]).dtype == dtypes.bool


X = Tensor(np.arange(2 * 3 * 6 * 6, dtype=np.float32).reshape(2, 3, 6, 6))
W = Tensor(np.ones((4, 3, 3, 3), np.float32))


@pytest.mark.parametrize("arg, value", [("stride", 0), ("stride", -1), ("stride", (1, 0)), ("dilation", 0),
                                        ("dilation", -2), ("dilation", (0, 1))])  # fmt: skip
def test_conv2d_needs_positive_stride_and_dilation(arg: str, value: Any) -> None:
    _rejected(lambda: X.conv2d(W, **{arg: value}), ValueError, arg, "positive", str(value))


def test_conv2d_negative_padding_crops_as_documented() -> None:
    # conv2d's padding follows pad(): a negative amount crops the input (TENSOR_API 7.4)
    got = X.conv2d(W, padding=-1).numpy()
    np.testing.assert_allclose(got, X[:, :, 1:-1, 1:-1].conv2d(W).numpy(), rtol=1e-6)
    assert got.shape == (2, 4, 2, 2)


def test_conv_transpose2d_needs_positive_stride_and_dilation() -> None:
    wt = Tensor(np.ones((3, 2, 3, 3), np.float32))
    _rejected(lambda: X.conv_transpose2d(wt, stride=0), ValueError, "stride", "positive")
    _rejected(lambda: X.conv_transpose2d(wt, dilation=0), ValueError, "dilation", "positive")


@pytest.mark.parametrize("pool", ["max_pool2d", "avg_pool2d"])
@pytest.mark.parametrize("arg, value", [("kernel_size", 0), ("kernel_size", (2, -1)), ("stride", 0), ("stride", -2),
                                        ("dilation", 0)])  # fmt: skip
def test_pooling_needs_positive_window_arguments(pool: str, arg: str, value: Any) -> None:
    kw = {"kernel_size": 2, arg: value}
    _rejected(lambda: getattr(X, pool)(**kw), ValueError, arg, "positive")


@pytest.mark.parametrize("reps", [(-1,), (2, -1), (-3, 1, 1)])
def test_repeat_counts_must_not_be_negative(reps: tuple[int, ...]) -> None:
    _rejected(lambda: Tensor.ones(2, 3).repeat(*reps) if len(reps) > 1 else Tensor.ones(2).repeat(*reps), ValueError,
              "repeat", ">= 0")  # fmt: skip


def test_repeat_by_zero_is_empty_like_numpy() -> None:
    assert Tensor.ones(2, 3).repeat(0, 2).shape == np.tile(np.ones((2, 3)), (0, 2)).shape


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("shape, axis", [((0,), None), ((2, 0), 1), ((0, 3), 0), ((2, 0, 3), (1, 2))])
def test_max_and_min_of_nothing_are_errors(op: str, shape: tuple[int, ...], axis: Any) -> None:
    with pytest.raises(ValueError):  # numpy's own answer for the same reduction
        getattr(np.ones(shape), op)(axis=axis)
    _rejected(lambda: getattr(Tensor.ones(*shape), op)(axis=axis), ValueError, op, "empty", str(shape))


def test_reductions_over_non_empty_axes_of_empty_tensors_and_identities_still_work() -> None:
    assert Tensor.ones(0, 2).max(1).shape == (0,) and Tensor.ones(0, 2).min(1).shape == (0,)
    assert Tensor.ones(0).any().item() is False and Tensor.ones(0).all().item() is True
    assert Tensor.ones(0).sum().item() == 0 and Tensor.ones(0).softmax().shape == (0,)
