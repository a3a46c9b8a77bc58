"""tinygrad-parity leftovers: Tensor.training follows the TRAINING setting, dtypes.from_np, scans (cumsum/cumprod/
cummax/cummin/logcumsumexp) over a symbolic dim, and edge shapes. Values are checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from speck.tensor import Context, Tensor, Variable, dtypes
from speck.tensor.helpers import DEV
from speck.uop.helpers import Target


def test_training_attribute_follows_the_training_setting() -> None:
    t = Tensor([1.0])
    assert Tensor.training is False and t.training is False
    with Context(TRAINING=1):
        assert Tensor.training is True and t.training is True
        with Tensor.test():
            assert Tensor.training is False
        assert Tensor.training is True
    assert Tensor.training is False
    with Tensor.train():
        assert Tensor.training is True
    # a direct write (older tinygrad code) is the setting: dropout sees it, and Context restores it
    with Context(TRAINING=0):
        Tensor.training = True
        x = Tensor.ones(4000).dropout(0.5).numpy()
        assert set(np.unique(x).tolist()) == {0.0, 2.0}
    assert Tensor.training is False


def test_dev_value_unset_is_one_empty_target() -> None:
    with Context(DEV=""):
        assert DEV.value == [Target()] and len(DEV.value) == 1
        assert (DEV.device, DEV.renderer, DEV.arch, DEV.interface, DEV.indices) == ("",) * 5


@pytest.mark.parametrize("np_dt", [np.float32, np.float16, np.float64, np.int8, np.uint16, np.int64, np.bool_])
def test_dtypes_from_np(np_dt: type) -> None:
    dt = dtypes.from_np(np_dt)
    assert dt == dtypes.from_np(np.dtype(np_dt))
    assert Tensor(np.zeros(3, dtype=np_dt)).dtype == dt


def test_dtypes_from_np_refuses_kinds_speck_lacks() -> None:
    with pytest.raises(TypeError, match="complex64"):
        dtypes.from_np(np.complex64)


def _full(t: Tensor, axis: int, top: int) -> np.ndarray:
    """A tensor with a symbolic dim at axis, padded back to `top` (concrete) and read."""
    n = t.shape[axis]
    pads = tuple((0, top - n) if k == axis else (0, 0) for k in range(t.ndim))
    return t.pad(pads).numpy()


@pytest.mark.parametrize("k", [1, 5, 9])
@pytest.mark.parametrize("axis", [0, 1])
def test_scans_over_a_symbolic_dim(k: int, axis: int) -> None:
    rng = np.random.default_rng(k)
    a = rng.standard_normal((9, 9)).astype(np.float32) * 0.5 + 1.0
    v = Variable("n", 1, 9).bind(k)
    t = Tensor(a)[:v] if axis == 0 else Tensor(a)[:, :v]
    ref = a[:k] if axis == 0 else a[:, :k]
    np.testing.assert_allclose(_full(t.cumsum(axis), axis, 9)[: ref.shape[0], : ref.shape[1]],
                               np.cumsum(ref, axis), rtol=1e-5, atol=1e-5)  # fmt: skip
    np.testing.assert_allclose(_full(t.cumprod(axis), axis, 9)[: ref.shape[0], : ref.shape[1]],
                               np.cumprod(ref, axis), rtol=1e-4)  # fmt: skip
    mx, idx = t.cummax(axis)
    np.testing.assert_array_equal(_full(mx, axis, 9)[: ref.shape[0], : ref.shape[1]], np.maximum.accumulate(ref, axis))
    want_idx = np.moveaxis(np.array([[int(np.argmax(row[: j + 1])) for j in range(row.shape[0])]
                                     for row in np.moveaxis(ref, axis, -1)]), -1, axis)  # fmt: skip
    np.testing.assert_array_equal(_full(idx, axis, 9)[: ref.shape[0], : ref.shape[1]], want_idx)
    mn, _ = t.cummin(axis)
    np.testing.assert_array_equal(_full(mn, axis, 9)[: ref.shape[0], : ref.shape[1]], np.minimum.accumulate(ref, axis))
    np.testing.assert_allclose(_full(t.logcumsumexp(axis), axis, 9)[: ref.shape[0], : ref.shape[1]],
                               np.logaddexp.accumulate(ref, axis), rtol=1e-5, atol=1e-5)  # fmt: skip


def test_scan_over_a_concrete_dim_of_a_symbolic_tensor() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = Tensor(a)[: Variable("r", 1, 3).bind(2)]
    np.testing.assert_allclose(_full(t.cumsum(1), 0, 3)[:2], np.cumsum(a[:2], 1))


@pytest.mark.parametrize("np_dt", [np.int32, np.int64, np.uint8])
def test_reflected_shifts_take_the_tensor_as_the_amount(np_dt: type) -> None:
    s = np.array([0, 1, 3, 7], dtype=np_dt)
    r = 1 << Tensor(s)
    assert r.dtype == dtypes.from_np(np_dt)
    np.testing.assert_array_equal(r.numpy(), (np.ones(4, dtype=np_dt) << s))
    np.testing.assert_array_equal((100 >> Tensor(s)).numpy(), np.full(4, 100, dtype=np_dt) >> s)
    if np_dt is not np.uint8:
        np.testing.assert_array_equal((-100 >> Tensor(s)).numpy(), np.full(4, -100, dtype=np_dt) >> s)


def test_shift_by_a_float_amount_is_refused() -> None:
    with pytest.raises(RuntimeError, match="int shift amount"):
        Tensor([1, 2]) << 1.5
    with pytest.raises(RuntimeError, match="int shift amount"):
        Tensor([1, 2]) >> Tensor([1.0, 2.0])
    with pytest.raises(RuntimeError, match="int shift amount"):
        1 << Tensor([1.0])
    np.testing.assert_array_equal((Tensor([4, 8]) >> True).numpy(), [2, 4])  # a bool amount is 0 or 1


_W = np.array([1, 2, 3, 4], dtype=np.int32)
_WF = _W.astype(np.float32) * 2.5  # what the weak tensor reads as (weakfloat -> the default float)


@pytest.mark.parametrize(
    "name, op, ref",
    [
        ("getitem tensor", lambda w: w[Tensor([3, 0, 0])], lambda a: a[[3, 0, 0]]),
        ("getitem list", lambda w: w[[1, 2]], lambda a: a[[1, 2]]),
        ("gather", lambda w: w.gather(0, Tensor([2, 0])), lambda a: a[[2, 0]]),
        ("sort", lambda w: (-w).sort()[0], lambda a: np.sort(-a)),
        ("topk", lambda w: w.topk(2)[0], lambda a: np.sort(a)[::-1][:2]),
        ("scatter", lambda w: w.scatter(0, Tensor([1]), 9.0), lambda a: np.where(np.arange(4) == 1, 9.0, a)),
        (
            "scatter_reduce",
            lambda w: w.scatter_reduce(0, Tensor([0, 0]), Tensor([1.0, 2.0]), "sum"),
            lambda a: a + np.array([3.0, 0, 0, 0]),
        ),
        ("masked_select", lambda w: w.masked_select(Tensor([True, False, True, False])), lambda a: a[[0, 2]]),
        (
            "masked_select sized",
            lambda w: w.masked_select(Tensor([True, False, True, False]), size=3),
            lambda a: np.array([a[0], a[2], 0.0]),
        ),
        (
            "interpolate nearest",
            lambda w: w.reshape(1, 1, 4).interpolate((8,), mode="nearest").flatten(),
            lambda a: np.repeat(a, 2),
        ),
        ("diag", lambda w: w.diag(), np.diag),
    ],
)
def test_weak_tensors_through_index_and_sort_ops(name: str, op: object, ref: object) -> None:
    """A weak tensor (an int tensor times a float literal) has no storage; ops that gather, scatter or sort it
    compute at its default dtype instead of refusing to build a weak-dtype buffer."""
    got = op(Tensor(_W) * 2.5)  # type: ignore[operator]
    assert got.dtype == dtypes.float32, name
    np.testing.assert_allclose(got.numpy(), ref(_WF), rtol=1e-6)  # type: ignore[operator]


def test_weak_zero_dim_masked_select() -> None:
    np.testing.assert_array_equal(Tensor(3.0).masked_select(Tensor(True)).numpy(), np.array([3.0], np.float32))
    np.testing.assert_array_equal(Tensor(7).masked_select(Tensor([True, False, True])).numpy(), [7, 7])


def test_weak_tensors_through_linalg() -> None:
    a = np.array([[2, 1], [1, 3]], dtype=np.int32)
    q, r = (Tensor(a) * 0.5).qr()
    assert q.dtype == dtypes.float32
    np.testing.assert_allclose((q @ r).numpy(), a * 0.5, atol=1e-5)
    np.testing.assert_allclose((Tensor(a) * 0.5).svd()[1].numpy(), np.linalg.svd(a * 0.5)[1], rtol=1e-5)


def test_masked_fill_promotes_like_where() -> None:
    """masked_fill(mask, value) is mask.where(value, self): an int tensor filled with 1.5 holds 1.5 (it was cast to
    the int dtype: 1), an int value keeps the int dtype, a half tensor stays half."""
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    m = x > 2
    got = Tensor(x).masked_fill(Tensor(m), 1.5)
    np.testing.assert_array_equal(got.numpy(), np.where(m, 1.5, x).astype(np.float32))
    assert dtypes.is_float(got.dtype)
    ints = Tensor(x).masked_fill(Tensor(m), 7)
    assert ints.dtype == dtypes.int32
    np.testing.assert_array_equal(ints.numpy(), np.where(m, 7, x))
    half = Tensor(x.astype(np.float16)).masked_fill(Tensor(m), -np.inf)
    assert half.dtype == dtypes.half
    np.testing.assert_array_equal(half.numpy(), np.where(m, -np.inf, x).astype(np.float16))


@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("np_dt", [np.float32, np.int32, np.bool_])
def test_sort_along_a_symbolic_dim(k: int, descending: bool, np_dt: type) -> None:
    """Padding that sorts last (+NaN / -inf for floats, the dtype's max / min for ints and bools) keeps the real
    elements first, ties in their original order (stable), so values and indices match numpy's stable sort."""
    rng = np.random.default_rng(k)
    a = (rng.integers(-3, 4, (2, 8)) if np_dt is not np.float32 else rng.standard_normal((2, 8))).astype(np_dt)
    if np_dt is np.float32:
        a[0, 0] = a[0, 1] = -np.inf  # ties at the pad value of a descending sort
    v = Variable("L", 1, 8).bind(k)
    vals, idx = Tensor(a)[:, :v].sort(1, descending)
    ref = a[:, :k]
    order = np.argsort(~ref if np_dt is np.bool_ and descending else -ref if descending else ref, 1, kind="stable")
    np.testing.assert_array_equal(_full(idx, 1, 8)[:, :k], order)
    np.testing.assert_array_equal(_full(vals, 1, 8)[:, :k], np.take_along_axis(ref, order, 1))
    np.testing.assert_array_equal(_full(Tensor(a)[:, :v].argsort(1, descending), 1, 8)[:, :k], order)
