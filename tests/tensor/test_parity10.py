"""Parity probes, round 10: what tinygrad programs do with dtypes, contractions and the nn/optim surface, checked
differentially against numpy (TENSOR_API 7.3, 7.4 and the sections named per test)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import Context, Tensor, dtypes, nn
from speck.uop import DType

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


# ---------------- odd functions have their derivative at exactly 0 (5) ----------------
ODD_DERIVATIVES_AT_0 = {"tanh": 1.0, "asin": 1.0, "acos": -1.0, "atan": 1.0, "asinh": 1.0, "sinh": 1.0, "atanh": 1.0,
                        "sin": 1.0, "erf": 2 / math.sqrt(math.pi)}  # fmt: skip


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64, dtypes.half])
@pytest.mark.parametrize("fn", sorted(ODD_DERIVATIVES_AT_0))
def test_odd_functions_have_their_derivative_at_zero(fn: str, dt: DType) -> None:
    x = Tensor([0.0, -0.0], dtype=dt)
    getattr(x, fn)().sum().backward()
    assert x.grad is not None
    np.testing.assert_allclose(x.grad.numpy().astype(np.float64), [ODD_DERIVATIVES_AT_0[fn]] * 2, rtol=2e-3)


def test_tanh_of_zero_inputs_still_trains() -> None:
    # a zero pre-activation (zero-initialised bias and input) must pass gradient through tanh, as it does in numpy's
    # derivative 1 - tanh(0)^2 = 1
    w = Tensor([[0.5, -0.25]])
    b = Tensor([0.0])
    x = Tensor([[0.0], [0.0]])
    (x @ w + b).tanh().sum().backward()
    assert w.grad is not None and b.grad is not None
    np.testing.assert_array_equal(b.grad.numpy(), [4.0])  # (broadcast over the 2x2 output)


# ---------------- float64 special functions to float64 precision ----------------
@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-1.0, 1.0, allow_nan=False), min_size=1, max_size=40))
def test_float64_asin_acos_match_math(xs: list[float]) -> None:
    got_asin = Tensor(xs, dtype=dtypes.float64).asin().numpy()
    got_acos = Tensor(xs, dtype=dtypes.float64).acos().numpy()
    np.testing.assert_allclose(got_asin, [math.asin(v) for v in xs], rtol=2e-15, atol=1e-300)
    np.testing.assert_allclose(got_acos, [math.acos(v) for v in xs], rtol=0, atol=1e-15)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=40))
def test_float64_atan_matches_math(xs: list[float]) -> None:
    got = Tensor(xs, dtype=dtypes.float64).atan().numpy()
    np.testing.assert_allclose(got, [math.atan(v) for v in xs], rtol=2e-15, atol=1e-300)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-8.0, 8.0, allow_nan=False), min_size=1, max_size=40))
def test_float64_erf_matches_math(xs: list[float]) -> None:
    got = Tensor(xs, dtype=dtypes.float64).erf().numpy()
    np.testing.assert_allclose(got, [math.erf(v) for v in xs], rtol=4e-15, atol=1e-300)


def test_float64_special_function_edges_and_gradients() -> None:
    x = Tensor([2.0, -1.5, 1.0, -1.0, math.nan], dtype=dtypes.float64)
    got = x.asin().numpy()
    assert np.isnan(got[[0, 1, 4]]).all() and got[2] == math.pi / 2 and got[3] == -math.pi / 2
    e = Tensor([math.inf, -math.inf, 6.0, 30.0, math.nan, -0.0], dtype=dtypes.float64).erf().numpy()
    np.testing.assert_array_equal(e[:4], [1.0, -1.0, 1.0, 1.0])
    assert np.isnan(e[4]) and e[5] == 0.0 and np.signbit(e[5])
    v = np.array([-0.99, -0.6, -0.5, 0.2, 0.5, 0.7])
    t = Tensor(v)
    t.asin().sum().backward()
    assert t.grad is not None
    np.testing.assert_allclose(t.grad.numpy(), 1 / np.sqrt(1 - v * v), rtol=1e-12)
    z = np.array([-7.0, -3.0, -2.5, -1.0, 1e-5, 2.4, 2.5, 5.0, 6.5])
    t = Tensor(z)
    t.erf().sum().backward()
    assert t.grad is not None
    want = 2 / np.sqrt(np.pi) * np.exp(-z * z)  # (below 1e-15 past 6, where erf is exactly 1 and its gradient 0)
    np.testing.assert_allclose(t.grad.numpy(), want, rtol=1e-10, atol=1e-15)


def test_normalizing_a_zero_vector_has_a_finite_gradient() -> None:
    for p in (2.0, 1.0, 3.0):
        x = Tensor([[0.0, 0.0], [3.0, 4.0]])
        y = x.normalize(p=p, dim=1)
        y.sum().backward()
        assert x.grad is not None
        g = x.grad.numpy()
        np.testing.assert_allclose(g[0], [1e12, 1e12], rtol=1e-6)  # x / eps where the norm is below eps
        v = np.array([3.0, 4.0])
        n = (np.abs(v) ** p).sum() ** (1 / p)
        want = 1 / n - (np.abs(v) ** (p - 1) * np.sign(v)) * v.sum() / n ** (p + 1)  # d/dv sum(v / ||v||_p)
        np.testing.assert_allclose(g[1], want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(y.numpy(), [[0, 0], v / n], rtol=1e-6)


# ---------------- losses over logits masked with -inf (7.5) ----------------
def _np_log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 5), st.integers(2, 6), st.integers(0, 2**32 - 1))
def test_losses_over_masked_logits_are_finite_like_numpy(n: int, c: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c)).astype(np.float32)
    y = rng.integers(0, c, n)
    x[rng.random((n, c)) < 0.4] = -np.inf  # masked classes (never the label)
    x[np.arange(n), y] = rng.standard_normal(n)
    want = -_np_log_softmax(x.astype(np.float64))[np.arange(n), y]
    lx, ly = Tensor(x), Tensor(y.astype(np.int32))
    np.testing.assert_allclose(lx.sparse_categorical_crossentropy(ly, reduction="none").numpy(), want, rtol=1e-5)
    np.testing.assert_allclose(lx.cross_entropy(ly).numpy(), want.mean(), rtol=1e-5)
    np.testing.assert_allclose(lx.cross_entropy(Tensor(np.eye(c, dtype=np.float32)[y])).numpy(), want.mean(), rtol=1e-5)
    np.testing.assert_allclose(lx.log_softmax(1).nll_loss(ly, reduction="sum").numpy(), want.sum(), rtol=1e-5)
    w = rng.random(c).astype(np.float32) + 0.5
    nll_w = lx.log_softmax(1).nll_loss(ly, weight=Tensor(w)).numpy()
    np.testing.assert_allclose(nll_w, (want * w[y]).sum() / w[y].sum(), rtol=1e-5)
    lx.sparse_categorical_crossentropy(ly).backward()
    assert lx.grad is not None
    p = np.exp(_np_log_softmax(x.astype(np.float64)))
    np.testing.assert_allclose(lx.grad.numpy(), (p - np.eye(c)[y]) / n, rtol=1e-4, atol=1e-6)


def test_ignored_rows_with_masked_logits_do_not_poison_the_mean() -> None:
    x = Tensor([[0.0, -np.inf, 1.0], [0.0, 0.0, 0.0]])
    np.testing.assert_allclose(x.sparse_categorical_crossentropy(Tensor([1, 0]), ignore_index=1).numpy(), np.log(3))
    np.testing.assert_allclose(x.log_softmax(1).nll_loss(Tensor([1, 0]), ignore_index=1).numpy(), np.log(3), rtol=1e-6)


# ---------------- nn.Embedding is a row lookup (8) ----------------
@settings(max_examples=20, deadline=None)
@given(st.integers(1, 12), st.integers(1, 5), st.lists(st.integers(0, 11), min_size=1, max_size=10), st.integers(0, 99))
def test_embedding_rows_and_gradient_match_numpy(vocab: int, dim: int, ids: list[int], seed: int) -> None:
    ids = [i % vocab for i in ids]
    e = nn.Embedding(vocab, dim)
    w = np.random.default_rng(seed).standard_normal((vocab, dim)).astype(np.float32)
    e.weight.assign(Tensor(w)).realize()
    out = e(Tensor(np.array(ids, np.int32).reshape(1, -1)))
    np.testing.assert_array_equal(out.numpy(), w[ids][None])
    g = np.random.default_rng(seed + 1).standard_normal(out.shape).astype(np.float32)
    (out * Tensor(g)).sum().backward()
    want = np.zeros_like(w)
    np.add.at(want, ids, g[0])  # duplicates add up
    assert e.weight.grad is not None
    np.testing.assert_allclose(e.weight.grad.numpy(), want, rtol=1e-6, atol=1e-6)


def test_embedding_rows_stay_apart() -> None:
    e = nn.Embedding(4, 2)
    w = np.array([[np.inf, 1.0], [np.nan, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)
    e.weight.assign(Tensor(w)).realize()
    np.testing.assert_array_equal(e(Tensor([3, 2])).numpy(), w[[3, 2]])  # one-hot @ weight gave NaN everywhere
    with Context(CHECK_OOB=0):  # an index outside the table reads a zero row (no wrap of -1)
        np.testing.assert_array_equal(e(Tensor([-1, 4, 2])).numpy(), [[0, 0], [0, 0], [3, 4]])


def test_tied_embedding_with_position_embedding_trains_like_numpy() -> None:
    # GPT-2's layout: token embedding reused as the output projection, plus a position embedding indexed by arange
    rng = np.random.default_rng(5)
    wte, wpe = nn.Embedding(13, 8), nn.Embedding(8, 8)
    w, p = rng.standard_normal((13, 8)).astype(np.float32), rng.standard_normal((8, 8)).astype(np.float32)
    wte.weight.assign(Tensor(w)).realize()
    wpe.weight.assign(Tensor(p)).realize()
    ids = np.array([[1, 5, 2, 7, 0, 0], [1, 9, 4, 3, 8, 2]])
    h = wte(Tensor(ids.astype(np.int32))) + wpe(Tensor.arange(6).unsqueeze(0).expand(2, 6))
    logits = h @ wte.weight.T
    loss = logits.sum()
    loss.backward()
    hn = w[ids] + p[np.arange(6)][None]
    np.testing.assert_allclose(logits.numpy(), hn @ w.T, rtol=1e-5, atol=1e-5)
    assert wte.weight.grad is not None and wpe.weight.grad is not None
    Tensor.realize(wte.weight.grad, wpe.weight.grad)
    gh = np.ones((2, 6, 13)) @ w  # d loss / d h
    gw = np.ones((2, 6, 13)).reshape(-1, 13).T @ hn.reshape(-1, 8)  # the projection's part
    np.add.at(gw, ids.reshape(-1), gh.reshape(-1, 8))  # the lookup's part
    gp = np.zeros_like(p)
    np.add.at(gp, np.tile(np.arange(6), 2), gh.reshape(-1, 8))
    np.testing.assert_allclose(wte.weight.grad.numpy(), gw, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(wpe.weight.grad.numpy(), gp, rtol=1e-4, atol=1e-4)


# ---------------- binary_crossentropy differentiates like PyTorch's (7.5) ----------------
@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 1.0, 1e-3, 0.3, 0.5, 0.9, 0.999]), st.sampled_from([0.0, 1.0, 0.25])),
                min_size=1, max_size=8))  # fmt: skip
def test_bce_gradient_is_finite_at_saturated_probabilities(pairs: list[tuple[float, float]]) -> None:
    p = np.array([a for a, _ in pairs], np.float64)
    y = np.array([b for _, b in pairs], np.float64)
    pt, yt = Tensor(p.astype(np.float32)), Tensor(y.astype(np.float32))
    loss = pt.binary_crossentropy(yt)
    loss.backward()
    with np.errstate(divide="ignore"):
        lp, l1p = np.maximum(np.log(p), -100), np.maximum(np.log(1 - p), -100)
    np.testing.assert_allclose(loss.numpy(), -(y * lp + (1 - y) * l1p).mean(), rtol=1e-4, atol=1e-6)
    assert pt.grad is not None and yt.grad is not None
    want_p = (p - y) / np.maximum(p * (1 - p), 1e-12) / len(p)  # torch.nn.BCELoss's derivative
    np.testing.assert_allclose(pt.grad.numpy(), want_p, rtol=1e-4)
    np.testing.assert_allclose(yt.grad.numpy(), (l1p - lp) / len(p), rtol=1e-4, atol=1e-6)


def test_saturated_sigmoid_then_bce_trains() -> None:
    x = Tensor([-30.0, 30.0, 0.5])  # sigmoid(30) is exactly 1.0 in float32
    x.sigmoid().binary_crossentropy(Tensor([0.0, 1.0, 1.0])).backward()
    assert x.grad is not None
    g = x.grad.numpy()
    assert np.isfinite(g).all() and g[1] == 0.0
    np.testing.assert_allclose(g[2], (1 / (1 + np.exp(-0.5)) - 1) / 3, rtol=1e-5)
