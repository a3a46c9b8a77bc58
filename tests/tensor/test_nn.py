"""nn layers and Tensor nn ops against direct numpy implementations of their (PyTorch-documented) definitions."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import GlobalCounters, Tensor, dtypes, nn
from tensor_helpers import FEW

RTOL, ATOL = 1e-4, 1e-5


def rnd(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def close(got: Tensor, ref: np.ndarray, rtol: float = RTOL, atol: float = ATOL) -> None:
    g = got.numpy()
    assert g.shape == np.shape(ref), f"shape {g.shape} != {np.shape(ref)}"
    np.testing.assert_allclose(g, ref, rtol=rtol, atol=atol)


# ---------------- numpy references ----------------
def np_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: tuple[int, ...],
            pads: list[tuple[int, int]], dil: tuple[int, ...], groups: int) -> np.ndarray:  # fmt: skip
    """N-d cross-correlation, one kernel tap at a time."""
    x = x.astype(np.float64)
    nsp = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0), *pads])
    o_, cg = w.shape[:2]
    k = w.shape[2:]
    osz = [(xp.shape[2 + i] - dil[i] * (k[i] - 1) - 1) // stride[i] + 1 for i in range(nsp)]
    out = np.zeros((x.shape[0], o_, *osz))
    og = o_ // groups
    for tap in np.ndindex(*k):
        sl = tuple(
            slice(tap[i] * dil[i], tap[i] * dil[i] + stride[i] * (osz[i] - 1) + 1, stride[i]) for i in range(nsp)
        )
        for g in range(groups):
            patch = xp[(slice(None), slice(g * cg, (g + 1) * cg), *sl)]
            wt = w[(slice(g * og, (g + 1) * og), slice(None), *tap)]
            out[:, g * og : (g + 1) * og] += np.einsum("nc...,oc->no...", patch, wt)
    if b is not None:
        out += b.reshape(1, -1, *([1] * nsp))
    return out


def np_conv_transpose(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: tuple[int, ...],
                      pad: tuple[int, ...], dil: tuple[int, ...], outpad: tuple[int, ...],
                      groups: int) -> np.ndarray:  # fmt: skip
    """Scatter-add definition: input (i, j) adds x * w[tap] at output (i*s + tap*d - p)."""
    n, cin = x.shape[:2]
    nsp = x.ndim - 2
    cout_g = w.shape[1]
    k = w.shape[2:]
    full = [(x.shape[2 + i] - 1) * stride[i] + dil[i] * (k[i] - 1) + 1 + outpad[i] for i in range(nsp)]
    out = np.zeros((n, cout_g * groups, *full))
    cin_g = cin // groups
    for g in range(groups):
        for pos in np.ndindex(*x.shape[2:]):
            for tap in np.ndindex(*k):
                o = tuple(pos[i] * stride[i] + tap[i] * dil[i] for i in range(nsp))
                xv = x[(slice(None), slice(g * cin_g, (g + 1) * cin_g), *pos)]  # (n, cin_g)
                wv = w[(slice(g * cin_g, (g + 1) * cin_g), slice(None), *tap)]  # (cin_g, cout_g)
                out[(slice(None), slice(g * cout_g, (g + 1) * cout_g), *o)] += xv @ wv
    size = [(x.shape[2 + i] - 1) * stride[i] - 2 * pad[i] + dil[i] * (k[i] - 1) + outpad[i] + 1 for i in range(nsp)]
    out = out[(slice(None), slice(None), *[slice(pad[i], pad[i] + size[i]) for i in range(nsp)])]
    if b is not None:
        out += b.reshape(1, -1, *([1] * nsp))
    return out


# ---------------- convolutions ----------------
CONV_CASES = [
    # cin, cout, k, stride, padding, dilation, groups, hw
    (2, 3, 3, 1, 0, 1, 1, (5, 6)),
    (2, 4, 3, 2, 1, 1, 2, (6, 5)),
    (4, 4, (2, 3), 1, "same", 2, 4, (5, 5)),
    (3, 2, 2, (2, 1), (1, 0), (1, 2), 1, (5, 6)),
    (2, 2, 4, 1, "same", 1, 1, (5, 4)),
    (3, 6, 1, 3, 2, 1, 3, (4, 4)),
    (2, 2, 3, 1, "valid", 1, 2, (4, 4)),
]


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d_layer(case: tuple[Any, ...]) -> None:
    cin, cout, k, stride, padding, dilation, groups, hw = case
    layer = nn.Conv2d(cin, cout, k, stride=stride, padding=padding, dilation=dilation, groups=groups)
    x = rnd(2, cin, *hw, seed=1)
    kk = (k, k) if isinstance(k, int) else k
    st_, dl = (
        (stride,) * 2 if isinstance(stride, int) else stride,
        (dilation,) * 2 if isinstance(dilation, int) else dilation,
    )
    if padding == "same":
        pads = [(d * (kq - 1) // 2, d * (kq - 1) - d * (kq - 1) // 2) for kq, d in zip(kk, dl)]
    elif padding == "valid":
        pads = [(0, 0), (0, 0)]
    else:
        pp = (padding,) * 2 if isinstance(padding, int) else padding
        pads = [(p, p) for p in pp]
    ref = np_conv(
        x, layer.weight.numpy(), layer.bias.numpy() if layer.bias is not None else None, st_, pads, dl, groups
    )
    out = layer(Tensor(x))
    if padding == "same":
        assert out.shape[2:] == hw
    close(out, ref)


def test_conv1d_and_conv3d() -> None:
    c1 = nn.Conv1d(2, 3, 3, stride=2, padding=1, dilation=1, groups=1)
    x = rnd(2, 2, 7, seed=2)
    close(c1(Tensor(x)), np_conv(x, c1.weight.numpy(), c1.bias.numpy(), (2,), [(1, 1)], (1,), 1))
    w, x3 = rnd(2, 1, 2, 2, 2, seed=3), rnd(1, 2, 3, 3, 4, seed=4)
    close(Tensor(x3).conv2d(Tensor(w), groups=2, padding=1),
          np_conv(x3, w, None, (1, 1, 1), [(1, 1)] * 3, (1, 1, 1), 2))  # fmt: skip


def test_conv2d_asymmetric_padding_tuple() -> None:
    # 4-tuple padding is (left, right, top, bottom), innermost dim first
    w, x = rnd(2, 1, 2, 2, seed=5), rnd(1, 1, 3, 4, seed=6)
    close(Tensor(x).conv2d(Tensor(w), padding=(1, 0, 2, 1)), np_conv(x, w, None, (1, 1), [(2, 1), (1, 0)], (1, 1), 1))


def test_conv2d_errors() -> None:
    x = Tensor(rnd(1, 3, 4, 4))
    with pytest.raises(RuntimeError, match="channels don't match"):
        x.conv2d(Tensor(rnd(2, 2, 3, 3)))
    with pytest.raises(RuntimeError, match="same"):
        x.conv2d(Tensor(rnd(2, 3, 3, 3)), stride=2, padding="same")
    with pytest.raises(RuntimeError, match="larger than the padded input"):
        x.conv2d(Tensor(rnd(2, 3, 5, 5)))


CONVT_CASES = [
    # cin, cout, k, stride, padding, output_padding, dilation, groups, hw
    (2, 3, 3, 1, 0, 0, 1, 1, (3, 4)),
    (2, 2, 3, 2, 1, 1, 1, 1, (3, 3)),
    (4, 2, 2, 2, 0, 0, 1, 2, (2, 3)),
    (2, 3, 3, 3, 1, 0, 2, 1, (3, 2)),
]


@pytest.mark.parametrize("case", CONVT_CASES)
def test_conv_transpose2d_layer(case: tuple[Any, ...]) -> None:
    cin, cout, k, stride, padding, outpad, dilation, groups, hw = case
    layer = nn.ConvTranspose2d(cin, cout, k, stride=stride, padding=padding, output_padding=outpad, dilation=dilation,
                               groups=groups)  # fmt: skip
    x = rnd(2, cin, *hw, seed=7)
    ref = np_conv_transpose(x, layer.weight.numpy(), layer.bias.numpy(), (stride,) * 2, (padding,) * 2,
                            (dilation,) * 2, (outpad,) * 2, groups)  # fmt: skip
    close(layer(Tensor(x)), ref)


def test_conv_transpose1d() -> None:
    layer = nn.ConvTranspose1d(2, 3, 3, stride=2, padding=1)
    x = rnd(1, 2, 4, seed=8)
    close(layer(Tensor(x)), np_conv_transpose(x, layer.weight.numpy(), layer.bias.numpy(), (2,), (1,), (1,), (0,), 1))


@settings(max_examples=20, deadline=None)
@given(nsp=st.integers(1, 3), k=st.integers(1, 4), stride=st.integers(1, 2), padding=st.integers(0, 3),
       dilation=st.integers(1, 2), size=st.integers(1, 4), seed=st.integers(0, 2**16))  # fmt: skip
def test_conv_transpose_any_dims_matches_scatter(nsp: int, k: int, stride: int, padding: int, dilation: int,
                                                 size: int, seed: int) -> None:  # fmt: skip
    """1-, 2- and 3-d transposed convolutions: their padding is virtual along every dimension but the last, where
    codegen bounds the tap loops by the gates (speck.codegen.lower.gated_ranges)."""
    outsz = (size - 1) * stride - 2 * padding + dilation * (k - 1) + 1
    if outsz < 1:
        return  # no output: conv_transpose2d rejects it like any empty convolution
    x, w = rnd(2, 3, *[size] * nsp, seed=seed), rnd(3, 2, *[k] * nsp, seed=seed + 1)
    got = Tensor(x).conv_transpose2d(Tensor(w), stride=stride, padding=padding, dilation=dilation)
    close(got, np_conv_transpose(x, w, None, (stride,) * nsp, (padding,) * nsp, (dilation,) * nsp, (0,) * nsp, 1))


# ---------------- pooling ----------------
def np_pool(x: np.ndarray, k: tuple[int, int], s: tuple[int, int], p: tuple[int, int], fill: float,
            red: Any, ceil_mode: bool = False) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Pooled values and PyTorch-style flat indices (first max in window order) over (N, C, H, W)."""
    n, c, h, w = x.shape
    osz = []
    for i, size in enumerate((h, w)):
        num = size + 2 * p[i] - k[i]
        o = (-(-num // s[i]) if ceil_mode else num // s[i]) + 1
        if ceil_mode and (o - 1) * s[i] >= size + p[i]:
            o -= 1
        osz.append(o)
    out = np.zeros((n, c, *osz))
    idx = np.zeros((n, c, *osz), dtype=np.int64)
    for i in range(osz[0]):
        for j in range(osz[1]):
            r0, c0 = i * s[0] - p[0], j * s[1] - p[1]
            vals, inds = [], []
            for a in range(k[0]):
                for b in range(k[1]):
                    r, cc = r0 + a, c0 + b
                    inside = 0 <= r < h and 0 <= cc < w
                    vals.append(x[:, :, r, cc] if inside else np.full((n, c), fill))
                    inds.append(r * w + cc if inside else -1)
            v = np.stack(vals, -1)
            out[:, :, i, j] = red(v)
            idx[:, :, i, j] = np.array(inds)[np.argmax(v, -1)]
    return out, idx


@pytest.mark.parametrize("k,s,p", [((2, 2), (2, 2), (0, 0)), ((3, 3), (2, 2), (1, 1)), ((2, 3), (1, 2), (1, 0))])
def test_max_pool2d_indices_and_unpool(k: tuple[int, int], s: tuple[int, int], p: tuple[int, int]) -> None:
    x = rnd(2, 2, 5, 6, seed=9)
    out, idx = Tensor(x).max_pool2d(k, s, padding=p, return_indices=True)
    ref, ref_idx = np_pool(x, k, s, p, -np.inf, lambda v: v.max(-1))
    close(out, ref)
    np.testing.assert_array_equal(idx.numpy(), ref_idx)
    un = out.max_unpool2d(idx, k, s, padding=p, output_size=(5, 6)).numpy()
    ref_un = np.zeros_like(x)
    for nn_, cc in np.ndindex(2, 2):
        ref_un[nn_, cc].reshape(-1)[ref_idx[nn_, cc].reshape(-1)] = ref[nn_, cc].reshape(-1)
    np.testing.assert_allclose(un, ref_un, rtol=RTOL)


def test_max_pool2d_ties_pick_first_index() -> None:
    x = np.zeros((1, 1, 2, 4), dtype=np.float32)
    x[0, 0, 1, 1] = x[0, 0, 0, 1] = 1.0
    _, idx = Tensor(x).max_pool2d(2, return_indices=True)
    np.testing.assert_array_equal(idx.numpy(), [[[[1, 2]]]])  # (0,1)=1 comes first; the second window is all 0s


def test_max_pool2d_ceil_mode_and_dilation() -> None:
    x = rnd(1, 2, 5, 5, seed=10)
    ref, _ = np_pool(x, (2, 2), (2, 2), (0, 0), -np.inf, lambda v: v.max(-1), ceil_mode=True)
    close(Tensor(x).max_pool2d(2, ceil_mode=True), ref)
    # dilation 2, kernel 2: taps at offsets 0 and 2
    got = Tensor(x).max_pool2d(2, stride=1, dilation=2).numpy()
    ref_d = np.maximum.reduce([x[:, :, a : a + 3, b : b + 3] for a in (0, 2) for b in (0, 2)])
    np.testing.assert_allclose(got, ref_d)


@pytest.mark.parametrize("k,s,p,cip,ceil", [(2, 2, 0, True, False), (3, 2, 1, True, False), (3, 2, 1, False, False),
                                            (2, 2, 0, True, True), (3, 1, 1, False, True)])  # fmt: skip
def test_avg_pool2d(k: int, s: int, p: int, cip: bool, ceil: bool) -> None:
    x = rnd(2, 1, 5, 6, seed=11)
    got = Tensor(x).avg_pool2d(k, s, padding=p, count_include_pad=cip, ceil_mode=ceil)
    # reference: sum over the window inside the padded input, divided by the window size clipped the PyTorch way
    n, c, h, w = x.shape
    summed, _ = np_pool(x, (k, k), (s, s), (p, p), 0.0, lambda v: v.sum(-1), ceil_mode=ceil)
    cnt = np.zeros(summed.shape[2:])
    for i, j in np.ndindex(*cnt.shape):
        r0, c0 = i * s - p, j * s - p
        if cip:  # the window clipped to the padded input (not beyond, in ceil mode)
            cnt[i, j] = (min(r0 + k, h + p) - r0) * (min(c0 + k, w + p) - c0)
        else:
            cnt[i, j] = (min(r0 + k, h) - max(r0, 0)) * (min(c0 + k, w) - max(c0, 0))
    close(got, summed / cnt)


# ---------------- normalisation ----------------
def test_batchnorm_train_eval_and_running_stats() -> None:
    bn = nn.BatchNorm2d(3, momentum=0.2)
    bn.weight = Tensor(rnd(3, seed=12))
    bn.bias = Tensor(rnd(3, seed=13))
    rm, rv = np.zeros(3), np.ones(3)
    for step in range(3):
        x = rnd(4, 3, 2, 5, seed=20 + step) * 2 + 1
        with Tensor.train():
            y = bn(Tensor(x)).numpy()
        mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3))
        ref = (x - mean.reshape(1, 3, 1, 1)) / np.sqrt(var.reshape(1, 3, 1, 1) + 1e-5)
        ref = ref * bn.weight.numpy().reshape(1, 3, 1, 1) + bn.bias.numpy().reshape(1, 3, 1, 1)
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
        n = x.size / 3
        rm, rv = rm * 0.8 + mean * 0.2, rv * 0.8 + var * n / (n - 1) * 0.2
        np.testing.assert_allclose(bn.running_mean.numpy(), rm, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(bn.running_var.numpy(), rv, rtol=1e-5, atol=1e-6)
        assert bn.num_batches_tracked.numpy().tolist() == step + 1  # a 0-d int64 counter
    x = rnd(2, 3, 2, 2, seed=30)
    y = bn(Tensor(x)).numpy()  # eval: running statistics, which stay unchanged
    ref = (x - rm.reshape(1, 3, 1, 1)) / np.sqrt(rv.reshape(1, 3, 1, 1) + 1e-5)
    ref = ref * bn.weight.numpy().reshape(1, 3, 1, 1) + bn.bias.numpy().reshape(1, 3, 1, 1)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(bn.running_mean.numpy(), rm, rtol=1e-5, atol=1e-6)


def test_batchnorm_eval_right_after_a_training_call_uses_the_updated_stats() -> None:
    """An eval forward built before anything is realized reads the statistics the training call updated (tinygrad's
    lazy assigns), not the ones from before it."""
    x, xe = rnd(4, 3, 2, 2, seed=41) * 3 + 1, rnd(2, 3, 2, 2, seed=42)
    bn = nn.BatchNorm2d(3)
    with Tensor.train():
        out = bn(Tensor(x))
    ev = bn(Tensor(xe))
    n = x.size / 3
    rm, rv = 0.1 * x.mean((0, 2, 3)), 0.9 + 0.1 * x.var((0, 2, 3)) * n / (n - 1)
    close(ev, (xe - rm.reshape(1, 3, 1, 1)) / np.sqrt(rv.reshape(1, 3, 1, 1) + 1e-5), atol=1e-4)
    close(out, (x - x.mean((0, 2, 3), keepdims=True)) / np.sqrt(x.var((0, 2, 3), keepdims=True) + 1e-5), atol=1e-4)
    np.testing.assert_allclose(bn.running_mean.numpy(), rm, rtol=1e-5, atol=1e-6)  # updated once, not twice
    assert bn.num_batches_tracked.numpy().tolist() == 1


def test_batchnorm_running_stats_share_the_forward_pass() -> None:
    """The running-statistics updates are computed in the schedule that realizes the output: tracking them adds only
    the small update kernels, not another pass over the convolution feeding the BatchNorm."""
    x = Tensor(rnd(2, 2, 8, 8, seed=40).astype(np.float32)).realize()
    counts = {}
    for track in (True, False):
        conv, bn = nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4, track_running_stats=track)
        with Tensor.train():
            bn(conv(x)).sum().realize()  # the first call realizes the lazily initialised weights
            GlobalCounters.reset()
            bn(conv(x)).sum().realize()
            counts[track] = GlobalCounters.kernel_count
    # running mean, running var, batch counter (and at most one shared statistic of the batch)
    assert counts[True] - counts[False] <= 4, counts


