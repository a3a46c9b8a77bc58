"""TENSOR_API 7.4/7.5 against float64 numpy re-implementations of PyTorch's definitions: max_pool2d's indices
(ties, NaN windows, windows of -inf next to the padding), avg_pool2d's divisor under ceil_mode/count_include_pad,
conv_transpose2d's output_padding, the losses' reductions/ignore_index/label_smoothing/weights and
scaled_dot_product_attention's score dtype (float32 scores of half inputs, cast back before the softmax)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import Tensor, dtypes


def _out_len(n: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    num = n + 2 * p - d * (k - 1) - 1
    o = (-(-num // s) if ceil else num // s) + 1
    return o - 1 if ceil and (o - 1) * s >= n + p else o  # the last window starts inside the input or its left pad


def np_pool(x: np.ndarray, k: tuple[int, ...], s: tuple[int, ...], p: tuple[int, ...], d: tuple[int, ...],
            ceil: bool, mode: str, cip: bool = True) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """PyTorch's pooling loop: max keeps the first maximum (a NaN wins, starting from the first in-bounds input),
    avg divides by the window clipped to the padded input (cip) or to the input."""
    nd, sp = len(k), x.shape[-len(k) :]
    outs = [_out_len(sp[i], k[i], s[i], p[i], d[i], ceil) for i in range(nd)]
    lead = x.shape[: x.ndim - nd]
    out, idx = np.zeros(lead + tuple(outs)), np.zeros(lead + tuple(outs), np.int64)
    for o in itertools.product(*[range(v) for v in outs]):
        starts = [o[i] * s[i] - p[i] for i in range(nd)]
        window = list(itertools.product(*[[starts[i] + j * d[i] for j in range(k[i])] for i in range(nd)]))
        inside = [w for w in window if all(0 <= w[i] < sp[i] for i in range(nd))]
        vals = np.stack([x[(...,) + w] for w in inside], -1)
        flat = np.array([np.ravel_multi_index(w, sp) for w in inside])
        if mode == "max":
            best, bi = vals[..., 0].copy(), np.full(lead, flat[0])
            for j in range(1, len(inside)):
                take = (vals[..., j] > best) & ~np.isnan(best) | np.isnan(vals[..., j]) & ~np.isnan(best)
                best, bi = np.where(take, vals[..., j], best), np.where(take, flat[j], bi)
            out[(...,) + o], idx[(...,) + o] = best, bi
        else:
            div = 1
            for i in range(nd):
                end = min(starts[i] + k[i], sp[i] + p[i])
                div *= (end - starts[i]) if cip else (min(end, sp[i]) - max(starts[i], 0))
            out[(...,) + o] = vals.sum(-1) / div
    return out, idx


windows = st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(0, 1), st.booleans())


@pytest.mark.parametrize("fill", ["normal", "ties", "neg_inf", "nan"])
@settings(max_examples=10)
@given(windows, st.integers(0, 2**16))
def test_max_pool_indices_match_pytorchs_first_maximum(fill: str, win: tuple[int, int, int, int, bool],
                                                       seed: int) -> None:  # fmt: skip
    k, s, d, p, ceil = win
    p, d = min(p, k // 2), min(d, 2)  # PyTorch's limit: padding at most half the kernel; windows fit in 6
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 6, 7)).astype(np.float32)
    if fill == "ties":
        x = rng.integers(0, 2, x.shape).astype(np.float32)
    elif fill == "neg_inf":  # a window of -inf beside -inf padding points at its first input, never the padding
        x[rng.random(x.shape) < 0.6] = -np.inf
    elif fill == "nan":
        x[rng.random(x.shape) < 0.1] = np.nan
    ref, ref_idx = np_pool(x.astype(np.float64), (k, k), (s, s), (p, p), (d, d), ceil, "max")
    out, idx = Tensor(x).max_pool2d(kernel_size=k, stride=s, dilation=d, padding=p, ceil_mode=ceil,
                                    return_indices=True)  # fmt: skip
    np.testing.assert_array_equal(out.numpy(), ref.astype(np.float32))
    assert idx.dtype == dtypes.int32
    np.testing.assert_array_equal(idx.numpy(), ref_idx)


def test_max_pool_indices_of_a_nan_window_point_at_the_nan() -> None:
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    x[0, 0, 1, 1] = np.nan
    out, idx = Tensor(x).max_pool2d(kernel_size=2, return_indices=True)
    assert np.isnan(out.numpy()[0, 0, 0, 0]) and idx.numpy()[0, 0, 0, 0] == 5  # was 16: past the end of the input


def test_max_pool_indices_of_all_minus_inf_windows_are_inputs() -> None:
    x = np.full((1, 1, 3, 3), -np.inf, np.float32)
    _, idx = Tensor(x).max_pool2d(kernel_size=2, stride=1, padding=1, return_indices=True)
    np.testing.assert_array_equal(idx.numpy()[0, 0], [[0, 0, 1, 2], [0, 0, 1, 2], [3, 3, 4, 5], [6, 6, 7, 8]])


@settings(max_examples=20)
@given(windows, st.booleans(), st.integers(0, 2**16))
def test_avg_pool_divisor_matches_pytorch(win: tuple[int, int, int, int, bool], cip: bool, seed: int) -> None:
    k, s, _, p, ceil = win
    p = min(p, k // 2)
    x = np.random.default_rng(seed).standard_normal((2, 5, 7))
    ref, _ = np_pool(x, (k, k), (s, s), (p, p), (1, 1), ceil, "avg", cip)
    out = Tensor(x.astype(np.float32)).avg_pool2d(kernel_size=k, stride=s, padding=p, ceil_mode=ceil,
                                                  count_include_pad=cip)  # fmt: skip
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-6)


def np_conv_transpose(x: np.ndarray, w: np.ndarray, stride: tuple[int, int], padding: tuple[int, int],
                      dilation: tuple[int, int], groups: int, out_pad: tuple[int, int]) -> np.ndarray:  # fmt: skip
    """Scatter every input element times the kernel into the output, then crop `padding` from both sides."""
    n, c, *isp = x.shape
    og, cg = w.shape[1], c // groups
    full = [(isp[i] - 1) * stride[i] + dilation[i] * (w.shape[2 + i] - 1) + 1 + out_pad[i] for i in range(2)]
    out = np.zeros((n, og * groups, *full))
    for g, (i, j), (a, b) in itertools.product(range(groups), np.ndindex(*isp), np.ndindex(*w.shape[2:])):
        xi = x[:, g * cg : (g + 1) * cg, i, j]
        out[:, g * og : (g + 1) * og, i * stride[0] + a * dilation[0], j * stride[1] + b * dilation[1]] += (
            xi @ w[g * cg : (g + 1) * cg, :, a, b]
        )
    return out[:, :, padding[0] : full[0] - padding[0], padding[1] : full[1] - padding[1]]


@settings(max_examples=15)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(0, 1), st.integers(1, 2), st.sampled_from([1, 2]),
       st.integers(0, 2**16))  # fmt: skip
def test_conv_transpose_output_padding_matches_scatter(s0: int, s1: int, p: int, d: int, groups: int,
                                                       seed: int) -> None:  # fmt: skip
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal((2, 4, 4, 3)), rng.standard_normal((4, 3, 3, 2))
    op = (s0 - 1, min(s1, d) - 1)  # output_padding must be below stride or dilation
    ref = np_conv_transpose(x, w, (s0, s1), (p, p), (d, d), groups, op)
    out = Tensor(x.astype(np.float32)).conv_transpose2d(Tensor(w.astype(np.float32)), groups=groups, stride=(s0, s1),
                                                        dilation=d, padding=p, output_padding=op)  # fmt: skip
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-4)


# ---------------- losses ----------------
def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    m = x.max(axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis, keepdims=True))


def _reduce(loss: np.ndarray, reduction: str, count: float | None = None) -> np.ndarray:
    if reduction == "none":
        return loss
    with np.errstate(invalid="ignore"):  # nothing counted: 0/0 = nan, as PyTorch's
        total = loss.sum()
        return np.asarray(total if reduction == "sum" else total / (count if count is not None else loss.size))


reductions = st.sampled_from(["mean", "sum", "none"])


@given(st.sampled_from([-1, 0, 3]), st.sampled_from([0.0, 0.1, 1.0]), reductions, st.integers(0, 2**16))
def test_sparse_categorical_crossentropy_masks_and_smooths(ignore: int, ls: float, reduction: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal((2, 3, 4)), rng.integers(-1, 4, (2, 3))
    y = np.where(y == -1, ignore, y)
    lp, mask = _log_softmax(x, -1), y != ignore  # speck masks ignore_index -1 too (README: not the quirk)
    picked = np.take_along_axis(lp, np.where(mask, y, 0)[..., None], -1)[..., 0]
    loss = ((1 - ls) * -picked + ls * -lp.mean(-1)) * mask
    out = Tensor(x.astype(np.float32)).sparse_categorical_crossentropy(
        Tensor(y.astype(np.int32)), ignore_index=ignore, label_smoothing=ls, reduction=reduction
    )
    np.testing.assert_allclose(out.numpy(), _reduce(loss, reduction, mask.sum()), rtol=1e-5, atol=1e-6)


@given(st.sampled_from([(4,), (3, 5), (2, 5, 3)]), st.sampled_from([0.0, 0.25]), reductions, st.booleans(),
       st.integers(0, 2**16))  # fmt: skip
def test_cross_entropy_in_torchs_layout(shape: tuple[int, ...], ls: float, reduction: str, probs: bool,
                                        seed: int) -> None:  # fmt: skip
    rng = np.random.default_rng(seed)
    x, cax = rng.standard_normal(shape), 0 if len(shape) == 1 else 1
    c = shape[cax]
    if probs:
        y = rng.random(shape)
        target = y / y.sum(cax, keepdims=True)
        yt = Tensor(target.astype(np.float32))
    else:
        y = rng.integers(0, c, shape[:cax] + shape[cax + 1 :])
        target, yt = np.moveaxis(np.eye(c)[y], -1, cax), Tensor(np.asarray(y, np.int32))
    loss = -(_log_softmax(x, cax) * (target * (1 - ls) + ls / c)).sum(cax)
    out = Tensor(x.astype(np.float32)).cross_entropy(yt, reduction=reduction, label_smoothing=ls)
    np.testing.assert_allclose(out.numpy(), _reduce(loss, reduction), rtol=1e-5, atol=1e-6)


@given(st.sampled_from([(4, 3), (2, 3, 4)]), st.booleans(), st.sampled_from([None, 1]), reductions,
       st.integers(0, 2**16))  # fmt: skip
def test_nll_loss_weighted_mean(shape: tuple[int, ...], weighted: bool, ignore: int | None, reduction: str,
                                seed: int) -> None:  # fmt: skip
    rng = np.random.default_rng(seed)
    x = _log_softmax(rng.standard_normal(shape), 1)
    y = rng.integers(0, shape[1], (shape[0], *shape[2:]))
    wt = rng.random(shape[1]) + 0.5 if weighted else np.ones(shape[1])
    picked = np.take_along_axis(np.moveaxis(x, 1, -1), y[..., None], -1)[..., 0]
    ww = wt[y] * (y != ignore if ignore is not None else 1)
    out = Tensor(x.astype(np.float32)).nll_loss(Tensor(y.astype(np.int32)), ignore_index=ignore, reduction=reduction,
                                                weight=Tensor(wt.astype(np.float32)) if weighted else None)  # fmt: skip
    np.testing.assert_allclose(out.numpy(), _reduce(-picked * ww, reduction, ww.sum()), rtol=1e-5, atol=1e-6)


@given(reductions, st.booleans(), st.integers(0, 2**16))
def test_binary_crossentropy_forms(reduction: str, pos_weight: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    logits, y = rng.standard_normal((3, 4)) * 4, rng.random((3, 4))
    pw = rng.random(4) + 0.5 if pos_weight else np.ones(4)
    p = 1 / (1 + np.exp(-logits))
    ref = -(pw * y * np.log(p) + (1 - y) * np.log(1 - p))
    f32 = lambda a: Tensor(a.astype(np.float32))
    pwt = f32(pw) if pos_weight else None
    out = f32(logits).binary_crossentropy_logits(f32(y), reduction=reduction, pos_weight=pwt)
    np.testing.assert_allclose(out.numpy(), _reduce(ref, reduction), rtol=1e-4, atol=1e-5)
    if not pos_weight:
        out = f32(p).binary_crossentropy(f32(y), reduction=reduction)
        np.testing.assert_allclose(out.numpy(), _reduce(ref, reduction), rtol=1e-4, atol=1e-5)


# ---------------- attention ----------------
def np_sdpa(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, causal: bool) -> np.ndarray:
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if causal:
        mask = np.tril(np.ones((q.shape[-2], k.shape[-2]), bool))
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


@given(st.sampled_from(["none", "bool", "float", "causal"]), st.integers(0, 2**16))
def test_sdpa_masks_match_numpy(mask_kind: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((2, 3, 4, 8)), rng.standard_normal((2, 3, 6, 8)), rng.standard_normal((2, 3, 6, 5))
    mask = None
    if mask_kind == "bool":
        mask = rng.random((4, 6)) > 0.4
        mask[:, 0] = True
    elif mask_kind == "float":
        mask = rng.standard_normal((2, 1, 4, 6))
    tm = None if mask is None else Tensor(mask if mask.dtype == bool else mask.astype(np.float32))
    f32 = lambda a: Tensor(a.astype(np.float32))
    out = f32(q).scaled_dot_product_attention(f32(k), f32(v), attn_mask=tm, is_causal=mask_kind == "causal")
    np.testing.assert_allclose(out.numpy(), np_sdpa(q, k, v, mask, mask_kind == "causal"), rtol=1e-4, atol=1e-5)


def test_sdpa_half_scores_are_summed_wider_than_half() -> None:
    """q.k of 256 terms near 400 each is ~1e5, past half's 65504; scaled by 1/16 it fits. The scores are float32
    until the scale, then cast to half for the softmax (was: half scores, inf - inf = NaN rows)."""
    rng = np.random.default_rng(0)
    q, k, v = (20 + rng.standard_normal((1, 2, 2, 256)), 20 + rng.standard_normal((1, 2, 3, 256)),
               rng.standard_normal((1, 2, 3, 4)))  # fmt: skip
    h = [a.astype(np.float16) for a in (q, k, v)]
    out = Tensor(h[0]).scaled_dot_product_attention(Tensor(h[1]), Tensor(h[2]))
    assert out.dtype == dtypes.half
    ref = np_sdpa(*(a.astype(np.float64) for a in h), None, False)
    np.testing.assert_allclose(out.numpy().astype(np.float64), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dt", [dtypes.half, dtypes.bfloat16, dtypes.float32, dtypes.float64], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_losses_keep_the_inputs_float_dtype(dt: object, reduction: str) -> None:
    """nll_loss's weighted mean divided a half loss by a float32 weight sum: the result was float32."""
    rng = np.random.default_rng(0)
    x, y = _log_softmax(rng.standard_normal((6, 4)), 1), rng.integers(0, 4, 6)
    xt, yt = Tensor(x.astype(np.float32)).cast(dt), Tensor(y.astype(np.int32))
    for out in (xt.nll_loss(yt, reduction=reduction), xt.sparse_categorical_crossentropy(yt, reduction=reduction),
                xt.cross_entropy(yt, reduction=reduction)):  # fmt: skip
        assert out.dtype == dt, (out.dtype, dt)
    ref = _reduce(-x[np.arange(6), y], reduction)
    tol = 1e-5 if dt in (dtypes.float32, dtypes.float64) else 3e-2
    np.testing.assert_allclose(xt.nll_loss(yt, reduction=reduction).float().numpy(), ref, rtol=tol, atol=tol)


