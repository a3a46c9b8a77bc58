"""Winograd convolution (speck.tensor.winograd, the WINO setting): the F(m, r) matrices are the correlation exactly;
conv2d's forward and both gradients under WINO=2 match a float64 numpy convolution (hypothesis over batch, channels,
sizes, kernel and padding) to float32 accuracy, and WINO=0 (the direct convolution) agrees with it; which
convolutions are rewritten and with which tile; and the kernels a Winograd convolution's forward takes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import Context, Tensor, assert_kernel_count, dtypes
from speck.tensor.errors import TensorValueError
from speck.tensor.winograd import matrices, winograd_tile

# float32 Winograd: the transforms' sums of up to a few hundred terms with coefficients up to 21 (F(4, 5)), errors a
# few 1e-6 of the largest output where the direct sum's are ~2e-7 (measured over 32 channels)
RTOL = 3e-5


def _conv_np(x: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    kh, kw = w.shape[2:]
    win = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))
    return np.einsum("bihwyx,oiyx->bohw", win, w.astype(np.float64))


def _grads_np(x: np.ndarray, w: np.ndarray, g: np.ndarray, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """d/dx and d/dw of sum(conv(x, w, pad) * g), by the chain rule over every window tap."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    kh, kw = w.shape[2:]
    oh, ow = g.shape[2:]
    dxp, dw = np.zeros_like(xp), np.zeros(w.shape)
    g64, w64 = g.astype(np.float64), w.astype(np.float64)
    for ky in range(kh):
        for kx in range(kw):
            dw[:, :, ky, kx] = np.einsum("bohw,bihw->oi", g64, xp[:, :, ky : ky + oh, kx : kx + ow])
            dxp[:, :, ky : ky + oh, kx : kx + ow] += np.einsum("bohw,oi->bihw", g64, w64[:, :, ky, kx])
    return dxp[:, :, pad : pad + x.shape[2], pad : pad + x.shape[3]], dw


def _run(x: np.ndarray, w: np.ndarray, g: np.ndarray, pad: int, wino: int) -> tuple[np.ndarray, ...]:
    with Context(WINO=wino):
        xt, wt = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
        out = xt.conv2d(wt, padding=pad)
        (out * Tensor(g)).sum().backward()
        assert xt.grad is not None and wt.grad is not None
        return out.numpy(), xt.grad.numpy(), wt.grad.numpy()


def _close(got: np.ndarray, ref: np.ndarray) -> None:
    assert got.shape == ref.shape, f"shape {got.shape} != {ref.shape}"
    scale = max(float(np.abs(ref).max()), 1.0)
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=0, atol=RTOL * scale)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("r", [1, 2, 3, 5, 7])
def test_matrices_compute_the_correlation(m: int, r: int) -> None:
    """At @ ((G @ g) * (Bt @ d)) is sum_k g[k] d[i + k] for random data, in float64."""
    at, g, bt = (np.array(mat, dtype=np.float64) for mat in matrices(m, r))
    assert at.shape == (m, m + r - 1) and g.shape == (m + r - 1, r) and bt.shape == (m + r - 1, m + r - 1)
    rng = np.random.default_rng(m * 10 + r)
    for _ in range(5):
        gv, d = rng.standard_normal(r), rng.standard_normal(m + r - 1)
        ref = np.array([sum(gv[k] * d[i + k] for k in range(r)) for i in range(m)])
        np.testing.assert_allclose(at @ ((g @ gv) * (bt @ d)), ref, rtol=1e-9, atol=1e-9)


def test_matrices_reject_an_empty_tile() -> None:
    with pytest.raises(TensorValueError, match="m >= 1"):
        matrices(0, 3)


@settings(max_examples=30)  # each example compiles its own ~40 kernels (two convolutions' forward and backward)
@given(
    n=st.integers(1, 3),
    cin=st.integers(1, 5),
    cout=st.integers(1, 5),
    h=st.integers(3, 11),
    w=st.integers(3, 11),
    k=st.sampled_from([3, 5]),
    pad=st.integers(0, 2),
    seed=st.integers(0, 2**16),
)
def test_forward_and_gradients_match_numpy(n: int, cin: int, cout: int, h: int, w: int, k: int, pad: int,
                                           seed: int) -> None:  # fmt: skip
    if min(h, w) + 2 * pad < k + 1:  # at least 2 outputs per axis: smaller ones stay direct (winograd_tile)
        return
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
    wt = rng.standard_normal((cout, cin, k, k)).astype(np.float32)
    g = rng.standard_normal((n, cout, h + 2 * pad - k + 1, w + 2 * pad - k + 1)).astype(np.float32)
    out, dx, dw = _run(x, wt, g, pad, wino=2)
    ref_dx, ref_dw = _grads_np(x, wt, g, pad)
    _close(out, _conv_np(x, wt, pad))
    _close(dx, ref_dx)
    _close(dw, ref_dw)
    # the direct convolution (WINO=0) agrees with it
    for a, b in zip((out, dx, dw), _run(x, wt, g, pad, wino=0)):
        _close(a, b.astype(np.float64))


