"""Gradients read one at a time (`loss.backward(); for p in params: p.grad.numpy()`): the intermediates the first read
computes are kept for the other gradients of that backward, so the reads together run no more kernels than realizing
every gradient at once, give the same values, and never read a value a later write made stale."""

from __future__ import annotations

import gc
import weakref

import numpy as np

from speck.tensor import GlobalCounters, Tensor, nn
from speck.tensor.nn.state import get_parameters


def _mlp(seed: int, x: np.ndarray | Tensor) -> tuple[list[Tensor], Tensor]:
    rng = np.random.default_rng(seed)
    ws = [Tensor(rng.standard_normal((12, 12)).astype(np.float32) * 0.3, requires_grad=True) for _ in range(4)]
    return ws, _mlp_loss(ws, x if isinstance(x, Tensor) else Tensor(x))


def _mlp_loss(ws: list[Tensor], x: Tensor) -> Tensor:
    h = x
    for w in ws:
        h = (h @ w).relu()
    return h.square().mean()


def _np_mlp_grads(ws: list[np.ndarray], x: np.ndarray) -> list[np.ndarray]:
    """d mean(relu(...relu(x@w0)...@w3)^2) / d w_i in float64."""
    hs, pre = [x], []
    for w in ws:
        pre.append(hs[-1] @ w)
        hs.append(np.maximum(pre[-1], 0))
    g = 2 * hs[-1] / hs[-1].size
    out = [np.zeros_like(w) for w in ws]
    for i in reversed(range(len(ws))):
        g = g * (pre[i] > 0)
        out[i] = hs[i].T @ g
        g = g @ ws[i].T
    return out


def _reads(grads: list[Tensor]) -> tuple[list[np.ndarray], list[int]]:
    vals, kernels = [], []
    for g in grads:
        k = GlobalCounters.kernel_count
        vals.append(g.numpy())
        kernels.append(GlobalCounters.kernel_count - k)
    return vals, kernels


def _all_at_once(grads: list[Tensor]) -> tuple[list[np.ndarray], int]:
    k = GlobalCounters.kernel_count
    Tensor.realize(*grads)
    n = GlobalCounters.kernel_count - k
    return [g.numpy() for g in grads], n


def test_mlp_grads_read_one_at_a_time_match_numpy_and_all_at_once() -> None:
    x = np.random.default_rng(1).standard_normal((6, 12)).astype(np.float32)
    for _ in range(2):  # the second time: graphs of a structure scheduled before (the schedule cache's plans)
        ws, loss = _mlp(0, x)
        loss.backward()
        one, kernels = _reads([w.grad for w in ws if w.grad is not None])
        ws2, loss2 = _mlp(0, x)
        loss2.backward()
        every, n_all = _all_at_once([w.grad for w in ws2 if w.grad is not None])
        ref = _np_mlp_grads([w.numpy().astype(np.float64) for w in ws], x.astype(np.float64))
        for a, b, r in zip(one, every, ref):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-6)
        # (without the kept intermediates each read computed the forward and the backward below it again: 4 reads
        # ran about three times the kernels realizing them together does)
        assert sum(kernels) <= n_all, (kernels, n_all)


def _lstm_grads(seed: int) -> list[Tensor]:
    Tensor.manual_seed(seed)
    cell, out = nn.LSTMCell(5, 7), nn.Linear(7, 3)
    params = get_parameters(cell) + get_parameters(out)
    for p in params:
        p.requires_grad = True
    x = Tensor(np.random.default_rng(seed).standard_normal((3, 6, 5)).astype(np.float32))
    hc = None
    for t in range(6):
        hc = cell(x[:, t], hc)
    assert hc is not None
    out(hc[0]).square().mean().backward()
    return [p.grad for p in params if p.grad is not None]


def test_lstm_grads_read_one_at_a_time_equal_all_at_once_in_no_more_kernels() -> None:
    for _ in range(2):
        one, kernels = _reads(_lstm_grads(3))
        every, n_all = _all_at_once(_lstm_grads(3))
        assert len(one) == len(every) == 6
        for a, b in zip(one, every):
            np.testing.assert_array_equal(a, b)
        assert sum(kernels) <= n_all, (kernels, n_all)


