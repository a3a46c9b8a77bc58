"""TinyJit: a captured training step replays exactly like the eager step (parameters, optimizer state, batch-norm
running statistics and the returned loss), and calls its capture can't serve raise JitError."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from speck.tensor import Tensor, TinyJit, dtypes, nn
from speck.tensor.jit import JitError
from speck.tensor.nn.optim import SGD, Adam
from speck.tensor.nn.state import get_state_dict


class Net:
    def __init__(self) -> None:
        self.l1 = nn.Linear(4, 6)
        self.bn = nn.BatchNorm(6)
        self.l2 = nn.Linear(6, 3)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.bn(self.l1(x).reshape(-1, 6, 1)).reshape(-1, 6).relu())


def _make(seed: int, opt_cls: Any) -> tuple[Net, Any]:
    Tensor.manual_seed(seed)
    net = Net()
    params = [t for k, t in get_state_dict(net).items() if "running" not in k and "num_batches" not in k]
    return net, opt_cls(params, lr=0.05)


def _step_fn(net: Net, opt: Any) -> Any:
    def step(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        with Tensor.train():
            opt.zero_grad()
            out = net(x)
            loss = out.sparse_categorical_crossentropy(y)
            loss.backward()
            acc = (out.argmax(axis=1) == y).float().mean()
            opt.step(loss, acc)
        return loss, acc

    return step


@pytest.mark.parametrize("opt_cls,every_step", [(SGD, True), (Adam, True), (Adam, False)])
def test_replay_equals_eager_training(opt_cls: Any, every_step: bool) -> None:
    """every_step=False reads nothing between steps: state that is never realized by the test must still update."""
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((5, 4)).astype(np.float32), rng.integers(0, 3, 5).astype(np.int32)) for _ in range(5)]
    eager_net, eager_opt = _make(1, opt_cls)
    jit_net, jit_opt = _make(1, opt_cls)
    eager, jitted = _step_fn(eager_net, eager_opt), TinyJit(_step_fn(jit_net, jit_opt))
    for i, (x, y) in enumerate(data):
        le, ae = eager(Tensor(x), Tensor(y))
        lj, aj = jitted(Tensor(x), Tensor(y))
        if not every_step and i < len(data) - 1:
            continue
        np.testing.assert_allclose(lj.numpy(), le.numpy(), rtol=1e-5, atol=1e-6, err_msg=f"loss at step {i}")
        np.testing.assert_allclose(aj.numpy(), ae.numpy(), err_msg=f"accuracy at step {i}")
        for (k, te), tj in zip(get_state_dict(eager_net).items(), get_state_dict(jit_net).values()):
            np.testing.assert_allclose(tj.numpy(), te.numpy(), rtol=1e-5, atol=1e-6, err_msg=f"{k} at step {i}")
    assert jitted.cnt == len(data) and jitted.captured is not None  # calls 3.. were replays


def test_replay_uses_new_inputs() -> None:
    @TinyJit
    def f(a: Tensor, b: Tensor) -> Tensor:
        return (a * 2 + b).sum(axis=1)

    rng = np.random.default_rng(1)
    for _ in range(4):
        a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
        np.testing.assert_allclose(f(Tensor(a), Tensor(b)).numpy(), (a * 2 + b).sum(axis=1), rtol=1e-5, atol=1e-6)


def test_replay_with_lazy_and_view_inputs() -> None:
    @TinyJit
    def f(a: Tensor) -> Tensor:
        return a + 1

    base = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    for i in range(4):
        x = base[:, 1:3] * (i + 1)  # lazy, not contiguous: the jit realizes it
        np.testing.assert_allclose(f(x).numpy(), np.arange(12, dtype=np.float32).reshape(3, 4)[:, 1:3] * (i + 1) + 1)


def test_shape_change_raises() -> None:
    @TinyJit
    def f(a: Tensor) -> Tensor:
        return a * 3

    for _ in range(3):
        f(Tensor(np.ones((2, 3), dtype=np.float32)))
    with pytest.raises(JitError, match=r"argument 0 changed: captured shape \(2, 3\).*got shape \(3, 3\)"):
        f(Tensor(np.ones((3, 3), dtype=np.float32)))
    with pytest.raises(JitError, match="dtypes.float.*dtypes.int"):
        f(Tensor(np.ones((2, 3), dtype=np.int32)))
    with pytest.raises(JitError, match="1 tensor inputs, called with 0"):
        f(3)
    f.reset()
    np.testing.assert_array_equal(f(Tensor(np.ones((3, 3), dtype=np.float32))).numpy(), np.full((3, 3), 3.0))


def test_jit_error_is_runtime_error() -> None:
    assert issubclass(JitError, RuntimeError)


def test_jit_method() -> None:
    class M:
        def __init__(self) -> None:
            self.w = Tensor(np.array([1.0, 2.0], dtype=np.float32))

        @TinyJit
        def f(self, x: Tensor) -> Tensor:
            return x * self.w

    m = M()
    for i in range(4):
        np.testing.assert_allclose(m.f(Tensor(np.array([i, 1.0], dtype=np.float32))).numpy(), [i, 2.0])
    assert dtypes.float32 == m.w.dtype


def test_replay_with_strided_view_of_a_buffer() -> None:
    @TinyJit
    def f(a: Tensor) -> Tensor:
        return a * 10

    rng = np.random.default_rng(2)
    for _ in range(4):
        big = rng.standard_normal((4, 5)).astype(np.float32)
        x = Tensor(big)[1:3, ::2]  # a pure view into a larger buffer
        np.testing.assert_allclose(f(x).numpy(), big[1:3, ::2] * 10, rtol=1e-6)


def test_replay_reads_each_call_s_slice_of_one_realized_tensor() -> None:
    """Successive contiguous slices of one realized tensor (evaluation batches of a test set) are distinct inputs:
    every replay computes on its own slice, not on the slice the capture saw."""
    data = np.arange(40, dtype=np.float32).reshape(8, 5)
    full = Tensor(data).realize()

    @TinyJit
    def f(x: Tensor) -> Tensor:
        return (x * 2).sum(axis=1).realize()

    for i in range(4):
        got = f(full[2 * i : 2 * i + 2].contiguous()).numpy()
        np.testing.assert_allclose(got, (data[2 * i : 2 * i + 2] * 2).sum(axis=1))


def test_learning_rate_assigned_between_replays_takes_effect() -> None:
    """opt.lr is a kernel input: assigning a new value between calls (a schedule) changes what replays compute."""
    w = Tensor([1.0, 2.0], requires_grad=True)
    opt = SGD([w], lr=0.1)

    @TinyJit
    def step() -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = (w * w).sum()
            loss.backward()
            opt.step(loss)
        return loss

    want = np.array([1.0, 2.0])
    for lr in (0.1, 0.1, 0.1, 0.25, 0.0, 0.05):
        opt.lr.assign(Tensor([lr], dtype=dtypes.float32))
        step()
        want = want - lr * 2 * want
        np.testing.assert_allclose(w.numpy(), want, rtol=1e-6)