def test_weighted_nll_loss_divides_by_weight_sums_below_one() -> None:
    """The mean divided by max(sum of weights, 1): weights summing below 1 gave a loss too small (0.4, not 2)."""
    x, w = Tensor([[-1.0, -2.0, -3.0], [-1.5, -0.5, -2.0]]), Tensor([0.1, 0.2, 0.3])
    assert x[:1].nll_loss(Tensor([1]), weight=w).item() == pytest.approx(2.0)
    assert x.nll_loss(Tensor([1, 2]), weight=w).item() == pytest.approx(2.0)
    assert x.nll_loss(Tensor([1, 2]), weight=w, ignore_index=1).item() == pytest.approx(2.0)


def test_a_mean_over_no_counted_label_is_nan_like_an_empty_mean() -> None:
    x, y = Tensor([[-1.0, -2.0, -3.0], [-1.5, -0.5, -2.0]]), Tensor([1, 1])
    assert np.isnan(x.nll_loss(y, ignore_index=1).item())
    assert np.isnan(x.sparse_categorical_crossentropy(y, ignore_index=1).item())
    assert np.isnan(x.cross_entropy(y, ignore_index=1).item()) and np.isnan(Tensor([]).mean().item())
    assert x.sparse_categorical_crossentropy(y, ignore_index=1, reduction="sum").item() == 0


