"""Elementwise ops against numpy: hypothesis over shapes (0- and 1-size dims included), dtypes and values.

Float tolerances (float32): arithmetic 1e-6 abs / 1e-5 rel; transcendental (exp/log/sin...) 1e-5 abs / 1e-4 rel
(the IR has only EXP2/LOG2/SIN/SQRT, the rest is composed); asin/acos/atan/erf use polynomial approximations with
errors below 2e-7 (abs 2e-5 allowed); hyperbolic inverses 1e-4 rel. Ints and bools are exact."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.tensor import Tensor, dtypes
from speck.tensor.errors import TensorTypeError
from tensor_helpers import FEW, SOME, arrays, assert_matches, broadcast_shapes, shapes

UNARY_FLOAT: list[tuple[str, Callable[[Tensor], Tensor], Callable[[np.ndarray], Any], tuple[float, float], float]] = [
    # name, speck, numpy, (lo, hi) input range, atol
    ("neg", lambda t: -t, np.negative, (-3, 3), 1e-6),
    ("reciprocal", lambda t: t.reciprocal(), lambda a: 1 / a, (0.5, 3), 1e-6),
    ("sqrt", lambda t: t.sqrt(), np.sqrt, (0, 9), 1e-6),
    ("rsqrt", lambda t: t.rsqrt(), lambda a: 1 / np.sqrt(a), (0.5, 9), 1e-5),
    ("exp", lambda t: t.exp(), np.exp, (-5, 5), 1e-5),
    ("exp2", lambda t: t.exp2(), np.exp2, (-5, 5), 1e-5),
    ("log", lambda t: t.log(), np.log, (0.1, 9), 1e-5),
    ("log2", lambda t: t.log2(), np.log2, (0.1, 9), 1e-5),
    ("log10", lambda t: t.log10(), np.log10, (0.1, 9), 1e-5),
    ("sin", lambda t: t.sin(), np.sin, (-6, 6), 1e-5),
    ("cos", lambda t: t.cos(), np.cos, (-6, 6), 1e-5),
    ("tan", lambda t: t.tan(), np.tan, (-1.2, 1.2), 1e-4),
    ("asin", lambda t: t.asin(), np.arcsin, (-1, 1), 2e-5),
    ("acos", lambda t: t.acos(), np.arccos, (-1, 1), 2e-5),
    ("atan", lambda t: t.atan(), np.arctan, (-10, 10), 2e-5),
    ("sinh", lambda t: t.sinh(), np.sinh, (-3, 3), 1e-5),
    ("cosh", lambda t: t.cosh(), np.cosh, (-3, 3), 1e-5),
    ("tanh", lambda t: t.tanh(), np.tanh, (-4, 4), 1e-5),
    ("asinh", lambda t: t.asinh(), np.arcsinh, (-5, 5), 1e-5),
    ("acosh", lambda t: t.acosh(), np.arccosh, (1.1, 6), 1e-5),
    ("atanh", lambda t: t.atanh(), np.arctanh, (-0.9, 0.9), 1e-5),
    ("sigmoid", lambda t: t.sigmoid(), lambda a: 1 / (1 + np.exp(-a)), (-6, 6), 1e-6),
    ("erf", lambda t: t.erf(), None, (-3, 3), 2e-6),
    ("abs", lambda t: t.abs(), np.abs, (-3, 3), 0),
    ("sign", lambda t: t.sign(), np.sign, (-3, 3), 0),
    ("floor", lambda t: t.floor(), np.floor, (-9, 9), 0),
    ("ceil", lambda t: t.ceil(), np.ceil, (-9, 9), 0),
    ("trunc", lambda t: t.trunc(), np.trunc, (-9, 9), 0),
    ("round", lambda t: (t * 2).round(), lambda a: np.round(a * 2), (-9, 9), 0),
    ("relu", lambda t: t.relu(), lambda a: np.maximum(a, 0), (-3, 3), 0),
    ("square", lambda t: t.square(), np.square, (-3, 3), 1e-6),
]


def _erf(a: np.ndarray) -> np.ndarray:
    import math

    return np.vectorize(math.erf, otypes=[np.float64])(a.astype(np.float64))


@pytest.mark.parametrize("name,fn,ref,rng,atol", UNARY_FLOAT, ids=[u[0] for u in UNARY_FLOAT])
@given(shape=shapes(), seed=st.integers(0, 2**16))
@FEW
def test_unary_float(name: str, fn: Any, ref: Any, rng: tuple[float, float], atol: float, shape: tuple[int, ...],
                     seed: int) -> None:  # fmt: skip
    a = arrays(shape, np.float32, seed, *rng)
    got = fn(Tensor(a)).numpy()
    expect = _erf(a) if ref is None else ref(a)
    assert_matches(got, expect, atol=atol, rtol=1e-4 if atol else 0)


def test_round_half_to_even() -> None:
    vals = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.49, -3.51, 1e8 + 1, 0.0], dtype=np.float32)
    assert_matches(Tensor(vals).round().numpy(), np.round(vals), atol=0, rtol=0)


BINARY: list[tuple[str, Callable[[Any, Any], Any]]] = [
    ("add", lambda a, b: a + b),
    ("sub", lambda a, b: a - b),
    ("mul", lambda a, b: a * b),
    ("maximum", lambda a, b: a.maximum(b) if isinstance(a, Tensor) else np.maximum(a, b)),
    ("minimum", lambda a, b: a.minimum(b) if isinstance(a, Tensor) else np.minimum(a, b)),
    ("lt", lambda a, b: a < b),
    ("le", lambda a, b: a <= b),
    ("gt", lambda a, b: a > b),
    ("ge", lambda a, b: a >= b),
    ("eq", lambda a, b: a == b),
    ("ne", lambda a, b: a != b),
]


def _bshapes() -> st.SearchStrategy[tuple[tuple[int, ...], tuple[int, ...]]]:
    return broadcast_shapes()


@pytest.mark.parametrize("name,op", BINARY, ids=[b[0] for b in BINARY])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint8])
@given(sh=_bshapes(), seed=st.integers(0, 2**16), swap=st.booleans())
@FEW
def test_binary_broadcast(name: str, op: Any, dtype: Any, sh: tuple[tuple[int, ...], tuple[int, ...]], seed: int,
                          swap: bool) -> None:  # fmt: skip
    s1, s2 = sh if not swap else (sh[1], sh[0])
    a, b = arrays(s1, dtype, seed, 0, 9), arrays(s2, dtype, seed + 1, 0, 9)
    got = op(Tensor(a), Tensor(b)).numpy()
    assert_matches(got, op(a, b), check_dtype=np.result_type(op(a, b)) if name not in ("maximum", "minimum") else None)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int8, np.bool_])
@pytest.mark.parametrize("scalar", [2, 2.5, True, -1])
def test_python_scalar_promotion(dtype: Any, scalar: Any) -> None:
    """A Python int adopts the tensor's dtype, a Python float turns ints/bools into float32 (tinygrad's rules)."""
    a = arrays((3,), dtype, 1, 0, 5)
    t = Tensor(a)
    for got, ref_fn in ((t + scalar, lambda: a + scalar), (scalar * t, lambda: scalar * a)):
        out = got.numpy()
        if isinstance(scalar, float):
            expect_dt = np.float32
        elif isinstance(scalar, bool):
            expect_dt = dtype
        else:
            expect_dt = np.int32 if dtype == np.bool_ else dtype
        assert out.dtype == expect_dt, f"{dtype} op {scalar!r} gave {out.dtype}, expected {np.dtype(expect_dt)}"
        with np.errstate(all="ignore"):
            assert_matches(out, np.asarray(ref_fn()).astype(expect_dt))


def test_reflected_ops() -> None:
    a = np.array([1.0, 2.0, 4.0], dtype=np.float32)
    t = Tensor(a)
    for got, ref in ((3 - t, 3 - a), (3 / t, 3 / a), (2**t, 2**a), (7 // Tensor([2, 3, -2]), 7 // np.array([2, 3, -2])),
                     (7 % Tensor([2, 3, -2]), 7 % np.array([2, 3, -2])), (1 + t, 1 + a), (2 * t, 2 * a)):  # fmt: skip
        assert_matches(got.numpy(), ref)


@given(sh=_bshapes(), seed=st.integers(0, 2**16))
@SOME
def test_int_division_and_modulo(sh: tuple[tuple[int, ...], tuple[int, ...]], seed: int) -> None:
    """// and % follow Python/numpy (floor, sign of divisor); fmod and div(rounding_mode='trunc') follow C."""
    a = arrays(sh[0], np.int32, seed, -20, 20)
    b = arrays(sh[1], np.int32, seed + 1, 1, 6) * np.where(arrays(sh[1], np.bool_, seed + 2), 1, -1).astype(np.int32)
    ta, tb = Tensor(a), Tensor(b)
    assert_matches((ta // tb).numpy(), a // b)
    assert_matches((ta % tb).numpy(), a % b)
    assert_matches(ta.fmod(tb).numpy(), np.fmod(a, b))
    assert_matches(ta.div(tb, rounding_mode="trunc").numpy(), np.trunc(a / b).astype(np.int32))
    assert_matches((ta / tb).numpy(), (a / b).astype(np.float32), rtol=1e-6)


@given(shape=shapes(1, 2, 1), seed=st.integers(0, 2**16))
@SOME
def test_float_mod_fmod(shape: tuple[int, ...], seed: int) -> None:
    a = arrays(shape, np.float32, seed, -10, 10)
    b = arrays(shape, np.float32, seed + 1, 0.5, 3) * np.where(arrays(shape, np.bool_, seed), 1, -1).astype(np.float32)
    assert_matches((Tensor(a) % Tensor(b)).numpy(), np.mod(a, b), atol=1e-5)
    assert_matches(Tensor(a).fmod(Tensor(b)).numpy(), np.fmod(a, b), atol=1e-5)


@given(shape=shapes(1, 2, 1), seed=st.integers(0, 2**16))
@SOME
def test_pow_float_cases(shape: tuple[int, ...], seed: int) -> None:
    """Positive bases with any exponent, negative bases with integral exponents (sign kept) and 0 ** 0 == 1."""
    a = arrays(shape, np.float32, seed, -3, 3)
    e_int = arrays(shape, np.int32, seed + 1, -3, 3).astype(np.float32)
    e_frac = arrays(shape, np.float32, seed + 2, -2, 2)
    ta = Tensor(a)
    assert_matches((ta ** Tensor(e_int)).numpy(), np.power(a, e_int), atol=1e-4, rtol=1e-4)
    with np.errstate(all="ignore"):
        assert_matches((ta.abs() ** Tensor(e_frac)).numpy(), np.power(np.abs(a), e_frac), atol=1e-4, rtol=1e-4)
    for k in (0, 1, 2, 3, -1, -2, 0.5):
        with np.errstate(all="ignore"):
            src = np.abs(a) + 0.5 if k in (-1, -2, 0.5) else a
            assert_matches((Tensor(src) ** k).numpy(), np.power(src, k).astype(np.float32), atol=1e-4, rtol=1e-4)
    assert Tensor([0.0]).pow(Tensor([0.0])).tolist() == [1.0]
    assert np.isnan(Tensor([-2.0]).pow(Tensor([0.5])).item())


@given(shape=shapes(1, 2, 1), seed=st.integers(0, 2**16), dtype=st.sampled_from([np.int32, np.int8]))
@FEW
def test_pow_int_exact(shape: tuple[int, ...], seed: int, dtype: Any) -> None:
    """int ** int is exact (wrapping like numpy); negative exponents give 1, +-1 or 0 (numpy refuses them)."""
    a = arrays(shape, dtype, seed, -4, 4)
    e = arrays(shape, dtype, seed + 1, 0, 6)
    with np.errstate(all="ignore"):
        assert_matches((Tensor(a) ** Tensor(e)).numpy(), np.power(a, e))
        assert_matches((Tensor(a) ** 3).numpy(), np.power(a, 3).astype(dtype))
    neg = Tensor(np.array([1, -1, -1, 2, -3, 0], dtype=dtype)) ** Tensor(np.array([-2, -3, -2, -1, -1, 2],
                                                                                  dtype=dtype))  # fmt: skip
    assert neg.tolist() == [1, -1, 1, 0, 0, 0]


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.int8, np.bool_])
@given(shape=shapes(), seed=st.integers(0, 2**16))
@FEW
def test_bitwise_and_logical(dtype: Any, shape: tuple[int, ...], seed: int) -> None:
    a, b = arrays(shape, dtype, seed, -50, 50), arrays(shape, dtype, seed + 1, -50, 50)
    ta, tb = Tensor(a), Tensor(b)
    assert_matches((ta & tb).numpy(), a & b)
    assert_matches((ta | tb).numpy(), a | b)
    assert_matches((ta ^ tb).numpy(), a ^ b)
    assert_matches((~ta).numpy(), ~a)
    assert_matches(ta.logical_not().numpy(), np.logical_not(a))
    assert_matches(ta.logical_and(tb).numpy(), np.logical_and(a, b))
    assert_matches(ta.logical_or(tb).numpy(), np.logical_or(a, b))


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.int64])
@given(shape=shapes(), seed=st.integers(0, 2**16), k=st.integers(0, 7))
@FEW
def test_shifts(dtype: Any, shape: tuple[int, ...], seed: int, k: int) -> None:
    a = arrays(shape, dtype, seed, -100, 100)
    assert_matches((Tensor(a) << k).numpy(), np.left_shift(a, dtype(k)))
    assert_matches((Tensor(a) >> k).numpy(), np.right_shift(a, dtype(k)))
    assert_matches(Tensor(a).lshift(Tensor(np.full(shape, k, dtype))).numpy(), np.left_shift(a, dtype(k)))