def test_the_main_jobs_conv2_shape_matches_numpy() -> None:
    """conv2 of the main job (32 -> 32 channels, 5x5 over 24x24: F(4, 5), 6x6 tiles of the input gradient)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 32, 24, 24)).astype(np.float32)
    w = (rng.standard_normal((32, 32, 5, 5)) * 0.1).astype(np.float32)
    g = rng.standard_normal((2, 32, 20, 20)).astype(np.float32)
    out, dx, dw = _run(x, w, g, 0, wino=1)
    ref_dx, ref_dw = _grads_np(x, w, g, 0)
    _close(out, _conv_np(x, w, 0))
    _close(dx, ref_dx)
    _close(dw, ref_dw)


@pytest.mark.parametrize("k", [3, 5])
def test_a_batch_of_64_images_matches_numpy(k: int) -> None:
    """64 images are enough for codegen to walk the input transforms image by image and the second transform pass
    column block by column block (speck.codegen.opt.heuristic): forward and both gradients still match."""
    rng = np.random.default_rng(k)
    x = rng.standard_normal((64, 16, 11, 13)).astype(np.float32)
    w = (rng.standard_normal((16, 16, k, k)) * 0.2).astype(np.float32)
    g = rng.standard_normal((64, 16, 11 - k + 1, 13 - k + 1)).astype(np.float32)
    out, dx, dw = _run(x, w, g, 0, wino=1)
    ref_dx, ref_dw = _grads_np(x, w, g, 0)
    _close(out, _conv_np(x, w, 0))
    _close(dx, ref_dx)
    _close(dw, ref_dw)


def test_float64_is_accurate_to_float64() -> None:
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((2, 3, 9, 9)), rng.standard_normal((4, 3, 3, 3))
    with Context(WINO=2):
        out = Tensor(x, dtype=dtypes.float64).conv2d(Tensor(w, dtype=dtypes.float64), padding=1).numpy()
    np.testing.assert_allclose(out, _conv_np(x, w, 1), rtol=0, atol=1e-12 * np.abs(out).max())


def _tile(shape: tuple[int, ...], wshape: tuple[int, ...], mode: int, stride: int = 1, dilation: int = 1,
          pad: int = 0, dtype: object = dtypes.float32) -> int:  # fmt: skip
    x, w = Tensor.empty(*shape, dtype=dtype), Tensor.empty(*wshape, dtype=dtype)
    return winograd_tile(x, w, (stride, stride), (dilation, dilation), ((pad, pad), (pad, pad)), mode)


def test_which_convolutions_are_rewritten() -> None:
    big = ((8, 32, 24, 24), (32, 32, 5, 5))
    assert _tile(*big, mode=1) == 4  # the main job's conv2: F(4, 5)
    assert _tile(*big, mode=0) == 0
    assert _tile(*big, mode=1, stride=2) == 0
    assert _tile(*big, mode=1, dilation=2) == 0
    assert _tile(*big, mode=1, dtype=dtypes.int32) == 0
    assert _tile(*big, mode=1, dtype=dtypes.half) == 0  # WINO=1: float32 only
    assert _tile(*big, mode=2, dtype=dtypes.half) == 4
    assert _tile((8, 1, 28, 28), (32, 1, 5, 5), mode=1) == 0  # a first layer: too few channels to pay
    assert _tile((8, 1, 28, 28), (32, 1, 5, 5), mode=2) == 4
    assert _tile((8, 32, 8, 8), (32, 32, 1, 1), mode=2) == 0  # 1x1: nothing to save
    assert _tile((8, 32, 8, 8), (32, 32, 3, 5), mode=2) == 0  # not square
    assert _tile((8, 64, 8, 8), (64, 64, 3, 3), mode=1) == 2  # 6x6 out: 3 tiles of 2 rather than 2 of 4 (a tie)
    assert _tile((8, 32, 10, 10), (64, 32, 3, 3), mode=1) == 4  # 8x8 out: 2 tiles of 4
    assert _tile((8, 32, 4, 4), (32, 32, 3, 3), mode=2) == 2
    assert _tile((8, 32, 3, 3), (32, 32, 3, 3), mode=2) == 0  # a single output: direct


def test_forward_kernels() -> None:
    """The forward of a Winograd convolution is 9 kernels: the channel-last copy of the input, the input and weight
    transforms (two passes each, one per axis), the batched matmul, the output transform's two passes and the copy
    back to (N, C, H, W) (uploading the transforms' small constant matrices is a copy, not a kernel)."""
    x, w = Tensor.randn(2, 16, 12, 12).realize(), Tensor.randn(16, 16, 3, 3).realize()
    with Context(WINO=2), assert_kernel_count(9):
        x.conv2d(w).realize()
    with Context(WINO=0), assert_kernel_count(2):  # the channel-last copy of the weights, the convolution
        x.conv2d(w).realize()


def test_an_unknown_setting_is_an_error() -> None:
    x, w = Tensor.randn(1, 2, 6, 6), Tensor.randn(2, 2, 3, 3)
    with Context(WINO=3), pytest.raises(TensorValueError, match="WINO must be 0"):
        x.conv2d(w)
