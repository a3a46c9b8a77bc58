"""Pooling, unpooling, convolution, gather and nn layers where they used to differ from PyTorch's definitions:
ceil_mode divisors, indices of pools over other than two leading dims, gradients of unpooling with overlapping
windows, empty batches, parameters that must be tensors of their own. References are numpy loops written from the
definitions (and central finite differences for gradients)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from speck.tensor import Context, Tensor, dtypes, nn
from speck.tensor.nn.state import get_state_dict
from tensor_helpers import assert_matches


def _out_size(n: int, k: int, s: int, d: int, pb: int, pa: int, ceil_mode: bool) -> int:
    span = n + pb + pa - d * (k - 1) - 1
    o = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (o - 1) * s >= n + pb:  # the last window must start inside the input or its leading padding
        o -= 1
    return o


def _pool_ref(x: np.ndarray, k: tuple[int, ...], s: tuple[int, ...], d: tuple[int, ...],
              pads: tuple[tuple[int, int], ...], ceil_mode: bool, mode: str,
              count_include_pad: bool = True) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(pooled values, flat argmax indices over the pooled dims) by PyTorch's definitions, one window at a time."""
    nsp = len(k)
    sp = x.shape[-nsp:]
    osz = tuple(_out_size(n, kk, ss, dd, pb, pa, ceil_mode) for n, kk, ss, dd, (pb, pa) in zip(sp, k, s, d, pads))
    lead = x.shape[:-nsp]
    vals = np.zeros(lead + osz, np.float64)
    idx = np.zeros(lead + osz, np.int64)
    for lo in itertools.product(*[range(n) for n in lead]):
        for o in itertools.product(*[range(n) for n in osz]):
            taps = [[oi * ss - pb + j * dd for j in range(kk)] for oi, ss, (pb, _), dd, kk in zip(o, s, pads, d, k)]
            inside = [p for p in itertools.product(*taps) if all(0 <= q < n for q, n in zip(p, sp))]
            padded = [p for p in itertools.product(*taps) if all(-pb <= q < n + pa for q, n, (pb, pa)
                                                                  in zip(p, sp, pads))]  # fmt: skip
            if mode == "max":
                best = max(inside, key=lambda p: (x[lo + p], -np.ravel_multi_index(p, sp)))
                vals[lo + o], idx[lo + o] = x[lo + best], np.ravel_multi_index(best, sp)
            else:
                total = sum(x[lo + p] for p in inside)
                vals[lo + o] = total / (len(padded) if count_include_pad else len(inside))
    return vals, idx


POOLS = [
    # kernel, stride, dilation, padding (per dim (before, after)), ceil_mode, input shape
    ((3, 3), (2, 2), (1, 1), ((1, 1), (1, 1)), True, (2, 3, 8, 9)),
    ((5, 5), (2, 2), (1, 1), ((2, 2), (2, 2)), True, (1, 2, 5, 5)),
    ((2, 2), (2, 2), (1, 1), ((0, 0), (0, 0)), True, (1, 2, 7, 7)),
    ((3, 2), (2, 1), (1, 1), ((1, 1), (0, 0)), True, (2, 2, 6, 5)),
    ((3, 3), (2, 2), (1, 1), ((1, 1), (1, 1)), False, (1, 1, 6, 7)),
]


@pytest.mark.parametrize("k,s,d,pads,ceil_mode,shape", POOLS)
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool_divisor(k: tuple[int, ...], s: tuple[int, ...], d: tuple[int, ...],
                          pads: tuple[tuple[int, int], ...], ceil_mode: bool, shape: tuple[int, ...],
                          count_include_pad: bool) -> None:  # fmt: skip
    # padding counts in the divisor (count_include_pad), the ceil_mode extension never does
    x = np.random.default_rng(0).uniform(-2, 2, shape).astype(np.float32)
    ref, _ = _pool_ref(x, k, s, d, pads, ceil_mode, "avg", count_include_pad)
    got = Tensor(x).avg_pool2d(k, s, d, tuple(p for p, _ in pads), ceil_mode, count_include_pad)
    assert_matches(got.numpy(), ref, atol=1e-6, rtol=1e-5)