@given(sh=_bshapes(), seed=st.integers(0, 2**16))
@SOME
def test_where_lerp_clip(sh: tuple[tuple[int, ...], tuple[int, ...]], seed: int) -> None:
    a, b = arrays(sh[0], np.float32, seed), arrays(sh[1], np.float32, seed + 1)
    c = arrays(sh[1], np.bool_, seed + 2)
    ta, tb, tc = Tensor(a), Tensor(b), Tensor(c)
    assert_matches(tc.where(ta, tb).numpy(), np.where(c, a, b))
    assert_matches(tc.where(ta, 2.0).numpy(), np.where(c, a, np.float32(2.0)))
    assert_matches(tc.where(1, 0).numpy(), np.where(c, 1, 0).astype(np.int32))
    assert_matches(ta.lerp(tb, 0.25).numpy(), a + (b - a) * np.float32(0.25), atol=1e-6)
    assert_matches(ta.clip(-1, 0.5).numpy(), np.clip(a, -1, 0.5))
    assert_matches(ta.masked_fill(tc, -7.0).numpy(), np.where(c, np.float32(-7.0), a))


def test_nan_inf_predicates_and_isclose() -> None:
    v = np.array([0.0, -1.5, np.inf, -np.inf, np.nan, 1e-9], dtype=np.float32)
    t = Tensor(v)
    assert_matches(t.isnan().numpy(), np.isnan(v))
    assert_matches(t.isinf().numpy(), np.isinf(v))
    assert_matches(t.isinf(detect_negative=False).numpy(), np.isposinf(v))
    assert_matches(t.isfinite().numpy(), np.isfinite(v))
    w = v + np.float32(1e-7)
    assert_matches(t.isclose(Tensor(w)).numpy(), np.isclose(v, w))
    assert_matches(t.isclose(Tensor(w), equal_nan=True).numpy(), np.isclose(v, w, equal_nan=True))
    assert Tensor([1.0, 2.0]).allclose(Tensor([1.0, 2.0 + 1e-7])).item()
    assert not Tensor([1.0, 2.0]).allclose(Tensor([1.0, 2.1])).item()


