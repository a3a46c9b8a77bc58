"""Junk arguments a fuzz of every public Tensor method (each parameter given None, a str, NaN, inf, a huge int, a
list, an object array...) still found failing raw: a number where batchnorm wants its statistics ("'int' object has
no attribute 'reshape'"), scatter's index (".. has no attribute 'ndim'"), a non-callable custom kernel ("'NoneType'
object is not callable"), and an array or a str as isclose/allclose's equal_nan, full's buffer or train/test's mode
(numpy's "truth value ... is ambiguous", or a str silently counted as yes). Each is now the tensor package's named
error; the same calls with valid arguments match numpy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import Tensor
from speck.tensor.errors import CustomKernelError, TensorError, TensorTypeError


def x() -> Tensor:
    return Tensor([[1.0, 2.0], [3.0, 4.0]])


def ones2() -> Tensor:
    return Tensor([1.0, 1.0])


JUNK: dict[str, tuple[Callable[[], Any], type[Exception], str]] = {
    "batchnorm_mean_int": (lambda: x().batchnorm(None, None, 1, ones2()), TensorTypeError, "mean must be a Tensor"),
    "batchnorm_invstd_list": (lambda: x().batchnorm(None, None, ones2(), [1, 1]), TensorTypeError, "invstd must be"),
    "batchnorm_weight_float": (
        lambda: x().batchnorm(2.0, None, ones2(), ones2()),
        TensorTypeError,
        "weight must be a Tensor or None",
    ),  # fmt: skip
    "batchnorm_bias_array": (lambda: x().batchnorm(None, np.ones(2), ones2(), ones2()), TensorTypeError, "bias"),
    "scatter_index_none": (lambda: x().scatter(0, None, 1.0), TensorTypeError, "scatter: index"),
    "scatter_index_list": (lambda: x().scatter(0, [[0, 1]], 1.0), TensorTypeError, "must be a Tensor"),
    "custom_kernel_fxn_none": (lambda: x().custom_kernel(fxn=None), CustomKernelError, "fxn must be a function"),
    "custom_kernel_grad_int": (
        lambda: x().custom_kernel(fxn=lambda a: a, grad_fxn=1),
        CustomKernelError,
        "grad_fxn (or None) must be a function",
    ),  # fmt: skip
    "isclose_equal_nan_array": (lambda: x().isclose(x(), equal_nan=np.array([1, 2])), TensorTypeError, "equal_nan"),
    "allclose_equal_nan_str": (lambda: x().allclose(x(), equal_nan="no"), TensorTypeError, "equal_nan must be a bool"),
    "full_buffer_array": (lambda: Tensor.full((2,), 1.0, buffer=np.array([1, 0])), TensorTypeError, "buffer"),
    "train_mode_str": (lambda: Tensor.train("no"), TensorTypeError, "train: mode must be a bool"),
    "test_mode_array": (lambda: Tensor.test(np.array([1, 2])), TensorTypeError, "test: mode must be a bool"),
}


@pytest.mark.parametrize("name", sorted(JUNK))
def test_junk_arguments_are_named_errors(name: str) -> None:
    call, cls, words = JUNK[name]
    with pytest.raises(cls, match=words.replace("(", r"\(").replace(")", r"\)")) as ei:
        call()
    assert isinstance(ei.value, TensorError)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.floats(-4, 4, width=32), min_size=6, max_size=6), st.booleans())
def test_batchnorm_with_tensor_statistics_matches_numpy(vals: list[float], affine: bool) -> None:
    a = np.array(vals, dtype=np.float32).reshape(2, 3)
    mean, invstd = np.array([0.5, -1.0, 2.0], np.float32), np.array([1.0, 0.5, 2.0], np.float32)
    w, b = np.array([2.0, 1.0, -1.0], np.float32), np.array([0.0, 1.0, 3.0], np.float32)
    want = (a - mean) * invstd * (w if affine else 1) + (b if affine else 0)
    args = (Tensor(w), Tensor(b)) if affine else (None, None)
    got = Tensor(a).batchnorm(*args, Tensor(mean), Tensor(invstd)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("equal_nan", [True, False, np.bool_(True), np.bool_(False), 0, 1])
def test_isclose_takes_any_bool_like_equal_nan_like_numpy(equal_nan: Any) -> None:
    a = np.array([1.0, np.nan, np.inf, 2.0], dtype=np.float32)
    b = np.array([1.0 + 1e-7, np.nan, np.inf, 2.1], dtype=np.float32)
    want = np.isclose(a, b, equal_nan=bool(equal_nan))
    np.testing.assert_array_equal(Tensor(a).isclose(Tensor(b), equal_nan=equal_nan).numpy(), want)
    assert Tensor(a).allclose(Tensor(b), equal_nan=equal_nan).item() == bool(want.all())


def test_train_and_test_take_bools_and_numpy_bools() -> None:
    for mode in (True, False, np.bool_(True), np.bool_(False), 1, 0):
        with Tensor.train(mode):
            assert Tensor.training is bool(mode)
        with Tensor.test(mode):
            assert Tensor.training is not bool(mode)


def test_scatter_with_a_tensor_index_matches_numpy() -> None:
    a = np.zeros((2, 3), dtype=np.float32)
    idx = np.array([[2, 0, 1], [1, 1, 0]])
    want = a.copy()
    np.put_along_axis(want, idx, 5.0, axis=1)  # (an index of self's shape: torch's scatter and numpy's agree)
    np.testing.assert_array_equal(Tensor(a).scatter(1, Tensor(idx), 5.0).numpy(), want)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.sampled_from([0.0, -0.0, 0.5, -2.0, 3.0, 1e-3, -7.25]), min_size=6, max_size=6),
    st.sampled_from([np.inf, -np.inf, 0, 1, 2, 3, 0.5, -1]),
    st.sampled_from([0, 1, -1]),
)
def test_normalize_of_every_norm_order_matches_numpy(vals: list[float], p: float, dim: int) -> None:
    # p=inf gave x back unchanged (|x|**inf summed, then **0 is 1), p=0 was Python's "division by zero"
    a = np.array(vals, dtype=np.float32).reshape(2, 3)
    with np.errstate(divide="ignore"):
        norm = np.linalg.norm(a.astype(np.float64), ord=p, axis=dim, keepdims=True)
    want = a / np.maximum(norm, 1e-12)
    np.testing.assert_allclose(Tensor(a).normalize(p=p, dim=dim).numpy(), want, rtol=1e-5)


@pytest.mark.parametrize(("call", "words"), [
    (lambda: x().normalize(p=float("nan")), "p is NaN"),
    (lambda: x().softplus(beta=0), "beta must be a nonzero number"),
    (lambda: x().softplus(beta=float("nan")), "beta must be a nonzero number"),
])  # fmt: skip
def test_a_norm_order_or_beta_that_has_no_value_is_named(call: Callable[[], Any], words: str) -> None:
    with pytest.raises(ValueError, match=words) as ei:
        call()
    assert isinstance(ei.value, TensorError)


@pytest.mark.parametrize("a", [1e300, -1e200, 1e155])
def test_kaiming_of_a_huge_slope_is_the_limit_not_an_overflow(a: float) -> None:
    # (a**2 of a float past the range raised OverflowError; the gain sqrt(2 / (1 + a*a)) tends to 0)
    with np.errstate(over="ignore"):
        want_std = np.sqrt(2.0 / (1 + np.float64(a) ** 2)) / np.sqrt(4)
    for init in (Tensor.kaiming_normal, Tensor.kaiming_uniform):
        out = init(3, 4, a=a).numpy()
        assert np.all(np.abs(out) <= max(np.sqrt(3.0) * want_std, np.finfo(np.float32).smallest_subnormal) * 8)


NP_DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.float16, np.int32, np.float32, np.int64, np.float64]


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=24), st.sampled_from(NP_DTYPES), st.sampled_from([bytes, bytearray, memoryview]))
def test_tensor_of_bytes_reads_them_as_numpy_frombuffer_does(raw: bytes, np_dt: Any, kind: Any) -> None:
    # bytes as bool was a BITCAST no renderer expresses (UnsupportedOpError at the first read)
    raw = raw[: len(raw) // np.dtype(np_dt).itemsize * np.dtype(np_dt).itemsize]
    want = np.frombuffer(raw, dtype=np_dt)
    t = Tensor(kind(raw), dtype=np_dt)
    np.testing.assert_array_equal(t.numpy(), want)
    if np_dt is np.bool_:  # (kernels see each nonzero byte as True)
        np.testing.assert_array_equal(t.logical_not().numpy(), ~want)
        assert t.sum().item() == int(want.sum())