def test_avg_pool_of_ints_is_float() -> None:
    x = np.arange(2 * 7 * 7).reshape(1, 2, 7, 7).astype(np.int32)
    ref, _ = _pool_ref(x.astype(np.float64), (2, 2), (2, 2), (1, 1), ((0, 0), (0, 0)), True, "avg")
    got = Tensor(x).avg_pool2d(2, ceil_mode=True)
    assert dtypes.is_float(got.dtype)
    assert_matches(got.numpy(), ref, rtol=1e-6)


@pytest.mark.parametrize(
    "shape,k,s,pads",
    [
        ((3, 8, 9), (2, 2), (2, 2), ((0, 0), (0, 0))),  # one leading dim, not (N, C)
        ((2, 3, 9), (3,), (2,), ((1, 1),)),  # a 1-d kernel pools the last dim
        ((1, 2, 4, 5, 6), (2, 2, 2), (2, 2, 2), ((0, 0), (0, 0), (0, 0))),  # 3-d
        ((2, 2, 6, 7), (3, 3), (2, 1), ((1, 1), (0, 0))),
    ],
)
def test_max_pool_indices_flatten_the_pooled_dims(shape: tuple[int, ...], k: tuple[int, ...], s: tuple[int, ...],
                                                  pads: tuple[tuple[int, int], ...]) -> None:  # fmt: skip
    x = np.random.default_rng(1).permutation(math.prod(shape)).reshape(shape).astype(np.float32)
    ref, ref_idx = _pool_ref(x, k, s, (1,) * len(k), pads, False, "max")
    out, idx = Tensor(x).max_pool2d(k, s, padding=tuple(p for p, _ in pads), return_indices=True)
    assert_matches(out.numpy(), ref)
    assert_matches(idx.numpy(), ref_idx.astype(idx.numpy().dtype))


def test_max_pool_takes_torch_order_padding_and_pads_ints_with_their_minimum() -> None:
    x = np.random.default_rng(2).integers(-50, 50, (1, 2, 5, 6)).astype(np.int32)
    # 4 values in torch order: (left, right, top, bottom)
    out = Tensor(x).max_pool2d(2, padding=(1, 0, 0, 1))
    ref, _ = _pool_ref(x.astype(np.float64), (2, 2), (2, 2), (1, 1), ((0, 1), (1, 0)), False, "max")
    assert out.dtype == dtypes.int32
    assert_matches(out.numpy(), ref.astype(np.int32))


def _unpool_ref(vals: np.ndarray, idx: np.ndarray, out_sp: tuple[int, ...]) -> np.ndarray:
    nsp = len(out_sp)
    lead = vals.shape[:-nsp]
    out = np.zeros(lead + (math.prod(out_sp),), vals.dtype)
    fv, fi = vals.reshape(lead + (-1,)), idx.reshape(lead + (-1,))
    for lo in itertools.product(*[range(n) for n in lead]):
        out[lo][fi[lo]] = fv[lo]
    return out.reshape(lead + out_sp)


@pytest.mark.parametrize("k,s,shape", [(2, 2, (2, 3, 8, 8)), (3, 2, (1, 2, 9, 9)), ((3,), (1,), (2, 2, 7))])
def test_max_unpool_values_and_gradient(k: int | tuple[int, ...], s: int | tuple[int, ...],
                                        shape: tuple[int, ...]) -> None:  # fmt: skip
    x = np.random.default_rng(3).permutation(math.prod(shape)).reshape(shape).astype(np.float32)
    out, idx = Tensor(x).max_pool2d(k, s, return_indices=True)
    nsp = 1 if isinstance(k, tuple) else 2
    sp = shape[-nsp:]
    un = out.max_unpool2d(idx, k, s, output_size=sp)
    ref = _unpool_ref(out.numpy(), idx.numpy(), sp)
    assert_matches(un.numpy(), ref)
    # each pooled value moves whole to its position: its gradient is the output gradient there, also where
    # overlapping windows (k=3, s=2) chose one position twice
    w = np.random.default_rng(4).uniform(0.5, 1.5, un.shape).astype(np.float32)
    v = Tensor(out.numpy())
    g = (v.max_unpool2d(Tensor(idx.numpy()), k, s, output_size=sp) * Tensor(w)).sum().gradient(v)[0].numpy()
    lead = out.shape[:-nsp]
    wf, fi = w.reshape(lead + (-1,)), idx.numpy().reshape(lead + (-1,))
    assert_matches(g, np.take_along_axis(wf, fi, -1).reshape(out.shape))