@given(shape=shapes(1, 2, 1), seed=st.integers(0, 2**16))
@SOME
def test_logaddexp_copysign(shape: tuple[int, ...], seed: int) -> None:
    a, b = arrays(shape, np.float32, seed, -20, 20), arrays(shape, np.float32, seed + 1, -20, 20)
    assert_matches(Tensor(a).logaddexp(Tensor(b)).numpy(), np.logaddexp(a, b), atol=1e-5, rtol=1e-5)
    assert_matches(Tensor(a).copysign(Tensor(b)).numpy(), np.copysign(a, b))
    assert Tensor([1.0, 2.0]).copysign(Tensor([-0.0, 0.0])).tolist() == [-1.0, 2.0]


SRC_DTYPES = [np.float32, np.int32, np.int8, np.uint8, np.int64, np.bool_, np.float16, np.uint32, np.float64]


@pytest.mark.parametrize("src", SRC_DTYPES)
@pytest.mark.parametrize("dst", SRC_DTYPES)
def test_cast(src: Any, dst: Any) -> None:
    """Casts agree with numpy on values every dtype represents (no overflowing float->int)."""
    a = np.array([0, 1, 2, 3, 100, 7, 0, 1], dtype=np.float64)
    if np.dtype(src) == np.bool_:
        a = a % 2
    a = a.astype(src)
    got = Tensor(a).cast(dtypes.fields()[np.dtype(dst).name if dst is not np.bool_ else "bool"]).numpy()
    assert_matches(got, a.astype(dst), check_dtype=dst)