def test_first_read_runs_no_more_kernels_than_a_lone_gradient() -> None:
    """Keeping intermediates adds no kernel: the first read runs what reading that gradient alone runs."""
    x = np.random.default_rng(2).standard_normal((6, 12)).astype(np.float32)
    ws, loss = _mlp(5, x)
    loss.backward()
    k = GlobalCounters.kernel_count
    assert ws[0].grad is not None
    ws[0].grad.numpy()
    first = GlobalCounters.kernel_count - k
    ws2, loss2 = _mlp(5, x)
    (g,) = loss2.gradient(ws2[0])  # (a gradient made alone: no other gradient shares its graph)
    k = GlobalCounters.kernel_count
    g.numpy()
    assert first <= GlobalCounters.kernel_count - k


def test_a_write_between_reads_is_seen_by_later_graphs_not_by_earlier_ones() -> None:
    """Kept intermediates read the weights as they were: after an in-place update of a weight, a gradient made
    before it still has the old value (program order), and a new backward over the same (hash-consed) graph gets the
    new one, not the kept intermediates."""
    x = np.random.default_rng(3).standard_normal((6, 12)).astype(np.float32)
    xt = Tensor(x)  # (one input buffer: the second graph is made of the first one's nodes where it can be)
    ws, loss = _mlp(7, xt)
    old = [w.numpy().astype(np.float64) for w in ws]
    loss.backward()
    grads = [w.grad for w in ws]
    assert grads[3] is not None and grads[0] is not None
    g3 = grads[3].numpy()
    ws[0][2:9] = Tensor(np.full((7, 12), 0.25, np.float32))  # in place, between reads (every kept value reads ws[0])
    ws[0].realize()  # (written now: the graph below is made of the first one's nodes, over the same buffer)
    g0 = grads[0].numpy()
    ref_old = _np_mlp_grads(old, x.astype(np.float64))
    np.testing.assert_allclose(g3, ref_old[3], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(g0, ref_old[0], rtol=1e-4, atol=1e-6)
    for w in ws:
        w.grad = None
    _mlp_loss(ws, xt).backward()
    new = [w.numpy().astype(np.float64) for w in ws]
    ref_new = _np_mlp_grads(new, x.astype(np.float64))
    for w, r in zip(reversed(ws), reversed(ref_new)):
        assert w.grad is not None
        np.testing.assert_allclose(w.grad.numpy(), r, rtol=1e-4, atol=1e-6)
    assert not np.allclose(ref_new[0], ref_old[0])  # (the update changed the gradient: the check can fail)


def test_kept_intermediates_go_with_the_graphs_holding_them() -> None:
    """Once every gradient is read, no graph holds the intermediates: their nodes (and buffers) are freed."""
    x = np.random.default_rng(4).standard_normal((6, 12)).astype(np.float32)
    ws, loss = _mlp(9, x)
    node = weakref.ref(loss.uop)
    loss.backward()
    for w in ws:
        assert w.grad is not None
        w.grad.numpy()
    del loss
    gc.collect()
    assert node() is None


def test_relu_and_pow_gradient_rules_do_not_keep_their_graph_alive() -> None:
    a = Tensor(np.ones((3, 3), np.float32), requires_grad=True)
    for make in (lambda t: (t * 2).relu(), lambda t: (t + 1) ** Tensor(np.full((3, 3), 1.5, np.float32))):
        y = make(a)
        node = weakref.ref(y.uop)
        del y
        gc.collect()
        assert node() is None
    x = Tensor(np.array([-1.0, 0.0, 2.0], np.float32), requires_grad=True)
    e = Tensor(np.array([2.0, 3.0, 0.5], np.float32), requires_grad=True)
    ((x.relu() + 1) ** e).sum().backward()
    assert x.grad is not None and e.grad is not None
    xs, es = np.array([-1.0, 0.0, 2.0]), np.array([2.0, 3.0, 0.5])
    base = np.maximum(xs, 0) + 1
    np.testing.assert_allclose(x.grad.numpy(), es * base ** (es - 1) * (xs > 0), rtol=1e-5)
    np.testing.assert_allclose(e.grad.numpy(), base**es * np.log(base), rtol=1e-5)