def test_max_unpool_signature_puts_dilation_before_padding() -> None:
    # TENSOR_API 7.4: max_unpool2d(indices, kernel_size, stride, dilation, padding, output_size)
    x = np.random.default_rng(5).permutation(36).reshape(1, 1, 6, 6).astype(np.float32)
    out, idx = Tensor(x).max_pool2d(2, 2, 1, 1, return_indices=True)
    un = out.max_unpool2d(idx, 2, 2, 1, 1)  # the default output size inverts the pooling's: 6x6
    assert un.shape == (1, 1, 6, 6)
    assert_matches(un.numpy(), _unpool_ref(out.numpy(), idx.numpy(), (6, 6)))


def test_conv2d_with_an_empty_batch_differentiates() -> None:
    x, w = Tensor.zeros(0, 3, 6, 6), Tensor(np.random.default_rng(6).standard_normal((4, 3, 3, 3)).astype(np.float32))
    out = x.conv2d(w, padding=1)
    assert out.shape == (0, 4, 6, 6)
    gx, gw = out.sum().gradient(x, w)
    assert gx.shape == (0, 3, 6, 6)
    assert_matches(gw.numpy(), np.zeros((4, 3, 3, 3)))


def test_gather_negative_indices_wrap_and_out_of_range_ones_raise() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4) + 1
    idx = np.array([[0, -1, 3, 4], [2, 1, -4, 0]], np.int32)
    # negatives count from the end, as numpy's take_along_axis
    assert_matches(Tensor(x).gather(1, Tensor(idx[:, :3])).numpy(), np.take_along_axis(x[:2], idx[:, :3], 1))
    bad = idx.copy()
    bad[1, 2] = -5
    with pytest.raises(IndexError, match="^gather: index -5 is out of bounds for dim 1 with size 4"):
        Tensor(x).gather(1, Tensor(bad)).numpy()
    with Context(CHECK_OOB=0):  # unchecked: an index outside [-4, 4) reads 0
        got = Tensor(x).gather(1, Tensor(bad)).numpy()
    ok = (bad >= -4) & (bad < 4)
    assert_matches(got, np.where(ok, np.take_along_axis(x[:2], np.where(ok, bad, 0), 1), 0))
    with pytest.raises(AssertionError):
        Tensor(x).gather(1, Tensor(np.zeros((4, 2), np.int32)))  # 4 rows > 3: bigger than self off dim 1


def test_constant_initialised_parameters_are_independent() -> None:
    # two layers of one size must not share a graph node (gradients would add up across them)
    a, b = nn.BatchNorm2d(3), nn.BatchNorm2d(3)
    x = np.random.default_rng(7).standard_normal((2, 3, 4, 4)).astype(np.float32)
    loss = (a(Tensor(x)) * Tensor(np.arange(3, dtype=np.float32).reshape(1, 3, 1, 1))).sum() + b(Tensor(x)).sum() * 0
    ga, gb = loss.gradient(a.bias, b.bias)
    assert_matches(ga.numpy(), np.arange(3) * 32.0)
    assert_matches(gb.numpy(), np.zeros(3))
    for layer in (nn.LayerNorm(5), nn.GroupNorm(1, 5), nn.InstanceNorm(5), nn.RMSNorm(5), nn.LSTMCell(2, 5)):
        params = list(get_state_dict(layer).values())
        assert len({id(p.uop) for p in params}) == len(params), f"{type(layer).__name__} shares a parameter node"