def test_cast_shorthands_and_bitcast() -> None:
    t = Tensor([1.5, -2.25, 3.0])
    assert t.int().dtype == dtypes.int32 and t.int().tolist() == [1, -2, 3]
    assert t.long().dtype == dtypes.int64 and t.half().dtype == dtypes.float16 and t.double().dtype == dtypes.float64
    assert t.bool().tolist() == [True, True, True] and t.float().dtype == dtypes.float32
    a = np.array([1.0, -2.5, 3.25], dtype=np.float32)
    assert_matches(Tensor(a).bitcast(dtypes.uint32).numpy(), a.view(np.uint32))
    assert_matches(Tensor(a.view(np.int32)).bitcast("float32").numpy(), a)
    # another item size rescales the last dim (little-endian bytes), like numpy's view
    assert_matches(Tensor(a).bitcast(dtypes.int16).numpy(), a.view(np.int16))


def test_assign_updates_buffer_and_views() -> None:
    t = Tensor([1.0, 2.0, 3.0, 4.0]).realize()
    v = t.reshape(2, 2)
    t.assign(Tensor([5.0, 6.0, 7.0, 8.0]))
    assert t.tolist() == [5.0, 6.0, 7.0, 8.0]
    assert v.tolist() == [[5.0, 6.0], [7.0, 8.0]]
    t.assign(t * 2)
    assert t.tolist() == [10.0, 12.0, 14.0, 16.0]
    t += 1
    assert t.tolist() == [11.0, 13.0, 15.0, 17.0]
    with pytest.raises(ValueError, match="shape"):  # a broadcast failure (spec 4.6)
        t.assign(Tensor([1.0, 2.0]))
    assert t.tolist() == [11.0, 13.0, 15.0, 17.0]


_BOOL_REMAINDERS = [(lambda a, b: a % b, np.remainder), (lambda a, b: a.fmod(b), np.fmod),
                    (lambda a, b: a % True, lambda a, b: a % 1), (lambda a, b: True % a, lambda a, b: 1 % a),
                    (lambda a, b: a // b, np.floor_divide)]  # fmt: skip


@pytest.mark.parametrize("op,ref", _BOOL_REMAINDERS)
def test_remainder_and_floor_division_of_bools_are_refused(op: Callable[..., Tensor], ref: Callable[..., Any]) -> None:
    """bool % bool has no bool answer (numpy's is int8, torch refuses it); it compiled to garbage or failed in the
    C/LLVM compilers, and the x86 backend returned the dividend. Now a TensorTypeError at the op; the same op on
    ints still computes."""
    a, b = Tensor([True, False]), Tensor([True, True])
    with pytest.raises(TensorTypeError, match="bool tensors is not supported"):
        op(a, b)
    ia, ib = np.array([1, 0], np.int32), np.array([1, 1], np.int32)
    np.testing.assert_array_equal(op(Tensor(ia), Tensor(ib)).numpy(), ref(ia, ib))