def test_batchnorm_1d_input_and_no_running_stats() -> None:
    bn = nn.BatchNorm(4, track_running_stats=False, affine=False)
    x = rnd(6, 4, seed=31)
    close(bn(Tensor(x)), (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5), atol=1e-4)


def test_layernorm() -> None:
    ln = nn.LayerNorm((3, 4))
    ln.weight, ln.bias = Tensor(rnd(3, 4, seed=32)), Tensor(rnd(3, 4, seed=33))
    x = rnd(2, 3, 4, seed=34)
    m, v = x.mean((1, 2), keepdims=True), x.var((1, 2), keepdims=True)
    close(ln(Tensor(x)), (x - m) / np.sqrt(v + 1e-5) * ln.weight.numpy() + ln.bias.numpy(), atol=1e-4)
    with pytest.raises(RuntimeError, match="LayerNorm"):
        ln(Tensor(rnd(2, 4, 3)))


def test_layernorm2d() -> None:
    ln = nn.LayerNorm2d(3)
    ln.weight, ln.bias = Tensor(rnd(3, seed=35)), Tensor(rnd(3, seed=36))
    x = rnd(2, 3, 2, 2, seed=37)
    m, v = x.mean(1, keepdims=True), x.var(1, keepdims=True)
    ref = (x - m) / np.sqrt(v + 1e-5) * ln.weight.numpy().reshape(1, 3, 1, 1) + ln.bias.numpy().reshape(1, 3, 1, 1)
    close(Tensor(x).sequential([ln]) if hasattr(Tensor, "sequential") else ln(Tensor(x)), ref, atol=1e-4)


