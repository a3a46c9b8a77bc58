"""Tensor.callify, linear_with_vars and schedule_linear (TENSOR_API 13.3)."""

from __future__ import annotations

import numpy as np
import pytest

from speck.tensor import GlobalCounters, Tensor, Variable, assert_kernel_count, dtypes
from speck.tensor.function import callify, linear_with_vars, schedule_linear
from speck.tensor.realize import execute
from speck.uop import Ops

RNG = np.random.default_rng(13)


def _data(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def test_callify_keeps_values_and_rewires() -> None:
    a, b = _data(4, 5), _data(4, 5)
    ta, tb = Tensor(a).realize(), Tensor(b).realize()
    x, y = ta * 2 + tb, (ta - tb).exp().sum(1)
    before = (x.uop, y.uop)
    assert x.callify(y) is x
    assert (x.uop, y.uop) != before  # rewired to the call's outputs
    assert x.uop.base.op is Ops.CONTIGUOUS and y.uop.base.op is Ops.CONTIGUOUS  # each output a buffer of its own
    np.testing.assert_allclose(x.numpy(), a * 2 + b, rtol=1e-6)
    np.testing.assert_allclose(y.numpy(), np.exp(a - b).sum(1), rtol=1e-5)


def test_callify_outputs_are_materialized_once() -> None:
    """A callified value is a unit of its own: two consumers read its buffer instead of fusing (and recomputing)
    the body."""
    a = Tensor(_data(64)).realize()
    x = (a * 3).exp()
    x.callify()
    u, v = x + 1, x * 2
    with assert_kernel_count(3):  # the call's kernel, then one per consumer
        Tensor.realize(u, v)
    np.testing.assert_allclose(v.numpy(), np.exp(a.numpy() * 3) * 2, rtol=1e-5)


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.int32, dtypes.bool, dtypes.float16, dtypes.uint8])
def test_callify_keeps_dtype(dt: dtypes) -> None:  # type: ignore[valid-type]
    t = Tensor(np.arange(6) % 3).cast(dt) + Tensor(np.ones(6, np.int32)).cast(dt)
    ref = t.numpy()
    t2 = Tensor(np.arange(6) % 3).cast(dt) + Tensor(np.ones(6, np.int32)).cast(dt)
    t2.callify()
    assert t2.dtype == dt and t2.shape == (6,)
    np.testing.assert_array_equal(t2.numpy(), ref)


def test_callify_realized_tensor_is_untouched() -> None:
    t = Tensor(_data(3)).realize()
    u = t.uop
    callify(t)
    assert t.uop is u


def test_callify_keeps_gradients_flowing() -> None:
    a = _data(5)
    x = Tensor(a, requires_grad=True)
    y = (x * x).sum()
    y.callify()
    y.backward()
    assert x.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), 2 * a, rtol=1e-6)


def test_linear_with_vars_does_not_run() -> None:
    a = Tensor(_data(8)).realize()
    t = (a + 1).sum() * (a * 2).max()
    before = GlobalCounters.kernel_count
    items, var_vals = t.linear_with_vars()
    assert GlobalCounters.kernel_count == before and var_vals == {}
    assert items and all(it.ast is not None for it in items)
    assert not t.uop.is_realized  # the tensor still holds its computation
    execute(items)  # the program is runnable as it is
    assert GlobalCounters.kernel_count == before + len(items)


def test_linear_with_vars_reports_bound_variables() -> None:
    a = Tensor(np.arange(10, dtype=np.float32)).realize()
    v = Variable("n", 1, 10).bind(4)
    t = a[:v] * 2
    items, var_vals = linear_with_vars(t)
    assert var_vals == {"n": 4} and items
    with pytest.raises(AssertionError, match="Variables"):
        t.schedule_linear()


def test_schedule_linear_matches_schedule() -> None:
    a, b = Tensor(_data(6)).realize(), Tensor(_data(6)).realize()
    x, y = a + b, (a * b).sum()
    items = schedule_linear(x, y)
    assert [it.ast for it in items] == [it.ast for it in x.schedule(y)]
    assert x.schedule_linear() and schedule_linear() == []
