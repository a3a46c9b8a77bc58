"""Model programs, fourth set (with test_programs4.py): a padded text classifier the way Hugging Face-style code
feeds one (left padding, position ids from a cumsum of the attention mask, a boolean key-padding mask into
scaled_dot_product_attention, masked mean pooling) trained under TinyJit with an OptimizerGroup of LAMB for the
matrices and SGD for the rest; and a small CNN with reflect padding, ceil-mode max pooling and average pooling trained
with LARS. Checked against numpy float64: forward values, gradients by central differences, the optimizers' update
rules step by step."""

from __future__ import annotations

import math

import numpy as np
from gradcheck import num_grad

from speck.tensor import Tensor, TinyJit, nn
from speck.tensor.nn.optim import LAMB, LARS, SGD, OptimizerGroup
from speck.tensor.nn.state import get_state_dict

F64 = np.float64
P = dict[str, np.ndarray]


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(F64)


def init(model: object, seed: int, scale: float = 0.5) -> P:
    r, p = rng(seed), {}
    for k, t in get_state_dict(model).items():
        p[k] = f32(r.standard_normal(t.shape) * scale)
        t.replace(Tensor(p[k].astype(np.float32)).realize())
    return p


def np_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def np_xent(z: np.ndarray, y: np.ndarray) -> float:
    lp = z - z.max(-1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
    return float(-lp[np.arange(len(y)), y].mean())


def np_layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps) * w + b