def test_groupnorm_and_instancenorm() -> None:
    gn = nn.GroupNorm(2, 4)
    gn.weight, gn.bias = Tensor(rnd(4, seed=38)), Tensor(rnd(4, seed=39))
    x = rnd(2, 4, 3, 2, seed=40)
    xg = x.reshape(2, 2, -1)
    ref = ((xg - xg.mean(-1, keepdims=True)) / np.sqrt(xg.var(-1, keepdims=True) + 1e-5)).reshape(x.shape)
    close(gn(Tensor(x)), ref * gn.weight.numpy().reshape(1, 4, 1, 1) + gn.bias.numpy().reshape(1, 4, 1, 1), atol=1e-4)
    inorm = nn.InstanceNorm(4)
    inorm.weight, inorm.bias = Tensor(rnd(4, seed=41)), Tensor(rnd(4, seed=42))
    m, v = x.mean((2, 3), keepdims=True), x.var((2, 3), keepdims=True)
    ref = (x - m) / np.sqrt(v + 1e-5) * inorm.weight.numpy().reshape(1, 4, 1, 1) + inorm.bias.numpy().reshape(
        1, 4, 1, 1
    )
    close(inorm(Tensor(x)), ref, atol=1e-4)


def test_rmsnorm() -> None:
    rn = nn.RMSNorm(5)
    rn.weight = Tensor(rnd(5, seed=43))
    x = rnd(2, 3, 5, seed=44)
    close(rn(Tensor(x)), x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * rn.weight.numpy())