def _lstm_np(x: np.ndarray, wih: np.ndarray, whh: np.ndarray, bih: np.ndarray, bhh: np.ndarray) -> np.ndarray:
    def sig(v: np.ndarray) -> np.ndarray:
        return 1 / (1 + np.exp(-v))

    gates = x @ wih.T + bih + bhh  # h = c = 0
    i, f, g, o = np.split(gates, 4, axis=1)
    c = sig(i) * np.tanh(g)
    return sig(o) * np.tanh(c)


def test_lstm_cell_bias_gradients_match_finite_differences() -> None:
    cell = nn.LSTMCell(3, 2)
    x = np.random.default_rng(8).standard_normal((4, 3))
    p = {k: v.numpy().astype(np.float64) for k, v in get_state_dict(cell).items()}
    g_ih, g_hh = cell(Tensor(x.astype(np.float32)))[0].sum().gradient(cell.bias_ih, cell.bias_hh)
    eps, fd = 1e-6, np.zeros(8)
    for j in range(8):
        e = np.zeros(8)
        e[j] = eps
        hi = _lstm_np(x, p["weight_ih"], p["weight_hh"], p["bias_ih"] + e, p["bias_hh"]).sum()
        lo = _lstm_np(x, p["weight_ih"], p["weight_hh"], p["bias_ih"] - e, p["bias_hh"]).sum()
        fd[j] = (hi - lo) / (2 * eps)
    assert_matches(g_ih.numpy(), fd, atol=1e-5, rtol=1e-4)
    assert_matches(g_hh.numpy(), fd, atol=1e-5, rtol=1e-4)


def test_meshgrid_as_a_method_and_unfold_of_0d() -> None:
    a, b = np.array([1, 2, 3], np.int32), np.array([4, 5], np.int32)
    for indexing in ("ij", "xy"):
        got = Tensor(a).meshgrid(Tensor(b), indexing=indexing)
        ref = np.meshgrid(a, b, indexing=indexing)
        assert len(got) == 2
        for g, r in zip(got, ref):
            assert_matches(g.numpy(), r)
    assert_matches(Tensor(np.float32(4.0)).unfold(0, 1, 1).numpy(), np.array([4.0]))


def _conv_transpose_ref(x: np.ndarray, w: np.ndarray, stride: int, pads: tuple[tuple[int, int], ...],
                        out_pad: int) -> np.ndarray:  # fmt: skip
    """1-d transposed convolution by its definition: every input element scatters its weighted kernel."""
    n, cin, length = x.shape
    _, cout, k = w.shape
    full = np.zeros((n, cout, (length - 1) * stride + k + out_pad))
    for i in range(length):
        full[:, :, i * stride : i * stride + k] += np.einsum("nc,cok->nok", x[:, :, i], w)
    ((pb, pa),) = pads
    return full[:, :, pb : full.shape[2] - pa]


@pytest.mark.parametrize("padding,pads", [(1, ((1, 1),)), ((2, 0), ((2, 0),)), ((0, 3), ((0, 3),))])
def test_conv_transpose_takes_per_side_padding(
    padding: int | tuple[int, int], pads: tuple[tuple[int, int], ...]
) -> None:
    # two values for one spatial dim are (left, right) in torch order, as conv2d takes them
    rng = np.random.default_rng(9)
    x, w = rng.standard_normal((2, 3, 5)).astype(np.float32), rng.standard_normal((3, 2, 4)).astype(np.float32)
    got = Tensor(x).conv_transpose2d(Tensor(w), stride=2, padding=padding, output_padding=1)
    assert_matches(got.numpy(), _conv_transpose_ref(x, w, 2, pads, 1), atol=1e-5, rtol=1e-5)


def test_conv_transpose_to_an_empty_output() -> None:
    # (i-1)*s - 2p + d(k-1) + 1 = 0: the padding crops everything; a negative size is an error
    x, w = Tensor.ones(2, 4, 1, 3), Tensor.ones(4, 3, 2, 3)
    out = x.conv_transpose2d(w, stride=2, padding=1)
    assert out.shape == (2, 3, 0, 5)
    assert out.numpy().shape == (2, 3, 0, 5)
    with pytest.raises(AssertionError):
        x.conv_transpose2d(w, padding=2)
