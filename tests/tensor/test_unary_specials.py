"""Every float unary op against numpy at the values where formulas go wrong: NaN, +-inf, +-0, subnormals, the
smallest normals, values near 0 where exp(x) - 1 or log(1 + x) cancel, values where exp overflows, and the
largest floats, on the default CPU backend (LLVM), the C backend and speck's own x86-64 backend. numpy computes in
float64 and rounds to float32; speck must agree in NaN-ness and infinities exactly and in finite values within the
op's tolerance (0 for the exact ops, which must also keep the sign of zero)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import Tensor

N = 64  # one kernel per op and device: every example has this many values
TINY = 1.1754944e-38  # the smallest normal float32: below it a result only has to be within this of the reference
SPECIALS = [math.nan, -math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-45, -1e-45, 1e-40, -1e-40, TINY, -TINY, 1e-30,
            -1e-30, 1e-20, 1e-12, -1e-12, 1e-7, -1e-7, 3e-5, -3e-5, 1e-3, -1e-3, 0.1, -0.1, 0.25, -0.3, 0.5, -0.5,
            0.999, -0.999, 1.0, -1.0, 1.5, 2.5, -2.5, 3.0, 10.0, -10.0, 20.0, -20.0, 50.0, -50.0, 88.7, 89.5, -87.3,
            -103.9, -150.0, 127.9, 1e4, -1e4, 8388609.0, 1e7, -1e7, 3e9, 1e20, -1e20, 1e30, -1e30, 3.4028235e38,
            -3.4028235e38, 1.0000001]  # fmt: skip


def _f64(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    return lambda a: fn(a.astype(np.float64))


def _erf(a: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(a)


def _sigmoid(a: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0, -a))


def _gelu(a: np.ndarray) -> np.ndarray:
    # 0.5 * a * (1 + tanh(z)) written as a * sigmoid(2z): the same function, without float64's own cancellation
    return a * _sigmoid(2 * math.sqrt(2 / math.pi) * (a + 0.044715 * a**3))


# name -> (speck, numpy in float64, relative tolerance; 0: exact, zero's sign included). exp(x) is exp2(x / ln 2)
# with x / ln 2 rounded to float32: a relative error up to |x| * 2**-24 (5e-6 at x = 88), inherited by the ops on it
UNARY: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[np.ndarray], np.ndarray], float]] = {
    "neg": (lambda t: -t, np.negative, 0),
    "abs": (lambda t: t.abs(), np.abs, 0),
    "sign": (lambda t: t.sign(), np.sign, 0),
    "sqrt": (lambda t: t.sqrt(), np.sqrt, 0),
    "floor": (lambda t: t.floor(), np.floor, 0),
    "ceil": (lambda t: t.ceil(), np.ceil, 0),
    "trunc": (lambda t: t.trunc(), np.trunc, 0),
    "round": (lambda t: t.round(), np.round, 0),
    "square": (lambda t: t.square(), np.square, 0),
    "reciprocal": (lambda t: t.reciprocal(), np.reciprocal, 0),
    "rsqrt": (lambda t: t.rsqrt(), lambda a: 1 / np.sqrt(a), 2e-7),
    "exp": (lambda t: t.exp(), np.exp, 1e-5),
    "exp2": (lambda t: t.exp2(), np.exp2, 3e-7),
    "log": (lambda t: t.log(), np.log, 5e-7),
    "log2": (lambda t: t.log2(), np.log2, 5e-7),
    "log10": (lambda t: t.log10(), np.log10, 5e-7),
    "sin": (lambda t: t.sin(), np.sin, 1e-6),
    "cos": (lambda t: t.cos(), np.cos, 1e-6),
    "tan": (lambda t: t.tan(), np.tan, 2e-6),
    "asin": (lambda t: t.asin(), np.arcsin, 1e-6),
    "acos": (lambda t: t.acos(), np.arccos, 1e-6),
    "atan": (lambda t: t.atan(), np.arctan, 1e-6),
    "sinh": (lambda t: t.sinh(), np.sinh, 1e-5),
    "cosh": (lambda t: t.cosh(), np.cosh, 1e-5),
    "tanh": (lambda t: t.tanh(), np.tanh, 1e-6),
    "asinh": (lambda t: t.asinh(), np.arcsinh, 1e-6),
    "acosh": (lambda t: t.acosh(), np.arccosh, 1e-6),
    "atanh": (lambda t: t.atanh(), np.arctanh, 1e-6),
    "erf": (lambda t: t.erf(), _erf, 1e-6),
    "sigmoid": (lambda t: t.sigmoid(), _sigmoid, 1e-5),
    "logsigmoid": (lambda t: t.logsigmoid(), lambda a: -np.logaddexp(0, -a), 1e-5),
    "softplus": (lambda t: t.softplus(), lambda a: np.logaddexp(0, a), 1e-5),
    "silu": (lambda t: t.silu(), lambda a: a * _sigmoid(a), 1e-5),
    "gelu": (lambda t: t.gelu(), _gelu, 1e-5),
    "quick_gelu": (lambda t: t.quick_gelu(), lambda a: a * _sigmoid(1.702 * a), 1e-5),
    "elu": (lambda t: t.elu(), lambda a: np.where(a > 0, a, np.expm1(np.minimum(a, 0))), 1e-6),
    "celu": (lambda t: t.celu(), lambda a: np.where(a > 0, a, np.expm1(np.minimum(a, 0))), 1e-6),
    "selu": (lambda t: t.selu(), lambda a: 1.0507 * np.where(a > 0, a, 1.67326 * np.expm1(np.minimum(a, 0))), 1e-6),
    "mish": (lambda t: t.mish(), lambda a: a * np.tanh(np.logaddexp(0, a)), 1e-5),
    "softsign": (lambda t: t.softsign(), lambda a: a / (1 + np.abs(a)), 1e-6),
    "relu": (lambda t: t.relu(), lambda a: np.maximum(a, 0), 1e-7),
    "relu6": (lambda t: t.relu6(), lambda a: np.where(np.isnan(a), a, np.clip(a, 0, 6)), 1e-7),
    "leaky_relu": (lambda t: t.leaky_relu(), lambda a: np.where(a < 0, 0.01 * a, a), 1e-6),
    "hardswish": (lambda t: t.hardswish(), lambda a: a * np.where(np.isnan(a), a, np.clip(a + 3, 0, 6)) / 6, 1e-6),
    "hardsigmoid": (lambda t: t.hardsigmoid(), lambda a: np.where(np.isnan(a), a, np.clip(a / 6 + 0.5, 0, 1)), 1e-6),
    "hardtanh": (lambda t: t.hardtanh(), lambda a: np.where(np.isnan(a), a, np.clip(a, -1, 1)), 0),
}
DEVICES = ["CPU", pytest.param("CPU:CLANG", marks=pytest.mark.c_backend), "CPU:X86"]


def check(name: str, device: str, x: np.ndarray) -> None:
    fn, ref, rtol = UNARY[name]
    got = fn(Tensor(x, device=device)).numpy()
    with np.errstate(all="ignore"):
        want = ref(x.astype(np.float64)).astype(np.float32)
        w, g = want.astype(np.float64), got.astype(np.float64)
        bad = np.isnan(w) != np.isnan(g)
        bad |= np.isinf(w) & (g != w)
        close = np.abs(g - w) <= rtol * np.abs(w) + (TINY if rtol else 0)
        bad |= np.isfinite(w) & ~close
    if rtol == 0:  # exact ops keep the sign of zero
        bad |= (w == 0) & (np.signbit(w) != np.signbit(g))
    assert not bad.any(), f"{name} on {device}: " + "; ".join(
        f"{name}({x[i]!r}) = {got[i]!r}, numpy {want[i]!r}" for i in np.flatnonzero(bad)[:8]
    )


def _padded(vals: list[float]) -> np.ndarray:
    return np.resize(np.array(vals, np.float32), N)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_op_at_special_values(name: str, device: str) -> None:
    x = np.array(SPECIALS, np.float32)
    for start in range(0, len(x), N):
        check(name, device, _padded(list(x[start : start + N])))


floats32 = st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(UNARY))
@given(vals=st.lists(st.one_of(st.sampled_from(SPECIALS), floats32), min_size=1, max_size=N))
@settings(max_examples=15, deadline=None)
def test_unary_op_on_drawn_values(name: str, device: str, vals: list[Any]) -> None:
    check(name, device, _padded(vals))


def test_two_over_pi_pieces_sum_to_two_over_pi() -> None:
    """The 24-bit pieces of 2/pi behind the float32 argument reduction, against 2/pi from Machin's formula."""
    from fractions import Fraction

    from speck.tensor.elementwise import _TWO_OVER_PI_24

    bits = 300
    one = 1 << bits

    def arctan_inv(k: int) -> int:
        s, t, n, sign = 0, one // k, 1, 1
        while t:
            s, t, n, sign = s + sign * (t // n), t // (k * k), n + 2, -sign
        return s

    pi = Fraction(4 * (4 * arctan_inv(5) - arctan_inv(239)), one)
    pieces = [Fraction(c) for c in _TWO_OVER_PI_24]
    assert all(p.denominator <= 2 ** (24 * (j + 1)) and p * 2 ** (24 * (j + 1)) < 2**24 for j, p in enumerate(pieces))
    assert abs(sum(pieces) - 2 / pi) < Fraction(1, 2**216)
