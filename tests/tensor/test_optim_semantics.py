"""Optimizer contract: schedule_step() returns the tensors to realize and step() realizes them; params and buffers
split by is_param; the learning rate is a tensor; TRAINING is required; argument errors; SGD/Muon are LARS and
Adam/AdamW are LAMB with the documented defaults; LARS options, Muon and fused= against numpy references."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import Context, Tensor, dtypes, nn
from speck.tensor.nn import optim
from speck.tensor.nn.state import get_parameters

P0 = [np.array([[0.5, -1.2, 0.3], [0.8, 0.1, -0.7]], dtype=np.float32), np.array([0.3, -0.2, 0.9], dtype=np.float32)]
T = np.array([[1.0, -1.0, 0.5], [0.5, 2.0, -0.3]], dtype=np.float32)


def loss_of(a: Tensor, c: Tensor) -> Tensor:
    return ((a * c - Tensor(T)) ** 2).sum() + (c * c).sum() * 0.5


def np_grads(a: np.ndarray, c: np.ndarray) -> list[np.ndarray]:
    r = a * c - T
    return [2 * r * c, (2 * r * a).sum(0) + c]


def run(make: Callable[[list[Tensor]], Any], steps: int = 3) -> list[np.ndarray]:
    ps = [Tensor(p.copy()) for p in P0]
    opt = make(ps)
    with Tensor.train():
        for _ in range(steps):
            opt.zero_grad()
            loss_of(*ps).backward()
            opt.step()
    return [p.numpy() for p in ps]


def run_np(
    update: Callable[[int, list[np.ndarray], list[np.ndarray], dict[str, Any]], list[np.ndarray]], steps: int = 3
) -> list[np.ndarray]:
    ps = [p.astype(np.float64) for p in P0]
    st_: dict[str, Any] = {}
    for t in range(1, steps + 1):
        ps = update(t, ps, np_grads(*ps), st_)
    return ps


def check(got: list[np.ndarray], ref: list[np.ndarray], rtol: float = 1e-4, atol: float = 1e-5) -> None:
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol)


# ---------------- step protocol ----------------
def test_schedule_step_returns_what_to_realize_and_step_realizes_it() -> None:
    a, c = Tensor(P0[0].copy()), Tensor(P0[1].copy())
    stats = Tensor(np.zeros(3, np.float32)).is_param_(False)
    opt = optim.Adam([a, c, stats], lr=0.1)
    assert opt.params == [a, c] and opt.buffers == [stats]
    with Tensor.train():
        loss_of(a, c).backward()
        out = opt.schedule_step()
    assert isinstance(out, list) and all(isinstance(t, Tensor) for t in out)
    ids = {id(t) for t in out}
    assert {id(a), id(c), id(stats), id(opt.b1_t), id(opt.b2_t)} <= ids and {id(m) for m in opt.m} <= ids
    Tensor.realize(*out)
    np.testing.assert_allclose(opt.b1_t.numpy(), [0.9], rtol=1e-6)
    # Adam's first step moves every element by lr (up to eps) against its gradient's sign
    g = np_grads(*P0)
    np.testing.assert_allclose(a.numpy(), P0[0] - 0.1 * np.sign(g[0]), rtol=1e-4, atol=1e-5)
    with Tensor.train():
        loss_of(a, c).backward()
        assert opt.step() is None


def test_training_mode_and_gradients_are_required() -> None:
    p = Tensor(np.ones(3, np.float32))
    opt = optim.SGD([p], lr=0.1)
    with pytest.raises(AssertionError, match="no gradient"), Tensor.train():
        opt.step()
    (p * p).sum().backward()
    with pytest.raises(RuntimeError, match="TRAINING|training mode"):
        opt.schedule_step()
    with Context(TRAINING=1):
        opt.step()
    np.testing.assert_allclose(p.numpy(), np.full(3, 0.8), rtol=1e-6)


def test_argument_errors() -> None:
    p = Tensor(np.ones(2, np.float32))
    with pytest.raises(ValueError, match="learning rate"):
        optim.SGD([p], lr=-0.1)
    with pytest.raises(ValueError, match="momentum"):
        optim.SGD([p], momentum=-0.5)
    with pytest.raises(ValueError, match="weight_decay"):
        optim.LAMB([p], weight_decay=-1.0)
    with pytest.raises(AssertionError, match="no parameters"):
        optim.Adam([Tensor(np.ones(2, np.float32)).is_param_(False)])
    with pytest.raises(AssertionError, match="fused"):
        optim.Muon([p], fused=True)


def test_factories_and_defaults() -> None:
    p = Tensor(np.ones(2, np.float32))
    sgd, muon, adam, adamw = optim.SGD([p]), optim.Muon([p]), optim.Adam([p]), optim.AdamW([p])
    assert isinstance(sgd, optim.LARS) and isinstance(muon, optim.LARS)
    assert isinstance(adam, optim.LAMB) and isinstance(adamw, optim.LAMB)
    assert (sgd.momentum, sgd.wd, sgd.nesterov, sgd.classic, sgd.tcoef, sgd.pre_wd) == (0, 0, False, False, 0, True)
    assert (muon.momentum, muon.wd, muon.ns_steps, muon.nesterov) == (0.95, 0.1, 5, True)
    assert (muon.classic, muon.pre_wd, muon.tcoef) == (False, False, 0)
    assert muon.ns_coefficients == (3.4445, -4.775, 2.0315)
    assert (adam.b1, adam.b2, adam.eps, adam.wd, adam.adam) == (0.9, 0.999, 1e-8, 0.0, True)
    assert (adamw.wd, adamw.adam) == (0.01, True)
    lars, lamb = optim.LARS([p]), optim.LAMB([p])
    assert (lars.momentum, lars.wd, lars.tcoef, lars.classic, lars.pre_wd) == (0.9, 1e-4, 0.001, True, True)
    assert (lamb.eps, lamb.wd, lamb.adam) == (1e-6, 0.0, False)
    for o in (sgd, adam):
        assert o.lr.shape == (1,) and o.lr.dtype == dtypes.float32 and o.lr.device == p.device
        assert o.device == p.device and not o.lr.is_param
    assert not adam.b1_t.is_param and adam.b1_t.shape == (1,)


def test_params_are_deduplicated() -> None:
    p = Tensor(np.ones(2, np.float32))
    assert optim.SGD([p, p, p]).params == [p]


def test_learning_rate_tensor_drives_the_step() -> None:
    p = Tensor(np.ones(2, np.float32))
    opt = optim.SGD([p], lr=0.1)
    with Tensor.train():
        for lr in (0.1, 0.5, 0.0):
            opt.lr.assign(Tensor([lr], dtype=dtypes.float32))
            before = p.numpy()
            opt.zero_grad()
            (p * p).sum().backward()
            opt.step()
            np.testing.assert_allclose(p.numpy(), before - lr * 2 * before, rtol=1e-6)


def test_batchnorm_statistics_are_buffers_realized_each_step() -> None:
    bn = nn.BatchNorm(3)
    opt = optim.SGD(get_parameters(bn), lr=0.1)
    assert {id(bn.running_mean), id(bn.running_var)} <= {id(t) for t in opt.buffers}
    assert id(bn.weight) in {id(t) for t in opt.params}
    x = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)
    with Tensor.train():
        opt.zero_grad()
        bn(Tensor(x)).sum().backward()
        opt.step()
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.1 * x.mean(0), rtol=1e-5, atol=1e-6)


def test_optimizer_group() -> None:
    a, c = (Tensor(p.copy()) for p in P0)
    s = Tensor(np.zeros(2, np.float32)).is_param_(False)
    g = optim.OptimizerGroup(optim.SGD([a], lr=0.1), optim.Adam([c, s], lr=0.1))
    assert isinstance(g[0], optim.LARS) and isinstance(g[1], optim.LAMB)
    assert g.params == [a, c] and g.buffers == [s]
    with Tensor.train():
        loss_of(a, c).backward()
        out = g.schedule_step()
        assert {id(a), id(c), id(s)} <= {id(t) for t in out}
        assert g.step() is None  # (a second step on the same gradients is allowed)
    g.zero_grad()
    assert a.grad is None and c.grad is None


# ---------------- update rules against numpy ----------------
def lars_ref(
    lr: float,
    momentum: float,
    wd: float,
    nesterov: bool,
    classic: bool,
    pre_wd: bool,
    tcoef: float,
    ns: tuple[int, tuple[float, ...]] | None = None,
    fused: bool = False,
) -> Any:
    def up(t: int, ps: list[np.ndarray], gs: list[np.ndarray], st_: dict[str, Any]) -> list[np.ndarray]:
        shapes = [p.shape for p in ps]
        if fused:
            ps, gs = [np.concatenate([p.ravel() for p in ps])], [np.concatenate([g.ravel() for g in gs])]
        out = []
        for i, (w, g) in enumerate(zip(ps, gs)):
            wn, gn = np.linalg.norm(w), np.linalg.norm(g)
            r = tcoef * wn / (gn + wd * wn) if tcoef and wn > 0 and gn > 0 else 1.0
            if pre_wd and wd > 0:
                g = g + wd * w
            if classic:
                g = g * r * lr
            if momentum:
                b = st_[i] = st_.get(i, np.zeros_like(w)) * momentum + g
                g = g + momentum * b if nesterov else b
            if ns:
                g = np_newton_schulz(g.reshape(g.shape[0], -1), *ns).reshape(g.shape)
            if not pre_wd and wd > 0:
                w = w * (1 - wd * lr)
            if not classic:
                g = g * r * lr
            out.append(w - g)
        if fused:
            flat, out, off = out[0], [], 0
            for s in shapes:
                n = int(np.prod(s))
                out.append(flat[off : off + n].reshape(s))
                off += n
        return out

    return up


def np_newton_schulz(g: np.ndarray, steps: int, coeffs: tuple[float, ...], eps: float = 1e-7) -> np.ndarray:
    a, b, c = coeffs
    tr = g.shape[0] > g.shape[1]
    x = g.T if tr else g
    x = x / (np.linalg.norm(x) + eps)
    for _ in range(steps):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if tr else x


@pytest.mark.parametrize(
    "classic,pre_wd,nesterov", [(True, True, False), (False, True, True), (True, False, False), (False, False, True)]
)
@pytest.mark.parametrize("fused", [False, True])
def test_lars_options(classic: bool, pre_wd: bool, nesterov: bool, fused: bool) -> None:
    kw = dict(lr=0.2, momentum=0.8, weight_decay=0.05, nesterov=nesterov, classic=classic, pre_wd=pre_wd, tcoef=0.01)
    got = run(lambda ps: optim.LARS(ps, fused=fused, **kw))  # type: ignore[arg-type]
    check(got, run_np(lars_ref(0.2, 0.8, 0.05, nesterov, classic, pre_wd, 0.01, fused=fused)))


def test_sgd_classic_equals_default_without_trust_ratio() -> None:
    ref = run_np(lars_ref(0.05, 0.9, 0.01, False, True, True, 0.0))
    check(run(lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01, classic=True)), ref)
    check(run(lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01)), ref)  # constant lr: the same


def test_muon_defaults() -> None:
    got = run(lambda ps: optim.Muon(ps, lr=0.05))
    ref = run_np(lars_ref(0.05, 0.95, 0.1, True, False, False, 0.0, ns=(5, (3.4445, -4.775, 2.0315))))
    check(got, ref, rtol=1e-3, atol=1e-4)


def lamb_ref(lr: float, b1: float, b2: float, eps: float, wd: float, adam: bool, fused: bool) -> Any:
    def up(t: int, ps: list[np.ndarray], gs: list[np.ndarray], st_: dict[str, Any]) -> list[np.ndarray]:
        shapes = [p.shape for p in ps]
        if fused:
            ps, gs = [np.concatenate([p.ravel() for p in ps])], [np.concatenate([g.ravel() for g in gs])]
        out = []
        for i, (w, g) in enumerate(zip(ps, gs)):
            m = st_[("m", i)] = st_.get(("m", i), 0.0) * b1 + (1 - b1) * g
            v = st_[("v", i)] = st_.get(("v", i), 0.0) * b2 + (1 - b2) * g * g
            u = (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps) + wd * w
            wn, un = np.linalg.norm(w), np.linalg.norm(u)
            r = 1.0 if adam or not (wn > 0 and un > 0) else wn / un
            out.append(w - lr * r * u)
        if fused:
            flat, out, off = out[0], [], 0
            for s in shapes:
                n = int(np.prod(s))
                out.append(flat[off : off + n].reshape(s))
                off += n
        return out

    return up


@pytest.mark.parametrize("adam", [False, True])
@pytest.mark.parametrize("fused", [False, True])
def test_lamb_fused_and_unfused(adam: bool, fused: bool) -> None:
    got = run(lambda ps: optim.LAMB(ps, lr=0.05, weight_decay=0.02, adam=adam, fused=fused))
    check(got, run_np(lamb_ref(0.05, 0.9, 0.999, 1e-6, 0.02, adam, fused)))


def test_fuse_optim_setting_is_the_default() -> None:
    p = Tensor(np.ones(2, np.float32))
    assert optim.Adam([p]).fused is False
    with Context(FUSE_OPTIM=1):
        assert optim.Adam([p]).fused is True


@settings(max_examples=12)
@given(lr=st.floats(0.0, 0.5), momentum=st.floats(0.0, 0.99), wd=st.floats(0.0, 0.2), nesterov=st.booleans())
def test_sgd_matches_numpy(lr: float, momentum: float, wd: float, nesterov: bool) -> None:
    got = run(lambda ps: optim.SGD(ps, lr=lr, momentum=momentum, weight_decay=wd, nesterov=nesterov), steps=2)
    check(got, run_np(lars_ref(lr, momentum, wd, nesterov, False, True, 0.0), steps=2), rtol=2e-4, atol=2e-5)
