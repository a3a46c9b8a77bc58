"""Training-loop programs (fourth set, with test_programs4.py), written the way tinygrad users write them: an MLP
whose parameters are cast to half / bfloat16 and trained in that dtype; gradient accumulation over micro-batches
(backward several times, one optimizer step); a language model whose output layer shares the embedding matrix;
a checkpoint of model, BatchNorm statistics and optimizer state through safe_save/safe_load in the middle of
training; and BatchNorm running statistics read (or saved) right after a training forward, before anything is
realized. Each is checked against a numpy float64 re-implementation (analytic gradients, the optimizer's update
rule) step by step."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from gradcheck import num_grad

from speck.tensor import Tensor, TinyJit, dtypes, nn
from speck.tensor.nn.optim import SGD, Adam, AdamW
from speck.tensor.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save

F64 = np.float64
P = dict[str, np.ndarray]


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(F64)


def load(t: Tensor, x: np.ndarray) -> Tensor:
    t.replace(Tensor(np.asarray(x, np.float32)).cast(t.dtype).realize())
    return t


def np_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def np_adam(p: P, g: P, st: dict, t: int, lr: float, wd: float = 0.0, b1: float = 0.9, b2: float = 0.999,
            eps: float = 1e-8) -> None:  # fmt: skip
    for k, gk in g.items():
        m = st.setdefault(("m", k), np.zeros_like(gk))
        v = st.setdefault(("v", k), np.zeros_like(gk))
        m[...] = b1 * m + (1 - b1) * gk
        v[...] = b2 * v + (1 - b2) * gk * gk
        p[k] = p[k] - lr * ((m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps) + wd * p[k])


class MLP:
    def __init__(self, n_in: int, n_hid: int, n_out: int) -> None:
        self.l1, self.l2 = nn.Linear(n_in, n_hid), nn.Linear(n_hid, n_out)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x).tanh())


def np_mlp(p: P, x: np.ndarray, y: np.ndarray) -> tuple[float, P]:
    """Mean cross-entropy of the tanh MLP and its gradients, by hand."""
    h = np.tanh(x @ p["l1.weight"].T + p["l1.bias"])
    z = h @ p["l2.weight"].T + p["l2.bias"]
    prob = np_softmax(z)
    n = len(y)
    loss = float(-np.log(prob[np.arange(n), y]).mean())
    dz = prob.copy()
    dz[np.arange(n), y] -= 1
    dz /= n
    dh = (dz @ p["l2.weight"]) * (1 - h * h)
    return loss, {"l1.weight": dh.T @ x, "l1.bias": dh.sum(0), "l2.weight": dz.T @ h, "l2.bias": dz.sum(0)}


def init_mlp(model: MLP, seed: int, scale: float = 0.5) -> P:
    r, p = rng(seed), {}
    for k, t in get_state_dict(model).items():
        p[k] = f32(r.standard_normal(t.shape) * scale)
        load(t, p[k])
    return p


# ---------------- the whole MLP in half / bfloat16: parameters, activations, gradients, optimizer ----------------
@pytest.mark.parametrize("low", ["half", "bfloat16"])
def test_mlp_cast_to_low_precision_trains_close_to_float64(low: str) -> None:
    dt = getattr(dtypes, low)
    model = MLP(6, 8, 3)
    p = init_mlp(model, seed=1)
    for t in get_parameters(model):  # the tinygrad way to train in half: cast the parameters in place
        t.replace(t.cast(dt).realize())
    sd = get_state_dict(model)
    r = rng(2)
    opt = SGD(get_parameters(model), lr=0.2, momentum=0.9)
    buf: P = {}
    tol = 1e-2 if low == "half" else 6e-2  # 11 vs 8 mantissa bits, compounded over the steps
    losses = []
    for step in range(6):
        x, y = f32(r.standard_normal((8, 6))), r.integers(0, 3, 8)
        with Tensor.train():
            opt.zero_grad()
            out = model(Tensor(x.astype(np.float32)).cast(dt))
            assert out.dtype == dt
            loss = out.float().sparse_categorical_crossentropy(Tensor(y.astype(np.int32))).backward()
            opt.step()
        want, grads = np_mlp(p, x, y)
        losses.append(want)
        assert loss.item() == pytest.approx(want, rel=tol, abs=tol), f"step {step}"
        for k, t in sd.items():
            assert t.dtype == dt and t.grad is not None and t.grad.dtype == dt, k
            buf[k] = grads[k] if k not in buf else 0.9 * buf[k] + grads[k]
            p[k] = p[k] - 0.2 * buf[k]
            np.testing.assert_allclose(t.float().numpy(), p[k], rtol=tol, atol=tol, err_msg=f"{k} step {step}")
    assert losses[-1] != losses[0]


# ---------------- gradient accumulation: backward per micro-batch, one AdamW step ----------------
def test_gradient_accumulation_over_micro_batches_equals_the_full_batch() -> None:
    model, full = MLP(5, 7, 4), MLP(5, 7, 4)
    p = init_mlp(model, seed=3)
    init_mlp(full, seed=3)
    sd, sdf = get_state_dict(model), get_state_dict(full)
    opt = AdamW(get_parameters(model), lr=0.01, weight_decay=0.1)
    opt_full = AdamW(get_parameters(full), lr=0.01, weight_decay=0.1)
    r = rng(4)
    st: dict = {}
    micro = 3
    for step in range(1, 4):
        x, y = f32(r.standard_normal((12, 5))), r.integers(0, 4, 12)
        xs, ys = np.split(x, micro), np.split(y, micro)
        with Tensor.train():
            opt.zero_grad()
            total = 0.0
            for xm, ym in zip(xs, ys):  # .grad accumulates across the backward calls
                loss = model(Tensor(xm.astype(np.float32))).sparse_categorical_crossentropy(Tensor(ym.astype(np.int32)))
                (loss / micro).backward()
                total += loss.item() / micro
            opt.step()
            opt_full.zero_grad()
            model_loss = full(Tensor(x.astype(np.float32))).sparse_categorical_crossentropy(Tensor(y.astype(np.int32)))
            model_loss.backward()
            opt_full.step()
        want, grads = np_mlp(p, x, y)
        assert total == pytest.approx(want, rel=1e-5)
        assert model_loss.item() == pytest.approx(want, rel=1e-5)
        np_adam(p, grads, st, step, lr=0.01, wd=0.1)
        for k in p:
            np.testing.assert_allclose(sd[k].numpy(), p[k], rtol=1e-4, atol=1e-5, err_msg=f"{k} step {step}")
            np.testing.assert_allclose(sdf[k].numpy(), sd[k].numpy(), rtol=1e-5, atol=1e-6, err_msg=k)


# ---------------- weight tying: the output layer is the embedding matrix ----------------
class TiedLM:
    def __init__(self, vocab: int, dim: int) -> None:
        self.tok = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied

    def __call__(self, idx: Tensor) -> Tensor:
        h = self.tok(idx)
        h = h + self.proj(h).gelu()
        return self.head(h)


def np_tied(p: P, idx: np.ndarray, y: np.ndarray) -> tuple[float, P]:
    e = p["tok.weight"]
    h0 = e[idx]
    a = h0 @ p["proj.weight"].T + p["proj.bias"]
    c = np.sqrt(2 / np.pi)
    u = c * (a + 0.044715 * a**3)
    th = np.tanh(u)
    h = h0 + 0.5 * a * (1 + th)
    z = h @ e.T
    prob = np_softmax(z)
    n = len(y)
    loss = float(-np.log(prob[np.arange(n), y]).mean())
    dz = prob.copy()
    dz[np.arange(n), y] -= 1
    dz /= n
    g_e = dz.T @ h  # the output path
    dh = dz @ e
    da = dh * (0.5 * (1 + th) + 0.5 * a * (1 - th**2) * c * (1 + 3 * 0.044715 * a**2))
    dh0 = dh + da @ p["proj.weight"]
    np.add.at(g_e, idx, dh0)  # the embedding path
    return loss, {"tok.weight": g_e, "proj.weight": da.T @ h0, "proj.bias": da.sum(0)}


def test_tied_embedding_and_output_layer_get_both_gradients_and_one_update() -> None:
    vocab, dim = 9, 6
    model = TiedLM(vocab, dim)
    r = rng(5)
    p = {k: f32(r.standard_normal(t.shape) * 0.5) for k, t in get_state_dict(model).items() if k != "head.weight"}
    for k, v in p.items():
        load(get_state_dict(model)[k], v)
    assert model.head.weight is model.tok.weight
    params = get_parameters(model)
    assert len(params) == 3  # the shared matrix once
    opt = Adam(params, lr=0.02)
    st: dict = {}
    idx, y = r.integers(0, vocab, 10), r.integers(0, vocab, 10)
    for step in range(1, 4):
        with Tensor.train():
            opt.zero_grad()
            loss = model(Tensor(idx.astype(np.int32))).sparse_categorical_crossentropy(Tensor(y.astype(np.int32)))
            loss.backward()
            want, grads = np_tied(p, idx, y)
            assert loss.item() == pytest.approx(want, rel=1e-5)
            g = model.tok.weight.grad
            assert g is not None
            np.testing.assert_allclose(g.numpy(), grads["tok.weight"], rtol=1e-4, atol=1e-6)
            opt.step()
        np_adam(p, grads, st, step, lr=0.02)
        assert model.head.weight is model.tok.weight  # still tied after the update
        for k, v in p.items():
            np.testing.assert_allclose(get_state_dict(model)[k].numpy(), v, rtol=1e-4, atol=1e-5, err_msg=k)


# ---------------- checkpoint mid-training: model, BatchNorm statistics, optimizer state; resumed under TinyJit ----
class ConvBN:
    def __init__(self) -> None:
        self.conv = nn.Conv2d(2, 3, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(3)
        self.fc = nn.Linear(3, 2)

    def __call__(self, x: Tensor) -> Tensor:
        return self.fc(self.bn(self.conv(x)).relu().mean((2, 3)))


def np_convbn(p: P, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    w = p["conv.weight"]
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    hh, ww = x.shape[2:]
    c = sum(np.einsum("nchw,oc->nohw", xp[:, :, a : a + hh, b : b + ww], w[:, :, a, b]) for a in range(3)
            for b in range(3))  # fmt: skip
    mean, var = c.mean((0, 2, 3)), c.var((0, 2, 3))
    k = lambda v: v[None, :, None, None]
    y = (c - k(mean)) / np.sqrt(k(var) + 1e-5) * k(p["bn.weight"]) + k(p["bn.bias"])
    n = c.size / c.shape[1]
    return np.maximum(y, 0).mean((2, 3)) @ p["fc.weight"].T + p["fc.bias"], mean, var * n / (n - 1)


def np_xent(z: np.ndarray, y: np.ndarray) -> float:
    lp = z - z.max(-1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
    return float(-lp[np.arange(len(y)), y].mean())


TRAIN = ("conv.weight", "bn.weight", "bn.bias", "fc.weight", "fc.bias")


def test_checkpoint_mid_training_with_batchnorm_and_adam_resumes_like_numpy(tmp_path: pathlib.Path) -> None:
    r = rng(6)
    batches = [(f32(r.standard_normal((3, 2, 4, 4))), r.integers(0, 2, 3)) for _ in range(5)]
    init = {k: f32(r.standard_normal(s) * 0.5) for k, s in zip(TRAIN, [(3, 2, 3, 3), (3,), (3,), (2, 3), (2,)])}
    init["bn.weight"] += 1

    def make() -> tuple[ConvBN, Adam, TinyJit]:
        model = ConvBN()
        for k, v in init.items():
            load(get_state_dict(model)[k], v)
        opt = Adam(get_parameters(model), lr=0.03)

        @TinyJit
        @Tensor.train()
        def step(x: Tensor, y: Tensor) -> Tensor:
            opt.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(y).backward()
            opt.step()
            return loss.realize()

        return model, opt, step

    # numpy: five steps, the running statistics alongside
    p: P = {k: v.copy() for k, v in init.items()}
    rm, rv, st, want_losses = np.zeros(3), np.ones(3), {}, []
    for t, (x, y) in enumerate(batches, 1):
        z, mean, var = np_convbn(p, x)
        want_losses.append(np_xent(z, y))
        grads = {k: num_grad(lambda: np_xent(np_convbn(p, x)[0], y), p[k]) for k in TRAIN}  # noqa: B023
        rm, rv = 0.9 * rm + 0.1 * mean, 0.9 * rv + 0.1 * var
        np_adam(p, grads, st, t, lr=0.03)

    model, opt, step = make()
    losses = [step(Tensor(x.astype(np.float32)), Tensor(y.astype(np.int32))).item() for x, y in batches[:3]]
    ckpt = {**{f"model.{k}": v for k, v in get_state_dict(model).items()},
            **{f"opt.{k}": v for k, v in get_state_dict(opt).items()}}  # fmt: skip
    safe_save(ckpt, str(tmp_path / "ckpt.safetensors"))
    del model, opt, step
    model2, opt2, step2 = make()
    loaded = safe_load(str(tmp_path / "ckpt.safetensors"))
    load_state_dict(model2, {k[6:]: v for k, v in loaded.items() if k.startswith("model.")}, verbose=False)
    load_state_dict(opt2, {k[4:]: v for k, v in loaded.items() if k.startswith("opt.")}, verbose=False)
    assert model2.bn.num_batches_tracked.item() == 3
    losses += [step2(Tensor(x.astype(np.float32)), Tensor(y.astype(np.int32))).item() for x, y in batches[3:]]
    np.testing.assert_allclose(losses, want_losses, rtol=1e-4)
    sd = get_state_dict(model2)
    for k in TRAIN:
        np.testing.assert_allclose(sd[k].numpy(), p[k], rtol=1e-3, atol=1e-5, err_msg=k)
    np.testing.assert_allclose(sd["bn.running_mean"].numpy(), rm, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(sd["bn.running_var"].numpy(), rv, rtol=1e-4, atol=1e-6)
    assert sd["bn.num_batches_tracked"].item() == 5


# ---------------- BatchNorm running statistics observed before realize ----------------
def np_bn_stats(xs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    rm, rv = np.zeros(xs[0].shape[1]), np.ones(xs[0].shape[1])
    for x in xs:
        n = x.size / x.shape[1]
        rm = 0.9 * rm + 0.1 * x.mean((0, 2, 3))
        rv = 0.9 * rv + 0.1 * x.var((0, 2, 3)) * n / (n - 1)
    return rm, rv


@pytest.mark.parametrize("how", ["numpy", "tolist", "state_dict_numpy", "safe_save", "two_forwards"])
def test_batchnorm_running_stats_read_right_after_training_forward(how: str, tmp_path: pathlib.Path) -> None:
    r = rng(7)
    xs = [f32(r.standard_normal((4, 3, 2, 2)) * 2 + 1) for _ in range(2 if how == "two_forwards" else 1)]
    bn = nn.BatchNorm2d(3)
    with Tensor.train():
        outs = [bn(Tensor(x.astype(np.float32))) for x in xs]  # nothing realized yet
        if how == "numpy":
            rm, rv = bn.running_mean.numpy(), bn.running_var.numpy()
        elif how == "tolist":
            rm, rv = np.array(bn.running_mean.tolist()), np.array(bn.running_var.tolist())
        elif how == "state_dict_numpy":
            sd = get_state_dict(bn)
            rm, rv = sd["running_mean"].numpy(), sd["running_var"].numpy()
        elif how == "safe_save":
            safe_save(get_state_dict(bn), str(tmp_path / "bn.safetensors"))
            back = safe_load(str(tmp_path / "bn.safetensors"))
            rm, rv = back["running_mean"].numpy(), back["running_var"].numpy()
        else:
            rm, rv = bn.running_mean.numpy(), bn.running_var.numpy()
        want_rm, want_rv = np_bn_stats(xs)
        np.testing.assert_allclose(rm, want_rm, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(rv, want_rv, rtol=1e-5, atol=1e-6)
        # realizing the outputs afterwards does not apply the update a second time
        Tensor.realize(*outs)
        np.testing.assert_allclose(bn.running_mean.numpy(), want_rm, rtol=1e-5, atol=1e-6)
        assert bn.num_batches_tracked.item() == len(xs)
        x = xs[-1]
        want_out = (x - x.mean((0, 2, 3))[None, :, None, None]) / np.sqrt(x.var((0, 2, 3))[None, :, None, None] + 1e-5)
        np.testing.assert_allclose(outs[-1].numpy(), want_out, rtol=1e-4, atol=1e-5)


def test_train_then_validate_in_one_jitted_step_reads_the_updated_batchnorm_stats() -> None:
    """One jitted function: a training forward (statistics updated), then an eval forward on a validation batch
    before anything is realized; the eval forward normalises with the statistics that include this batch."""
    conv, bn = nn.Conv2d(2, 2, 1, bias=False), nn.BatchNorm2d(2)
    w = f32(rng(8).standard_normal((2, 2, 1, 1)))
    load(conv.weight, w)
    opt = SGD([conv.weight, bn.weight, bn.bias], lr=0.1)

    @TinyJit
    def step(x: Tensor, xv: Tensor) -> tuple[Tensor, Tensor]:
        with Tensor.train():
            opt.zero_grad()
            loss = bn(conv(x)).square().mean()  # the statistics update is deferred into this schedule
        val = bn(conv(xv))
        with Tensor.train():
            loss.backward()
            opt.step()
        return loss.realize(), val.realize()

    r = rng(9)
    rm, rv = np.zeros(2), np.ones(2)
    for i in range(4):
        x, xv = f32(r.standard_normal((3, 2, 2, 2)) * 2 + 1), f32(r.standard_normal((2, 2, 2, 2)))
        wk = conv.weight.numpy().astype(F64)  # (the weights before this step's update)
        c = np.einsum("nchw,oc->nohw", x, wk[:, :, 0, 0])
        n = c.size / 2
        rm, rv = 0.9 * rm + 0.1 * c.mean((0, 2, 3)), 0.9 * rv + 0.1 * c.var((0, 2, 3)) * n / (n - 1)
        gamma, beta = bn.weight.numpy().astype(F64), bn.bias.numpy().astype(F64)
        _, val = step(Tensor(x.astype(np.float32)), Tensor(xv.astype(np.float32)))
        cv = np.einsum("nchw,oc->nohw", xv, wk[:, :, 0, 0])
        k = lambda v: v[None, :, None, None]
        want = (cv - k(rm)) / np.sqrt(k(rv) + 1e-5) * k(gamma) + k(beta)
        np.testing.assert_allclose(val.numpy(), want, rtol=1e-4, atol=1e-5, err_msg=f"step {i}")
        np.testing.assert_allclose(bn.running_mean.numpy(), rm, rtol=1e-4, atol=1e-6)
        assert bn.num_batches_tracked.item() == i + 1
    assert step.cnt == 4
