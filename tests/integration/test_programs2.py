"""Whole model programs written the way tinygrad users write them (the names `from tinygrad import ...` gives, here
imported from speck.tensor, the same objects): a beautiful_mnist-style jitted training loop with SGD (momentum,
nesterov), AdamW, LAMB and LARS and a user-written learning-rate schedule; a mixture-of-experts layer; a ViT patch
embedding with an attention block; a 1-d convolutional audio model; a diffusion training step; an RNN unrolled by a
Python loop inside TinyJit; a CLIP-style contrastive loss; a decoder with grouped-query attention and a sliding-window
KV cache driven by a symbolic start_pos; mixed-precision training with float32 master weights and loss scaling; and
a checkpoint taken mid-training that resumes to identical results. Each is checked against a numpy float64
re-implementation (forward values, gradients - analytic or by central differences of the numpy forward - and the
parameters after several optimizer steps)."""

from __future__ import annotations

import math
import pathlib
from collections.abc import Callable
from functools import partial

import numpy as np
import pytest
from gradcheck import num_grad

from speck.tensor import Context, GlobalCounters, Tensor, TinyJit, Variable, dtypes, nn
from speck.tensor.nn.optim import LAMB, LARS, SGD, AdamW, Optimizer
from speck.tensor.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save

F64 = np.float64


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


# ---------------- beautiful_mnist-style loop ----------------
class MLP:
    def __init__(self, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray) -> None:
        self.l1, self.l2 = nn.Linear(*w1.shape[::-1]), nn.Linear(*w2.shape[::-1])
        self.l1.weight, self.l1.bias = Tensor(w1.astype(np.float32)), Tensor(b1.astype(np.float32))
        self.l2.weight, self.l2.bias = Tensor(w2.astype(np.float32)), Tensor(b2.astype(np.float32))

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x).relu())


