"""Hostile round 4, the API boundary: a yes/no flag (keepdim, descending, ceil_mode...) given a numpy array of
several values was numpy's own "truth value of an array ... is ambiguous" ValueError from deep inside, and a str
("False") or a list silently counted as yes; a junk dim in a shape (zeros, reshape, rand...) was speck.uop's
UOpTypeError. Each is now speck.tensor's TensorTypeError naming the function and the argument; good values keep
their results."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.tensor import Tensor, dtypes
from speck.tensor.errors import TensorTypeError


def t4() -> Tensor:
    return Tensor(np.arange(2 * 3 * 4 * 4, dtype=np.float32).reshape(2, 3, 4, 4))


def _refused(call: Callable[[], Any], *words: str) -> None:
    with pytest.raises(TensorTypeError) as ei:
        out = call()
        for x in out if isinstance(out, tuple) else (out,):
            if isinstance(x, Tensor):
                x.realize()
    for w in words:
        assert w in str(ei.value), f"{w!r} not in {ei.value}"


FLAG_TAKERS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "sum": ("keepdim", lambda j: t4().sum(keepdim=j)),
    "sum_axis": ("keepdim", lambda j: t4().sum(1, keepdim=j)),
    "prod": ("keepdim", lambda j: t4().prod(1, keepdim=j)),
    "max": ("keepdim", lambda j: t4().max(1, keepdim=j)),
    "min": ("keepdim", lambda j: t4().min(keepdim=j)),
    "any": ("keepdim", lambda j: t4().any(keepdim=j)),
    "all": ("keepdim", lambda j: t4().all(keepdim=j)),
    "mean": ("keepdim", lambda j: t4().mean(keepdim=j)),
    "var": ("keepdim", lambda j: t4().var(keepdim=j)),
    "std": ("keepdim", lambda j: t4().std(keepdim=j)),
    "argmax": ("keepdim", lambda j: t4().argmax(keepdim=j)),
    "argmax_axis": ("keepdim", lambda j: t4().argmax(1, keepdim=j)),
    "argmin": ("keepdim", lambda j: t4().argmin(keepdim=j)),
    "logsumexp": ("keepdim", lambda j: t4().logsumexp(1, keepdim=j)),
    "sort": ("descending", lambda j: t4().sort(descending=j)),
    "argsort": ("descending", lambda j: t4().argsort(descending=j)),
    "topk": ("largest", lambda j: t4().topk(1, largest=j)),
    "topk_sorted": ("sorted_", lambda j: t4().topk(1, sorted_=j)),
    "svd": ("full_matrices", lambda j: Tensor.eye(3).svd(full_matrices=j)),
    "interpolate": ("align_corners", lambda j: t4().interpolate((2, 2), align_corners=j)),
    "multinomial": ("replacement", lambda j: Tensor([0.5, 0.5]).multinomial(2, replacement=j)),
    "isinf": ("detect_positive", lambda j: t4().isinf(detect_positive=j)),
    "avg_pool2d": ("ceil_mode", lambda j: t4().avg_pool2d(ceil_mode=j)),
    "avg_pool2d_pad": ("count_include_pad", lambda j: t4().avg_pool2d(count_include_pad=j)),
    "max_pool2d": ("ceil_mode", lambda j: t4().max_pool2d(ceil_mode=j)),
    "max_pool2d_idx": ("return_indices", lambda j: t4().max_pool2d(return_indices=j)),
    "sdpa": ("is_causal", lambda j: t4().scaled_dot_product_attention(t4(), t4(), is_causal=j)),
}
JUNK_FLAGS: list[Any] = [np.array([1, 2]), np.array([[True], [False]]), "False", 1.5, [1], {"a": 1}]


@pytest.mark.parametrize("junk", JUNK_FLAGS, ids=lambda j: type(j).__name__ + repr(j)[:12])
@pytest.mark.parametrize("name", sorted(FLAG_TAKERS))
def test_a_junk_flag_is_a_type_error_naming_it(name: str, junk: Any) -> None:
    what, call = FLAG_TAKERS[name]
    _refused(lambda: call(junk), what, "must be a bool", type(junk).__name__)


@pytest.mark.parametrize("good", [True, np.bool_(True), np.array(True), 1, np.int64(1)], ids=repr)
def test_flags_take_bools_and_ints_like_python(good: Any) -> None:
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(Tensor(a).sum(1, keepdim=good).numpy(), a.sum(1, keepdims=True))
    np.testing.assert_array_equal(Tensor(a).max(2, keepdim=good).numpy(), a.max(2, keepdims=True))
    np.testing.assert_array_equal(Tensor(a).argsort(2, descending=good).numpy(), np.argsort(-a, axis=2))


@given(st.sampled_from([False, 0, None, np.bool_(False)]), st.integers(0, 2))
def test_a_false_flag_drops_the_dim_like_numpy(no: Any, axis: int) -> None:
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(Tensor(a).sum(axis, keepdim=no).numpy(), a.sum(axis))
    np.testing.assert_array_equal(Tensor(a).mean(axis, keepdim=no).numpy(), a.mean(axis))


@pytest.mark.parametrize("junk", [np.array([1, 2]), 1.5, ["trunc"]], ids=repr)
def test_pad_mode_and_rounding_mode_of_the_wrong_kind_are_named(junk: Any) -> None:
    with pytest.raises(NotImplementedError, match="pad mode must be"):
        t4().pad(((0, 0), (0, 0), (1, 1), (1, 1)), mode=junk)
    _refused(lambda: t4().div(2, rounding_mode=junk), "div", "rounding_mode")


SHAPE_TAKERS: dict[str, Callable[[Any], Any]] = {
    "zeros": lambda s: Tensor.zeros((s,)),
    "ones": lambda s: Tensor.ones(2, s),
    "full": lambda s: Tensor.full((s, 2), 1.0),
    "empty": lambda s: Tensor.empty(2, s),
    "rand": lambda s: Tensor.rand(2, s),
    "randn": lambda s: Tensor.randn(2, s),
    "reshape": lambda s: Tensor.ones(2, 3).reshape(2, s),
    "expand": lambda s: Tensor.ones(1, 3).expand(2, s),
}
JUNK_DIMS: list[Any] = ["3", 2.5, 3.0, [2], np.array([1, 2]), object(), 1j, True]


@pytest.mark.parametrize("junk", JUNK_DIMS, ids=lambda j: type(j).__name__)
@pytest.mark.parametrize("name", sorted(SHAPE_TAKERS))
def test_a_junk_dim_is_the_tensor_packages_type_error_naming_the_function(name: str, junk: Any) -> None:
    _refused(lambda: SHAPE_TAKERS[name](junk), name, "shape must be int", type(junk).__name__)


@given(st.integers(1, 4))
def test_numpy_int_dims_still_make_shapes(n: int) -> None:
    assert Tensor.zeros(np.int64(n), 2).shape == (n, 2)
    assert Tensor.ones(2, 3 * n).reshape(np.int32(2 * n), 3).shape == (2 * n, 3)
    assert Tensor.ones(1, 3).expand(np.int16(n), 3).shape == (n, 3)


@pytest.mark.parametrize("devices", [["CPU"], ("CPU:1",), ["CPU:1"]], ids=repr)
def test_to_a_one_device_list_moves_like_to_that_device(devices: Any) -> None:
    # (an unsharded tensor .to(["CPU"]) was a bare AssertionError from the sharded-only path)
    a = np.arange(6, dtype=np.float32)
    out = Tensor(a).to(devices)
    assert out.device == Tensor(a).to(devices[0]).device
    np.testing.assert_array_equal(out.numpy(), a)


def ti() -> Tensor:
    return Tensor([[1, 2], [3, 4]], dtype=dtypes.int32)


REVERSE_TAKERS: dict[str, Callable[[Any], Any]] = {
    "add": lambda j: t4().add(1, reverse=j),
    "sub": lambda j: t4().sub(1, reverse=j),
    "mul": lambda j: t4().mul(2, reverse=j),
    "div": lambda j: t4().div(2, reverse=j),
    "idiv": lambda j: ti().idiv(2, reverse=j),
    "floordiv": lambda j: ti().floordiv(2, reverse=j),
    "mod": lambda j: ti().mod(2, reverse=j),
    "bitwise_and": lambda j: ti().bitwise_and(1, reverse=j),
    "bitwise_or": lambda j: ti().bitwise_or(1, reverse=j),
    "bitwise_xor": lambda j: ti().bitwise_xor(1, reverse=j),
    "xor": lambda j: ti().xor(1, reverse=j),
    "pow": lambda j: t4().pow(2, reverse=j),
    "matmul": lambda j: Tensor.ones(2, 2).matmul(Tensor.ones(2, 2), reverse=j),
}


@pytest.mark.parametrize("junk", [np.array([1, 2]), "yes"], ids=repr)
@pytest.mark.parametrize("name", sorted(REVERSE_TAKERS))
def test_a_junk_reverse_flag_of_a_binary_op_is_named(name: str, junk: Any) -> None:
    # (an array was numpy's "truth value ... ambiguous"; a str silently reversed the operands)
    _refused(lambda: REVERSE_TAKERS[name](junk), name, "reverse", "must be a bool")


@given(st.integers(-3, 3), st.booleans())
def test_a_bool_or_numpy_bool_reverse_flag_matches_numpy(c: int, rev: bool) -> None:
    a = np.arange(1, 5, dtype=np.float32)
    want = (c - a) if rev else (a - c)
    np.testing.assert_array_equal(Tensor(a).sub(c, reverse=np.bool_(rev)).numpy(), want)


JUNK_CALLS: dict[str, tuple[Callable[[], Any], str]] = {
    "gather_list_index": (lambda: t4().gather(0, [[0]]), "gather: index 0 must be a Tensor"),
    "gather_none_index": (lambda: t4().gather(0, None), "gather: index 0 must be a Tensor"),
    "newton_schulz_none": (lambda: Tensor.eye(3).newton_schulz(2, None), "params must be three numbers"),
    "newton_schulz_pair": (lambda: Tensor.eye(3).newton_schulz(2, (1.0, 2.0)), "params must be three numbers"),
    "newton_schulz_steps": (lambda: Tensor.eye(3).newton_schulz(2.5, (3.4, -4.7, 2.0)), "steps must be an int"),
    "gelu_array_mode": (lambda: t4().gelu(np.array(["none", "tanh"])), "gelu: approximate must be"),
    "unflatten_none": (lambda: t4().unflatten(1, None), "unflatten: sizes must be a tuple or list"),
    "unflatten_str": (lambda: t4().unflatten(1, "13"), "unflatten: sizes must be a tuple or list"),
    "interpolate_array_mode": (lambda: t4().interpolate((2, 2), mode=np.array([1, 2])), "interpolate: mode must be"),
}


@pytest.mark.parametrize("name", sorted(JUNK_CALLS))
def test_junk_arguments_found_by_the_method_fuzz_are_named(name: str) -> None:
    call, words = JUNK_CALLS[name]
    _refused(call, words)