# ---------------- embedding, linear, LSTM ----------------
def test_embedding() -> None:
    emb = nn.Embedding(7, 3)
    idx = np.array([[0, 6, 2], [2, 2, 5]], dtype=np.int32)
    close(emb(Tensor(idx)), emb.weight.numpy()[idx])
    with pytest.raises(RuntimeError, match="integers"):
        emb(Tensor([0.0, 1.0]))


def test_linear() -> None:
    lin = nn.Linear(4, 3)
    x = rnd(2, 5, 4, seed=45)
    close(lin(Tensor(x)), x @ lin.weight.numpy().T + lin.bias.numpy())
    assert nn.Linear(4, 3, bias=False).bias is None


def _sig(z: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-z))


def test_lstm_cell() -> None:
    cell = nn.LSTMCell(3, 4)
    x = rnd(2, 3, seed=46)
    h0, c0 = rnd(2, 4, seed=47), rnd(2, 4, seed=48)
    wi, wh, bi, bh = (t.numpy() for t in (cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh))  # type: ignore[union-attr]
    gates = x @ wi.T + bi + h0 @ wh.T + bh
    i, f, g, o = np.split(gates, 4, axis=1)
    c = _sig(f) * c0 + _sig(i) * np.tanh(g)
    h = _sig(o) * np.tanh(c)
    hh, cc = cell(Tensor(x), (Tensor(h0), Tensor(c0)))
    close(hh, h)
    close(cc, c)
    h1, c1 = cell(Tensor(x))  # zero initial state
    gates = x @ wi.T + bi + bh
    i, f, g, o = np.split(gates, 4, axis=1)
    c = _sig(i) * np.tanh(g)
    close(c1, c)
    close(h1, _sig(o) * np.tanh(c))


