"""Each optimizer's steps against a numpy implementation of the same documented update, over several steps, on a
loss that couples two parameters (so a step that updates one parameter before the other's gradient is computed
shows up)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from speck.tensor import TRAINING, Context, Tensor
from speck.tensor.nn import optim

A0 = np.array([[0.5, -1.2, 0.3], [0.8, 0.1, -0.7]], dtype=np.float32)
B0 = np.array([[0.2, -0.4], [1.1, 0.6], [-0.3, 0.9]], dtype=np.float32)
C0 = np.array([0.3, -0.2], dtype=np.float32)
T = np.array([[1.0, -1.0], [0.5, 2.0]], dtype=np.float32)


def np_grads(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> list[np.ndarray]:
    """Gradients of sum((a @ b + c - T)^2) + sum(c^2 * 0.5)."""
    r = a.astype(np.float64) @ b + c - T
    return [2 * r @ b.T, 2 * a.T @ r, 2 * r.sum(0) + c]


def run_speck(make: Callable[[list[Tensor]], Any], steps: int) -> list[list[np.ndarray]]:
    ps = [Tensor(x.copy()) for x in (A0, B0, C0)]
    opt = make(ps)
    hist = []
    with Tensor.train():
        for _ in range(steps):
            opt.zero_grad()
            a, b, c = ps
            loss = ((a @ b + c - Tensor(T)) ** 2).sum() + (c * c * 0.5).sum()
            loss.backward()
            assert opt.step() is None
            hist.append([p.numpy() for p in ps])
    return hist


def run_numpy(update: Callable[[int, int, np.ndarray, np.ndarray, dict[str, Any]], np.ndarray],
              steps: int) -> list[list[np.ndarray]]:  # fmt: skip
    ps = [x.astype(np.float64) for x in (A0, B0, C0)]
    states: list[dict[str, Any]] = [{} for _ in ps]
    hist = []
    for t in range(1, steps + 1):
        gs = np_grads(*ps)
        ps = [update(t, i, p, g, states[i]) for i, (p, g) in enumerate(zip(ps, gs))]
        hist.append([p.copy() for p in ps])
    return hist


def check(make: Callable[[list[Tensor]], Any], update: Any, steps: int = 4, rtol: float = 2e-4,
          atol: float = 2e-5) -> None:  # fmt: skip
    got, ref = run_speck(make, steps), run_numpy(update, steps)
    for s, (gs, rs) in enumerate(zip(got, ref)):
        for i, (g, r) in enumerate(zip(gs, rs)):
            np.testing.assert_allclose(g, r, rtol=rtol, atol=atol, err_msg=f"step {s + 1}, parameter {i}")


def sgd_ref(lr: float, momentum: float = 0.0, wd: float = 0.0, nesterov: bool = False) -> Any:
    def up(t: int, i: int, p: np.ndarray, g: np.ndarray, st: dict[str, Any]) -> np.ndarray:
        g = g + wd * p
        if momentum:
            st["b"] = st.get("b", np.zeros_like(p)) * momentum + g
            g = g + momentum * st["b"] if nesterov else st["b"]
        return p - lr * g

    return up


@pytest.mark.parametrize("momentum,wd,nesterov", [(0.0, 0.0, False), (0.9, 0.0, False), (0.9, 0.01, True),
                                                  (0.5, 0.1, False)])  # fmt: skip
def test_sgd(momentum: float, wd: float, nesterov: bool) -> None:
    check(lambda ps: optim.SGD(ps, lr=0.01, momentum=momentum, weight_decay=wd, nesterov=nesterov),
          sgd_ref(0.01, momentum, wd, nesterov))  # fmt: skip


def adam_ref(lr: float, b1: float, b2: float, eps: float, wd: float, lamb: bool) -> Any:
    def up(t: int, i: int, p: np.ndarray, g: np.ndarray, st: dict[str, Any]) -> np.ndarray:
        st["m"] = st.get("m", np.zeros_like(p)) * b1 + (1 - b1) * g
        st["v"] = st.get("v", np.zeros_like(p)) * b2 + (1 - b2) * g * g
        u = (st["m"] / (1 - b1**t)) / (np.sqrt(st["v"] / (1 - b2**t)) + eps) + wd * p
        if not lamb:
            return p - lr * u
        r1, r2 = np.linalg.norm(p), np.linalg.norm(u)
        return p - lr * (r1 / r2 if r1 > 0 and r2 > 0 else 1.0) * u

    return up


def test_adam() -> None:
    check(lambda ps: optim.Adam(ps, lr=0.01, b1=0.8, b2=0.99), adam_ref(0.01, 0.8, 0.99, 1e-8, 0.0, False))


def test_adamw() -> None:
    check(lambda ps: optim.AdamW(ps, lr=0.01, weight_decay=0.1), adam_ref(0.01, 0.9, 0.999, 1e-8, 0.1, False))


def test_lamb() -> None:
    check(lambda ps: optim.LAMB(ps, lr=0.02, weight_decay=0.05), adam_ref(0.02, 0.9, 0.999, 1e-6, 0.05, True))


def lars_ref(lr: float, momentum: float, wd: float, tcoef: float) -> Any:
    def up(t: int, i: int, p: np.ndarray, g: np.ndarray, st: dict[str, Any]) -> np.ndarray:
        pn, gn = np.linalg.norm(p), np.linalg.norm(g)
        trust = tcoef * pn / (gn + wd * pn) if pn > 0 and gn > 0 else 1.0
        st["b"] = st.get("b", np.zeros_like(p)) * momentum + (g + wd * p) * trust
        return p - lr * st["b"]

    return up


def test_lars() -> None:
    check(
        lambda ps: optim.LARS(ps, lr=0.5, momentum=0.9, weight_decay=0.01, tcoef=0.02), lars_ref(0.5, 0.9, 0.01, 0.02)
    )


def np_newton_schulz(g: np.ndarray, steps: int, eps: float = 1e-7) -> np.ndarray:
    a, b, c = 3.4445, -4.7750, 2.0315
    tr = g.shape[0] > g.shape[1]
    x = g.T if tr else g
    x = x / (np.linalg.norm(x) + eps)
    for _ in range(steps):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if tr else x


def muon_ref(lr: float, momentum: float, nesterov: bool, ns_steps: int, wd: float) -> Any:
    def up(t: int, i: int, p: np.ndarray, g: np.ndarray, st: dict[str, Any]) -> np.ndarray:
        st["b"] = st.get("b", np.zeros_like(p)) * momentum + g
        u = g + momentum * st["b"] if nesterov else st["b"]
        u = np_newton_schulz(u.reshape(p.shape[0], -1), ns_steps).reshape(p.shape)  # every param as a matrix
        return p * (1 - wd * lr) - lr * u

    return up


@pytest.mark.parametrize("nesterov,wd", [(True, 0.0), (False, 0.1)])
def test_muon(nesterov: bool, wd: float) -> None:
    check(lambda ps: optim.Muon(ps, lr=0.02, momentum=0.9, nesterov=nesterov, ns_steps=3, weight_decay=wd),
          muon_ref(0.02, 0.9, nesterov, 3, wd), rtol=1e-3, atol=1e-4)  # fmt: skip


def test_newton_schulz_orthogonalizes() -> None:
    g = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    x = optim.newton_schulz(Tensor(g), 5).numpy()
    np.testing.assert_allclose(x, np_newton_schulz(g.astype(np.float64), 5), rtol=1e-3, atol=1e-4)
    # singular values of the result are near 1 (the quintic iteration lands in roughly [0.7, 1.2])
    sv = np.linalg.svd(x, compute_uv=False)
    assert np.all((sv > 0.5) & (sv < 1.5)), sv


def test_optimizer_group_matches_separate() -> None:
    def make(ps: list[Tensor]) -> Any:
        return optim.OptimizerGroup(optim.SGD(ps[:1], lr=0.01, momentum=0.9), optim.Adam(ps[1:], lr=0.01))

    sgd, adam = sgd_ref(0.01, 0.9), adam_ref(0.01, 0.9, 0.999, 1e-8, 0.0, False)
    check(make, lambda t, i, p, g, st: sgd(t, i, p, g, st) if i == 0 else adam(t, i, p, g, st))


def test_step_outside_training_mode_raises() -> None:
    p = Tensor(np.ones(3, dtype=np.float32))
    opt = optim.SGD([p], lr=0.1)
    (p * p).sum().backward()
    with pytest.raises(RuntimeError, match="outside training mode"):
        opt.step()
    np.testing.assert_array_equal(p.numpy(), np.ones(3, dtype=np.float32))  # nothing was updated
    with Context(TRAINING=1):  # the context variable works as well as Tensor.train()
        opt.step()
    assert TRAINING.value == 0
    np.testing.assert_allclose(p.numpy(), np.full(3, 0.8, dtype=np.float32), rtol=1e-6)


def test_step_without_backward_raises() -> None:
    p = Tensor(np.ones(3, dtype=np.float32))
    opt = optim.Adam([p])
    with Tensor.train(), pytest.raises(RuntimeError, match="no gradient"):
        opt.step()


def test_optimizer_marks_params_and_skips_frozen() -> None:
    p, frozen = Tensor(np.ones(2, dtype=np.float32)), Tensor(np.ones(2, dtype=np.float32), requires_grad=False)
    opt = optim.SGD([p, frozen], lr=0.5)
    assert opt.params == [p] and opt.buffers == [frozen]
    with Tensor.train():
        (p * frozen * 2).sum().backward()
        opt.step()
    np.testing.assert_allclose(p.numpy(), [0.0, 0.0])
    np.testing.assert_array_equal(frozen.numpy(), [1.0, 1.0])
    opt.zero_grad()
    assert p.grad is None


def test_scalar_parameter() -> None:
    p = Tensor.full((), 2.0)  # (Tensor(2.0) is a device-less literal: it takes no gradient, TENSOR_API 0.2)
    opt = optim.Adam([p], lr=0.1)
    with Tensor.train():
        for _ in range(3):
            opt.zero_grad()
            (p * p).backward()
            opt.step()
    assert p.shape == ()
    ref = adam_ref(0.1, 0.9, 0.999, 1e-8, 0.0, False)
    x, st = np.float64(2.0), {}
    for t in range(1, 4):
        x = ref(t, 0, x, 2 * x, st)
    np.testing.assert_allclose(p.numpy(), x, rtol=1e-5)


def run_split(make: Callable[[list[Tensor]], Any], steps: int, devices: tuple[str, str, str]) -> list[list[np.ndarray]]:
    """run_speck's loss with each parameter on its own device (a model split across devices, one optimizer)."""
    ps = [Tensor(x.copy(), device=d) for x, d in zip((A0, B0, C0), devices)]
    opt = make(ps)
    hist = []
    with Tensor.train():
        for _ in range(steps):
            opt.zero_grad()
            a, b, c = (p.to(devices[0]) for p in ps)
            loss = ((a @ b + c - Tensor(T, device=devices[0])) ** 2).sum() + (c * c * 0.5).sum()
            loss.backward()
            opt.step()
            hist.append([p.numpy() for p in ps])
    assert [p.device for p in ps] == list(devices)
    return hist


@pytest.mark.parametrize("make", [
    lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01),
    lambda ps: optim.Adam(ps, lr=0.05),
    lambda ps: optim.AdamW(ps, lr=0.05, weight_decay=0.1),
    lambda ps: optim.LAMB(ps, lr=0.05),
], ids=["sgd", "adam", "adamw", "lamb"])  # fmt: skip
def test_one_optimizer_over_parameters_on_several_devices(make: Callable[[list[Tensor]], Any]) -> None:
    # the learning rate and Adam's bias corrections live on the first parameter's device: the others' updates get
    # them copied (they failed at realize with "buffer ... lives on CPU"), and match the one-device run
    one = run_speck(make, 3)
    split = run_split(make, 3, ("CPU", "CPU:1", "CPU:2"))
    for got, want in zip(split, one):
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_fused_optimizer_over_several_devices_is_refused() -> None:
    ps = [Tensor(A0.copy()), Tensor(C0.copy(), device="CPU:1")]
    with pytest.raises(optim.OptimizerError, match="2 devices"):
        optim.Adam(ps, fused=True)
