"""Hostile arguments across the Tensor surface: a float, string, NaN or infinity where a size is expected, a
window op on a tensor with too few dims, float class labels, slices with a float bound or a zero step, scatter on a
device-less tensor. Each is refused with the package's error class (also the builtin numpy raises) saying what
was expected and what was found, where it used to be a bare builtin error or, worse, a silently wrong result
(eye(2.5) was 3x3, linspace(0, 1, 2.5) had 3 steps, a 1-D avg_pool2d pooled its only dim, a float label of 5.0 out
of 3 classes added 0 to the loss)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.tensor import Tensor
from speck.tensor.errors import TensorError


def _rejected(fn: Callable[[], Any], cls: type[BaseException], *words: str) -> str:
    with pytest.raises(cls) as ei:
        out = fn()
        if isinstance(out, Tensor):
            out.realize()
    msg = str(ei.value)
    assert isinstance(ei.value, TensorError), f"{type(ei.value).__name__}: {msg}"
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    return msg


# ---------------- sizes that are not whole numbers ----------------
NOT_INTS = [2.5, 3.0, float("nan"), float("inf"), "3", None, True]


@pytest.mark.parametrize("v", NOT_INTS)
def test_eye_and_linspace_take_whole_numbers(v: Any) -> None:
    _rejected(lambda: Tensor.eye(v), TypeError, "eye", "int", repr(v))
    if v is not None:  # (m=None: m = n)
        _rejected(lambda: Tensor.eye(2, v), TypeError, "eye", "int")
    _rejected(lambda: Tensor.linspace(0, 1, v), TypeError, "linspace", "steps")


@given(st.integers(0, 6), st.integers(0, 6))
def test_eye_and_linspace_with_numpy_ints_match_numpy(n: int, m: int) -> None:
    np.testing.assert_array_equal(Tensor.eye(np.int64(n), np.int32(m)).numpy(), np.eye(n, m, dtype=np.float32))
    np.testing.assert_allclose(Tensor.linspace(0, 1, np.int64(n)).numpy(), np.linspace(0, 1, n, dtype=np.float32),
                               rtol=1e-6)  # fmt: skip


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("where", ["start", "stop", "step"])
def test_arange_with_a_non_finite_bound_is_a_value_error(bad: float, where: str) -> None:
    args = {"start": 0.0, "stop": 5.0, "step": 1.0, where: bad}
    _rejected(lambda: Tensor.arange(args["start"], args["stop"], args["step"]), ValueError, "arange", where, "finite")


@pytest.mark.parametrize("bad", ["5", None, [5], 1j])
def test_arange_with_a_non_number_is_a_type_error(bad: Any) -> None:
    _rejected(lambda: Tensor.arange(bad), TypeError, "arange", "stop", "real number")
    _rejected(lambda: Tensor.arange(0, 5, bad), TypeError, "arange", "step")


@given(st.integers(-20, 20), st.integers(-20, 20), st.integers(-5, 5).filter(bool))
def test_arange_of_numpy_ints_is_an_int_range_like_numpy(start: int, stop: int, step: int) -> None:
    got = Tensor.arange(np.int64(start), np.int32(stop), np.int16(step)).numpy()
    want = np.arange(start, stop, step)
    assert np.issubdtype(got.dtype, np.integer), got.dtype
    np.testing.assert_array_equal(got, want)


@given(st.floats(-50, 50), st.floats(-50, 50), st.floats(0.25, 8))
def test_arange_of_numpy_floats_matches_python_floats(start: float, stop: float, step: float) -> None:
    got = Tensor.arange(np.float64(start), np.float64(stop), np.float64(step)).numpy()
    np.testing.assert_array_equal(got, Tensor.arange(start, stop, step).numpy())
    assert len(got) == max(math.ceil((stop - start) / step), 0)


# ---------------- windows, pools, interpolation ----------------
X4 = np.arange(32, dtype=np.float32).reshape(1, 2, 4, 4)


@pytest.mark.parametrize("arg", ["stride", "dilation", "padding"])
@pytest.mark.parametrize("v", [1.5, (1.5, 1), "2", None])
def test_conv2d_window_arguments_must_be_ints(arg: str, v: Any) -> None:
    if arg == "padding" and (v is None or v == "2"):
        v = (1, 0.5)
    w = Tensor.ones(3, 2, 2, 2)
    _rejected(lambda: Tensor(X4).conv2d(w, **{arg: v}), TypeError, arg, "int", repr(v))


@pytest.mark.parametrize("pool", ["max_pool2d", "avg_pool2d"])
@pytest.mark.parametrize("v", [2.5, (2, 2.0), "2"])
def test_pool_kernel_sizes_must_be_ints(pool: str, v: Any) -> None:
    _rejected(lambda: getattr(Tensor(X4), pool)(kernel_size=v), TypeError, f"{pool} kernel_size", "int")
    _rejected(lambda: getattr(Tensor(X4), pool)(stride=v), TypeError, f"{pool} stride", "int")


def test_numpy_int_window_arguments_are_ints() -> None:
    got = Tensor(X4).max_pool2d(np.int64(2), stride=np.int32(2)).numpy()
    np.testing.assert_array_equal(got, X4.reshape(1, 2, 2, 2, 2, 2).max(axis=(3, 5)))


@pytest.mark.parametrize("pool", ["max_pool2d", "avg_pool2d"])
@pytest.mark.parametrize("shape", [(), (4,)])
def test_a_pool_needs_as_many_dims_as_its_kernel(pool: str, shape: tuple[int, ...]) -> None:
    _rejected(lambda: getattr(Tensor.ones(*shape), pool)(), ValueError, pool, "2-D kernel", str(shape))


def test_a_pool_over_fewer_dims_still_pools_a_1d_tensor() -> None:
    np.testing.assert_array_equal(Tensor(np.arange(6.0, dtype=np.float32)).max_pool2d((2,)).numpy(), [1, 3, 5])


@pytest.mark.parametrize("size", [(0, 8), (-8, 8), (8, 8, 8, 8, 8), (8.5, 8), "8"])
def test_interpolate_sizes_are_positive_ints_for_dims_that_exist(size: Any) -> None:
    _rejected(lambda: Tensor(X4).interpolate(size), (ValueError, TypeError), "size" if size != "8" else "int")


# ---------------- losses ----------------
@pytest.mark.parametrize("labels", [[0.5, 1.0], [5.0, 1.0], [True, False]])
def test_class_labels_must_be_ints(labels: list[Any]) -> None:
    logits = Tensor(np.ones((2, 3), np.float32))
    _rejected(lambda: logits.sparse_categorical_crossentropy(Tensor(labels)), TypeError, "labels", "int")
    _rejected(lambda: logits.log_softmax(-1).nll_loss(Tensor(labels)), TypeError, "nll_loss", "int")
    _rejected(lambda: logits.cross_entropy(Tensor(labels)), TypeError, "labels", "int")


# ---------------- slices ----------------
@pytest.mark.parametrize("sl", [slice(0.5, None), slice(None, "2"), slice(None, None, 1.0), slice(0, 2.0)])
def test_slice_bounds_must_be_ints(sl: slice) -> None:
    _rejected(lambda: Tensor([1, 2, 3])[sl], TypeError, "slice", "int or None")


def test_a_zero_slice_step_is_a_value_error_like_numpy() -> None:
    _rejected(lambda: Tensor([1, 2, 3])[::0], ValueError, "step", "zero")
    _rejected(lambda: Tensor([1, 2, 3])[:: np.int64(0)], ValueError, "step", "zero")


@given(st.integers(-5, 5) | st.none(), st.integers(-5, 5) | st.none(), st.integers(-3, 3).filter(bool) | st.none())
def test_slices_with_numpy_int_bounds_match_numpy(a: int | None, b: int | None, c: int | None) -> None:
    x = np.arange(4, dtype=np.int32)
    wrap = [None if v is None else np.int64(v) for v in (a, b, c)]
    np.testing.assert_array_equal(Tensor(x)[wrap[0] : wrap[1] : wrap[2]].numpy(), x[a:b:c])


# ---------------- scatter on a device-less tensor ----------------
def test_scatter_into_a_device_less_tensor_takes_the_index_device() -> None:
    base = Tensor.arange(12).reshape(3, 4).float()  # (a constant's graph: it has no device of its own)
    got = base.scatter(1, Tensor([[2], [0], [3]]), 9.0).numpy()
    want = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.put_along_axis(want, np.array([[2], [0], [3]]), 9.0, axis=1)
    np.testing.assert_array_equal(got, want)
    got = Tensor.zeros(2, 3).contiguous().scatter(1, Tensor.arange(2).reshape(2, 1), 1.0).numpy()
    np.testing.assert_array_equal(got, np.eye(2, 3, dtype=np.float32))


# ---------------- element counts beyond int64 ----------------
@given(st.lists(st.integers(1, 2**40), min_size=2, max_size=4).filter(lambda s: math.prod(s) > 2**63 - 1))
def test_a_shape_of_more_elements_than_int64_counts_is_an_overflow_error(shape: list[int]) -> None:
    # (a lazy full of 2**80 elements summed to 0.0: the kernel's int64 element count wrapped)
    for make in (lambda: Tensor.full(tuple(shape), 1.0), lambda: Tensor.empty(*shape), lambda: Tensor.zeros(*shape)):
        _rejected(make, OverflowError, "elements", "int64")


@given(st.lists(st.integers(0, 2**31), min_size=1, max_size=3).filter(lambda s: math.prod(s) <= 2**63 - 1))
def test_shapes_int64_can_count_stay_lazy_and_allowed(shape: list[int]) -> None:
    assert Tensor.full(tuple(shape), 1.0).shape == tuple(shape)
    assert Tensor.ones(*shape, 0).shape == (*shape, 0)


# ---------------- one_hot, from_blob ----------------
@pytest.mark.parametrize("v", [2.5, True, "3", None])
def test_one_hot_num_classes_must_be_an_int(v: Any) -> None:
    _rejected(lambda: Tensor([0, 1]).one_hot(v), TypeError, "num_classes", "int")


def test_one_hot_takes_numpy_ints() -> None:
    np.testing.assert_array_equal(Tensor([0, 2]).one_hot(np.int64(3)).numpy(), np.eye(3, dtype=np.int32)[[0, 2]])


@pytest.mark.parametrize(("ptr", "cls"), [(1.5, TypeError), (True, TypeError), ("0x10", TypeError), (0, ValueError),
                                          (-1, ValueError), (2**64, ValueError), (8, ValueError)])  # fmt: skip
def test_from_blob_refuses_addresses_that_would_crash_the_process(ptr: Any, cls: type[BaseException]) -> None:
    # (address 8 and -1 used to segfault when the tensor was read; 0 read whatever the allocator gave)
    _rejected(lambda: Tensor.from_blob(ptr, (4,), dtype="float32").numpy(), cls, "from_blob")


@given(st.integers(0, 64), st.integers(0, 64))
def test_from_blob_of_a_live_numpy_array_reads_it(start: int, n: int) -> None:
    a = np.arange(128, dtype=np.float32)
    got = Tensor.from_blob(a.ctypes.data + 4 * start, (n,), dtype="float32").numpy()
    np.testing.assert_array_equal(got, a[start : start + n])


# ---------------- 0-d numpy arrays as indices ----------------
@given(st.integers(-4, 3), st.integers(-3, 2))
def test_a_0d_int_array_indexes_like_its_value(i: int, j: int) -> None:
    # (it was a bare "len() of unsized object" TypeError)
    x = np.arange(12, dtype=np.int32).reshape(4, 3)
    np.testing.assert_array_equal(Tensor(x)[np.array(i)].numpy(), x[np.array(i)])
    np.testing.assert_array_equal(Tensor(x)[np.array(i), np.array(j)].numpy(), x[i, j])
    t = Tensor(x.copy())
    t[np.array(i)] = 99
    want = x.copy()
    want[i] = 99
    np.testing.assert_array_equal(t.numpy(), want)


@pytest.mark.parametrize("i", [np.array(1.5), np.array("a")])
def test_a_0d_array_of_no_int_is_an_index_error(i: np.ndarray) -> None:
    _rejected(lambda: Tensor([1, 2, 3])[i], IndexError, "invalid index")


@pytest.mark.parametrize("bias", [(5,), (2, 2), ()])
def test_conv_bias_needs_one_value_per_output_channel(bias: tuple[int, ...]) -> None:
    # (a (5,) bias was a reshape error naming shapes the caller never wrote)
    _rejected(lambda: Tensor(X4).conv2d(Tensor.ones(3, 2, 2, 2), bias=Tensor.ones(*bias)), AssertionError, "bias",
              "(3,)", str(bias))  # fmt: skip


def test_conv_bias_of_any_shape_with_cout_values_is_added_per_channel() -> None:
    w, b = Tensor.ones(3, 2, 2, 2), np.array([1.0, 2.0, 3.0], np.float32)
    base = Tensor(X4).conv2d(w).numpy()
    for shape in ((3,), (1, 3, 1, 1)):
        np.testing.assert_allclose(Tensor(X4).conv2d(w, bias=Tensor(b.reshape(shape))).numpy(),
                                   base + b.reshape(1, 3, 1, 1))  # fmt: skip


@pytest.mark.parametrize("wshape", [(3,), (3, 2)])
def test_a_conv_weight_needs_a_kernel_dim(wshape: tuple[int, ...]) -> None:
    _rejected(lambda: Tensor(X4).conv2d(Tensor.ones(*wshape)), AssertionError, "weight", "kernel dim", str(wshape))


# ---------------- nested lists that never end ----------------
def _self_holding() -> list[Any]:
    x: list[Any] = []
    x.append(x)
    return x


def _shared(depth: int, leaf: Any) -> Any:
    x = leaf
    for _ in range(depth):
        x = [x, x]
    return x


@pytest.mark.parametrize("make", [_self_holding, lambda: _shared(60, [1.0]), lambda: _shared(60, []),
                                  lambda: _shared(100, 1), lambda: [[1], _self_holding()]])  # fmt: skip
def test_a_nest_that_holds_itself_or_claims_2_to_the_60_numbers_is_refused(make: Callable[[], Any]) -> None:
    # (each used to loop forever: the walk over the nest had no end)
    _rejected(lambda: Tensor(make()), ValueError, "nested sequence")


nests = st.recursive(st.integers(-5, 5) | st.floats(-4, 4, width=32) | st.booleans(),
                     lambda inner: st.lists(inner, max_size=4), max_leaves=24)  # fmt: skip


@given(nests)
def test_nested_lists_become_what_numpy_makes_or_a_value_error(data: Any) -> None:
    try:
        want = np.array(data)
    except ValueError:
        _rejected(lambda: Tensor(data), ValueError, "nested sequence")
        return
    if want.dtype == object:
        return
    got = Tensor(data).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-6)


@pytest.mark.parametrize("shape", [(-1, 4), (-2, -3), (3, -1, 0)])
def test_negative_dims_are_refused_by_every_constructor(shape: tuple[int, ...]) -> None:
    # (empty(-2, -3) made a 6-element tensor of shape (-2, -3))
    a = np.zeros(16, np.float32)
    for make in (lambda: Tensor.empty(*shape), lambda: Tensor.full(shape, 1.0), lambda: Tensor.zeros(*shape),
                 lambda: Tensor.from_blob(a.ctypes.data, shape, dtype="float32")):  # fmt: skip
        _rejected(make, ValueError, "negative dimension")


# ---------------- expand: element counts and negative sizes ----------------
def test_expand_past_int64_elements_is_an_overflow_error() -> None:
    # (ones(1).expand(2**40, 2**40).sum().item() was 0.0: the int64 element count wrapped)
    _rejected(lambda: Tensor.ones(1).expand(2**40, 2**40), OverflowError, "int64", "elements")
    _rejected(lambda: Tensor.ones(1, 1).expand(2**32, 2**32), OverflowError, "int64")


@pytest.mark.parametrize("n", [-2, -5])
def test_expand_to_a_negative_size_is_a_value_error(n: int) -> None:
    t = Tensor.ones(3, 4)
    _rejected(lambda: t[0:1].expand(n, 4), ValueError, "expand", ">= 0", str(n))


@given(st.integers(0, 4), st.integers(1, 3))
def test_expand_with_valid_sizes_matches_numpy(n: int, m: int) -> None:
    a = np.arange(m, dtype=np.float32).reshape(1, m)
    np.testing.assert_array_equal(Tensor(a).expand(n, -1).numpy(), np.broadcast_to(a, (n, m)))


# ---------------- non-whole amounts in movement ops: refused, never truncated ----------------
_T34: Callable[[], Tensor] = lambda: Tensor.ones(3, 4)
NOT_WHOLE_MOVES: list[tuple[str, Callable[[Any], Any]]] = [
    ("pad", lambda v: _T34().pad(((v, 0), (0, 0)))),  # (1.5 padded 1 row)
    ("pad", lambda v: _T34().pad((v, 0))),
    ("chunk", lambda v: _T34().chunk(v)),
    ("tril", lambda v: _T34().tril(v)),
    ("triu", lambda v: _T34().triu(v)),
    ("pad_to", lambda v: _T34().pad_to(v, 5)),
    ("shrink_to", lambda v: _T34().shrink_to(v, 4)),
    ("shrink", lambda v: _T34().shrink(((v, 2), None))),  # (was an AttributeError)
    ("topk", lambda v: Tensor([1.0, 2, 3]).topk(v)),
    ("split", lambda v: _T34().split(v)),  # (was a bare TypeError)
    ("split", lambda v: _T34().split([v, 1])),
    ("roll", lambda v: _T34().roll(v, 0)),
]


@pytest.mark.parametrize("v", [1.5, 0.5, 2.0, "1", None])
@pytest.mark.parametrize("name,fn", NOT_WHOLE_MOVES)
def test_movement_amounts_must_be_whole_numbers(name: str, fn: Callable[[Any], Any], v: Any) -> None:
    if v is None and name in ("pad_to", "shrink_to"):
        return  # (None keeps the dim there)
    _rejected(lambda: fn(v), TypeError, name, "int", repr(v))


def test_pad_pair_with_a_third_amount_is_refused() -> None:
    _rejected(lambda: _T34().pad(((1, 0, 2), (0, 0))), ValueError, "(before, after)", "(1, 0, 2)")
    _rejected(lambda: _T34().shrink(((0, 1, 2), None)), ValueError, "(begin, end)")


def test_split_with_a_negative_size_names_it() -> None:
    _rejected(lambda: _T34().split([5, -2]), ValueError, "[5, -2]", ">= 0")


@given(st.integers(-3, 3), st.integers(0, 2), st.integers(1, 4))
def test_numpy_ints_work_where_ints_do(k: int, axis: int, s: int) -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = Tensor(a)
    np.testing.assert_array_equal(t.tril(np.int64(k)).numpy(), np.tril(a, k))
    np.testing.assert_array_equal(t.sum(axis=np.int64(axis % 2)).numpy(), a.sum(axis=axis % 2))
    np.testing.assert_array_equal(t.roll(np.int32(k), np.int64(axis % 2)).numpy(), np.roll(a, k, axis % 2))
    np.testing.assert_array_equal(t.pad(((np.int64(s), 0), (0, 0))).numpy(), np.pad(a, ((s, 0), (0, 0))))
    np.testing.assert_array_equal(t.split(np.int64(s))[0].numpy(), a[:s])
    np.testing.assert_array_equal(t.flip(np.int64(axis % 2)).numpy(), np.flip(a, axis % 2))


# ---------------- constructor data ----------------
@pytest.mark.parametrize("n", [1, 2, 3, 5, 7])
def test_bytes_that_are_no_whole_number_of_items_are_refused(n: int) -> None:
    from speck.tensor import dtypes

    # (b"abc" as int32 was an empty tensor)
    _rejected(lambda: Tensor(bytes(range(n)), dtype=dtypes.int32), ValueError, "4 bytes", str(n))


@given(st.binary(max_size=16).map(lambda b: b[: len(b) // 4 * 4]))
def test_bytes_of_whole_items_match_numpy(b: bytes) -> None:
    from speck.tensor import dtypes

    np.testing.assert_array_equal(Tensor(b, dtype=dtypes.int32).numpy(), np.frombuffer(b, dtype="<i4"))


@pytest.mark.parametrize("dt", [">f4", ">i4", ">i8", ">u2", ">f8", ">i2"])
def test_big_endian_arrays_keep_their_values(dt: str) -> None:
    a = (np.arange(12) - 3).astype(dt).reshape(3, 4)
    if np.dtype(dt).kind == "u":
        a = np.arange(12).astype(dt).reshape(3, 4)
    out = Tensor(a).numpy()
    np.testing.assert_array_equal(out, a)
    assert out.dtype == a.dtype.newbyteorder("=")


# ---------------- setitem of values an int tensor can't hold ----------------
@pytest.mark.parametrize("v", [float("nan"), float("inf"), -float("inf"), np.float32("nan"), [1.0, float("nan")]])
def test_storing_nan_or_inf_into_an_int_tensor_is_refused_like_numpy(v: Any) -> None:
    t2 = Tensor([1, 2, 3])
    a = np.array([1, 2, 3])
    with pytest.raises((ValueError, OverflowError)):
        a[0 : np.ndim(v) + 1] = v  # numpy refuses too
    _rejected(lambda: t2.__setitem__(slice(0, np.ndim(v) + 1), v), ValueError, "NaN or infinity")  # (stored 0)
    np.testing.assert_array_equal(t2.numpy(), [1, 2, 3])


@pytest.mark.parametrize("v", [None, [None, 1]])
def test_storing_none_is_refused(v: Any) -> None:
    t2 = Tensor([1.0, 2, 3])
    _rejected(lambda: t2.__setitem__(slice(0, np.ndim(v) + 1 if v else 1), v), TypeError, "None")


@given(st.floats(allow_nan=True, allow_infinity=True, width=32))
def test_float_and_bool_tensors_store_any_float_like_numpy(v: float) -> None:
    for a in (np.array([1.0, 2.0], dtype=np.float32), np.array([True, False])):
        t = Tensor(a.copy())
        a[0] = v
        t[0] = v
        np.testing.assert_array_equal(t.numpy(), a)


# ---------------- matmul, einsum, rand, manual_seed ----------------
@pytest.mark.parametrize("v", [True, 3, 2.5, "x", None])
def test_matmul_with_a_non_array_is_a_type_error(v: Any) -> None:
    _rejected(lambda: Tensor.ones(3, 4) @ v, TypeError, "matmul", type(v).__name__)  # (was an AttributeError)


def test_matmul_with_an_array_like_matches_numpy() -> None:
    a, b = np.arange(12, dtype=np.float32).reshape(3, 4), np.arange(8, dtype=np.float32).reshape(4, 2)
    np.testing.assert_array_equal((Tensor(a) @ b).numpy(), a @ b)
    np.testing.assert_array_equal((Tensor(a) @ b.tolist()).numpy(), a @ b)


@pytest.mark.parametrize("formula,bad", [("i1->i", "'1'"), ("i_->i", "'_'"), ("i.j->i", "'.'")])
def test_einsum_subscripts_must_be_letters(formula: str, bad: str) -> None:
    _rejected(lambda: Tensor.einsum(formula, Tensor.ones(3, 3)), ValueError, "einsum", bad, "letters")


def test_einsum_repeated_output_letter_is_named() -> None:
    _rejected(lambda: Tensor.einsum("ij->ii", Tensor.ones(3, 4)), ValueError, "einsum", "['i']", "more than once")


def test_einsum_with_letters_still_matches_numpy() -> None:
    a = np.arange(9, dtype=np.float32).reshape(3, 3)
    for f in ("ii->i", "ij->ji", "Ab->b", "...j->...j"):
        np.testing.assert_allclose(Tensor.einsum(f, Tensor(a)).numpy(), np.einsum(f, a))


def test_rand_past_int64_elements_is_an_overflow_error() -> None:
    _rejected(lambda: Tensor.rand(2**40, 2**40), OverflowError, "int64")  # (was the builtin OverflowError)


@pytest.mark.parametrize("v", ["a", 1.5, None])
def test_manual_seed_takes_an_int(v: Any) -> None:
    _rejected(lambda: Tensor.manual_seed(v), TypeError, "manual_seed", "seed", repr(v))  # (builtin ValueError)


def test_manual_seed_with_a_numpy_int_is_the_same_seed() -> None:
    Tensor.manual_seed(np.int64(7))
    a = Tensor.rand(5).numpy()
    Tensor.manual_seed(7)
    np.testing.assert_array_equal(Tensor.rand(5).numpy(), a)