# ---------------- losses ----------------
def np_log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


@given(ls=st.sampled_from([0.0, 0.1, 0.4]), ignore=st.booleans(), reduction=st.sampled_from(["mean", "sum", "none"]),
       seed=st.integers(0, 1000))  # fmt: skip
@FEW
def test_cross_entropy(ls: float, ignore: bool, reduction: str, seed: int) -> None:
    x = rnd(6, 5, seed=seed)
    y = np.random.default_rng(seed).integers(0, 5, 6).astype(np.int32)
    if ignore:
        y[[1, 4]] = -100
    lp = np_log_softmax(x)
    keep = y != -100
    nll = -lp[np.arange(6), np.where(keep, y, 0)]
    per = ((1 - ls) * nll + ls * -lp.mean(-1)) * keep
    ref = {"none": per, "sum": per.sum(), "mean": per.sum() / keep.sum()}[reduction]
    close(Tensor(x).cross_entropy(Tensor(y), reduction=reduction, label_smoothing=ls), ref)


def test_cross_entropy_probabilities() -> None:
    x = rnd(3, 4, seed=50)
    p = np.abs(rnd(3, 4, seed=51))
    p /= p.sum(-1, keepdims=True)
    q = p * 0.8 + 0.2 / 4
    close(Tensor(x).cross_entropy(Tensor(p), label_smoothing=0.2), (-(np_log_softmax(x) * q).sum(-1)).mean())