# ---------------- padded text classifier: cumsum positions, key-padding mask, masked mean pooling ----------------
class TextClassifier:
    def __init__(self, vocab: int, max_pos: int, dim: int, n_heads: int, n_cls: int) -> None:
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(max_pos, dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.ln = nn.LayerNorm(dim)
        self.cls = nn.Linear(dim, n_cls)
        self.n_heads = n_heads

    def __call__(self, ids: Tensor, attention_mask: Tensor) -> Tensor:
        b, t = ids.shape
        position_ids = (attention_mask.cumsum(-1) - 1).maximum(0)  # left padding: the first real token is 0
        h = self.tok(ids) + self.pos(position_ids)
        q, k, v = (y.reshape(b, t, self.n_heads, -1).transpose(1, 2) for y in self.qkv(h).chunk(3, dim=-1))
        keep = (attention_mask == 1).reshape(b, 1, 1, t)  # keys only: every query sees the real tokens
        a = q.scaled_dot_product_attention(k, v, attn_mask=keep).transpose(1, 2).reshape(b, t, -1)
        h = self.ln(h + self.out(a))
        m = attention_mask.unsqueeze(-1).float()
        return self.cls((h * m).sum(1) / m.sum(1))


def np_text(p: P, ids: np.ndarray, am: np.ndarray, n_heads: int) -> np.ndarray:
    b, t = ids.shape
    d = p["tok.weight"].shape[1]
    pos = np.maximum(am.cumsum(-1) - 1, 0)
    h = p["tok.weight"][ids] + p["pos.weight"][pos]
    qkv = h @ p["qkv.weight"].T + p["qkv.bias"]
    q, k, v = (qkv[..., i * d : (i + 1) * d].reshape(b, t, n_heads, -1).transpose(0, 2, 1, 3) for i in range(3))
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // n_heads)
    s = np.where(am[:, None, None, :] == 1, s, -np.inf)
    a = (np_softmax(s) @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
    h = np_layernorm(h + a @ p["out.weight"].T + p["out.bias"], p["ln.weight"], p["ln.bias"])
    m = am[..., None].astype(F64)
    return (h * m).sum(1) / m.sum(1) @ p["cls.weight"].T + p["cls.bias"]


def np_lamb(p: P, g: P, st: dict, t: int, lr: float, wd: float, b1: float = 0.9, b2: float = 0.999,
            eps: float = 1e-6) -> None:  # fmt: skip
    for k, gk in g.items():
        m = st.setdefault(("m", k), np.zeros_like(gk))
        v = st.setdefault(("v", k), np.zeros_like(gk))
        m[...] = b1 * m + (1 - b1) * gk
        v[...] = b2 * v + (1 - b2) * gk * gk
        u = (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps) + wd * p[k]
        wn, un = np.linalg.norm(p[k]), np.linalg.norm(u)
        p[k] = p[k] - lr * (wn / un if wn > 0 and un > 0 else 1.0) * u


def test_padded_text_classifier_with_cumsum_positions_key_mask_and_optimizer_group() -> None:
    vocab, max_pos, dim, n_heads, n_cls, t = 13, 6, 8, 2, 3, 6
    model = TextClassifier(vocab, max_pos, dim, n_heads, n_cls)
    p = init(model, seed=1, scale=0.4)
    p["ln.weight"] += 1
    sd = get_state_dict(model)
    sd["ln.weight"].replace(Tensor(p["ln.weight"].astype(np.float32)).realize())
    mats = [k for k in p if p[k].ndim == 2]
    rest = [k for k in p if p[k].ndim != 2]
    opt = OptimizerGroup(LAMB([sd[k] for k in mats], lr=0.05, weight_decay=0.01), SGD([sd[k] for k in rest], lr=0.1))

    @TinyJit
    @Tensor.train()
    def step(ids: Tensor, am: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = model(ids, am).sparse_categorical_crossentropy(y).backward()
        opt.step()
        return loss.realize()

    r = rng(2)
    st: dict = {}
    for i in range(1, 5):
        lengths = r.integers(1, t + 1, 3)  # each row: left padding, then its real tokens
        am = (np.arange(t)[None] >= t - lengths[:, None]).astype(np.int32)
        ids = np.where(am == 1, r.integers(1, vocab, (3, t)), 0)
        y = r.integers(0, n_cls, 3)
        np_loss = lambda ids=ids, am=am, y=y: np_xent(np_text(p, ids, am, n_heads), y)
        want = np_loss()
        grads = {k: num_grad(np_loss, p[k]) for k in p}
        if i == 1:  # the forward alone, and the gradients, before the jitted steps
            np.testing.assert_allclose(model(Tensor(ids), Tensor(am)).numpy(), np_text(p, ids, am, n_heads), rtol=1e-4,
                                       atol=1e-5)  # fmt: skip
            with Tensor.train():
                opt.zero_grad()
                model(Tensor(ids), Tensor(am)).sparse_categorical_crossentropy(Tensor(y)).backward()
                for k in p:
                    got = sd[k].grad
                    assert got is not None, k
                    np.testing.assert_allclose(got.numpy(), grads[k], rtol=2e-3, atol=2e-5, err_msg=k)
        np.testing.assert_allclose(step(Tensor(ids), Tensor(am), Tensor(y)).item(), want, rtol=1e-5, err_msg=f"{i}")
        np_lamb(p, {k: grads[k] for k in mats}, st, i, lr=0.05, wd=0.01)
        for k in rest:
            p[k] = p[k] - 0.1 * grads[k]
        for k in p:
            np.testing.assert_allclose(sd[k].numpy(), p[k], rtol=1e-4, atol=1e-5, err_msg=f"{k} step {i}")
    assert step.cnt == 4  # the last two steps were replays
    # padding is invisible: the same sentence with more left padding classifies identically
    am1, am2 = np.array([[0, 0, 1, 1, 1, 1]]), np.array([[0, 0, 0, 0, 1, 1]])
    ids1, ids2 = np.array([[0, 0, 4, 5, 6, 7]]), np.array([[0, 0, 0, 0, 6, 7]])
    am3, ids3 = np.array([[0, 0, 0, 1, 1, 1]]), np.array([[0, 9, 3, 5, 6, 7]])  # junk under the mask
    got = [model(Tensor(a.astype(np.int32)), Tensor(m.astype(np.int32))).numpy() for a, m in ((ids1, am1),
                                                                                              (ids2, am2))]  # fmt: skip
    np.testing.assert_allclose(got[0], np_text(p, ids1, am1, n_heads), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[1], np_text(p, ids2, am2, n_heads), rtol=1e-4, atol=1e-5)
    clean = np.where(am3 == 1, ids3, 0)
    np.testing.assert_allclose(model(Tensor(ids3.astype(np.int32)), Tensor(am3.astype(np.int32))).numpy(),
                               np_text(p, clean, am3, n_heads), rtol=1e-4, atol=1e-5)  # fmt: skip


# ---------------- CNN: reflect padding, ceil-mode max pooling, average pooling, LARS ----------------
class PoolNet:
    def __init__(self) -> None:
        self.c1 = nn.Conv2d(2, 3, 3)
        self.c2 = nn.Conv2d(3, 4, 2)
        self.fc = nn.Linear(4, 3)

    def __call__(self, x: Tensor) -> Tensor:
        h = self.c1(x.pad((1, 1, 1, 1), mode="reflect")).relu()
        h = h.max_pool2d(kernel_size=2, stride=2, ceil_mode=True)  # 5x5 -> 3x3, the last window partial
        h = self.c2(h).relu().avg_pool2d(kernel_size=2)
        return self.fc(h.flatten(1))


def np_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    k = w.shape[2]
    ho, wo = x.shape[2] - k + 1, x.shape[3] - k + 1
    out = sum(np.einsum("nchw,oc->nohw", x[:, :, i : i + ho, j : j + wo], w[:, :, i, j]) for i in range(k)
              for j in range(k))  # fmt: skip
    return out + b[None, :, None, None]


def np_poolnet(p: P, x: np.ndarray) -> np.ndarray:
    h = np.maximum(np_conv(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), mode="reflect"), p["c1.weight"], p["c1.bias"]),
                   0)  # fmt: skip
    n = math.ceil((h.shape[2] - 2) / 2) + 1
    pooled = np.stack([np.stack([h[:, :, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2].max((2, 3)) for j in range(n)], -1)
                       for i in range(n)], -2)  # fmt: skip
    h = np.maximum(np_conv(pooled, p["c2.weight"], p["c2.bias"]), 0)
    h = h.reshape(h.shape[0], h.shape[1], 1, 2, 1, 2).mean((3, 5))
    return h.reshape(h.shape[0], -1) @ p["fc.weight"].T + p["fc.bias"]


def test_cnn_reflect_pad_ceil_mode_pooling_trains_with_lars() -> None:
    model = PoolNet()
    p = init(model, seed=3, scale=0.5)
    sd = get_state_dict(model)
    lr, mom, wd, tc = 0.5, 0.9, 1e-3, 0.02
    opt = LARS([sd[k] for k in p], lr=lr, momentum=mom, weight_decay=wd, tcoef=tc)
    r = rng(4)
    buf: P = {}
    for step in range(3):
        x, y = f32(r.standard_normal((3, 2, 5, 5))), r.integers(0, 3, 3)
        np_loss = lambda x=x, y=y: np_xent(np_poolnet(p, x), y)
        grads = {k: num_grad(np_loss, p[k]) for k in p}
        with Tensor.train():
            opt.zero_grad()
            out = model(Tensor(x.astype(np.float32)))
            np.testing.assert_allclose(out.numpy(), np_poolnet(p, x), rtol=1e-4, atol=1e-5)
            out.sparse_categorical_crossentropy(Tensor(y.astype(np.int32))).backward()
            if step == 0:
                for k in p:
                    got = sd[k].grad
                    assert got is not None, k
                    np.testing.assert_allclose(got.numpy(), grads[k], rtol=2e-3, atol=2e-5, err_msg=k)
            opt.step()
        for k in p:  # LARS: trust ratio, weight decay into the gradient, scaled by ratio*lr, then momentum
            wn, gn = np.linalg.norm(p[k]), np.linalg.norm(grads[k])
            ratio = tc * wn / (gn + wd * wn) if wn > 0 and gn > 0 else 1.0
            g = (grads[k] + wd * p[k]) * ratio * lr
            buf[k] = g if k not in buf else mom * buf[k] + g
            p[k] = p[k] - buf[k]
            np.testing.assert_allclose(sd[k].numpy(), p[k], rtol=1e-4, atol=1e-6, err_msg=f"{k} step {step}")


# ---------------- shared encoder called three times: triplet margin loss plus distillation from a teacher ----------
class Encoder:
    def __init__(self, n_in: int, n_hid: int, n_out: int) -> None:
        self.l1, self.l2 = nn.Linear(n_in, n_hid), nn.Linear(n_hid, n_out)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x).silu())


