"""Parity probes, round 10: what tinygrad programs do with dtypes, contractions and the nn/optim surface, checked
differentially against numpy (TENSOR_API 7.3, 7.4 and the sections named per test)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import Tensor, dtypes

INT_DTYPES = [(dtypes.int8, np.int8), (dtypes.uint8, np.uint8), (dtypes.int16, np.int16), (dtypes.uint16, np.uint16)]


# ---------------- a wider dtype= of a contraction multiplies in it (7.3, 7.4) ----------------
@settings(max_examples=25, deadline=None)
@given(st.sampled_from(INT_DTYPES), st.integers(1, 4), st.integers(1, 5), st.integers(1, 3), st.integers(0, 2**32 - 1))
def test_narrow_int_matmul_with_a_wide_dtype_does_not_wrap(dts, n, k, m, seed) -> None:  # type: ignore[no-untyped-def]
    dt, npdt = dts
    rng = np.random.default_rng(seed)
    info = np.iinfo(npdt)
    a = rng.integers(info.min, info.max, (n, k), dtype=npdt, endpoint=True)
    b = rng.integers(info.min, info.max, (k, m), dtype=npdt, endpoint=True)
    want = a.astype(np.int64) @ b.astype(np.int64)
    for got in (Tensor(a).matmul(Tensor(b), dtype=dtypes.int64), Tensor(a).dot(Tensor(b), dtype=dtypes.int64),
                Tensor.einsum("ij,jk->ik", Tensor(a), Tensor(b), dtype=dtypes.int64),
                Tensor(a).linear(Tensor(b), dtype=dtypes.int64)):  # fmt: skip
        assert got.dtype == dtypes.int64
        np.testing.assert_array_equal(got.numpy(), want)
    # without dtype= the product keeps the operands' dtype and wraps like numpy's
    np.testing.assert_array_equal((Tensor(a) @ Tensor(b)).numpy(), (a @ b).astype(npdt))


def test_int8_conv2d_with_an_int32_dtype_does_not_wrap() -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 127, (1, 2, 5, 5), dtype=np.int8)
    w = rng.integers(-128, 127, (3, 2, 3, 3), dtype=np.int8)
    got = Tensor(x).conv2d(Tensor(w), dtype=dtypes.int32, padding=1)
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))  # (1, 2, 5, 5, 3, 3)
    want = np.einsum("ncyxij,ocij->noyx", win, w.astype(np.int64))
    assert got.dtype == dtypes.int32
    np.testing.assert_array_equal(got.numpy(), want)


def test_half_matmul_with_a_float32_dtype_multiplies_in_float32() -> None:
    a = np.full((1, 8), 300.0, np.float16)  # each product, 90000, is beyond half's range
    got = Tensor(a).matmul(Tensor(a.T), dtype=dtypes.float32)
    assert got.dtype == dtypes.float32
    np.testing.assert_array_equal(got.numpy(), [[720000.0]])
    # a narrower dtype= still only sets the accumulation (the products are float32)
    f = np.full((1, 4), 1000.0, np.float32)
    assert Tensor(f).matmul(Tensor(f.T), dtype=dtypes.half).dtype == dtypes.half


def test_einsum_without_a_reduction_takes_the_requested_dtype() -> None:
    got = Tensor.einsum("i,j->ij", Tensor([1, 2]), Tensor([3, 4]), dtype=dtypes.float64)
    assert got.dtype == dtypes.float64
    np.testing.assert_array_equal(got.numpy(), [[3.0, 4.0], [6.0, 8.0]])


# ---------------- rand fills the dtype's whole significand (4.3) ----------------
def test_float64_rand_has_53_random_bits() -> None:
    Tensor.manual_seed(3)
    a = Tensor.rand(20000, dtype=dtypes.float64).numpy()
    assert a.dtype == np.float64 and a.min() >= 0.0 and a.max() < 1.0
    assert len(np.unique(a)) == a.size  # 2**24 possible values would repeat ~12 times in 20000 draws
    assert np.any(a * 2.0**24 % 1 != 0)  # bits below float32's resolution are random too
    assert abs(a.mean() - 0.5) < 0.01
    u = Tensor.uniform(20000, low=-1.0, high=1.0, dtype=dtypes.float64).numpy()
    assert len(np.unique(u)) == u.size and u.min() >= -1.0 and u.max() < 1.0


def test_narrow_float_rand_stays_below_one_and_float32_keeps_24_bits() -> None:
    Tensor.manual_seed(4)
    f = Tensor.rand(20000).numpy()
    assert f.dtype == np.float32 and np.all(f * 2.0**24 % 1 == 0) and f.max() < 1.0
    h = Tensor.rand(20000, dtype=dtypes.half).numpy()
    assert h.max() < 1.0 and np.all(h.astype(np.float64) * 2.0**11 % 1 == 0)