def np_interpolate(x: np.ndarray, size: tuple[int, ...], mode: str, align_corners: bool) -> np.ndarray:
    """Separable: per resized dim, nearest takes floor(i*in/out) ('nearest-exact': floor((i+0.5)*in/out)), linear
    blends the two neighbours of (i+0.5)*in/out-0.5 clipped to the input (align_corners: i*(in-1)/(out-1))."""
    for i, n_out in enumerate(size):
        ax = x.ndim - len(size) + i
        n_in = x.shape[ax]
        o = np.arange(n_out, dtype=np.float64)
        if mode != "linear":
            src = np.floor((o + (0.5 if mode == "nearest-exact" else 0.0)) * n_in / n_out).astype(int)
            x = np.take(x, np.minimum(src, n_in - 1), ax)
            continue
        if align_corners:
            pos = o * ((n_in - 1) / (n_out - 1)) if n_out > 1 else np.zeros(n_out)
        else:
            pos = np.clip((o + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
        lo = np.floor(pos).astype(int)
        hi, frac = np.minimum(lo + 1, n_in - 1), pos - lo
        shape = [1] * x.ndim
        shape[ax] = n_out
        x = np.take(x, lo, ax) + (np.take(x, hi, ax) - np.take(x, lo, ax)) * frac.reshape(shape)
    return x


@settings(max_examples=25)
@given(st.tuples(st.integers(1, 9), st.integers(1, 9)), st.sampled_from(["linear", "nearest", "nearest-exact"]),
       st.booleans(), st.integers(0, 2**16))  # fmt: skip
def test_interpolate_matches_numpy(size: tuple[int, int], mode: str, align_corners: bool, seed: int) -> None:
    align_corners = align_corners and mode == "linear"
    x = np.random.default_rng(seed).standard_normal((2, 3, 5, 4))
    out = Tensor(x.astype(np.float32)).interpolate(size, mode=mode, align_corners=align_corners)
    np.testing.assert_allclose(out.numpy(), np_interpolate(x, size, mode, align_corners), rtol=1e-5, atol=1e-5)
