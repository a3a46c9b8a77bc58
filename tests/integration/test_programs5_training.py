"""Training programs (fifth set, with test_programs5.py), written the way tinygrad users write them: int8 weight
quantisation (per-channel absmax scales, int8 tensors through safe_save/safe_load, an int32-accumulated integer
matmul, quantisation-aware training with a straight-through estimator); a WGAN-GP critic step whose gradient
penalty differentiates through an input gradient (double backward) under TinyJit; double DQN with a target network
synced by Tensor.assign between jitted steps and a Huber loss on gathered action values; a one-cycle learning-rate
schedule held in Tensors and stepped inside the jitted train step, with global-norm clipping, and a checkpoint taken
mid-schedule that resumes bit for bit. Each is checked against a numpy float64 re-implementation."""

from __future__ import annotations

import math
import pathlib

import numpy as np
from gradcheck import F64, P, init, np_adam, num_grad, rng

from speck.tensor import Device, Tensor, TinyJit, dtypes, nn
from speck.tensor.nn.optim import SGD, Adam
from speck.tensor.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save


def np_log_softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


class MLP:
    def __init__(self, n_in: int, n_hid: int, n_out: int) -> None:
        self.l1, self.l2 = nn.Linear(n_in, n_hid), nn.Linear(n_hid, n_out)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x).tanh())


def np_mlp(p: P, x: np.ndarray) -> np.ndarray:
    return np.tanh(x @ p["l1.weight"].T + p["l1.bias"]) @ p["l2.weight"].T + p["l2.bias"]


