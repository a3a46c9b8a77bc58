"""Elementwise ops at the edges a random sweep doesn't reach: special values (+-0, +-inf, NaN, float32 extremes),
accuracy where a naive formula loses it, and gradients that must stay finite where the function is. numpy (float64
where float32 would round the reference) is the reference for values; derivatives are checked against their closed
forms evaluated by numpy and, for the composed ops, against central finite differences."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from speck.tensor import Tensor, dtypes
from tensor_helpers import assert_matches

SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 0.5, -2.5, 1e-30, 88.0, -87.0, 1e6], np.float32)


def grad_of(fn: Callable[[Tensor], Tensor], x: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
    """d sum(fn(x) * w) / dx through Tensor.gradient (w defaults to ones)."""
    t = Tensor(x)
    out = fn(t)
    seed = np.ones(out.shape, np.float32) if w is None else w
    return (out * Tensor(seed)).sum().gradient(t)[0].numpy()


def finite_diff(fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Elementwise central differences of a float64 numpy function."""
    x = x.astype(np.float64)
    return (fn(x + eps) - fn(x - eps)) / (2 * eps)


# ---------------- values at special inputs ----------------
def test_sign_of_special_values() -> None:
    # +-0 -> 0, +-inf keep their sign, NaN -> NaN as in numpy and torch (tinygrad's 1 would be a silent wrong value)
    assert_matches(Tensor(SPECIAL).sign().numpy(), np.sign(SPECIAL), atol=0)
    ints = np.array([-3, 0, 5, -1], np.int32)
    assert_matches(Tensor(ints).sign().numpy(), np.sign(ints))
    u = np.array([0, 3, 255], np.uint8)
    assert_matches(Tensor(u).sign().numpy(), np.sign(u))


@pytest.mark.parametrize("name", ["le", "ge", "lt", "gt", "eq", "ne"])
def test_comparisons_with_nan_and_inf(name: str) -> None:
    a, b = np.meshgrid(SPECIAL[:8], SPECIAL[:8])
    ops = {"le": (lambda x, y: x <= y), "ge": (lambda x, y: x >= y), "lt": (lambda x, y: x < y),
           "gt": (lambda x, y: x > y), "eq": (lambda x, y: x == y), "ne": (lambda x, y: x != y)}  # fmt: skip
    f = ops[name]
    assert_matches(f(Tensor(a), Tensor(b)).numpy(), f(a, b))
    assert_matches(f(Tensor(a), 0.5).numpy(), f(a, np.float32(0.5)))


def test_fmod_and_mod_by_infinity() -> None:
    a, b = np.meshgrid(np.array([0.0, -0.0, 1.5, -1.5, 7.0, np.inf, np.nan], np.float32),
                       np.array([np.inf, -np.inf, 2.0, -2.0, 0.5], np.float32))  # fmt: skip
    with np.errstate(invalid="ignore"):
        assert_matches(Tensor(a).fmod(Tensor(b)).numpy(), np.fmod(a, b))
        assert_matches((Tensor(a) % Tensor(b)).numpy(), np.mod(a, b))


def test_mod_gradients_follow_floor() -> None:
    a = np.array([5.5, -5.5, 3.2, -0.7], np.float32)
    b = np.array([2.0, 2.0, -1.5, 0.3], np.float32)
    ta, tb = Tensor(a), Tensor(b)
    ga, gb = (ta % tb).sum().gradient(ta, tb)
    assert_matches(ga.numpy(), np.ones_like(a))
    assert_matches(gb.numpy(), -np.floor(a.astype(np.float64) / b), atol=1e-6)


def test_cos_is_accurate_near_its_zeros() -> None:
    # sin(pi/2 - x) rounds pi/2 - x first: absolute errors up to ulp(x)/2 (4e-6 at x = 100)
    x = np.linspace(-100, 100, 4001).astype(np.float32)
    assert_matches(Tensor(x).cos().numpy(), np.cos(x.astype(np.float64)), atol=3e-7, rtol=0)
    g = grad_of(lambda t: t.cos(), x[::40])
    assert_matches(g, -np.sin(x[::40].astype(np.float64)), atol=1e-5)


