"""Unrolled recurrences: a large value that one kernel computed fused gets a buffer of its own when another kernel
reaches it (fusion.SHARED_FUSE_LIMIT), so an LSTM trained through time schedules kernels whose total size grows
linearly in the number of steps (each c_t was recomputed, with the chain below it, in every kernel reaching it)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from speck.tensor import Context, Tensor, nn

_I, _H, _B = 3, 4, 2


def _sigmoid(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = 1 / (1 + np.exp(-x))
    return out


def _lstm_loss_np(
    w_ih: np.ndarray, w_hh: np.ndarray, b: np.ndarray, xs: list[np.ndarray]
) -> tuple[float, list[np.ndarray]]:
    h = c = np.zeros((_B, _H))
    outs = []
    for x in xs:
        i, f, g, o = np.split(x @ w_ih.T + h @ w_hh.T + b, 4, axis=1)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        h = _sigmoid(o) * np.tanh(c)
        outs.append(h)
    return float(np.mean(np.stack(outs) ** 2)), outs


def _numeric_grad(f: Callable[[], float], w: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    g = np.zeros_like(w)
    for ix in np.ndindex(*w.shape):
        old = w[ix]
        w[ix] = old + eps
        up = f()
        w[ix] = old - eps
        down = f()
        w[ix] = old
        g[ix] = (up - down) / (2 * eps)
    return g


def _lstm(steps: int, seed: int = 0) -> tuple[nn.LSTMCell, list[Tensor], Tensor, list[Tensor]]:
    rng = np.random.default_rng(seed)
    cell = nn.LSTMCell(_I, _H)
    cell.weight_ih = Tensor(rng.uniform(-0.8, 0.8, (4 * _H, _I)).astype(np.float32), requires_grad=True)
    cell.weight_hh = Tensor(rng.uniform(-0.8, 0.8, (4 * _H, _H)).astype(np.float32), requires_grad=True)
    cell.bias_ih = Tensor(rng.uniform(-0.5, 0.5, 4 * _H).astype(np.float32), requires_grad=True)
    cell.bias_hh = Tensor(rng.uniform(-0.5, 0.5, 4 * _H).astype(np.float32), requires_grad=True)
    xs = [Tensor(rng.standard_normal((_B, _I)).astype(np.float32)) for _ in range(steps)]
    hc = None
    outs = []
    for x in xs:
        hc = cell(x, hc)
        outs.append(hc[0])
    loss = Tensor.stack(*outs).square().mean()
    return cell, xs, loss, outs


def _train_step_sizes(steps: int) -> tuple[int, int]:
    """(total AST nodes, largest kernel's AST nodes) of the schedule of an LSTM's loss and its weight gradients."""
    cell, _, loss, _ = _lstm(steps)
    loss.backward()
    grads = [p.grad for p in (cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh) if p is not None]
    assert len(grads) == 4 and all(g is not None for g in grads)
    with Context(SCACHE=0):
        items = loss.schedule(*[g for g in grads if g is not None])
    sizes = [len(it.ast.toposort()) for it in items if it.ast is not None]
    return sum(sizes), max(sizes)


def test_an_lstm_through_time_schedules_kernels_growing_linearly_in_the_steps() -> None:
    (t2, _), (t4, m4), (t8, m8) = (_train_step_sizes(n) for n in (2, 4, 8))
    # linear: each step adds about as many nodes as the one before (recomputing the cell state in every kernel
    # reaching it made 2 -> 4 -> 8 steps about 4x the nodes each, and the largest kernel grow with the steps)
    assert t8 - t4 <= 1.3 * 2 * (t4 - t2), (t2, t4, t8)
    assert t8 <= 2.3 * t4, (t4, t8)
    assert m8 <= 1.2 * m4, (m4, m8)


def test_an_unrolled_lstm_matches_numpy_forward_and_backward() -> None:
    steps = 5
    cell, xs, loss, outs = _lstm(steps, seed=3)
    loss.backward()
    w_ih, w_hh = cell.weight_ih.numpy().astype(np.float64), cell.weight_hh.numpy().astype(np.float64)
    assert cell.bias_ih is not None and cell.bias_hh is not None
    b_ih, b_hh = cell.bias_ih.numpy().astype(np.float64), cell.bias_hh.numpy().astype(np.float64)
    xs_np = [x.numpy().astype(np.float64) for x in xs]
    want, want_outs = _lstm_loss_np(w_ih, w_hh, b_ih + b_hh, xs_np)
    np.testing.assert_allclose(loss.numpy(), want, rtol=1e-5)
    for got, w in zip(outs, want_outs):
        np.testing.assert_allclose(got.numpy(), w, rtol=1e-4, atol=1e-6)
    b = b_ih + b_hh

    def f() -> float:
        return _lstm_loss_np(w_ih, w_hh, b, xs_np)[0]

    for p, w in ((cell.weight_ih, w_ih), (cell.weight_hh, w_hh), (cell.bias_ih, b), (cell.bias_hh, b)):
        assert p.grad is not None
        np.testing.assert_allclose(p.grad.numpy(), _numeric_grad(f, w), rtol=1e-3, atol=1e-6)