def test_sparse_categorical_crossentropy_and_nll() -> None:
    x = rnd(5, 3, seed=52)
    y = np.array([0, 2, 1, 1, 0], dtype=np.int32)
    lp = np_log_softmax(x)
    close(Tensor(x).sparse_categorical_crossentropy(Tensor(y)), -lp[np.arange(5), y].mean())
    w = np.array([0.5, 2.0, 1.0], dtype=np.float32)
    picked = -lp[np.arange(5), y] * w[y]
    close(Tensor(lp.astype(np.float32)).nll_loss(Tensor(y), Tensor(w)), picked.sum() / w[y].sum())
    yi = y.copy()
    yi[2] = 7
    keep = yi != 7
    close(Tensor(lp.astype(np.float32)).nll_loss(Tensor(yi), ignore_index=7),
          -lp[np.arange(5), np.where(keep, yi, 0)][keep].mean())  # fmt: skip


def test_binary_crossentropy() -> None:
    x = rnd(4, 3, seed=53) * 3
    y = (np.random.default_rng(54).random((4, 3)) > 0.5).astype(np.float32)
    p = _sig(x.astype(np.float64))
    ref = -(y * np.log(p) + (1 - y) * np.log(1 - p))
    close(Tensor(p.astype(np.float32)).binary_crossentropy(Tensor(y)), ref.mean(), rtol=1e-4)
    close(Tensor(x).binary_crossentropy_logits(Tensor(y)), ref.mean())
    close(Tensor(x).binary_crossentropy_logits(Tensor(y), reduction="none"), ref)
    pw = np.array([0.5, 2.0, 3.0], dtype=np.float32)
    ref_pw = -(pw * y * np.log(p) + (1 - y) * np.log(1 - p))
    close(Tensor(x).binary_crossentropy_logits(Tensor(y), reduction="sum", pos_weight=Tensor(pw)), ref_pw.sum())
    # log clamp: p = 0 with y = 1 gives 100, not inf
    close(Tensor([0.0]).binary_crossentropy(Tensor([1.0])), np.float32(100.0))


