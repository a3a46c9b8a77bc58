"""Reductions, scans and sorting at their edges: 0-d tensors with an axis, prefixes far below the axis maximum,
NaN and infinities in sorts, no degrees of freedom left in var/std. numpy is the reference."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from speck.tensor import Tensor, dtypes
from tensor_helpers import assert_matches


@pytest.mark.parametrize("axis", [0, -1, None])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize(
    "name,fn,ref",
    [
        ("sum", lambda t, a, k: t.sum(a, keepdim=k), lambda x: x),
        ("mean", lambda t, a, k: t.mean(a, keepdim=k), lambda x: x),
        ("max", lambda t, a, k: t.max(a, keepdim=k), lambda x: x),
        ("min", lambda t, a, k: t.min(a, keepdim=k), lambda x: x),
        ("prod", lambda t, a, k: t.prod(a, keepdim=k), lambda x: x),
        ("var", lambda t, a, k: t.var(a, keepdim=k), lambda x: np.float32(np.nan)),  # 1 element, correction 1
        ("var0", lambda t, a, k: t.var(a, keepdim=k, correction=0), lambda x: np.float32(0)),
        ("std", lambda t, a, k: t.std(a, keepdim=k), lambda x: np.float32(np.nan)),
        ("logsumexp", lambda t, a, k: t.logsumexp(a, keepdim=k), lambda x: x),
        ("argmax", lambda t, a, k: t.argmax(a, keepdim=k), lambda x: np.int32(0)),
        ("argmin", lambda t, a, k: t.argmin(a, keepdim=k), lambda x: np.int32(0)),
    ],
)
def test_reductions_of_0d_tensors(name: str, fn: Callable[..., Tensor], ref: Callable[[Any], Any], axis: Any,
                                  keepdim: bool) -> None:  # fmt: skip
    # a 0-d tensor accepts axis 0 and -1 (nothing to reduce: the result is 0-d again)
    x = np.float32(2.5)
    out = fn(Tensor(x), axis, keepdim)
    assert out.shape == ()
    assert_matches(out.numpy(), np.asarray(ref(x)), rtol=1e-6)


def test_0d_reduction_rejects_other_axes() -> None:
    with pytest.raises(IndexError):
        Tensor(1.0).mean(1)
    with pytest.raises(IndexError):
        Tensor(1.0).argmax(-2)


def _logcumsumexp(x: np.ndarray, axis: int) -> np.ndarray:
    return np.logaddexp.accumulate(x.astype(np.float64), axis=axis)


@pytest.mark.parametrize(
    "vals,axis",
    [
        (np.array([-1000.0, 1000.0, -999.0, 0.0]), 0),  # prefix 0 is 1000 below the axis maximum
        (np.array([[3.0, -500.0, 2.0], [-400.0, -401.0, 300.0]]), 1),
        (np.array([[3.0, -500.0, 2.0], [-400.0, -401.0, 300.0]]), 0),
        (np.array([-np.inf, 1.0, -np.inf, 3.0]), 0),
        (np.array([-np.inf, -np.inf, 2.0]), 0),
        (np.linspace(-5, 5, 12).reshape(3, 4), -1),
    ],
)
def test_logcumsumexp_keeps_every_prefix(vals: np.ndarray, axis: int) -> None:
    x = vals.astype(np.float32)
    with np.errstate(invalid="ignore"):
        ref = _logcumsumexp(x, axis)
    assert_matches(Tensor(x).logcumsumexp(axis).numpy(), ref, atol=1e-5, rtol=1e-6)


def test_logcumsumexp_gradient_is_a_softmax_of_each_prefix() -> None:
    x = np.array([-30.0, 2.0, 1.0, -0.5, 40.0], np.float32)
    t = Tensor(x)
    g = t.logcumsumexp(0).sum().gradient(t)[0].numpy()
    xd = x.astype(np.float64)
    # d/dx_j sum_i lse(x[:i+1]) = sum_{i >= j} softmax(x[:i+1])_j
    want = np.zeros_like(xd)
    for i in range(len(xd)):
        p = np.exp(xd[: i + 1] - xd[: i + 1].max())
        want[: i + 1] += p / p.sum()
    assert_matches(g, want, atol=1e-6, rtol=1e-5)
    assert Tensor(np.float32(1.5)).logcumsumexp().numpy() == np.float32(1.5)
    assert Tensor.zeros(0).logcumsumexp().shape == (0,)


def _stable_order(x: np.ndarray, descending: bool) -> np.ndarray:
    """Stable sort order with NaN above +inf (last ascending, first descending), along the last axis."""
    out = []
    for row in x.reshape(-1, x.shape[-1]):
        if descending:
            key = [(0 if np.isnan(v) else 1, -v if not np.isnan(v) else 0) for v in row]
        else:
            key = [(1 if np.isnan(v) else 0, v if not np.isnan(v) else 0) for v in row]
        out.append(sorted(range(len(row)), key=lambda i: key[i]))
    return np.array(out, np.int32).reshape(x.shape)


@pytest.mark.parametrize("descending", [False, True])
def test_sort_with_nan_and_infinities_keeps_every_value(descending: bool) -> None:
    x = np.array([[1.0, np.nan, 3.0, -np.inf, np.nan, np.inf, 3.0, -0.5], [np.nan] * 4 + [2.0, 1.0, 2.0, 0.0]],
                 np.float32)  # fmt: skip
    v, i = Tensor(x).sort(-1, descending)
    order = _stable_order(x, descending)
    assert i.dtype == dtypes.int32
    assert_matches(i.numpy(), order)
    assert_matches(v.numpy(), np.take_along_axis(x, order, -1))
    assert_matches(Tensor(x).argsort(-1, descending).numpy(), order)
    vk, ik = Tensor(x).topk(3, largest=descending)
    assert_matches(ik.numpy(), order[:, :3])
    assert_matches(vk.numpy(), np.take_along_axis(x, order[:, :3], -1))


def test_sort_of_ints_is_stable_in_both_directions() -> None:
    x = np.array([[3, 1, 3, 2, 1, 1, -5]], np.int32)
    for desc in (False, True):
        order = _stable_order(x.astype(np.float64), desc)
        v, i = Tensor(x).sort(-1, desc)
        assert_matches(i.numpy(), order)
        assert_matches(v.numpy(), np.take_along_axis(x, order, -1))


@pytest.mark.parametrize("correction", [2, 3, 5])
def test_var_without_degrees_of_freedom_divides_by_zero(correction: int) -> None:
    # divides by max(n - correction, 0) (TENSOR_API 7.2): a nonzero spread gives inf, a constant row 0/0 = NaN
    x = np.array([[1.0, 2.0], [4.0, 4.0]], np.float32)
    got = Tensor(x).var(1, correction=correction).numpy()
    assert np.isinf(got[0]) and got[0] > 0 and np.isnan(got[1])
    assert np.isinf(Tensor(x).std(1, correction=correction).numpy()[0])
    assert_matches(Tensor(x).var(1, correction=1).numpy(), np.var(x, axis=1, ddof=1))


@pytest.mark.parametrize("n", [1025, 3000])
def test_long_scans_match_numpy(n: int) -> None:
    # scans longer than SCAN_BLOCKED_FROM run in blocks (scan within blocks, scan of block totals, combine)
    rng = np.random.default_rng(n)
    x = rng.uniform(-1, 1, (2, n)).astype(np.float32)
    assert_matches(Tensor(x).cumsum(1).numpy(), np.cumsum(x.astype(np.float64), 1), atol=2e-5, rtol=1e-5)
    assert_matches(Tensor(x.T.copy()).cumsum(0).numpy(), np.cumsum(x.T.astype(np.float64), 0), atol=2e-5, rtol=1e-5)
    p = (1 + x / 1000).astype(np.float32)
    assert_matches(Tensor(p).cumprod(1).numpy(), np.cumprod(p.astype(np.float64), 1), rtol=1e-5)
    assert_matches(Tensor(x).cummax(1)[0].numpy(), np.maximum.accumulate(x, 1))
    assert_matches(Tensor(x).cummin(1)[0].numpy(), np.minimum.accumulate(x, 1))
    ints = rng.integers(-100, 100, n).astype(np.int8)
    got = Tensor(ints).cumsum()
    assert got.dtype == dtypes.int32
    assert_matches(got.numpy(), np.cumsum(ints.astype(np.int32)))
    # d/dx_j sum_i w_i cumsum(x)_i = sum_{i >= j} w_i
    w = rng.uniform(0.5, 1.5, n).astype(np.float32)
    t = Tensor(x[0])
    g = (t.cumsum() * Tensor(w)).sum().gradient(t)[0].numpy()
    assert_matches(g, np.cumsum(w[::-1].astype(np.float64))[::-1], atol=1e-3, rtol=1e-5)