def test_cos_and_exp_of_half_compute_in_float32() -> None:
    x = np.linspace(-8, 8, 257).astype(np.float16)
    ref_cos = np.cos(x.astype(np.float64)).astype(np.float16)
    got = Tensor(x).cos()
    assert got.dtype == dtypes.float16
    assert_matches(got.numpy(), ref_cos, atol=1e-3, rtol=0)  # the float16 rounding of the exact value
    ref_exp = np.exp(x.astype(np.float64)).astype(np.float16)
    assert_matches(Tensor(x).exp().numpy().astype(np.float64), ref_exp.astype(np.float64), rtol=1e-3)


def test_hyperbolics_near_the_float32_limit() -> None:
    x = np.array([88.5, 89.0, -89.0, 89.4, 0.5, -3.0], np.float32)
    assert_matches(Tensor(x).sinh().numpy(), np.sinh(x.astype(np.float64)).astype(np.float32), rtol=1e-5)
    assert_matches(Tensor(x).cosh().numpy(), np.cosh(x.astype(np.float64)).astype(np.float32), rtol=1e-5)


def test_inverse_hyperbolics_of_large_and_special_values() -> None:
    x = np.array([1e10, -1e10, 3e38, -3e38, np.inf, -np.inf, np.nan, 0.0, 2.5, -2.5], np.float32)
    assert_matches(Tensor(x).asinh().numpy(), np.arcsinh(x.astype(np.float64)), rtol=1e-6)
    y = np.array([1.0, 1.5, 1e10, 3e38, np.inf, 0.5, -3e38, np.nan], np.float32)
    with np.errstate(invalid="ignore"):
        assert_matches(Tensor(y).acosh().numpy(), np.arccosh(y.astype(np.float64)), rtol=1e-6)


def test_atan_and_erf_at_infinity() -> None:
    x = np.array([np.inf, -np.inf, 1e30, -1e30, 0.0, np.nan], np.float32)
    assert_matches(Tensor(x).atan().numpy(), np.arctan(x.astype(np.float64)), atol=1e-6)
    assert_matches(Tensor(x).erf().numpy(), np.array([1.0, -1.0, 1.0, -1.0, 0.0, np.nan]), atol=1e-6)


def test_hardsigmoid_and_hardswish_saturate() -> None:
    x = np.array([np.inf, -np.inf, 3e38, -3e38, 0.0, 2.0, -2.0], np.float32)
    xd = x.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        assert_matches(Tensor(x).hardsigmoid().numpy(), np.clip(xd / 6 + 0.5, 0, 1))
        assert_matches(Tensor(x[4:]).hardswish().numpy(), xd[4:] * np.clip(xd[4:] + 3, 0, 6) / 6, atol=1e-6)


# ---------------- gradients that must stay finite ----------------
@pytest.mark.parametrize(
    "name,fn,deriv",
    [
        ("sigmoid", lambda t: t.sigmoid(), lambda x: np.exp(-np.abs(x)) / (1 + np.exp(-np.abs(x))) ** 2),
        ("tanh", lambda t: t.tanh(), lambda x: 1 - np.tanh(x) ** 2),
        ("elu", lambda t: t.elu(), lambda x: np.where(x > 0, 1.0, np.exp(np.minimum(x, 0)))),
        ("celu", lambda t: t.celu(0.5), lambda x: np.where(x > 0, 1.0, np.exp(np.minimum(x, 0) / 0.5))),
        ("selu", lambda t: t.selu(), lambda x: 1.0507 * np.where(x > 0, 1.0, 1.67326 * np.exp(np.minimum(x, 0)))),
        ("atan", lambda t: t.atan(), lambda x: 1 / (1 + x * x)),
        ("asinh", lambda t: t.asinh(), lambda x: 1 / np.sqrt(x * x + 1)),
    ],
)
def test_gradients_stay_finite_at_extreme_inputs(name: str, fn: Callable[[Tensor], Tensor],
                                                  deriv: Callable[[np.ndarray], np.ndarray]) -> None:  # fmt: skip
    # the unselected branch of a where (or the exp of a sigmoid) overflows here: 0 * inf would be NaN
    x = np.array([-300.0, -100.0, -20.0, -1e-3, 1e-8, -1e-8, 0.7, 20.0, 100.0, 300.0, 1e10], np.float32)
    w = np.linspace(0.5, 1.5, x.size).astype(np.float32)
    g = grad_of(fn, x, w)
    with np.errstate(over="ignore"):
        want = deriv(x.astype(np.float64)) * w
    assert np.isfinite(g).all(), f"{name}: non-finite gradient {g}"
    assert_matches(g, want, atol=1e-6, rtol=1e-4)


