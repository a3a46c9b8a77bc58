"""The direct max-pool gradient (speck.tensor.pool_grad) for non-overlapping windows: equal to a window-by-window
numpy reference of the MAX-reduce rule (ties split evenly) and to the general graph-walking path (to the bit, up to
the sign of zeros), correct against float64 finite differences, and two kernels for the backward of a realized
pool."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from speck.tensor import Tensor, assert_kernel_count, pool_grad
from tensor_helpers import FEW, SOME
from test_autograd import away, gradcheck


def _out_size(n: int, k: int, p: int, ceil: bool) -> int:
    """PyTorch's pooled size for stride == kernel (a ceil window must start inside the input or left padding)."""
    span = n + 2 * p - k
    o = (-(-span // k) if ceil else span // k) + 1
    if ceil and (o - 1) * k >= n + p:
        o -= 1
    return o


def ref_pool_grad(x: np.ndarray, g: np.ndarray, k: tuple[int, ...], p: tuple[int, ...],
                  ceil: bool) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(pooled, input gradient) window by window: each window's maxima (in the -inf padded input) share the
    window's output gradient evenly, computed in x's dtype as mask / count * g."""
    nsp = len(k)
    lead, sp = x.shape[:-nsp], x.shape[-nsp:]
    o = tuple(_out_size(n, kk, pp, ceil) for n, kk, pp in zip(sp, k, p))
    full = tuple(max(n + 2 * pp, oo * kk) for n, kk, pp, oo in zip(sp, k, p, o))
    xp = np.full(lead + full, -np.inf, dtype=x.dtype)
    inner = tuple(slice(pp, pp + n) for pp, n in zip(p, sp))
    xp[(..., *inner)] = x
    gp = np.zeros_like(xp)
    out = np.zeros(lead + o, dtype=x.dtype)
    one = x.dtype.type(1)
    for li in itertools.product(*(range(d) for d in lead)):
        for oi in itertools.product(*(range(d) for d in o)):
            win = (*li, *(slice(j * kk, j * kk + kk) for j, kk in zip(oi, k)))
            w = xp[win]
            m = w.max()
            mask = w == m
            out[(*li, *oi)] = m
            gp[win] += np.where(mask, one / x.dtype.type(mask.sum()) * g[(*li, *oi)], 0)
    return out, gp[(..., *inner)]


def _grad(x: np.ndarray, g: np.ndarray, **kw: Any) -> tuple[np.ndarray, np.ndarray]:
    t = Tensor(x, requires_grad=True)
    out = t.max_pool2d(**kw)
    (gx,) = out.gradient(t, gradient=Tensor(g))
    return out.numpy(), gx.numpy()


def _values(shape: tuple[int, ...], seed: int, ties: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if ties:  # few distinct integers: windows with 2, 3 or all equal maxima
        return rng.integers(-2, 3, shape).astype(np.float32)
    return rng.standard_normal(shape).astype(np.float32)


@given(nsp=st.sampled_from([1, 2]), n=st.integers(1, 7), m=st.integers(1, 6), k=st.integers(1, 3),
       pad=st.integers(0, 1), ceil=st.booleans(), ties=st.booleans(), seed=st.integers(0, 1000))  # fmt: skip
@example(nsp=2, n=5, m=6, k=3, pad=1, ceil=True, ties=True, seed=2)
@example(nsp=1, n=7, m=1, k=2, pad=1, ceil=True, ties=True, seed=3)
@SOME
def test_matches_window_reference(nsp: int, n: int, m: int, k: int, pad: int, ceil: bool, ties: bool,
                                  seed: int) -> None:  # fmt: skip
    p = min(pad, k // 2)  # PyTorch allows padding up to half the window
    sp = (n, m)[:nsp]
    ks = (k, k + 1 if nsp == 2 and k < 3 else k)[:nsp]
    if any(kk > s + 2 * p for kk, s in zip(ks, sp)):
        ks = tuple(min(kk, s + 2 * p) for kk, s in zip(ks, sp))
    x = _values((2, 2, *sp), seed, ties)
    o = tuple(_out_size(s, kk, p, ceil) for s, kk in zip(sp, ks))
    g = np.random.default_rng(seed + 1).standard_normal((2, 2, *o)).astype(np.float32)
    out, gx = _grad(x, g, kernel_size=ks, padding=(p,) * nsp, ceil_mode=ceil)
    ref_out, ref_gx = ref_pool_grad(x, g, ks, (p,) * nsp, ceil)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(gx, ref_gx)


def _general_path(x: np.ndarray, g: np.ndarray, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> np.ndarray:
    """The gradient by walking the pooling graph (the direct rule switched off). A fresh input tensor, so the
    pooled node is a new UOp with no override from an earlier call."""
    with monkeypatch.context() as mp:
        mp.setattr(pool_grad, "max_pool_gradient", lambda *a, **k: False)
        return _grad(x, g, **kw)[1]


@given(k=st.sampled_from([2, 3]), pad=st.integers(0, 1), ceil=st.booleans(), special=st.booleans(),
       seed=st.integers(0, 1000))  # fmt: skip
@example(k=2, pad=1, ceil=True, special=True, seed=0)
@example(k=3, pad=1, ceil=False, special=True, seed=1)
@FEW
def test_equal_to_general_path(k: int, pad: int, ceil: bool, special: bool, seed: int) -> None:
    # hypothesis forbids function-scoped fixtures in @given tests, so the patch context is made here
    monkeypatch = pytest.MonkeyPatch()
    x = _values((2, 3, 7, 5), seed, ties=True)
    if special:  # a -inf window (its maxima include the padding), a nan, an inf
        x[0, 0, :3, :3] = -np.inf
        x[1, 2, 4, 1] = np.nan
        x[1, 1, 0, 0] = np.inf
    p = min(pad, k // 2)
    o = tuple(_out_size(s, k, p, ceil) for s in x.shape[2:])
    g = np.random.default_rng(seed).standard_normal((2, 3, *o)).astype(np.float32)
    kw: dict[str, Any] = {"kernel_size": k, "padding": p, "ceil_mode": ceil}
    gx = _grad(x, g, **kw)[1]
    ref = _general_path(x, g, monkeypatch, **kw)
    # equal values, nan where the general path has nan; only the sign of a zero may differ (the general path sums
    # each element's window contributions, turning -0 into +0)
    np.testing.assert_array_equal(gx, ref)


def test_equal_to_general_path_cnn_sized(monkeypatch: pytest.MonkeyPatch) -> None:
    # the classic CNN's first pool on a slice of its batch: ReLU outputs, so many windows tie at 0
    x = np.maximum(_values((4, 32, 20, 20), 3, ties=False), 0)
    g = np.random.default_rng(4).standard_normal((4, 32, 10, 10)).astype(np.float32)
    np.testing.assert_array_equal(_grad(x, g, kernel_size=2)[1], _general_path(x, g, monkeypatch, kernel_size=2))


@pytest.mark.parametrize(
    "shape,kw",
    [
        ((1, 2, 5, 4), {"kernel_size": 2}),  # 5 rows: the last one is in no window
        ((2, 1, 7, 6), {"kernel_size": 3, "padding": 1}),
        ((1, 2, 5, 5), {"kernel_size": 2, "ceil_mode": True}),
        ((1, 1, 7, 5), {"kernel_size": (3, 2), "stride": (3, 2), "padding": (1, 0), "ceil_mode": True}),
        ((2, 3, 7), {"kernel_size": (2,)}),  # 1-d
        ((1, 2, 4, 5, 3), {"kernel_size": (2, 2, 2), "dilation": (1, 1, 1)}),  # 3-d
    ],
)
def test_gradcheck_float64(shape: tuple[int, ...], kw: dict[str, Any]) -> None:
    gradcheck(lambda x: x.max_pool2d(**kw), away(shape, sum(shape)))


def test_return_indices_uses_direct_gradient() -> None:
    x = _values((2, 2, 6, 5), 7, ties=True)
    g = np.random.default_rng(8).standard_normal((2, 2, 3, 2)).astype(np.float32)
    t = Tensor(x, requires_grad=True)
    out, idx = t.max_pool2d(2, return_indices=True)
    (gx,) = out.gradient(t, gradient=Tensor(g))
    np.testing.assert_array_equal(gx.numpy(), ref_pool_grad(x, g, (2, 2), (0, 0), False)[1])


WINDOWS = [
    # kernel, stride, dilation, whether the direct rule applies
    (2, 2, 1, True), (3, 3, 1, True), (3, 2, 1, False), (2, 1, 1, False), (2, 2, 2, False),
    ((2, 3), (2, 3), 1, True), ((2, 3), (3, 2), 1, False),
]  # fmt: skip


@pytest.mark.parametrize("k,s,d,expect", WINDOWS)
def test_direct_rule_only_for_non_overlapping_windows(k: Any, s: Any, d: int, expect: bool) -> None:
    x = Tensor(_values((1, 2, 8, 9), 9, ties=False))
    kk, ss = (k, k) if isinstance(k, int) else k, (s, s) if isinstance(s, int) else s
    out = x.max_pool2d(k, s, dilation=d)
    assert pool_grad.max_pool_gradient(out, x, kk, ss, (d, d), (0, 0)) is expect


def test_integer_input_keeps_graph_path() -> None:
    x = Tensor(np.arange(16, dtype=np.int32).reshape(1, 1, 4, 4))
    assert pool_grad.max_pool_gradient(x.max_pool2d(2), x, (2, 2), (2, 2), (1, 1), (0, 0)) is False


@pytest.mark.parametrize("shape,k", [((4, 8, 20, 20), (2, 2)), ((4, 8, 7, 6), (2, 2)), ((3, 5, 9), (2,))])
def test_backward_of_realized_pool_is_two_kernels(shape: tuple[int, ...], k: tuple[int, ...]) -> None:
    x = Tensor(_values(shape, 11, ties=True), requires_grad=True).realize()
    out = x.max_pool2d(k)
    g = Tensor(np.random.default_rng(12).standard_normal(out.shape).astype(np.float32)).realize()
    (gx,) = out.gradient(x, gradient=g)
    out.realize()  # the forward runs first (as in a training step, where the next layer needs it)
    with assert_kernel_count(2):  # the tie count per window, then the elementwise gradient
        gx.realize()
    np.testing.assert_array_equal(gx.numpy(), ref_pool_grad(x.numpy(), g.numpy(), k, (0,) * len(k), False)[1])