# ---------------- attention ----------------
def np_sdpa(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == np.bool_ else s + mask
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v


def test_scaled_dot_product_attention() -> None:
    q, k, v = rnd(2, 2, 3, 4, seed=55), rnd(2, 2, 5, 4, seed=56), rnd(2, 2, 5, 6, seed=57)
    close(Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v)), np_sdpa(q, k, v, None))
    bmask = np.random.default_rng(58).random((3, 5)) > 0.4
    bmask[:, 0] = True  # every row keeps at least one key
    close(
        Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), attn_mask=Tensor(bmask)), np_sdpa(q, k, v, bmask)
    )
    fmask = rnd(3, 5, seed=59)
    close(
        Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), attn_mask=Tensor(fmask)), np_sdpa(q, k, v, fmask)
    )
    kc, vc = rnd(2, 2, 3, 4, seed=60), rnd(2, 2, 3, 6, seed=61)
    causal = np.tril(np.ones((3, 3), dtype=np.bool_))
    close(Tensor(q).scaled_dot_product_attention(Tensor(kc), Tensor(vc), is_causal=True), np_sdpa(q, kc, vc, causal))
    with pytest.raises(RuntimeError, match="not both"):
        Tensor(q).scaled_dot_product_attention(Tensor(kc), Tensor(vc), attn_mask=Tensor(causal), is_causal=True)


# ---------------- dropout, interpolate, activations ----------------
def test_dropout_only_in_training() -> None:
    x = Tensor(np.ones((40, 50), dtype=np.float32))
    np.testing.assert_array_equal(x.dropout(0.3).numpy(), np.ones((40, 50)))
    with Tensor.train():
        y = x.dropout(0.3).numpy()
    kept = y != 0
    assert 0.6 < kept.mean() < 0.8, kept.mean()
    np.testing.assert_allclose(y[kept], 1 / 0.7, rtol=1e-6)
    with pytest.raises(RuntimeError, match=r"\[0, 1\]"):
        x.dropout(1.5)


def np_interp_linear(x: np.ndarray, size: int, align: bool) -> np.ndarray:
    n = x.shape[-1]
    i = np.arange(size, dtype=np.float64)
    src = i * (n - 1) / (size - 1) if align else np.maximum((i + 0.5) * n / size - 0.5, 0)
    lo = np.minimum(np.floor(src).astype(int), n - 1)
    hi = np.minimum(lo + 1, n - 1)
    f = src - lo
    return x[..., lo] * (1 - f) + x[..., hi] * f


@pytest.mark.parametrize("align", [False, True])
def test_interpolate_linear(align: bool) -> None:
    x = rnd(1, 2, 3, 4, seed=62)
    ref = np_interp_linear(np.swapaxes(np_interp_linear(np.swapaxes(x, -1, -2), 5, align), -1, -2), 7, align)
    close(Tensor(x).interpolate((5, 7), mode="linear", align_corners=align), ref)