def np_encoder(p: P, x: np.ndarray, pre: str = "") -> np.ndarray:
    h = x @ p[f"{pre}l1.weight"].T + p[f"{pre}l1.bias"]
    return (h / (1 + np.exp(-h))) @ p[f"{pre}l2.weight"].T + p[f"{pre}l2.bias"]


def np_log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def np_siamese_loss(p: P, t: P, a: np.ndarray, pos: np.ndarray, neg: np.ndarray, temp: float, margin: float) -> float:
    ea, ep, en = (np_encoder(p, x) for x in (a, pos, neg))
    unit = lambda e: e / np.maximum(np.linalg.norm(e, axis=-1, keepdims=True), 1e-12)
    ua, up, un = unit(ea), unit(ep), unit(en)
    trip = np.maximum(((ua - up) ** 2).sum(-1) - ((ua - un) ** 2).sum(-1) + margin, 0).mean()
    lt = np_log_softmax(np_encoder(t, a) / temp)
    ls = np_log_softmax(ea / temp)
    kl = (np.exp(lt) * (lt - ls)).sum(-1).mean() * temp**2
    return float(trip + kl)


def test_shared_encoder_triplet_loss_with_teacher_distillation() -> None:
    student, teacher = Encoder(4, 6, 5), Encoder(4, 6, 5)
    p, t = init(student, seed=5, scale=0.5), init(teacher, seed=6, scale=0.8)
    sd = get_state_dict(student)
    temp, margin = 2.0, 0.5
    opt = SGD(list(sd.values()), lr=0.1, momentum=0.9)
    r = rng(7)
    buf: P = {}
    for step in range(3):
        a, pos, neg = (f32(r.standard_normal((6, 4))) for _ in range(3))
        at, pt, nt = (Tensor(x.astype(np.float32)) for x in (a, pos, neg))
        with Tensor.train():
            opt.zero_grad()
            ea, ep, en = student(at), student(pt), student(nt)  # one set of weights, three graphs
            ua, up, un = (e / (e.square().sum(-1, keepdim=True).sqrt().maximum(1e-12)) for e in (ea, ep, en))
            trip = ((ua - up).square().sum(-1) - (ua - un).square().sum(-1) + margin).relu().mean()
            lt = (teacher(at).detach() / temp).log_softmax(-1)
            kl = (lt.exp() * (lt - (ea / temp).log_softmax(-1))).sum(-1).mean() * temp**2
            loss = (trip + kl).backward()
            np_loss = lambda a=a, pos=pos, neg=neg: np_siamese_loss(p, t, a, pos, neg, temp, margin)
            np.testing.assert_allclose(loss.item(), np_loss(), rtol=1e-5, err_msg=f"step {step}")
            grads = {k: num_grad(np_loss, p[k]) for k in p}
            for k, tk in sd.items():
                assert tk.grad is not None, k
                np.testing.assert_allclose(tk.grad.numpy(), grads[k], rtol=2e-3, atol=2e-5, err_msg=f"{k} {step}")
            for k, tk in get_state_dict(teacher).items():  # the teacher is frozen: detached, never stepped
                assert tk.grad is None or not tk.grad.numpy().any(), k
            opt.step()
        for k in p:
            buf[k] = grads[k] if k not in buf else 0.9 * buf[k] + grads[k]
            p[k] = p[k] - 0.1 * buf[k]
            np.testing.assert_allclose(sd[k].numpy(), p[k], rtol=1e-4, atol=1e-5, err_msg=f"{k} step {step}")
    for k, tk in get_state_dict(teacher).items():
        np.testing.assert_array_equal(tk.numpy(), t[k].astype(np.float32), err_msg=k)
