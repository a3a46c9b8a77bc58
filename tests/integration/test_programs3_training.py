"""Training-loop programs (third set, with test_programs3.py), written the way tinygrad users write them: gradient
accumulation over micro-batches with a warmup + cosine learning rate and an EMA of the weights; a tensor-parallel MLP
sharded over two CPU devices; dynamic loss scaling (float16 forward, float32 master weights, overflowing steps
skipped). Each is checked against a numpy float64 re-implementation (analytic MLP gradients, the optimizer's
update rule) step by step."""

from __future__ import annotations

import math

import numpy as np

from speck.tensor import Device, Tensor, dtypes, nn
from speck.tensor.nn.optim import SGD
from speck.tensor.nn.state import get_parameters

F64 = np.float64


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def f32(*xs: np.ndarray) -> list[np.ndarray]:
    """Rounded to float32 and back, so the float64 reference starts from the exact values speck holds."""
    return [np.asarray(x, np.float32).astype(F64) for x in xs]


def load(t: Tensor, x: np.ndarray) -> Tensor:
    """Replace a layer's parameter with the given values (float32), the way a checkpoint loader would."""
    t.replace(Tensor(np.asarray(x, np.float32)).realize())
    return t


def np_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


# ---------------- training loop utilities: gradient accumulation, warmup + cosine lr, EMA of the weights ----------
def np_mlp_grads(p: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> tuple[float, list[np.ndarray]]:
    w1, b1, w2, b2 = p
    h = x @ w1.T + b1
    a = np.maximum(h, 0)
    z = a @ w2.T + b2
    prob = np_softmax(z)
    n = len(y)
    loss = -np.log(prob[np.arange(n), y]).mean()
    dz = prob.copy()
    dz[np.arange(n), y] -= 1
    dz /= n
    dh = (dz @ w2) * (h > 0)
    return float(loss), [dh.T @ x, dh.sum(0), dz.T @ a, dz.sum(0)]


def warmup_cosine(step: int, base_lr: float, warmup: int, total: int) -> float:
    if step < warmup:
        return base_lr * (step + 1) / warmup
    return 0.5 * base_lr * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))


def test_gradient_accumulation_warmup_cosine_and_ema_match_numpy() -> None:
    r = rng(71)
    X, Y = f32(r.standard_normal((16, 6)))[0], r.integers(0, 3, 16)
    init = f32(r.standard_normal((16, 6)) * 0.5, np.zeros(16) + 0.1, r.standard_normal((3, 16)) * 0.5, np.zeros(3))
    l1, l2 = nn.Linear(6, 16), nn.Linear(16, 3)
    params = [l1.weight, l1.bias, l2.weight, l2.bias]
    for t, v in zip(params, init):
        load(t, v)
    model = lambda x: l2(l1(x).relu())
    ema = [t.detach().clone().realize() for t in params]
    opt = SGD(params, lr=0.0, momentum=0.9)
    xt, yt = Tensor(X.astype(np.float32)), Tensor(Y.astype(np.int32))
    n_micro, total, warmup, base_lr, decay = 4, 8, 3, 0.2, 0.8
    w = [v.copy() for v in init]
    buf = [np.zeros_like(v) for v in init]
    ema_np = [v.copy() for v in init]
    for step in range(total):
        lr = warmup_cosine(step, base_lr, warmup, total)
        opt.lr.assign(Tensor([lr], dtype=opt.lr.dtype)).realize()
        with Tensor.train():
            opt.zero_grad()
            for mb in range(n_micro):  # micro-batches of 4: each backward adds into .grad
                xb, yb = xt[mb * 4 : (mb + 1) * 4], yt[mb * 4 : (mb + 1) * 4]
                (model(xb).sparse_categorical_crossentropy(yb) / n_micro).backward()
            loss_np, grads = np_mlp_grads(w, X, Y)
            for t, g in zip(params, grads):  # the accumulated gradient is the big batch's
                np.testing.assert_allclose(t.grad.numpy(), g, rtol=1e-4, atol=1e-6, err_msg=f"step {step}")  # type: ignore[union-attr]
            opt.step()
        for e, t in zip(ema, params):
            e.assign(decay * e + (1 - decay) * t.detach()).realize()
        for i, g in enumerate(grads):
            buf[i] = 0.9 * buf[i] + g
            w[i] = w[i] - lr * buf[i]
            ema_np[i] = decay * ema_np[i] + (1 - decay) * w[i]
        np.testing.assert_allclose(opt.lr.item(), lr, rtol=1e-6)
        for t, v, e, ev in zip(params, w, ema, ema_np):
            np.testing.assert_allclose(t.numpy(), v, rtol=1e-4, atol=1e-5, err_msg=f"step {step}")
            np.testing.assert_allclose(e.numpy(), ev, rtol=1e-4, atol=1e-5, err_msg=f"ema, step {step}")
    assert np_mlp_grads(w, X, Y)[0] < np_mlp_grads(init, X, Y)[0]
    assert not np.allclose(ema_np[0], w[0], atol=1e-3)  # the average lags the weights


# ---------------- a tensor-parallel MLP sharded over two devices ----------------
DEVS = (f"{Device.DEFAULT}:0", f"{Device.DEFAULT}:1")