# ---------------- int8 weights: quantise, save, load, dequantised and integer matmuls, QAT with an STE ----------
def quantize(w: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric per-output-channel int8: q = round(w / s), s = max|w| / 127 over the row."""
    scale = w.abs().max(axis=1, keepdim=True) / 127
    return (w / scale).round().clip(-127, 127).cast(dtypes.int8), scale


def np_quantize(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = np.abs(w).max(1, keepdims=True) / 127
    return np.clip(np.round(w / s), -127, 127).astype(np.int8), s


def test_int8_weight_quantisation_safetensors_integer_matmul_and_qat(tmp_path: pathlib.Path) -> None:
    model = MLP(8, 16, 4)
    p = init(model, seed=1, scale=0.6)
    sd = {}
    for name in ("l1", "l2"):
        q, s = quantize(getattr(model, name).weight)
        sd[f"{name}.weight_q"], sd[f"{name}.scale"], sd[f"{name}.bias"] = q, s, getattr(model, name).bias
    safe_save(sd, str(tmp_path / "q.safetensors"))
    back = {k: v.to(Device.DEFAULT).realize() for k, v in safe_load(str(tmp_path / "q.safetensors")).items()}
    want_q = {n: np_quantize(p[f"{n}.weight"].astype(np.float32).astype(F64)) for n in ("l1", "l2")}
    for name in ("l1", "l2"):
        assert back[f"{name}.weight_q"].dtype == dtypes.int8
        np.testing.assert_array_equal(back[f"{name}.weight_q"].numpy(), want_q[name][0])
        np.testing.assert_allclose(back[f"{name}.scale"].numpy(), want_q[name][1], rtol=1e-6)

    @TinyJit
    def qforward(x: Tensor) -> Tensor:  # dequantise on the fly: int8 weights times their float scales
        h = x.linear((back["l1.weight_q"].cast(dtypes.float) * back["l1.scale"]).T, back["l1.bias"]).tanh()
        return h.linear((back["l2.weight_q"].cast(dtypes.float) * back["l2.scale"]).T, back["l2.bias"]).realize()

    r = rng(2)
    deq = {f"{n}.weight": want_q[n][0].astype(F64) * want_q[n][1] for n in ("l1", "l2")}
    deq.update({k: p[k] for k in ("l1.bias", "l2.bias")})
    for i in range(3):
        x = r.standard_normal((5, 8))
        got = qforward(Tensor(x.astype(np.float32))).numpy()
        np.testing.assert_allclose(got, np_mlp(deq, x), rtol=1e-4, atol=1e-5, err_msg=f"batch {i}")
        # the quantisation error is bounded by half a step per weight
        assert np.abs(got - np_mlp(p, x)).max() < 0.1
    assert qforward.cnt == 3

    # activations quantised per tensor, an int8 x int8 matmul accumulated in int32 (exact), rescaled to float
    x = r.standard_normal((6, 8))
    xs = np.abs(x).max() / 127
    xq = np.clip(np.round(x.astype(np.float32) / np.float32(xs)), -127, 127).astype(np.int8)
    acc = Tensor(xq).matmul(back["l1.weight_q"].T, dtype=dtypes.int32)
    assert acc.dtype == dtypes.int32
    want_acc = xq.astype(np.int64) @ want_q["l1"][0].astype(np.int64).T
    np.testing.assert_array_equal(acc.numpy(), want_acc)
    y = (acc.cast(dtypes.float) * xs * back["l1.scale"].T + back["l1.bias"]).numpy()
    np.testing.assert_allclose(y, want_acc * xs * want_q["l1"][1].T + p["l1.bias"], rtol=1e-5, atol=1e-5)

    # quantisation-aware training: the forward uses fake-quantised weights, the gradient passes straight through
    def fake_quant(w: Tensor) -> Tensor:
        q, s = quantize(w)
        return w + (q.cast(dtypes.float) * s - w).detach()

    xb, yb = r.standard_normal((8, 8)), r.integers(0, 4, 8)
    xt, yt = Tensor(xb.astype(np.float32)), Tensor(yb.astype(np.int32))
    opt = SGD(get_parameters(model), lr=0.1)

    @TinyJit
    def qat_step() -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            h = xt.linear(fake_quant(model.l1.weight).T, model.l1.bias).tanh()
            loss = h.linear(fake_quant(model.l2.weight).T, model.l2.bias).sparse_categorical_crossentropy(yt)
            loss.backward()
            opt.step()
        return loss.realize()

    for step in range(4):
        fq = {k: p[k] for k in ("l1.bias", "l2.bias")}
        for n in ("l1", "l2"):
            q, s = np_quantize(p[f"{n}.weight"].astype(np.float32).astype(F64))
            fq[f"{n}.weight"] = q * s

        def np_loss(fq: P = fq) -> float:
            return float(-np_log_softmax(np_mlp(fq, xb))[np.arange(8), yb].mean())

        want = np_loss()
        g = {k: num_grad(np_loss, fq[k]) for k in fq}  # the STE: d loss / d w = d loss / d fake_quant(w)
        np.testing.assert_allclose(qat_step().item(), want, rtol=1e-4, err_msg=f"step {step}")
        for k in p:
            p[k] = p[k] - 0.1 * g[k]
        for k, t in get_state_dict(model).items():
            np.testing.assert_allclose(t.numpy(), p[k], rtol=1e-4, atol=1e-5, err_msg=f"{k} step {step}")


# ---------------- WGAN-GP: a gradient penalty on the critic's input gradient, double backward under TinyJit -------
def np_critic_and_input_grad(p: P, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h = np.tanh(x @ p["l1.weight"].T + p["l1.bias"])
    d = h @ p["l2.weight"].T + p["l2.bias"]
    return d[:, 0], ((1 - h * h) * p["l2.weight"][0]) @ p["l1.weight"]  # dD/dx per row


def test_wgan_gp_critic_step_with_double_backward_matches_numpy() -> None:
    critic = MLP(2, 8, 1)
    p = init(critic, seed=11, scale=0.7)
    r = rng(12)
    real = r.standard_normal((6, 2)) + np.array([2.0, -1.0])
    fake = r.standard_normal((6, 2)) * 0.5
    eps = r.uniform(size=(6, 1))
    rt, ft, et = (Tensor(a.astype(np.float32)) for a in (real, fake, eps))
    opt = Adam(get_parameters(critic), lr=0.01, b1=0.0, b2=0.9)
    lam = 10.0

    def critic_loss() -> Tensor:
        xhat = et * rt + (1 - et) * ft
        (gx,) = critic(xhat).sum().gradient(xhat)  # the input gradient, itself differentiable
        gp = ((gx.square().sum(1) + 1e-12).sqrt() - 1).square().mean()
        return critic(ft).mean() - critic(rt).mean() + lam * gp

    def np_loss() -> float:
        xhat = eps * real + (1 - eps) * fake
        gx = np_critic_and_input_grad(p, xhat)[1]
        gp = ((np.sqrt((gx * gx).sum(1) + 1e-12) - 1) ** 2).mean()
        return float(
            np_critic_and_input_grad(p, fake)[0].mean() - np_critic_and_input_grad(p, real)[0].mean() + lam * gp
        )

    @TinyJit
    def step() -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = critic_loss().backward()
            opt.step()
        return loss.realize()

    params = get_state_dict(critic)
    with Tensor.train():
        loss = critic_loss().backward()
    g1 = {k: num_grad(np_loss, p[k]) for k in p}
    np.testing.assert_allclose(loss.item(), np_loss(), rtol=1e-5)
    for k, t in params.items():
        assert t.grad is not None, k
        np.testing.assert_allclose(t.grad.numpy(), g1[k], rtol=2e-3, atol=2e-5, err_msg=k)
    ad: dict = {}
    losses = []
    for i in range(1, 6):
        g = g1 if i == 1 else {k: num_grad(np_loss, p[k]) for k in p}
        want = np_loss()
        losses.append(step().item())
        np.testing.assert_allclose(losses[-1], want, rtol=1e-4, atol=1e-5, err_msg=f"step {i}")
        np_adam(p, g, ad, i, lr=0.01, b1=0.0, b2=0.9)
    for k, t in params.items():  # the output bias cancels in the loss: Adam (b1 = 0) on its ~0 gradient is noise
        if k != "l2.bias":
            np.testing.assert_allclose(t.numpy(), p[k], rtol=1e-4, atol=1e-5, err_msg=k)
    assert losses[-1] < losses[0]


# ---------------- double DQN: target network synced in place between jitted steps, Huber loss ----------
def sync(target: MLP, online: MLP) -> None:
    """Copy the online weights into the target network's own buffers. Tensor.assign writes in place, so a jitted
    step that reads the target sees the new weights; load_state_dict would replace the target tensors (tinygrad's
    semantics), leaving the capture reading the old buffers, and handed the online tensors themselves it would alias
    the two networks."""
    for t, s in zip(get_parameters(target), get_parameters(online), strict=True):
        t.assign(s.detach())
    Tensor.realize(*get_parameters(target))


def test_double_dqn_with_target_network_sync_between_jitted_steps_matches_numpy() -> None:
    n_s, n_a, gamma = 4, 3, 0.9
    q_net, target = MLP(n_s, 12, n_a), MLP(n_s, 12, n_a)
    p = init(q_net, seed=21, scale=0.5)
    init(target, seed=0)  # realized weights of its own, overwritten by the first sync
    sync(target, q_net)
    pt = {k: v.copy() for k, v in p.items()}
    opt = Adam(get_parameters(q_net), lr=0.01)

    @TinyJit
    def train_step(s: Tensor, a: Tensor, rew: Tensor, s2: Tensor, done: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            best = q_net(s2).argmax(-1, keepdim=True)  # double DQN: the online net picks, the target net rates
            nxt = target(s2).gather(1, best).squeeze(1)
            y = (rew + gamma * (1 - done) * nxt).detach()
            qa = q_net(s).gather(1, a.unsqueeze(1)).squeeze(1)
            d = qa - y
            loss = (d.abs() < 1).where(0.5 * d * d, d.abs() - 0.5).mean().backward()
            opt.step()
        return loss.realize()

    r = rng(22)
    ad: dict = {}
    for step in range(1, 9):
        s, s2 = r.standard_normal((8, n_s)) * 2, r.standard_normal((8, n_s)) * 2
        a, rew, done = r.integers(0, n_a, 8), r.standard_normal(8) * 3, (r.uniform(size=8) < 0.25).astype(F64)
        best = np_mlp(p, s2).argmax(-1)
        y = rew + gamma * (1 - done) * np_mlp(pt, s2)[np.arange(8), best]

        def np_loss(s: np.ndarray = s, a: np.ndarray = a, y: np.ndarray = y) -> float:
            d = np_mlp(p, s)[np.arange(8), a] - y
            return float(np.where(np.abs(d) < 1, 0.5 * d * d, np.abs(d) - 0.5).mean())

        want = np_loss()
        g = {k: num_grad(np_loss, p[k]) for k in p}
        args = (s.astype(np.float32), a.astype(np.int32), rew.astype(np.float32), s2.astype(np.float32), done)
        got = train_step(*(Tensor(np.asarray(x, np.float32) if x.dtype == F64 else x) for x in args)).item()
        np.testing.assert_allclose(got, want, rtol=1e-4, err_msg=f"step {step}")
        np_adam(p, g, ad, step, lr=0.01)
        if step % 3 == 0:  # sync: the jitted step must read the target network's new weights from now on
            sync(target, q_net)
            pt = {k: v.copy() for k, v in p.items()}
    for k, t in get_state_dict(q_net).items():
        np.testing.assert_allclose(t.numpy(), p[k], rtol=1e-3, atol=1e-4, err_msg=k)
    for k, t in get_state_dict(target).items():
        np.testing.assert_allclose(t.numpy(), pt[k], rtol=1e-3, atol=1e-4, err_msg=k)


# ---------------- one-cycle LR schedule in Tensors, stepped inside the jitted step; clipping; resume bit for bit ---
class OneCycle:
    """Linear warm-up from lr/div to lr over `warm` steps, then cosine down to lr/final_div at `total`; the step
    counter and the rate are Tensors so the jitted step updates them (the way hlb-style trainers write it)."""

    def __init__(self, opt: SGD, lr: float, warm: int, total: int, div: float = 10.0, final_div: float = 100.0):
        self.opt, self.lr, self.warm, self.total, self.div, self.final_div = opt, lr, warm, total, div, final_div
        self.step_count = Tensor([0], dtype=dtypes.int32).contiguous().realize()
        opt.lr.assign(self.get_lr()).realize()

    def get_lr(self) -> Tensor:
        t = self.step_count.cast(dtypes.float)
        up = self.lr / self.div + (self.lr - self.lr / self.div) * t / self.warm
        frac = ((t - self.warm) / (self.total - self.warm)).clip(0, 1)
        down = self.lr / self.final_div + (self.lr - self.lr / self.final_div) * 0.5 * (1 + (frac * math.pi).cos())
        return (t < self.warm).where(up, down)

    def step(self) -> None:
        self.step_count.assign(self.step_count + 1)
        self.opt.lr.assign(self.get_lr())


def np_onecycle(t: int, lr: float, warm: int, total: int, div: float = 10.0, final_div: float = 100.0) -> float:
    if t < warm:
        return lr / div + (lr - lr / div) * t / warm
    frac = min(max((t - warm) / (total - warm), 0.0), 1.0)
    return lr / final_div + (lr - lr / final_div) * 0.5 * (1 + math.cos(frac * math.pi))


def make_trainer(seed: int) -> tuple[MLP, SGD, OneCycle, TinyJit]:
    model = MLP(6, 10, 3)
    init(model, seed=seed, scale=0.7)
    opt = SGD(get_parameters(model), lr=0.0, momentum=0.9, nesterov=True, weight_decay=1e-3)
    sched = OneCycle(opt, lr=0.2, warm=3, total=10)

    @TinyJit
    def step(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        with Tensor.train():
            opt.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(y).backward()
            grads = [t.grad for t in opt.params if t.grad is not None]
            norm = Tensor.stack(*[g.square().sum() for g in grads]).sum().sqrt()
            for g in grads:  # clip the global norm to 1
                g.assign(g * (1.0 / (norm + 1e-6)).minimum(1.0))
            lr = opt.lr.clone()
            opt.step()
            sched.step()
        return loss.realize(), lr.realize()

    return model, opt, sched, step


def test_one_cycle_schedule_in_jitted_step_with_clipping_and_bitwise_resume(tmp_path: pathlib.Path) -> None:
    model, opt, sched, step = make_trainer(31)
    p = {k: t.numpy().astype(F64) for k, t in get_state_dict(model).items()}
    r = rng(32)
    data = [(r.standard_normal((8, 6)), r.integers(0, 3, 8)) for _ in range(10)]
    tens = [(Tensor(x.astype(np.float32)), Tensor(y.astype(np.int32))) for x, y in data]
    mom = {k: np.zeros_like(v) for k, v in p.items()}
    losses, snap = [], {}
    for t, ((x, y), (xt, yt)) in enumerate(zip(data, tens, strict=True)):

        def np_loss(x: np.ndarray = x, y: np.ndarray = y) -> float:
            return float(-np_log_softmax(np_mlp(p, x))[np.arange(8), y].mean())

        want = np_loss()
        g = {k: num_grad(np_loss, p[k]) for k in p}
        norm = math.sqrt(sum(float((v * v).sum()) for v in g.values()))
        lr_want = np_onecycle(t, 0.2, 3, 10)
        loss, lr = step(xt, yt)
        losses.append(loss.item())
        np.testing.assert_allclose(losses[-1], want, rtol=1e-4, err_msg=f"step {t}")
        np.testing.assert_allclose(lr.item(), lr_want, rtol=1e-5, err_msg=f"lr at step {t}")
        for k in p:  # SGD with decoupled-from-nothing L2 (added to the clipped gradient), nesterov momentum
            gk = g[k] * min(1.0, 1.0 / (norm + 1e-6)) + 1e-3 * p[k]
            mom[k] = 0.9 * mom[k] + gk
            p[k] = p[k] - lr_want * (gk + 0.9 * mom[k])
        for k, tt in get_state_dict(model).items():
            np.testing.assert_allclose(tt.numpy(), p[k], rtol=1e-4, atol=1e-5, err_msg=f"{k} step {t}")
        if t == 4:  # checkpoint: the model, the optimizer's state and the schedule's counter
            ckpt = {f"model.{k}": v for k, v in get_state_dict(model).items()}
            ckpt |= {f"opt.{k}": v for k, v in get_state_dict(opt).items()}
            ckpt["sched.step"] = sched.step_count
            safe_save(ckpt, str(tmp_path / "ckpt.safetensors"))
        if t >= 5:
            snap[t] = {k: v.numpy().copy() for k, v in get_state_dict(model).items()}
    assert losses[-1] < losses[0]

    # resume from the step-4 checkpoint in a fresh model, optimizer, schedule and jit: the same steps bit for bit
    model2, opt2, sched2, step2 = make_trainer(99)  # different initial weights: all overwritten by the load
    ck = safe_load(str(tmp_path / "ckpt.safetensors"))
    load_state_dict(model2, {k[6:]: v for k, v in ck.items() if k.startswith("model.")}, verbose=False)
    load_state_dict(opt2, {k[4:]: v for k, v in ck.items() if k.startswith("opt.")}, verbose=False)
    sched2.step_count.assign(ck["sched.step"]).realize()
    opt2.lr.assign(sched2.get_lr()).realize()
    for t in range(5, 10):
        _, lr = step2(*tens[t])
        np.testing.assert_allclose(lr.item(), np_onecycle(t, 0.2, 3, 10), rtol=1e-5, err_msg=f"resumed lr {t}")
        for k, v in get_state_dict(model2).items():
            np.testing.assert_array_equal(v.numpy(), snap[t][k], err_msg=f"{k} resumed step {t}")


# ---------------- EMA weights swapped in for a jitted evaluation and swapped back, between jitted train steps -----
def test_ema_weights_swapped_in_for_jitted_eval_and_back_between_jitted_steps() -> None:
    """The EMA pattern of image-model trainers: the train step updates the weights and their moving average; for
    evaluation the live weights are saved, the averages assigned in, evaluated, and the saved weights assigned back.
    Every one of those assigns is a whole realized buffer into a buffer the jitted steps write."""
    model = MLP(5, 8, 3)
    p = init(model, seed=61, scale=0.6)
    params = get_parameters(model)
    ema = [t.detach().clone().realize() for t in params]
    ema_np = {k: v.copy() for k, v in p.items()}
    keys = list(get_state_dict(model))
    opt = SGD(params, lr=0.2, momentum=0.5)
    r = rng(62)
    x, y = r.standard_normal((10, 5)), r.integers(0, 3, 10)
    xv = r.standard_normal((4, 5))
    xt, yt, xvt = Tensor(x.astype(np.float32)), Tensor(y.astype(np.int32)), Tensor(xv.astype(np.float32))

    @TinyJit
    def train_step(xb: Tensor, yb: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = model(xb).sparse_categorical_crossentropy(yb).backward()
            opt.step()
        for e, t in zip(ema, params, strict=True):
            e.assign(e * 0.8 + t.detach() * 0.2)
        return loss.realize()

    @TinyJit
    def evaluate(xb: Tensor) -> Tensor:
        return model(xb).softmax(-1).realize()

    mom = {k: np.zeros_like(v) for k, v in p.items()}
    for i in range(9):

        def np_loss() -> float:
            return float(-np_log_softmax(np_mlp(p, x))[np.arange(10), y].mean())

        g = {k: num_grad(np_loss, p[k]) for k in p}
        np.testing.assert_allclose(train_step(xt, yt).item(), np_loss(), rtol=1e-4, err_msg=f"step {i}")
        for k in p:
            mom[k] = 0.5 * mom[k] + g[k]
            p[k] = p[k] - 0.2 * mom[k]
            ema_np[k] = 0.8 * ema_np[k] + 0.2 * p[k]
        if i % 3 == 2:
            saved = [t.detach().clone().realize() for t in params]
            for t, e in zip(params, ema, strict=True):
                t.assign(e).realize()
            got = evaluate(xvt).numpy()
            z = np_mlp(ema_np, xv)
            np.testing.assert_allclose(got, np.exp(np_log_softmax(z)), rtol=1e-4, atol=1e-6, err_msg=f"eval {i}")
            for t, sv in zip(params, saved, strict=True):
                t.assign(sv).realize()
    for k, t, e in zip(keys, params, ema, strict=True):
        np.testing.assert_allclose(t.numpy(), p[k], rtol=1e-4, atol=1e-5, err_msg=k)
        np.testing.assert_allclose(e.numpy(), ema_np[k], rtol=1e-4, atol=1e-5, err_msg=f"ema {k}")


# ---------------- half weights and activations, float32 accumulation (matmul dtype=), float master weights ------
def test_half_weights_with_float_accumulation_train_without_overflow() -> None:
    """Each layer multiplies half activations by half weights accumulating in float32 (`dtype=dtypes.float`), the way
    mixed-precision code asks for it; the products here exceed half's range (300 * 300), which a half multiply
    would turn into inf. The master weights stay float32 and the SGD update happens there."""
    r = rng(41)
    w1, w2 = r.uniform(-300, 300, (6, 5)), r.uniform(-1, 1, (3, 6))
    x, y = r.uniform(-300, 300, (8, 5)), r.integers(0, 3, 8)
    m1, m2 = Tensor(w1.astype(np.float32)).requires_grad_(), Tensor(w2.astype(np.float32)).requires_grad_()
    xt, yt = Tensor(x.astype(np.float16)), Tensor(y.astype(np.int32))
    opt = SGD([m1, m2], lr=1e-3)
    h16 = lambda a: a.astype(np.float16).astype(F64)

    def forward(xb: Tensor) -> Tensor:
        h = xb.matmul(m1.half().T, dtype=dtypes.float) * 1e-4  # up to ~3e5 before the scale: float32, not half
        return h.relu().half().matmul(m2.half().T, dtype=dtypes.float)

    def np_forward(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # a, b: the half-rounded weights
        return h16(np.maximum((h16(x) @ a.T) * 1e-4, 0)) @ b.T

    @TinyJit
    def step(xb: Tensor, yb: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = forward(xb).sparse_categorical_crossentropy(yb).backward()
            opt.step()
        return loss.realize()

    assert np.abs(h16(x)[:, :, None] * h16(w1).T[None]).max() > 65504  # single products beyond half's max
    logits = forward(xt)
    assert logits.dtype == dtypes.float
    np.testing.assert_allclose(logits.numpy(), np_forward(h16(w1), h16(w2)), rtol=2e-3, atol=1e-3)
    losses = []
    for i in range(4):
        a, b = h16(m1.numpy().astype(F64)), h16(m2.numpy().astype(F64))
        want = float(-np_log_softmax(np_forward(a, b))[np.arange(8), y].mean())
        losses.append(step(xt, yt).item())
        assert np.isfinite(losses[-1])
        np.testing.assert_allclose(losses[-1], want, rtol=2e-3, err_msg=f"step {i}")
    assert np.isfinite(m1.numpy()).all() and np.isfinite(m2.numpy()).all()
    assert losses[-1] < losses[0]


# ---------------- the failures these programs found, reduced ----------------
def test_a_wider_accumulation_dtype_makes_every_product_exact() -> None:
    """matmul/einsum/conv2d with dtype= wider than the operands multiply in it (int8 products wrapped in int8 before
    the int32 sum: 100 * 100 came out 16; half products overflowed to inf under a float32 sum)."""
    r = rng(51)
    a, b = r.integers(-127, 128, (5, 7)).astype(np.int8), r.integers(-127, 128, (7, 3)).astype(np.int8)
    want = a.astype(np.int64) @ b.astype(np.int64)
    assert np.abs(want).max() > 127 * 127  # sums far outside int16, products outside int8
    for got in (Tensor(a).matmul(Tensor(b), dtype=dtypes.int32), Tensor(a).dot(Tensor(b), dtype=dtypes.int32),
                Tensor.einsum("ij,jk->ik", Tensor(a), Tensor(b), dtype=dtypes.int32)):  # fmt: skip
        assert got.dtype == dtypes.int32
        np.testing.assert_array_equal(got.numpy(), want)
    # without dtype= the result stays in the operands' dtype and wraps like numpy's int8 matmul
    np.testing.assert_array_equal(Tensor(a).matmul(Tensor(b)).numpy(), (a @ b).astype(np.int8))
    x, w = r.integers(-127, 128, (2, 3, 5, 5)).astype(np.int8), r.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    got = Tensor(x).conv2d(Tensor(w), dtype=dtypes.int32, padding=1).numpy()
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros((2, 4, 5, 5), np.int64)
    for i in range(3):
        for j in range(3):
            ref += np.einsum("ncij,oc->noij", xp[:, :, i : i + 5, j : j + 5], w[:, :, i, j].astype(np.int64))
    np.testing.assert_array_equal(got, ref)
    h = np.array([[300.0, 300.0, -2.0]], np.float16)
    np.testing.assert_array_equal(Tensor(h).matmul(Tensor(h.T), dtype=dtypes.float).numpy(), [[180004.0]])


def test_assigning_a_buffer_a_jit_replay_writes_copies_it() -> None:
    """x.assign(y) of a realized y shares y's memory until one is written in place; a TinyJit replay writes its
    buffers directly, so sharing one of them let the next replay change x (a target network synced from the online
    one, a jitted step's output kept with assign)."""
    keep = Tensor.zeros(3).contiguous().realize()

    @TinyJit
    def f(x: Tensor) -> Tensor:
        return (x * 2).realize()

    for i in range(4):
        out = f(Tensor.full((3,), float(i)).contiguous().realize())
        if i == 2:
            keep.assign(out).realize()
    np.testing.assert_array_equal(keep.numpy(), [4.0, 4.0, 4.0])

    w = Tensor([1.0, 2.0]).contiguous().realize()
    target = Tensor.zeros(2).contiguous().realize()

    @TinyJit
    def train(g: Tensor) -> Tensor:
        w.assign(w - g)
        return (w * target).sum().realize()

    for i in range(5):
        train(Tensor([1.0, 1.0]))
        if i == 2:
            target.assign(w).realize()  # w is [-2, -1] now
    np.testing.assert_array_equal(target.numpy(), [-2.0, -1.0])
    np.testing.assert_array_equal(w.numpy(), [-4.0, -3.0])