def np_mlp_loss_and_grads(p: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> tuple[float, list[np.ndarray]]:
    w1, b1, w2, b2 = p
    h = x @ w1.T + b1
    a = np.maximum(h, 0)
    z = a @ w2.T + b2
    z = z - z.max(1, keepdims=True)
    lse = np.log(np.exp(z).sum(1, keepdims=True))
    logp = z - lse
    n = len(y)
    loss = -logp[np.arange(n), y].mean()
    dz = np.exp(logp)
    dz[np.arange(n), y] -= 1
    dz /= n
    dw2, db2 = dz.T @ a, dz.sum(0)
    dh = (dz @ w2) * (h > 0)
    return float(loss), [dh.T @ x, dh.sum(0), dw2, db2]


class NpOpt:
    """The four optimizers' update rules in float64 (tinygrad's definitions)."""

    def __init__(self, kind: str, params: list[np.ndarray], lr: float, **kw: float) -> None:
        self.kind, self.p, self.lr, self.kw, self.t = kind, params, lr, kw, 0
        self.b = [np.zeros_like(q) for q in params]
        self.m = [np.zeros_like(q) for q in params]
        self.v = [np.zeros_like(q) for q in params]

    def step(self, grads: list[np.ndarray]) -> None:
        self.t += 1
        kw = self.kw
        for i, (w, g) in enumerate(zip(self.p, grads)):
            if self.kind in ("sgd", "lars"):
                mom, wd, nest = kw.get("momentum", 0.0), kw.get("weight_decay", 0.0), bool(kw.get("nesterov", 0))
                r = 1.0
                if self.kind == "lars":
                    wn, gn = np.linalg.norm(w), np.linalg.norm(g)
                    r = kw["tcoef"] * wn / (gn + wd * wn) if wn > 0 and gn > 0 else 1.0
                g = g + wd * w
                if self.kind == "lars":  # classic: the trust ratio and lr scale the gradient before the momentum
                    g = g * r * self.lr
                if mom:
                    self.b[i] = mom * self.b[i] + g
                    g = g + mom * self.b[i] if nest else self.b[i]
                w -= g if self.kind == "lars" else self.lr * g
            else:
                b1, b2, eps, wd = kw["b1"], kw["b2"], kw["eps"], kw["weight_decay"]
                self.m[i] = b1 * self.m[i] + (1 - b1) * g
                self.v[i] = b2 * self.v[i] + (1 - b2) * g * g
                mh, vh = self.m[i] / (1 - b1**self.t), self.v[i] / (1 - b2**self.t)
                u = mh / (np.sqrt(vh) + eps) + wd * w
                r = 1.0
                if self.kind == "lamb":
                    wn, un = np.linalg.norm(w), np.linalg.norm(u)
                    r = wn / un if wn > 0 and un > 0 else 1.0
                w -= self.lr * r * u


OPTS: dict[str, tuple[Callable[..., Optimizer], dict[str, float]]] = {
    "sgd_nesterov": (SGD, {"momentum": 0.9, "weight_decay": 1e-3, "nesterov": 1}),
    "sgd_momentum": (SGD, {"momentum": 0.8}),
    "adamw": (AdamW, {"b1": 0.9, "b2": 0.99, "eps": 1e-8, "weight_decay": 0.05}),
    "lamb": (LAMB, {"b1": 0.9, "b2": 0.999, "eps": 1e-6, "weight_decay": 0.01}),
    "lars": (LARS, {"momentum": 0.9, "weight_decay": 1e-3, "tcoef": 0.02}),
}


@pytest.mark.parametrize("name", sorted(OPTS))
def test_beautiful_mnist_style_loop_matches_numpy(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    make, kw = OPTS[name]
    kind = name.split("_")[0]
    r = rng(1)
    n, d_in, d_h, n_cls, bs = 48, 12, 16, 5, 8
    x_np, y_np = r.standard_normal((n, d_in)), r.integers(0, n_cls, n)
    params = [r.standard_normal((d_h, d_in)) * 0.3, r.standard_normal(d_h) * 0.1, r.standard_normal((n_cls, d_h)) * 0.3,
              r.standard_normal(n_cls) * 0.1]  # fmt: skip
    params = [p.astype(np.float32).astype(F64) for p in params]
    model = MLP(*params)
    x_train, y_train = Tensor(x_np.astype(np.float32)), Tensor(y_np.astype(np.int32))
    lr0 = 0.05 if kind in ("sgd", "lars") else 0.01
    torch_kw = {k: (bool(v) if k == "nesterov" else v) for k, v in kw.items()}
    opt = make(nn.state.get_parameters(model), lr=lr0, **torch_kw)
    ref = NpOpt("sgd" if kind == "sgd" else kind if kind in ("lamb", "lars") else "adamw", params, lr0, **kw)

    @TinyJit
    @Tensor.train()
    def train_step() -> tuple[Tensor, Tensor]:
        opt.zero_grad()
        samples = Tensor.randint(bs, high=x_train.shape[0])
        loss = model(x_train[samples]).sparse_categorical_crossentropy(y_train[samples]).backward()
        opt.step()
        return loss.realize(), samples.realize()

    Tensor.manual_seed(7)
    seen: set[tuple[int, ...]] = set()
    for i in range(6):
        lr = lr0 * (0.5 * (1 + math.cos(math.pi * i / 6)))  # a user's cosine schedule, written into opt.lr
        opt.lr.assign(Tensor([lr], dtype=opt.lr.dtype)).realize()
        ref.lr = lr
        GlobalCounters.reset()
        loss_t, samples_t = train_step()
        loss, idx = loss_t.item(), samples_t.numpy()
        print(f"step {i:2d} loss {loss:.4f} lr {lr:.4f} kernels {GlobalCounters.kernel_count}")
        seen.add(tuple(idx.tolist()))
        assert idx.shape == (bs,) and idx.min() >= 0 and idx.max() < n
        want_loss, grads = np_mlp_loss_and_grads(ref.p, x_np[idx], y_np[idx])
        assert loss == pytest.approx(want_loss, rel=1e-4, abs=1e-5), i
        ref.step(grads)
        if i >= 2:  # the jit replays: same kernels, no new compiles
            assert GlobalCounters.kernel_count > 0
    assert len(seen) > 1, "Tensor.randint inside the jit gave the same batch every step"
    got = [model.l1.weight, model.l1.bias, model.l2.weight, model.l2.bias]
    for g, w in zip(got, ref.p):
        np.testing.assert_allclose(g.numpy(), w, rtol=2e-4, atol=2e-5)
    assert "kernels" in capsys.readouterr().out


# ---------------- forward + gradient checks against a numpy float64 forward ----------------
def check_forward_and_grads(np_loss: Callable[[list[np.ndarray]], float], params: list[np.ndarray],
                            speck_loss: Callable[[list[Tensor]], Tensor], rtol: float = 2e-3,
                            atol: float = 2e-5) -> None:  # fmt: skip
    """speck_loss(params as float32 Tensors) equals np_loss(params in float64), and its gradients equal the central
    differences of np_loss."""
    params = [p.astype(np.float32).astype(F64) for p in params]
    ts = [Tensor(p.astype(np.float32), requires_grad=True) for p in params]
    loss = speck_loss(ts)
    loss.backward()
    assert loss.item() == pytest.approx(np_loss(params), rel=1e-4, abs=1e-6)
    for i, (t, p) in enumerate(zip(ts, params)):
        assert t.grad is not None, f"parameter {i} got no gradient"
        want = num_grad(lambda: np_loss(params), p)
        np.testing.assert_allclose(t.grad.numpy(), want, rtol=rtol, atol=atol, err_msg=f"gradient of parameter {i}")


def np_gelu(x: np.ndarray) -> np.ndarray:  # the tanh approximation tinygrad's gelu() uses
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def np_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def np_layernorm(x: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)


# ---------------- mixture of experts: top-k routing, gather, scatter, one_hot ----------------
E, K, D, H = 4, 2, 6, 8


def np_moe(p: list[np.ndarray], x: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    wr, w1, w2 = p
    probs = np_softmax(x @ wr)
    sel = np.argsort(-probs, axis=-1, kind="stable")[:, :K]
    top = np.take_along_axis(probs, sel, -1)
    gate = top / top.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for t in range(len(x)):
        for j in range(K):
            e = sel[t, j]
            out[t] += gate[t, j] * (np_gelu(x[t] @ w1[e]) @ w2[e])
    counts = np.bincount(sel.ravel(), minlength=E).astype(F64)
    aux = E * float((counts / sel.size * probs.mean(0)).sum())  # the switch-transformer load-balancing loss
    return out, counts, aux


def speck_moe(p: list[Tensor], x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    wr, w1, w2 = p
    probs = (x @ wr).softmax(-1)
    top, sel = probs.topk(K, dim=-1)
    gate = top / top.sum(-1, keepdim=True)
    h = (x.reshape(-1, 1, 1, D) @ w1[sel]).gelu()  # w1[sel]: (T, K, D, H) gathered per token and slot
    y = (h @ w2[sel]).reshape(-1, K, D)
    out = (gate.unsqueeze(-1) * y).sum(1)
    ones = Tensor.ones(sel.numel(), device=x.device)
    counts = Tensor.zeros(E, device=x.device).scatter_reduce(0, sel.flatten(), ones, reduce="sum")
    frac = sel.one_hot(E).sum((0, 1)) / sel.numel()
    aux = E * (frac * probs.mean(0)).sum()
    return out, counts, aux


def test_mixture_of_experts_routing_values_and_gradients() -> None:
    r = rng(2)
    x = r.standard_normal((7, D))
    params = [r.standard_normal((D, E)), r.standard_normal((E, D, H)) * 0.4, r.standard_normal((E, H, D)) * 0.4]
    target = r.standard_normal((7, D))
    xt = Tensor(x.astype(np.float32))
    out, counts, aux = speck_moe([Tensor(p.astype(np.float32)) for p in params], xt)
    want_out, want_counts, want_aux = np_moe([p.astype(np.float32).astype(F64) for p in params],
                                             x.astype(np.float32).astype(F64))  # fmt: skip
    np.testing.assert_allclose(out.numpy(), want_out, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(counts.numpy(), want_counts)
    assert aux.item() == pytest.approx(want_aux, rel=1e-5)
    x32 = x.astype(np.float32).astype(F64)

    def np_loss(p: list[np.ndarray]) -> float:
        o, _, a = np_moe(p, x32)
        return float(((o - target) ** 2).mean() + 0.1 * a)

    def sp_loss(p: list[Tensor]) -> Tensor:
        o, _, a = speck_moe(p, xt)
        return ((o - Tensor(target.astype(np.float32))) ** 2).mean() + 0.1 * a

    check_forward_and_grads(np_loss, params, sp_loss)


def test_switch_dispatch_with_expert_capacity_scatter_and_gather() -> None:
    """Switch-transformer dispatch: top-1 routing, each token's slot in its expert from a cumsum over the one-hot,
    tokens beyond the capacity dropped, tokens scattered into an (experts, capacity, dim) buffer, the experts run,
    and the outputs gathered back scaled by the gate; values and gradients against numpy."""
    n_exp, cap, d, t = 3, 2, 4, 7
    r = rng(11)
    x = r.standard_normal((t, d)).astype(np.float32)
    params = [r.standard_normal((d, n_exp)), r.standard_normal((n_exp, d, d)) * 0.5]

    def np_loss(p: list[np.ndarray]) -> float:
        probs = np_softmax(x.astype(F64) @ p[0])
        sel = probs.argmax(-1)
        gate = probs[np.arange(t), sel]
        pos = (np.cumsum(np.eye(n_exp)[sel], 0) - 1)[np.arange(t), sel].astype(int)
        buf = np.zeros((n_exp, cap, d))
        for i in range(t):
            if pos[i] < cap:
                buf[sel[i], pos[i]] = x[i]
        outb = np.einsum("ecd,edf->ecf", buf, p[1])
        out = np.zeros((t, d))
        for i in range(t):
            if pos[i] < cap:
                out[i] = gate[i] * outb[sel[i], pos[i]]
        return float((out**2).sum() + out.sum())

    def sp_loss(p: list[Tensor]) -> Tensor:
        xt = Tensor(x)
        probs = (xt @ p[0]).softmax(-1)
        sel = probs.argmax(-1)
        gate = probs.gather(1, sel.unsqueeze(1)).squeeze(1)
        oh = sel.one_hot(n_exp)
        pos = ((oh.cumsum(0) - 1) * oh).sum(1)
        keep = pos < cap
        slot = keep.where(sel * cap + pos.minimum(cap - 1), n_exp * cap)  # a dropped token goes to a spare slot
        idx = slot.reshape(t, 1).expand(t, d)
        buf = Tensor.zeros(n_exp * cap + 1, d).scatter(0, idx, xt)[: n_exp * cap].reshape(n_exp, cap, d)
        outb = (buf.unsqueeze(-1) * p[1].unsqueeze(1)).sum(2)
        out = outb.reshape(n_exp * cap, d).pad(((0, 1), None)).gather(0, idx) * gate.unsqueeze(1) * keep.unsqueeze(1)
        return (out**2).sum() + out.sum()

    check_forward_and_grads(np_loss, params, sp_loss)


@pytest.mark.parametrize("mode", ["sum", "mean", "amax", "amin", "prod"])
@pytest.mark.parametrize("include_self", [True, False])
def test_graph_message_passing_scatter_reduce(mode: str, include_self: bool) -> None:
    """A GNN layer: messages from edge sources (an indexed gather), aggregated into edge destinations with
    scatter_reduce (torch semantics; node 3 receives one edge, node 1 three), then a readout; values and gradients
    against numpy."""
    n, f, h = 5, 3, 4
    r = rng(12)
    x = r.standard_normal((n, f)).astype(np.float32)
    src, dst = np.array([0, 1, 2, 3, 4, 0, 2, 1]), np.array([1, 2, 3, 4, 0, 2, 1, 1])
    params = [r.standard_normal((f, h)) * 0.5, r.standard_normal((h, 2)) * 0.5]

    def np_loss(p: list[np.ndarray]) -> float:
        m = np.tanh(x.astype(F64)[src] @ p[0])
        agg = np.full((n, h), 0.5)
        got: list[list[np.ndarray]] = [[agg[i]] if include_self else [] for i in range(n)]
        for e in range(len(src)):
            got[dst[e]].append(m[e])
        comb = {"sum": np.sum, "mean": np.mean, "amax": np.max, "amin": np.min, "prod": np.prod}[mode]
        agg = np.stack([comb(np.stack(g), 0) if g else agg[i] for i, g in enumerate(got)])
        return float(((agg @ p[1]) ** 2).sum())

    def sp_loss(p: list[Tensor]) -> Tensor:
        m = (Tensor(x)[Tensor(src)] @ p[0]).tanh()
        idx = Tensor(dst.astype(np.int32)).reshape(-1, 1).expand(len(dst), h)
        agg = Tensor.full((n, h), 0.5).scatter_reduce(0, idx, m, reduce=mode, include_self=include_self)
        return ((agg @ p[1]) ** 2).sum()

    check_forward_and_grads(np_loss, params, sp_loss, rtol=3e-3, atol=1e-4)


# ---------------- ViT: patch embedding + attention block ----------------
def np_vit(p: list[np.ndarray], img: np.ndarray, heads: int = 2) -> np.ndarray:
    wc, bc, cls, pos, wqkv, wo, w1, w2, wh = p
    b, c, hh, ww = img.shape
    ps, d = wc.shape[2], wc.shape[0]
    patches = img.reshape(b, c, hh // ps, ps, ww // ps, ps).transpose(0, 2, 4, 1, 3, 5).reshape(b, -1, c * ps * ps)
    tok = patches @ wc.reshape(d, -1).T + bc
    x = np.concatenate([np.broadcast_to(cls, (b, 1, d)), tok], 1) + pos
    qkv = np_layernorm(x) @ wqkv.T
    q, k, v = (qkv[..., i * d : (i + 1) * d].reshape(b, -1, heads, d // heads).transpose(0, 2, 1, 3) for i in range(3))
    att = np_softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // heads)) @ v
    x = x + att.transpose(0, 2, 1, 3).reshape(b, -1, d) @ wo.T
    x = x + np_gelu(np_layernorm(x) @ w1.T) @ w2.T
    return np_layernorm(x[:, 0]) @ wh.T


class ViT:
    def __init__(self, p: list[Tensor], heads: int = 2) -> None:
        self.wc, self.bc, self.cls, self.pos, self.wqkv, self.wo, self.w1, self.w2, self.wh = p
        self.heads = heads

    def __call__(self, img: Tensor) -> Tensor:
        d = self.wc.shape[0]
        x = img.conv2d(self.wc, self.bc, stride=self.wc.shape[2]).flatten(2).transpose(1, 2)
        x = self.cls.expand(x.shape[0], 1, d).cat(x, dim=1) + self.pos
        b, t, _ = x.shape
        q, k, v = x.layernorm().linear(self.wqkv.T).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = q.scaled_dot_product_attention(k, v).transpose(1, 2).reshape(b, t, d)
        x = x + att.linear(self.wo.T)
        x = x + x.layernorm().linear(self.w1.T).gelu().linear(self.w2.T)
        return x[:, 0].layernorm().linear(self.wh.T)


def test_vit_patch_embedding_attention_block() -> None:
    r = rng(3)
    d, c, ps, n_cls = 8, 3, 4, 3
    img, y = r.standard_normal((2, c, 8, 8)), np.array([0, 2])
    s = 0.3
    params = [r.standard_normal((d, c, ps, ps)) * s, r.standard_normal(d) * s, r.standard_normal((1, 1, d)),
              r.standard_normal((1, 5, d)) * s, r.standard_normal((3 * d, d)) * s, r.standard_normal((d, d)) * s,
              r.standard_normal((2 * d, d)) * s, r.standard_normal((d, 2 * d)) * s,
              r.standard_normal((n_cls, d)) * s]  # fmt: skip
    img32 = img.astype(np.float32).astype(F64)

    def np_loss(p: list[np.ndarray]) -> float:
        logits = np_vit(p, img32)
        lp = logits - logits.max(1, keepdims=True)
        lp = lp - np.log(np.exp(lp).sum(1, keepdims=True))
        return float(-lp[np.arange(2), y].mean())

    def sp_loss(p: list[Tensor]) -> Tensor:
        return ViT(p)(Tensor(img.astype(np.float32))).sparse_categorical_crossentropy(Tensor(y))

    check_forward_and_grads(np_loss, params, sp_loss)


# ---------------- 1-d convolutional audio model ----------------
def np_conv1d(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int, pad: int, groups: int) -> np.ndarray:
    n, cin, length = x.shape
    cout, cg, k = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad)))
    lo = (length + 2 * pad - k) // stride + 1
    out = np.zeros((n, cout, lo))
    og = cout // groups
    for o in range(cout):
        g = o // og
        for t in range(lo):
            out[:, o, t] = (xp[:, g * cg : (g + 1) * cg, t * stride : t * stride + k] * w[o]).sum((1, 2))
    return out + b[None, :, None]


def np_groupnorm(x: np.ndarray, groups: int, w: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    n, c, length = x.shape
    xg = x.reshape(n, groups, -1)
    xg = (xg - xg.mean(-1, keepdims=True)) / np.sqrt(xg.var(-1, keepdims=True) + eps)
    return xg.reshape(n, c, length) * w[None, :, None] + b[None, :, None]


def test_conv1d_groupnorm_gelu_audio_model() -> None:
    r = rng(4)
    audio, y = r.standard_normal((2, 1, 24)), np.array([1, 0])
    params = [r.standard_normal((8, 1, 5)) * 0.5, r.standard_normal(8) * 0.1, 1 + 0.1 * r.standard_normal(8),
              0.1 * r.standard_normal(8), r.standard_normal((8, 4, 3)) * 0.3, r.standard_normal(8) * 0.1,
              r.standard_normal((2, 8)) * 0.5]  # fmt: skip
    a32 = audio.astype(np.float32).astype(F64)

    def np_loss(p: list[np.ndarray]) -> float:
        h = np_gelu(np_groupnorm(np_conv1d(a32, p[0], p[1], 2, 2, 1), 2, p[2], p[3]))
        h = np_gelu(np_conv1d(h, p[4], p[5], 1, 1, 2))
        logits = h.mean(-1) @ p[6].T
        lp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
        return float(-lp[np.arange(2), y].mean())

    def sp_loss(p: list[Tensor]) -> Tensor:
        c1, gn, c2 = (
            nn.Conv1d(1, 8, 5, stride=2, padding=2),
            nn.GroupNorm(2, 8),
            nn.Conv1d(8, 8, 3, padding=1, groups=2),
        )
        c1.weight, c1.bias, gn.weight, gn.bias, c2.weight, c2.bias, head = p
        h = c2(gn(c1(Tensor(audio.astype(np.float32)))).gelu()).gelu()
        return h.mean(-1).linear(head.T).sparse_categorical_crossentropy(Tensor(y))

    check_forward_and_grads(np_loss, params, sp_loss)


# ---------------- CLIP-style contrastive loss ----------------
def test_clip_contrastive_loss_with_logsumexp_and_normalize() -> None:
    r = rng(5)
    b, di, dt, d = 5, 6, 4, 3
    img_f, txt_f = r.standard_normal((b, di)), r.standard_normal((b, dt))
    params = [r.standard_normal((di, d)), r.standard_normal((dt, d)), np.array([math.log(1 / 0.07)])]
    i32, t32 = img_f.astype(np.float32).astype(F64), txt_f.astype(np.float32).astype(F64)

    def np_loss(p: list[np.ndarray]) -> float:
        ie, te = i32 @ p[0], t32 @ p[1]
        ie = ie / np.maximum(np.linalg.norm(ie, axis=1, keepdims=True), 1e-12)
        te = te / np.maximum(np.linalg.norm(te, axis=1, keepdims=True), 1e-12)
        lg = ie @ te.T * np.exp(p[2][0])
        diag = np.diag(lg)

        def lse(z: np.ndarray) -> np.ndarray:
            return z.max(1) + np.log(np.exp(z - z.max(1, keepdims=True)).sum(1))

        return float(((lse(lg) - diag).mean() + (lse(lg.T) - diag).mean()) / 2)

    def sp_loss(p: list[Tensor]) -> Tensor:
        ie = (Tensor(img_f.astype(np.float32)) @ p[0]).normalize(dim=-1)
        te = (Tensor(txt_f.astype(np.float32)) @ p[1]).normalize(dim=-1)
        logits = ie @ te.T * p[2].exp()
        labels = Tensor.arange(b)
        diag = (logits * labels.one_hot(b)).sum(1)
        return ((logits.logsumexp(1) - diag).mean() + (logits.T.logsumexp(1) - diag).mean()) / 2

    check_forward_and_grads(np_loss, params, sp_loss, rtol=3e-3, atol=5e-5)
    # the same loss through cross_entropy, both directions, equals it
    ts = [Tensor(p.astype(np.float32)) for p in params]
    ie, te = (
        (Tensor(img_f.astype(np.float32)) @ ts[0]).normalize(dim=-1),
        (Tensor(txt_f.astype(np.float32)) @ ts[1]).normalize(dim=-1),
    )
    lg = ie @ te.T * ts[2].exp()
    ce = (lg.cross_entropy(Tensor.arange(b)) + lg.T.cross_entropy(Tensor.arange(b))) / 2
    assert ce.item() == pytest.approx(np_loss([p.astype(np.float32).astype(F64) for p in params]), rel=1e-4)


# ---------------- diffusion training step ----------------
def np_timestep_embedding(t: np.ndarray, dim: int) -> np.ndarray:
    half = dim // 2
    freqs = np.exp(-math.log(10000) * np.arange(half) / half)
    args = t[:, None].astype(F64) * freqs[None]
    return np.concatenate([np.cos(args), np.sin(args)], -1)


def test_diffusion_training_step_matches_numpy() -> None:
    r = rng(6)
    steps_t, d, emb, hid, b = 20, 4, 6, 12, 5
    x0 = r.standard_normal((16, d)).astype(np.float32)
    params = [r.standard_normal((hid, d + emb)) * 0.3, np.zeros(hid), r.standard_normal((d, hid)) * 0.3, np.zeros(d)]
    params = [p.astype(np.float32).astype(F64) for p in params]
    l1, l2 = nn.Linear(d + emb, hid), nn.Linear(hid, d)
    l1.weight, l1.bias, l2.weight, l2.bias = (Tensor(p.astype(np.float32)) for p in params)
    opt = SGD([l1.weight, l1.bias, l2.weight, l2.bias], lr=0.1, momentum=0.9)
    betas = Tensor.linspace(1e-4, 0.2, steps_t)
    alphas_cumprod = (1 - betas).cumprod(0).realize()
    want_ac = np.cumprod(1 - np.linspace(1e-4, 0.2, steps_t))
    np.testing.assert_allclose(alphas_cumprod.numpy(), want_ac, rtol=1e-5)
    data = Tensor(x0)

    def timestep_embedding(t: Tensor, dim: int) -> Tensor:
        half = dim // 2
        freqs = (-math.log(10000) * Tensor.arange(half) / half).exp()
        args = t.unsqueeze(-1).float() * freqs.unsqueeze(0)
        return args.cos().cat(args.sin(), dim=-1)

    @TinyJit
    @Tensor.train()
    def train_step() -> tuple[Tensor, Tensor, Tensor, Tensor]:
        opt.zero_grad()
        idx = Tensor.randint(b, high=16)
        t = Tensor.randint(b, low=0, high=steps_t)
        noise = Tensor.randn(b, d)
        ac = alphas_cumprod[t].unsqueeze(-1)
        xt = ac.sqrt() * data[idx] + (1 - ac).sqrt() * noise
        pred = l2(l1(xt.cat(timestep_embedding(t, emb), dim=-1)).silu())
        loss = ((pred - noise) ** 2).mean().backward()
        opt.step()
        return loss.realize(), idx.realize(), t.realize(), noise.realize()

    def np_loss(p: list[np.ndarray], idx: np.ndarray, t: np.ndarray, noise: np.ndarray) -> float:
        ac = want_ac[t][:, None]
        xt = np.sqrt(ac) * x0[idx].astype(F64) + np.sqrt(1 - ac) * noise
        h = np.concatenate([xt, np_timestep_embedding(t, emb)], -1) @ p[0].T + p[1]
        h = h / (1 + np.exp(-h))
        return float((((h @ p[2].T + p[3]) - noise) ** 2).mean())

    Tensor.manual_seed(3)
    mom = [np.zeros_like(p) for p in params]
    for step in range(4):
        loss, idx, t, noise = train_step()
        idx_np, t_np, noise_np = idx.numpy(), t.numpy(), noise.numpy().astype(F64)
        assert t_np.min() >= 0 and t_np.max() < steps_t
        assert loss.item() == pytest.approx(np_loss(params, idx_np, t_np, noise_np), rel=1e-4), step
        grads = [num_grad(partial(np_loss, params, idx_np, t_np, noise_np), p) for p in params]
        for i, (p, g) in enumerate(zip(params, grads)):
            mom[i] = 0.9 * mom[i] + g
            p -= 0.1 * mom[i]
    for got, want in zip([l1.weight, l1.bias, l2.weight, l2.bias], params):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-3, atol=1e-5)


# ---------------- RNN unrolled by a Python loop inside TinyJit ----------------
def test_rnn_python_loop_inside_tinyjit_trains_like_numpy() -> None:
    r = rng(7)
    steps_t, din, dh, b = 5, 3, 6, 4
    params = [r.standard_normal((din, dh)) * 0.5, r.standard_normal((dh, dh)) * 0.4, np.zeros(dh),
              r.standard_normal((dh, 1)) * 0.5]  # fmt: skip
    params = [p.astype(np.float32).astype(F64) for p in params]
    wx, wh, bh, wo = (Tensor(p.astype(np.float32)) for p in params)
    opt = SGD([wx, wh, bh, wo], lr=0.05)
    seqs = [r.standard_normal((b, steps_t, din)).astype(np.float32) for _ in range(4)]
    ys = [r.standard_normal((b, 1)).astype(np.float32) for _ in range(4)]

    @TinyJit
    @Tensor.train()
    def step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        h = Tensor.zeros(x.shape[0], dh)
        for i in range(x.shape[1]):  # unrolled at capture time: one graph over all time steps
            h = (x[:, i] @ wx + h @ wh + bh).tanh()
        loss = ((h @ wo - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss.realize()

    def np_loss(p: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
        h = np.zeros((b, dh))
        for i in range(steps_t):
            h = np.tanh(x[:, i] @ p[0] + h @ p[1] + p[2])
        return float(((h @ p[3] - y) ** 2).mean())

    for x, y in zip(seqs, ys):
        x64, y64 = x.astype(F64), y.astype(F64)
        got = step(Tensor(x), Tensor(y)).item()
        assert got == pytest.approx(np_loss(params, x64, y64), rel=1e-4)
        grads = [num_grad(partial(np_loss, params, x64, y64), p) for p in params]
        for p, g in zip(params, grads):
            p -= 0.05 * g
    assert step.captured is not None  # the later calls replayed the captured kernels
    for got_t, want in zip([wx, wh, bh, wo], params):
        np.testing.assert_allclose(got_t.numpy(), want, rtol=1e-4, atol=1e-6)


# ---------------- decoder: grouped-query attention, sliding-window KV cache, symbolic start_pos ----------------
class SlidingGQADecoder:
    """One pre-norm attention block: n_heads query heads share n_kv key/value heads; each position attends to the
    last `window` positions. The cache is front-padded by window-1 slots, so the window of position p is the cache
    slice [p, p + window) for every p (one shape for the jitted decode step)."""

    def __init__(self, p: list[np.ndarray], n_heads: int, n_kv: int, window: int, max_ctx: int) -> None:
        self.emb, self.pos, self.wq, self.wk, self.wv, self.wo, self.head = (Tensor(x.astype(np.float32)) for x in p)
        self.n_heads, self.n_kv, self.window, self.max_ctx = n_heads, n_kv, window, max_ctx
        self.hd = self.wq.shape[1] // n_heads
        self.cache_kv = Tensor.zeros(2, 1, max_ctx + window - 1, n_kv, self.hd).contiguous().realize()
        self.decode = TinyJit(self.forward)

    def forward(self, tokens: Tensor, start_pos: int | Variable) -> Tensor:
        b, t = tokens.shape
        w = self.window
        x = self.emb[tokens] + self.pos.shrink(((start_pos, start_pos + t), None))
        h = x * (x.square().mean(-1, keepdim=True) + 1e-6).rsqrt()  # RMSNorm without a weight
        q = (h @ self.wq).reshape(b, t, self.n_heads, self.hd)
        k = (h @ self.wk).reshape(b, t, self.n_kv, self.hd)
        v = (h @ self.wv).reshape(b, t, self.n_kv, self.hd)
        self.cache_kv.shrink((None, None, (start_pos + w - 1, start_pos + w - 1 + t), None, None)).assign(
            Tensor.stack(k, v)
        ).realize()
        if t > 1:  # prefill (start_pos 0): this chunk's keys after window-1 padding slots, like the cache's layout
            keys, vals = k.pad((None, (w - 1, 0), None, None)), v.pad((None, (w - 1, 0), None, None))
        else:
            keys = self.cache_kv[0].shrink((None, (start_pos, start_pos + w), None, None))
            vals = self.cache_kv[1].shrink((None, (start_pos, start_pos + w), None, None))
        rep = self.n_heads // self.n_kv
        s = keys.shape[1]
        keys = keys.unsqueeze(3).expand(b, s, self.n_kv, rep, self.hd).reshape(b, s, self.n_heads, self.hd)
        vals = vals.unsqueeze(3).expand(b, s, self.n_kv, rep, self.hd).reshape(b, s, self.n_heads, self.hd)
        # key slot j holds position start_pos + j - (w - 1) in both layouts; query i is at start_pos + i
        qpos = Tensor.arange(t).reshape(t, 1) + start_pos
        kpos = Tensor.arange(s).reshape(1, s) + start_pos - (w - 1)
        ok = (kpos >= 0) & (kpos <= qpos) & (kpos > qpos - w)
        mask = ok.where(0.0, float("-inf")).reshape(1, 1, t, s)
        att = q.transpose(1, 2).scaled_dot_product_attention(keys.transpose(1, 2), vals.transpose(1, 2), mask)
        x = x + att.transpose(1, 2).reshape(b, t, -1) @ self.wo
        return (x @ self.head).realize()

    def __call__(self, tokens: Tensor, start_pos: int) -> Tensor:
        if tokens.shape[1] > 1:
            return self.forward(tokens, start_pos)
        return self.decode(tokens, Variable("start_pos", 1, self.max_ctx - 1).bind(start_pos))


def np_sliding_gqa(p: list[np.ndarray], tokens: np.ndarray, n_heads: int, n_kv: int, window: int) -> np.ndarray:
    emb, pos, wq, wk, wv, wo, head = p
    t = len(tokens)
    x = emb[tokens] + pos[:t]
    h = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
    hd = wq.shape[1] // n_heads
    q = (h @ wq).reshape(t, n_heads, hd)
    k = np.repeat((h @ wk).reshape(t, n_kv, hd), n_heads // n_kv, axis=1)
    v = np.repeat((h @ wv).reshape(t, n_kv, hd), n_heads // n_kv, axis=1)
    i, j = np.arange(t)[:, None], np.arange(t)[None]
    allowed = (j <= i) & (j > i - window)
    s = np.einsum("ihd,jhd->hij", q, k) / math.sqrt(hd)
    s = np.where(allowed[None], s, -np.inf)
    out = np.einsum("hij,jhd->ihd", np_softmax(s), v).reshape(t, -1)
    return (x + out @ wo) @ head


def test_sliding_window_gqa_decoder_with_symbolic_start_pos() -> None:
    r = rng(8)
    vocab, dim, n_heads, n_kv, window, max_ctx = 11, 16, 4, 2, 3, 10
    p = [r.standard_normal((vocab, dim)), r.standard_normal((max_ctx, dim)) * 0.5,
         *(r.standard_normal((dim, d)) * 0.3 for d in (dim, dim // 2, dim // 2, dim)),
         r.standard_normal((dim, vocab)) * 0.3]  # fmt: skip
    p = [x.astype(np.float32).astype(F64) for x in p]
    tokens = r.integers(0, vocab, max_ctx)
    want = np_sliding_gqa(p, tokens, n_heads, n_kv, window)
    model = SlidingGQADecoder(p, n_heads, n_kv, window, max_ctx)
    prompt = 4
    got = model(Tensor(tokens[None, :prompt].astype(np.int32)), 0)
    np.testing.assert_allclose(got.numpy()[0], want[:prompt], rtol=1e-4, atol=1e-4)
    for pos in range(prompt, max_ctx):  # teacher-forced decoding, one token per jitted call
        logits = model(Tensor([[int(tokens[pos])]], dtype=dtypes.int32), pos)
        np.testing.assert_allclose(logits.numpy()[0, 0], want[pos], rtol=1e-4, atol=1e-4, err_msg=f"position {pos}")
    # the window is real: the full-causal answer differs at the last position
    full = np_sliding_gqa(p, tokens, n_heads, n_kv, max_ctx)
    assert not np.allclose(full[-1], want[-1], atol=1e-3)


# ---------------- mixed precision: half / bfloat16 forward, float32 master weights, loss scaling ----------------
@pytest.mark.parametrize("low", ["half", "bfloat16"])
def test_mixed_precision_training_with_master_weights_and_loss_scaling(low: str) -> None:
    dt = getattr(dtypes, low)
    r = rng(9)
    params = [r.standard_normal((8, 6)) * 0.4, np.zeros(6), r.standard_normal((6, 3)) * 0.4, np.zeros(3)]
    params = [p.astype(np.float32).astype(F64) for p in params]
    master = [Tensor(p.astype(np.float32)) for p in params]
    opt = SGD(master, lr=0.1, momentum=0.5)
    xs = [r.standard_normal((10, 8)).astype(np.float32) for _ in range(5)]
    ys = [r.integers(0, 3, 10) for _ in range(5)]

    def np_loss(p: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
        z = np.maximum(x @ p[0] + p[1], 0) @ p[2] + p[3]
        z = z - z.max(1, keepdims=True)
        return float(-(z - np.log(np.exp(z).sum(1, keepdims=True)))[np.arange(len(y)), y].mean())

    scale, skipped, mom = 2.0**24 if low == "half" else 2.0**10, 0, [np.zeros_like(p) for p in params]
    for x, y in zip(xs, ys):
        with Tensor.train():
            opt.zero_grad()
            w1, b1, w2, b2 = (m.cast(dt) for m in master)
            logits = ((Tensor(x).cast(dt) @ w1 + b1).relu() @ w2 + b2).float()
            loss = logits.sparse_categorical_crossentropy(Tensor(y))
            (loss * scale).backward()
            assert all(m.grad is not None and m.grad.dtype == dtypes.float32 for m in master)
            finite = all(bool(m.grad.isfinite().all().item()) for m in master if m.grad is not None)
            assert loss.item() == pytest.approx(np_loss(params, x.astype(F64), y), rel=3e-2, abs=3e-2)
            if not finite:  # overflow in the low-precision backward: skip the step, lower the scale
                before = [m.numpy().copy() for m in master]
                scale, skipped = scale / 2**8, skipped + 1
                assert all(np.array_equal(m.numpy(), b) for m, b in zip(master, before))
                continue
            for m in master:
                assert m.grad is not None
                m.grad = m.grad / scale
            opt.step()
        grads = [num_grad(partial(np_loss, params, x.astype(F64), y), p) for p in params]
        for i, (p, g) in enumerate(zip(params, grads)):
            mom[i] = 0.5 * mom[i] + g
            p -= 0.1 * mom[i]
        for m, p in zip(master, params):
            assert m.dtype == dtypes.float32
            np.testing.assert_allclose(m.numpy(), p, rtol=5e-2, atol=2e-2 if low == "half" else 5e-2)
    if low == "half":
        assert skipped >= 1, "a 2**24 loss scale must overflow float16 gradients"
    else:
        assert skipped == 0, "bfloat16 has float32's range: no overflow at 2**10"


# ---------------- checkpoint mid-training, resume gives identical results ----------------
def test_checkpoint_mid_training_resumes_identically(tmp_path: pathlib.Path) -> None:
    r = rng(10)
    init = [r.standard_normal((8, 5)) * 0.3, r.standard_normal(8) * 0.1, r.standard_normal((3, 8)) * 0.3,
            r.standard_normal(3) * 0.1]  # fmt: skip
    batches = [(r.standard_normal((6, 5)).astype(np.float32), r.integers(0, 3, 6).astype(np.int32)) for _ in range(6)]

    def make() -> tuple[MLP, Optimizer, Callable[[Tensor, Tensor], Tensor]]:
        model = MLP(*init)
        opt = AdamW(get_parameters(model), lr=0.02, weight_decay=0.1)

        @TinyJit
        @Tensor.train()
        def step(x: Tensor, y: Tensor) -> Tensor:
            opt.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(y).backward()
            opt.step()
            return loss.realize()

        return model, opt, step

    model, opt, step = make()
    straight = [step(Tensor(x), Tensor(y)).item() for x, y in batches]
    final = {k: v.numpy() for k, v in get_state_dict(model).items()}

    model, opt, step = make()
    first = [step(Tensor(x), Tensor(y)).item() for x, y in batches[:3]]
    ckpt = {**{f"model.{k}": v for k, v in get_state_dict(model).items()},
            **{f"opt.{k}": v for k, v in get_state_dict(opt).items()}}  # fmt: skip
    safe_save(ckpt, tmp_path / "ckpt.safetensors")
    step(Tensor(batches[3][0]), Tensor(batches[3][1]))  # training goes on after the save: the file must not change

    model2, opt2, step2 = make()
    loaded = safe_load(tmp_path / "ckpt.safetensors")
    state = {k.removeprefix("model."): v for k, v in loaded.items() if k.startswith("model.")}
    state["l3.weight"] = Tensor.zeros(2, 2)  # a key the model lacks: strict=False ignores it
    load_state_dict(model2, state, strict=False, verbose=False)
    load_state_dict(opt2, {k.removeprefix("opt."): v for k, v in loaded.items() if k.startswith("opt.")})
    rest = [step2(Tensor(x), Tensor(y)).item() for x, y in batches[3:]]
    assert first + rest == straight
    for k, v in get_state_dict(model2).items():
        np.testing.assert_array_equal(v.numpy(), final[k], err_msg=k)
    # the checkpoint file kept the step-3 values (saving snapshotted them; the step after did not leak in)
    again = safe_load(tmp_path / "ckpt.safetensors")
    b1_t = np.ones(1, np.float32)
    for _ in range(3):
        b1_t = b1_t * np.float32(0.9)
    np.testing.assert_array_equal(again["opt.b1_t"].numpy(), b1_t)


# ---------------- two of the programs on USB:SIM (the AMD backend in the RDNA3 emulator), against the CPU --------
def _moe_program(dev: str) -> list[np.ndarray]:
    r = rng(2)
    x = r.standard_normal((5, D)).astype(np.float32)
    params = [r.standard_normal((D, E)), r.standard_normal((E, D, H)) * 0.4, r.standard_normal((E, H, D)) * 0.4]
    ps = [Tensor(p.astype(np.float32), device=dev, requires_grad=True) for p in params]
    out, counts, aux = speck_moe(ps, Tensor(x, device=dev))
    loss = (out * out).mean() + 0.1 * aux
    loss.backward()
    return [out.numpy(), counts.numpy(), loss.numpy(), *[p.grad.numpy() for p in ps if p.grad is not None]]


def _decoder_program(dev: str) -> list[np.ndarray]:
    with Context(DEV=dev):
        r = rng(8)
        vocab, dim, n_heads, n_kv, window, max_ctx = 7, 8, 2, 1, 2, 5
        p = [r.standard_normal((vocab, dim)), r.standard_normal((max_ctx, dim)) * 0.5,
             *(r.standard_normal((dim, d)) * 0.3 for d in (dim, dim // 2, dim // 2, dim)),
             r.standard_normal((dim, vocab)) * 0.3]  # fmt: skip
        tokens = r.integers(0, vocab, max_ctx)
        model = SlidingGQADecoder(p, n_heads, n_kv, window, max_ctx)
        outs = [model(Tensor(tokens[None, :2].astype(np.int32)), 0).numpy()]
        for pos in range(2, max_ctx):
            outs.append(model(Tensor([[int(tokens[pos])]], dtype=dtypes.int32), pos).numpy())
        assert model.decode.captured is not None
        return outs


@pytest.mark.usefixtures("two_simulated_bridges")
@pytest.mark.parametrize("program", [_moe_program, _decoder_program], ids=["moe", "sliding_gqa_decoder"])
def test_program_on_usb_sim_matches_cpu(program: Callable[[str], list[np.ndarray]]) -> None:
    want, got = program("CPU"), program("USB:SIM")
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, i
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"output {i}")


class ConvNet:
    """beautiful_mnist's model, shrunk: conv, relu, conv, relu, BatchNorm, max_pool2d, dropout, linear."""

    def __init__(self) -> None:
        self.layers: list[Callable[[Tensor], Tensor]] = [
            nn.Conv2d(1, 4, 3), Tensor.relu, nn.Conv2d(4, 4, 3), Tensor.relu, nn.BatchNorm(4), Tensor.max_pool2d,
            lambda x: x.flatten(1), lambda x: x.dropout(0.1), nn.Linear(4 * 2 * 2, 3),
        ]  # fmt: skip

    def __call__(self, x: Tensor) -> Tensor:
        return x.sequential(self.layers)


def _conv_mnist_program(dev: str) -> tuple[list[float], list[float], list[np.ndarray], list[int], list[int]]:
    with Context(DEV=dev):
        Tensor.manual_seed(0)
        x_train = Tensor((rng(0).random((32, 1, 8, 8)) * 255).astype(np.uint8))
        y_train = Tensor(rng(1).integers(0, 3, 32).astype(np.int32))
        model = ConvNet()
        params = nn.state.get_parameters(model)
        opt = nn.optim.OptimizerGroup(nn.optim.Adam(params[:2], lr=1e-2),
                                      SGD(params[2:], lr=0.05, momentum=0.9, nesterov=True))  # fmt: skip

        @TinyJit
        @Tensor.train()
        def train_step() -> Tensor:
            opt.zero_grad()
            samples = Tensor.randint(8, high=x_train.shape[0])
            loss = model(x_train[samples].float() / 255).sparse_categorical_crossentropy(y_train[samples]).backward()
            opt.step()
            return loss

        @TinyJit
        def get_test_acc() -> Tensor:
            return (model(x_train.float() / 255).argmax(axis=1) == y_train).mean() * 100

        losses, kernels, ops = [], [], []
        for _ in range(4):
            GlobalCounters.reset()
            losses.append(train_step().item())
            kernels.append(GlobalCounters.kernel_count)
            ops.append(GlobalCounters.global_ops)
        accs = [get_test_acc().item() for _ in range(3)]
        return losses, accs, [p.numpy() for p in params], kernels, ops


@pytest.mark.usefixtures("two_simulated_bridges")
def test_conv_mnist_loop_on_usb_sim_matches_cpu() -> None:
    """The jitted conv training loop (BatchNorm, dropout, randint batches, an OptimizerGroup of Adam and nesterov
    SGD, a jitted accuracy) gives the CPU's losses, accuracies and parameters; GlobalCounters count the same kernels
    and, on the GPU, the whole launch's operations (they counted one work-item's: ~200x fewer)."""
    # (each program's second run is compared: a one-element buffer an earlier TinyJit capture in this process wrote
    # is assigned by copy rather than by sharing memory (writes.replay_written), one kernel more, so a first run's
    # kernel count depends on what ran before; after one run of its own each device has the same history)
    cpu, usb = [[_conv_mnist_program(d) for _ in range(2)][-1] for d in ("CPU", "USB:SIM")]
    np.testing.assert_allclose(usb[0], cpu[0], rtol=1e-5)
    assert usb[1] == cpu[1] and len(set(cpu[1])) == 1
    for g, w in zip(usb[2], cpu[2]):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert usb[3] == cpu[3] and len(set(cpu[3])) == 1 and cpu[3][0] > 0
    assert all(u >= c / 2 for u, c in zip(usb[4], cpu[4])), (usb[4], cpu[4])