def test_tensor_parallel_mlp_over_two_devices_matches_one_device_and_numpy() -> None:
    r = rng(81)
    init = f32(r.standard_normal((8, 6)) * 0.5, r.standard_normal(8) * 0.1, r.standard_normal((3, 8)) * 0.5,
               r.standard_normal(3) * 0.1)  # fmt: skip
    X, Y = f32(r.standard_normal((10, 6)))[0], r.integers(0, 3, 10)

    def build(sharded: bool) -> tuple[list[nn.Linear], SGD]:
        ls = [nn.Linear(6, 8), nn.Linear(8, 3)]
        ps = [ls[0].weight, ls[0].bias, ls[1].weight, ls[1].bias]
        for t, v in zip(ps, init):
            load(t, v)
        if sharded:  # column-parallel first layer (its outputs split), row-parallel second (its inputs split)
            ls[0].weight.shard_(DEVS, axis=0)
            ls[0].bias.shard_(DEVS, axis=0)
            ls[1].weight.shard_(DEVS, axis=1)
            ls[1].bias.shard_(DEVS)
        return ls, SGD(ps, lr=0.3, momentum=0.5)

    (sm, sopt), (um, uopt) = build(True), build(False)
    two = tuple(Device.canonicalize(d) for d in DEVS)
    assert sm[0].weight.device == two and sm[0].weight.uop.axis == 0 and sm[1].weight.uop.axis == 1
    xs, ys = Tensor(X.astype(np.float32)).shard(DEVS), Tensor(Y.astype(np.int32)).shard(DEVS)
    xu, yu = Tensor(X.astype(np.float32)), Tensor(Y.astype(np.int32))
    w, buf = [v.copy() for v in init], [np.zeros_like(v) for v in init]
    for step in range(4):
        with Tensor.train():
            sopt.zero_grad()
            ls_ = sm[1](sm[0](xs).relu()).sparse_categorical_crossentropy(ys).backward()
            ls_.realize(*sopt.schedule_step())
            uopt.zero_grad()
            lu = um[1](um[0](xu).relu()).sparse_categorical_crossentropy(yu).backward()
            lu.realize(*uopt.schedule_step())
        loss_np, grads = np_mlp_grads(w, X, Y)
        np.testing.assert_allclose(ls_.item(), loss_np, rtol=1e-5)
        np.testing.assert_allclose(lu.item(), loss_np, rtol=1e-5)
        for i, g in enumerate(grads):
            buf[i] = 0.5 * buf[i] + g
            w[i] = w[i] - 0.3 * buf[i]
        for a, b, v in zip(get_parameters(sm), get_parameters(um), w):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6, err_msg=f"step {step}")
            np.testing.assert_allclose(a.numpy(), v, rtol=1e-4, atol=1e-5, err_msg=f"step {step}")
    assert sm[0].weight.device == two and sm[0].weight.uop.axis == 0  # the optimizer kept the layout


# ---------------- dynamic loss scaling: half forward, float32 master weights, overflow skips the step ----------------
def test_dynamic_loss_scaling_skips_overflowing_steps_and_matches_float32_training() -> None:
    r = rng(91)
    init = f32(r.standard_normal((16, 6)) * 0.5, np.zeros(16), r.standard_normal((3, 16)) * 0.5, np.zeros(3))
    X, Y = f32(r.standard_normal((16, 6)))[0], r.integers(0, 3, 16)
    master = [Tensor(v.astype(np.float32)).contiguous().realize() for v in init]  # float32 master weights
    opt = SGD(master, lr=0.2)
    xh, yt = Tensor(X.astype(np.float16)), Tensor(Y.astype(np.int32))
    scale, good_steps, growth_interval = 2.0**20, 0, 2  # starts far too big: float16 gradients overflow
    w = [v.copy() for v in init]
    skipped, applied = 0, 0
    for _ in range(10):
        half = [m.cast(dtypes.float16).detach().requires_grad_() for m in master]
        with Tensor.train():
            h = (xh @ half[0].T + half[1]).relu()
            loss = (h @ half[2].T + half[3]).float().sparse_categorical_crossentropy(yt)
            (loss * scale).backward()
        grads = [hp.grad.float() / scale for hp in half]  # type: ignore[union-attr]
        finite = Tensor.stack(*[g.isinf().logical_or(g.isnan()).any() for g in grads]).any().logical_not().item()
        loss_np, g_np = np_mlp_grads(w, X.astype(np.float16).astype(F64), Y)
        if not finite:  # skip the step, halve the scale
            skipped += 1
            scale /= 2
            good_steps = 0
            before = [m.numpy() for m in master]
        else:
            for m, g in zip(master, grads):
                m.grad = g
            with Tensor.train():
                opt.step()
            applied += 1
            w = [a - 0.2 * g for a, g in zip(w, g_np)]
            good_steps += 1
            if good_steps == growth_interval:
                scale, good_steps = scale * 2, 0
            np.testing.assert_allclose(loss.item(), loss_np, rtol=2e-2, atol=2e-3)
        for m, v in zip(master, w):  # float16 forward and backward: within half precision of float64 training
            np.testing.assert_allclose(m.numpy(), v, rtol=2e-2, atol=3e-3)
        if not finite:
            assert all(np.array_equal(m.numpy(), b) for m, b in zip(master, before))
    assert skipped >= 2 and applied >= 4
    assert np_mlp_grads(w, X, Y)[0] < np_mlp_grads(init, X, Y)[0]