def test_acosh_gradient_for_large_inputs() -> None:
    x = np.array([1.5, 3.0, 1e10, 1e30], np.float32)
    assert_matches(grad_of(lambda t: t.acosh(), x), 1 / np.sqrt(x.astype(np.float64) ** 2 - 1), rtol=1e-4)


def test_selu_gradient_at_zero_takes_the_exponential_branch() -> None:
    # at 0 the derivative of elu-like functions is alpha (the negative side's), as in PyTorch
    g = grad_of(lambda t: t.selu(), np.zeros(2, np.float32))
    assert_matches(g, np.full(2, 1.0507 * 1.67326), rtol=1e-6)


@pytest.mark.parametrize("fn,ref", [
    (lambda t: t.sinh(), np.sinh), (lambda t: t.cosh(), np.cosh), (lambda t: t.cos(), np.cos),
    (lambda t: t.hardsigmoid(), lambda x: np.clip(x / 6 + 0.5, 0, 1)), (lambda t: t.atan(), np.arctan),
    (lambda t: t.asinh(), np.arcsinh), (lambda t: t.acosh(), np.arccosh),
])  # fmt: skip
def test_rewritten_ops_match_finite_differences(fn: Callable[[Tensor], Tensor],
                                                ref: Callable[[np.ndarray], np.ndarray]) -> None:  # fmt: skip
    x = np.array([1.2, 1.7, 2.9, 4.1, 1.05], np.float64)
    assert_matches(fn(Tensor(x)).numpy(), ref(x), atol=1e-7, rtol=1e-7)
    assert_matches(grad_of(fn, x), finite_diff(ref, x), atol=1e-6, rtol=1e-6)


def test_sigmoid_family_keeps_values_at_the_tails() -> None:
    x = np.array([-100.0, -30.0, -1.0, 0.0, 1.0, 30.0, 100.0], np.float32)
    xd = x.astype(np.float64)
    assert_matches(Tensor(x).sigmoid().numpy(), 1 / (1 + np.exp(-xd)), atol=1e-7, rtol=1e-6)
    assert_matches(Tensor(x).tanh().numpy(), np.tanh(xd), atol=1e-6)
    assert_matches(Tensor(x).logsigmoid().numpy(), -np.logaddexp(0, -xd), rtol=1e-5, atol=1e-6)
    assert math.isfinite(float(grad_of(lambda t: t.logsigmoid(), x).sum()))


@pytest.mark.parametrize(
    "name,fn,deriv", [("sin", lambda t: t.sin(), np.cos), ("cos", lambda t: t.cos(), lambda x: -np.sin(x))]
)
def test_sin_cos_gradients_for_large_arguments(name: str, fn: Callable[[Tensor], Tensor],
                                               deriv: Callable[[np.ndarray], np.ndarray]) -> None:  # fmt: skip
    # the derivative of SIN is cos(x) = 1 - 2 sin(x/2)^2: sin(x - pi/2) would round x - pi/2 first (0.03 at 1e6)
    x = np.array([1e1, 1e3, 1e5, 1e6, -1e6, 123456.7, -3e6], np.float32)
    assert_matches(grad_of(fn, x), deriv(x.astype(np.float64)), atol=2e-6, rtol=0)


def test_idiv_truncates_toward_zero() -> None:
    a = np.array([7, -7, 7, -7, 0, 9], np.int32)
    b = np.array([2, 2, -2, -2, 3, -4], np.int32)
    assert_matches(Tensor(a).idiv(Tensor(b)).numpy(), np.trunc(a / b).astype(np.int32))
    assert_matches(Tensor(a).idiv(3).numpy(), np.trunc(a / 3).astype(np.int32))
    assert_matches(Tensor(b).idiv(7, reverse=True).numpy(), np.trunc(7 / b).astype(np.int32))