def test_interpolate_nearest() -> None:
    x = rnd(1, 1, 3, 4, seed=63)
    r = np.floor(np.arange(5) * 3 / 5).astype(int)
    c = np.floor(np.arange(2) * 4 / 2).astype(int)
    close(Tensor(x).interpolate((5, 2), mode="nearest"), x[:, :, r][:, :, :, c])
    re = np.floor((np.arange(5) + 0.5) * 3 / 5).astype(int)
    close(Tensor(x).interpolate((5, 4), mode="nearest-exact"), x[:, :, re])


ACTS: dict[str, Any] = {
    "relu6": lambda x: np.clip(x, 0, 6),
    "leaky_relu": lambda x: np.where(x >= 0, x, 0.01 * x),
    "elu": lambda x: np.where(x > 0, x, np.exp(x) - 1),
    "celu": lambda x: np.maximum(x, 0) + np.minimum(0, np.exp(x) - 1),
    "selu": lambda x: 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * (np.exp(x) - 1)),
    "gelu": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "quick_gelu": lambda x: x * _sig(1.702 * x),
    "silu": lambda x: x * _sig(x),
    "swish": lambda x: x * _sig(x),
    "mish": lambda x: x * np.tanh(np.log1p(np.exp(x))),
    "softplus": lambda x: np.log1p(np.exp(x)),
    "hardswish": lambda x: x * np.clip(x + 3, 0, 6) / 6,
    "hardsigmoid": lambda x: np.clip(x / 6 + 0.5, 0, 1),
    "hardtanh": lambda x: np.clip(x, -1, 1),
    "logsigmoid": lambda x: -np.log1p(np.exp(-x)),
    "softsign": lambda x: x / (1 + np.abs(x)),
}


@pytest.mark.parametrize("name", sorted(ACTS))
def test_activation(name: str) -> None:
    x = np.linspace(-8, 8, 33).astype(np.float32)
    close(getattr(Tensor(x), name)(), ACTS[name](x.astype(np.float64)), rtol=2e-4, atol=2e-5)


def test_float16_layer_dtype() -> None:
    lin = nn.Linear(2, 2)
    assert lin.weight.dtype == dtypes.float32


def test_pooling_with_one_or_three_dim_kernels_takes_int_options_per_dim() -> None:
    """An int stride/padding/dilation applies to every pooled dim, whatever the kernel tuple's length."""
    x = rnd(2, 3, 10, seed=50).astype(np.float32)
    got = Tensor(x).max_pool2d((3,), padding=1).numpy()
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1)), constant_values=-np.inf)
    np.testing.assert_allclose(got, np.stack([xp[..., i : i + 3].max(-1) for i in range(0, 10, 3)], -1))
    np.testing.assert_allclose(Tensor(x).avg_pool2d((2,)).numpy(), x.reshape(2, 3, 5, 2).mean(-1), rtol=1e-6)
    y = rnd(1, 2, 4, 4, 4, seed=51).astype(np.float32)
    want = y.reshape(1, 2, 2, 2, 2, 2, 2, 2).max(axis=(3, 5, 7))
    np.testing.assert_allclose(Tensor(y).max_pool2d((2, 2, 2)).numpy(), want)


@pytest.mark.c_backend
def test_conv_weight_gradients_on_the_c_backend_match_llvm() -> None:
    # the 5x5 weight gradient is register-blocked by 5 rows: 5-lane vectors, which C renders as 4 + 1 lanes
    from speck.tensor.nn.state import get_parameters

    def grads(dev: str) -> list[np.ndarray]:
        Tensor.manual_seed(0)
        c1, c2 = nn.Conv2d(1, 8, 5), nn.Conv2d(8, 8, 5)
        for p in get_parameters([c1, c2]):
            p.to_(dev)
        x = Tensor(np.random.default_rng(0).random((4, 1, 16, 16)).astype(np.float32), device=dev)
        c2(c1(x).relu()).relu().sum().backward()
        return [p.grad.numpy() for p in get_parameters([c1, c2])]

    for got, want in zip(grads("CPU:CLANG"), grads("CPU")):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
