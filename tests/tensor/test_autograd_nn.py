"""Gradients of the nn ops (convolutions with stride/padding/dilation/groups, pooling, normalisation, losses,
attention, interpolation) against float64 central finite differences (see test_autograd.gradcheck)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.tensor import Tensor
from tensor_helpers import FEW
from test_autograd import away, gradcheck, pos

CONV = [
    # stride, padding, dilation, groups, cin, cout, k
    (1, 0, 1, 1, 2, 2, 2),
    (2, 1, 1, 1, 1, 2, 3),
    (1, "same", 2, 2, 2, 2, 2),
    ((2, 1), (1, 0), (1, 2), 1, 1, 1, 2),
]


@pytest.mark.parametrize("case", CONV)
def test_conv2d_grad(case: tuple[Any, ...]) -> None:
    stride, padding, dilation, groups, cin, cout, k = case
    x, w, b = away((1, cin, 4, 4), 1), away((cout, cin // groups, k, k), 2), away((cout,), 3)
    gradcheck(lambda x, w, b: x.conv2d(w, b, groups=groups, stride=stride, dilation=dilation, padding=padding), x, w, b)


@pytest.mark.slow
@given(stride=st.sampled_from([1, 2]), padding=st.sampled_from([0, 1]), dilation=st.sampled_from([1, 2]),
       groups=st.sampled_from([1, 2]), seed=st.integers(0, 1000))  # fmt: skip
@FEW
def test_conv2d_grad_random(stride: int, padding: int, dilation: int, groups: int, seed: int) -> None:
    x, w = away((1, 2, 5, 4), seed), away((2, 2 // groups, 2, 2), seed + 1)
    gradcheck(lambda x, w: x.conv2d(w, groups=groups, stride=stride, dilation=dilation, padding=padding), x, w,
              seed=seed)  # fmt: skip


@pytest.mark.parametrize("stride,padding,outpad,groups", [(1, 0, 0, 1), (2, 1, 1, 1), (2, 0, 0, 2)])
def test_conv_transpose2d_grad(stride: int, padding: int, outpad: int, groups: int) -> None:
    x, w = away((1, 2, 3, 2), 4), away((2, 2 // groups, 2, 2), 5)
    gradcheck(lambda x, w: x.conv_transpose2d(w, groups=groups, stride=stride, padding=padding, output_padding=outpad),
              x, w)  # fmt: skip


def test_conv1d_grad() -> None:
    gradcheck(lambda x, w: x.conv2d(w, stride=2, padding=1), away((2, 2, 5), 6), away((3, 2, 2), 7))


@pytest.mark.parametrize("k,s,p,d", [(2, 2, 0, 1), (3, 2, 1, 1), (2, 1, 0, 2)])
def test_max_pool2d_grad(k: int, s: int, p: int, d: int) -> None:
    gradcheck(lambda x: x.max_pool2d(k, s, dilation=d, padding=p), away((1, 2, 5, 4), 8))


@pytest.mark.parametrize("k,s,p,cip,ceil", [(2, 2, 0, True, False), (3, 2, 1, False, False), (2, 2, 0, True, True)])
def test_avg_pool2d_grad(k: int, s: int, p: int, cip: bool, ceil: bool) -> None:
    gradcheck(lambda x: x.avg_pool2d(k, s, padding=p, count_include_pad=cip, ceil_mode=ceil), away((1, 1, 5, 4), 9))


def test_max_unpool2d_grad() -> None:
    x = away((1, 1, 4, 4), 10)
    _, idx = Tensor(x).max_pool2d(2, return_indices=True)
    gradcheck(lambda v: v.max_unpool2d(idx, 2, output_size=(4, 4)), away((1, 1, 2, 2), 11))


@pytest.mark.parametrize("mode,align", [("linear", False), ("linear", True), ("nearest", False)])
def test_interpolate_grad(mode: str, align: bool) -> None:
    gradcheck(lambda x: x.interpolate((4, 5), mode=mode, align_corners=align), away((1, 1, 3, 3), 12))


def test_norm_helpers_grad() -> None:
    gradcheck(lambda x: x.layernorm(-1), away((2, 4), 13))
    mean, invstd = Tensor(away((3,), 14)), Tensor(pos((3,), 15))
    gradcheck(lambda x, w, b: x.batchnorm(w, b, mean, invstd), away((2, 3, 2), 16), away((3,), 17), away((3,), 18))


def test_batchnorm_training_grad() -> None:
    """Batch statistics are part of the graph in training mode: the gradient flows through mean and variance."""

    def f(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
        axes = (0, 2)
        m = x.mean(axis=axes, keepdim=True)
        v = ((x - m) ** 2).mean(axis=axes, keepdim=True)
        return x.batchnorm(w, b, m.reshape(-1), (v.reshape(-1) + 1e-5).rsqrt())

    gradcheck(f, away((3, 2, 2), 19), away((2,), 20), away((2,), 21))


@given(ls=st.sampled_from([0.0, 0.2]), ignore=st.booleans(), seed=st.integers(0, 1000))
@FEW
def test_cross_entropy_grad(ls: float, ignore: bool, seed: int) -> None:
    y = np.random.default_rng(seed).integers(0, 3, 4).astype(np.int32)
    if ignore:
        y[0] = -100
    gradcheck(lambda x: x.cross_entropy(Tensor(y), label_smoothing=ls), away((4, 3), seed), seed=seed)


def test_bce_grads() -> None:
    y = Tensor(np.array([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]]))
    gradcheck(lambda x: x.binary_crossentropy_logits(y), away((2, 3), 22))
    gradcheck(lambda x: x.binary_crossentropy_logits(y, pos_weight=Tensor(np.array([1.0, 2.0, 0.5]))), away((2, 3), 23))
    gradcheck(lambda x: x.sigmoid().binary_crossentropy(y), away((2, 3), 24))
    gradcheck(lambda x: x.log_softmax(-1).nll_loss(Tensor(np.array([2, 0], dtype=np.int32))), away((2, 3), 25))


def test_sdpa_grad() -> None:
    mask = Tensor(np.array([[True, False, True], [True, True, False]]))
    gradcheck(lambda q, k, v: q.scaled_dot_product_attention(k, v, attn_mask=mask), away((1, 2, 2), 26),
              away((1, 3, 2), 27), away((1, 3, 2), 28))  # fmt: skip
    gradcheck(lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True), away((2, 2), 29), away((2, 2), 30),
              away((2, 2), 31))  # fmt: skip


@pytest.mark.slow
def test_embedding_lstm_grad() -> None:
    idx = Tensor(np.array([[1, 0], [3, 1]], dtype=np.int32))

    def emb(w: Tensor) -> Tensor:
        onehot = idx.reshape(2, 2, 1) == Tensor.arange(4).reshape(1, 1, 4)
        return onehot.cast(w.dtype) @ w

    gradcheck(emb, away((4, 2), 32))

    def lstm(x: Tensor, wih: Tensor, whh: Tensor, h: Tensor, c: Tensor) -> Tensor:
        gates = x @ wih.T + h @ whh.T
        i, f, g, o = gates.chunk(4, dim=1)
        c2 = f.sigmoid() * c + i.sigmoid() * g.tanh()
        return (o.sigmoid() * c2.tanh()).cat(c2, dim=1)

    gradcheck(lstm, away((2, 2), 33), away((4, 2), 34), away((4, 1), 35), away((2, 1), 36), away((2, 1), 37))


@pytest.mark.parametrize("batch", [3, 36])  # 36: the weight gradient sums over batch chunks, then over the chunks
def test_conv2d_grads_match_numpy_without_a_window_tensor(batch: int) -> None:
    """The input gradient is a transposed convolution, not a sum over a materialised (N, Cin, *out, *k) tensor of
    per-window gradients: no kernel of the backward writes a buffer that large."""
    from numpy.lib.stride_tricks import sliding_window_view

    from speck.tensor.schedule import Scheduler

    rng = np.random.default_rng(batch)
    xn, wn = (
        rng.standard_normal((batch, 3, 9, 8)).astype(np.float32),
        rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
    )
    gn = rng.standard_normal((batch, 4, 7, 6)).astype(np.float32)
    x, w = Tensor(xn, requires_grad=True), Tensor(wn, requires_grad=True)
    x.conv2d(w).backward(Tensor(gn))
    assert x.grad is not None and w.grad is not None
    sched = Scheduler()
    sched.realize(x.grad.uop)
    sched.realize(w.grad.uop)
    window_tensor = batch * 3 * 7 * 6 * 3 * 3
    assert max(int(it.bufs[0].arg) for it in sched.items if it.ast is not None) < window_tensor
    win = sliding_window_view(xn, (3, 3), axis=(2, 3))  # (N, C, 7, 6, 3, 3)
    gw = np.einsum("bcyxij,boyx->ocij", win, gn)
    gx = np.einsum("boyxij,ocij->bcyx", sliding_window_view(np.pad(gn, ((0, 0), (0, 0), (2, 2), (2, 2))), (3, 3),
                                                             axis=(2, 3)), wn[:, :, ::-1, ::-1])  # fmt: skip
    np.testing.assert_allclose(w.grad.numpy(), gw, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(x.grad.numpy(), gx, rtol=1e-4, atol=1e-4)
