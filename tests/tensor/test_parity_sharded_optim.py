"""Optimizers over sharded parameters whose gradients come out sharded differently (issue 28): a replicated bias
after a layer whose output is split by features gets a sharded gradient; Adam/LAMB/SGD must update it (and their
state placed like it) with the parameter's own sharding, giving what the same training gives on one device."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from speck.tensor import Tensor, TinyJit, nn
from speck.tensor.nn.optim import LAMB, SGD, Adam

DEVS = ("CPU", "CPU:1")


class _MLP:
    def __init__(self, rng: np.random.Generator, layers: int, width: int) -> None:
        self.ls = []
        for _ in range(layers):
            lin = nn.Linear(width, width)
            lin.weight = Tensor(rng.standard_normal((width, width), dtype=np.float32) * 0.3)
            lin.bias = Tensor(rng.standard_normal(width, dtype=np.float32) * 0.1)
            self.ls.append(lin)

    def shard(self) -> None:
        for lin in self.ls:
            lin.weight.shard_(DEVS, axis=0)  # split by output features
            lin.bias.shard_(DEVS, axis=None)  # replicated

    def __call__(self, x: Tensor) -> Tensor:
        for lin in self.ls:
            x = lin(x).relu()
        return x


def _train(opt_cls: Any, sharded: bool, jit: bool, steps: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    m = _MLP(rng, layers=3, width=8)
    xn = rng.standard_normal((4, 8), dtype=np.float32)
    if sharded:
        m.shard()
    x = Tensor(xn).shard(DEVS, axis=0) if sharded else Tensor(xn)
    opt = opt_cls(nn.state.get_parameters(m), lr=0.01)

    def step(x: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = m(x).square().sum()
            loss.backward()
            opt.step()
        return loss.realize()

    f = TinyJit(step) if jit else step
    for _ in range(steps):
        f(x.realize())
    return [p.numpy() for p in nn.state.get_parameters(m)]


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("opt_cls", [SGD, Adam, LAMB])
def test_sharded_training_matches_single_device(opt_cls: Any, jit: bool) -> None:
    ref = _train(opt_cls, sharded=False, jit=False)
    got = _train(opt_cls, sharded=True, jit=jit)
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def _copied_elements(*ts: Tensor) -> list[int]:
    items = ts[0].schedule(*ts[1:])
    return [int(it.bufs[0].arg) for it in items if it.ast is None]


def test_reshard_of_broadcast_operand_copies_unbroadcast_data() -> None:
    """x split by batch times w split by output features: the matmul's broadcast operands are resharded before
    their expand (a copy of at most the operand's own data), not as an (8, 32, 64) materialized broadcast."""
    rng = np.random.default_rng(1)
    xn, wn = rng.random((16, 64), dtype=np.float32), rng.random((64, 64), dtype=np.float32)
    x, w = Tensor(xn).shard(DEVS, axis=0), Tensor(wn).shard(DEVS, axis=0)
    y = (x @ w.T).relu()
    (gw,) = y.square().sum().gradient(w)
    limit = max(xn.size, wn.size)
    assert max(_copied_elements(y, gw)) <= limit
    yn = np.maximum(xn @ wn.T, 0)
    np.testing.assert_allclose(y.numpy(), yn, rtol=1e-5)
    np.testing.assert_allclose(gw.numpy(), (2 * yn).T @ xn, rtol=1e-4)


def test_jitted_sharded_training_memory_close_to_one_device() -> None:
    """A captured multi-layer sharded training step holds about what the one-device capture holds (it held a
    materialized broadcast per layer: 8x the one-device memory with 4 layers)."""
    from speck.tensor import GlobalCounters

    def captured_bytes(sharded: bool) -> int:
        rng = np.random.default_rng(2)
        m = _MLP(rng, layers=4, width=64)
        if sharded:
            m.shard()
        xn = rng.standard_normal((16, 64), dtype=np.float32)
        x = (Tensor(xn).shard(DEVS, axis=0) if sharded else Tensor(xn)).realize()
        opt = Adam(nn.state.get_parameters(m), lr=0.01)

        @TinyJit
        def step(x: Tensor) -> Tensor:
            with Tensor.train():
                opt.zero_grad()
                loss = m(x).sum()
                loss.backward()
                opt.step()
            return loss.realize()

        step(x)
        before = GlobalCounters.mem_used
        step(x)
        step(x)
        return GlobalCounters.mem_used - before

    # (3x: since captures fold the optimizer's copies of new values into the kernels computing them, the
    # one-device capture holds no temporaries for them, while the sharded one keeps its cross-device buffers, about
    # 440 KB here; the broadcast per layer this guards against was 8x. Measured: 684 KB against 245 KB, both
    # ~135 KB less since gradient rules stopped keeping their nodes' buffers alive)
    assert captured_bytes(True) <= 3 * captured_bytes(False)


@pytest.mark.parametrize("axis", [None, 0])
@pytest.mark.parametrize("write", ["assign", "iadd", "slice"])
def test_sharded_value_built_before_a_write_keeps_old_values(axis: Any, write: str) -> None:
    """'same as eager' (TENSOR_API 4.6) for sharded tensors: a lazy value made before a write to its input reads
    the old contents (it read the new ones: the writes did not see which buffers a sharded graph reads)."""
    a = Tensor(np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)).shard(DEVS, axis=axis).realize()
    b = a * 2
    if write == "assign":
        a.assign(Tensor(np.full(4, 5.0, dtype=np.float32)).shard(DEVS, axis=axis))
        want = [5.0] * 4
    elif write == "iadd":
        a += 1
        want = [2.0, 3.0, 4.0, 5.0]
    else:
        a.assign(a.shrink(((0, 2),)).pad(((0, 2),)))  # a lazy value of a itself, written back whole
        want = [1.0, 2.0, 0.0, 0.0]
    np.testing.assert_equal(b.numpy(), [2.0, 4.0, 6.0, 8.0])
    np.testing.assert_equal(a.numpy(), want)


def test_sharded_training_losses_match_one_device() -> None:
    """The loss returned by a step is computed from the parameters before the update (it was read after it)."""

    def losses(sharded: bool) -> list[float]:
        rng = np.random.default_rng(5)
        m = _MLP(rng, layers=2, width=8)
        if sharded:
            m.shard()
        opt = Adam(nn.state.get_parameters(m), lr=0.05)
        out = []
        for _ in range(3):
            xn = rng.standard_normal((4, 8), dtype=np.float32)
            x = Tensor(xn).shard(DEVS, axis=0) if sharded else Tensor(xn)
            with Tensor.train():
                opt.zero_grad()
                loss = m(x).square().sum()
                loss.backward()
                opt.step()  # the loss is not realized with the step: it must still read the old parameters
            out.append(loss.item())
        return out

    np.testing.assert_allclose(losses(True), losses(False), rtol=1e-5)
