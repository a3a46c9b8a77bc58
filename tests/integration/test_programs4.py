"""Whole model programs, fourth set, written the way tinygrad user code writes them (the names `from tinygrad import
...` gives, here from speck.tensor): a GPT block with rotary embeddings gathered per position and rotated with cat,
causal scaled_dot_product_attention, trained with AdamW, then decoding with a KV cache under TinyJit with a bound
start_pos Variable; a GRU cell unrolled by hand; a ResNet basic block whose BatchNorm running statistics are read
right after a training forward (before anything is realized) and then used in eval mode; a VAE with the
reparameterisation trick; a GAN step with two optimizers; a U-Net-ish path through conv_transpose2d and
interpolate. Each is checked against a numpy float64 re-implementation of the same math: forward values, gradients
by central differences of the numpy forward, and the optimizer's update rule over a few steps."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from gradcheck import num_grad

from speck.tensor import Tensor, TinyJit, Variable, nn
from speck.tensor.nn.optim import SGD, Adam, AdamW
from speck.tensor.nn.state import get_state_dict

F64 = np.float64
P = dict[str, np.ndarray]


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def load(t: Tensor, x: np.ndarray) -> Tensor:
    t.replace(Tensor(np.asarray(x, np.float32)).realize())
    return t


def init(model: object, seed: int, scale: float = 0.5, skip: tuple[str, ...] = ()) -> P:
    """Every parameter replaced by seeded normals (float32); the float64 copies the numpy reference works on."""
    r, p = rng(seed), {}
    for k, t in get_state_dict(model).items():
        if k.startswith(skip):
            continue
        load(t, r.standard_normal(t.shape) * scale)
        p[k] = t.numpy().astype(F64)
    return p


def np_grads(f: Callable[[], float], p: P, keys: list[str]) -> P:
    return {k: num_grad(f, p[k]) for k in keys}


def check_grads(got: dict[str, Tensor], want: P, rtol: float = 2e-3, atol: float = 2e-5) -> None:
    Tensor.realize(*[t.grad for t in got.values() if t.grad is not None])
    for k, t in got.items():
        assert t.grad is not None, f"{k} has no gradient"
        np.testing.assert_allclose(t.grad.numpy(), want[k], rtol=rtol, atol=atol, err_msg=k)


def np_adam(p: P, g: P, st: dict, t: int, lr: float, wd: float = 0.0, b1: float = 0.9, b2: float = 0.999,
            eps: float = 1e-8) -> None:  # fmt: skip
    """One AdamW step (decoupled weight decay) on p in place; st holds the moments."""
    for k, gk in g.items():
        m = st.setdefault(("m", k), np.zeros_like(gk))
        v = st.setdefault(("v", k), np.zeros_like(gk))
        m[...] = b1 * m + (1 - b1) * gk
        v[...] = b2 * v + (1 - b2) * gk * gk
        upd = (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
        p[k] = p[k] - lr * (upd + wd * p[k])


def np_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def np_xent(logits: np.ndarray, y: np.ndarray) -> float:
    z = logits.reshape(-1, logits.shape[-1])
    lp = z - z.max(-1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
    return float(-lp[np.arange(len(z)), y.reshape(-1)].mean())


def np_layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps) * w + b


def np_gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def np_sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


# ---------------- GPT block: RoPE by gather + cat, causal SDPA, AdamW; then KV-cache decode under TinyJit ----------
def rope_tables(max_ctx: int, head_dim: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin of pos * base^(-2i/d), each half repeated (the rotate-half layout), shape (max_ctx, head_dim)."""
    inv = base ** (-np.arange(0, head_dim, 2) / head_dim)
    ang = np.arange(max_ctx)[:, None] * inv[None]
    return np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return Tensor.cat(-x[..., half:], x[..., :half], dim=-1)


class GPTBlock:
    def __init__(self, vocab: int, dim: int, n_heads: int, max_ctx: int) -> None:
        self.tok_emb = nn.Embedding(vocab, dim)
        self.ln1, self.ln2, self.ln_f = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.n_heads, self.head_dim, self.max_ctx = n_heads, dim // n_heads, max_ctx
        cos, sin = rope_tables(max_ctx, self.head_dim)
        # tables, not parameters: kept out of the optimizer's list by the caller
        self.rope = (Tensor(cos.astype(np.float32)).realize(), Tensor(sin.astype(np.float32)).realize())

    def heads(self, x: Tensor) -> Tensor:
        return x.reshape(x.shape[0], x.shape[1], self.n_heads, self.head_dim).transpose(1, 2)

    def rotary(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        return x * cos + rotate_half(x) * sin

    def __call__(self, idx: Tensor, positions: Tensor) -> Tensor:
        """Training forward: positions (B, T) of int, one row per sequence (the tables are gathered per token)."""
        b, t = idx.shape
        gidx = positions.reshape(b * t, 1).expand(b * t, self.head_dim)
        cos, sin = (tab.gather(0, gidx).reshape(b, 1, t, self.head_dim) for tab in self.rope)
        h = self.tok_emb(idx)
        x = self.ln1(h)
        q, k, v = self.heads(self.wq(x)), self.heads(self.wk(x)), self.heads(self.wv(x))
        q, k = self.rotary(q, cos, sin), self.rotary(k, cos, sin)
        a = q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
        h = h + self.wo(a)
        h = h + self.fc2(self.fc1(self.ln2(h)).gelu())
        return self.lm_head(self.ln_f(h))

    def decode(self, idx: Tensor, start_pos: Variable | int) -> Tensor:
        """Inference with a KV cache: idx (B, T) continues the sequences at start_pos; the logits of the last token."""
        b, t = idx.shape
        if not hasattr(self, "cache_k"):
            self.cache_k = Tensor.zeros(b, self.n_heads, self.max_ctx, self.head_dim).contiguous().realize()
            self.cache_v = Tensor.zeros(b, self.n_heads, self.max_ctx, self.head_dim).contiguous().realize()
        cos, sin = (tab.shrink(((start_pos, start_pos + t), None)).reshape(1, 1, t, self.head_dim) for tab in self.rope)
        h = self.tok_emb(idx)
        x = self.ln1(h)
        q, k, v = self.heads(self.wq(x)), self.heads(self.wk(x)), self.heads(self.wv(x))
        q, k = self.rotary(q, cos, sin), self.rotary(k, cos, sin)
        self.cache_k.shrink((None, None, (start_pos, start_pos + t), None)).assign(k).realize()
        self.cache_v.shrink((None, None, (start_pos, start_pos + t), None)).assign(v).realize()
        keys = self.cache_k.shrink((None, None, (0, start_pos + t), None))
        values = self.cache_v.shrink((None, None, (0, start_pos + t), None))
        a = q.scaled_dot_product_attention(keys, values, is_causal=t > 1).transpose(1, 2).reshape(b, t, -1)
        h = h + self.wo(a)
        h = h + self.fc2(self.fc1(self.ln2(h)).gelu())
        return self.lm_head(self.ln_f(h[:, -1:, :])).realize()


def np_gpt(p: P, idx: np.ndarray, pos: np.ndarray, n_heads: int, max_ctx: int) -> np.ndarray:
    b, t = idx.shape
    d = p["tok_emb.weight"].shape[1]
    hd = d // n_heads
    cos, sin = rope_tables(max_ctx, hd)
    cos, sin = cos[pos][:, None], sin[pos][:, None]  # (B, 1, T, hd)

    def rot(y: np.ndarray) -> np.ndarray:
        return y * cos + np.concatenate([-y[..., hd // 2 :], y[..., : hd // 2]], -1) * sin

    h = p["tok_emb.weight"][idx]
    x = np_layernorm(h, p["ln1.weight"], p["ln1.bias"])
    q, k, v = ((x @ p[f"{n}.weight"].T).reshape(b, t, n_heads, hd).transpose(0, 2, 1, 3) for n in ("wq", "wk", "wv"))
    q, k = rot(q), rot(k)
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)
    s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
    a = (np_softmax(s) @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
    h = h + a @ p["wo.weight"].T
    x = np_layernorm(h, p["ln2.weight"], p["ln2.bias"])
    h = h + np_gelu(x @ p["fc1.weight"].T + p["fc1.bias"]) @ p["fc2.weight"].T + p["fc2.bias"]
    return np_layernorm(h, p["ln_f.weight"], p["ln_f.bias"]) @ p["lm_head.weight"].T


def test_gpt_block_rope_gather_causal_sdpa_adamw_then_kv_cache_jit_decode() -> None:
    vocab, dim, n_heads, max_ctx = 11, 8, 2, 12
    model = GPTBlock(vocab, dim, n_heads, max_ctx)
    p = init(model, seed=1, scale=0.4, skip=("rope",))
    sd = get_state_dict(model)
    keys = list(p)
    params = {k: sd[k] for k in keys}
    r = rng(2)
    idx = r.integers(0, vocab, (2, 5))
    y = r.integers(0, vocab, (2, 5))
    pos = np.array([[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]])  # the second sequence continues a longer one
    it, yt, pt = Tensor(idx.astype(np.int32)), Tensor(y.astype(np.int32)), Tensor(pos.astype(np.int32))
    opt = AdamW(list(params.values()), lr=0.02, weight_decay=0.1)
    st: dict = {}
    for step in range(1, 4):
        np_loss = lambda: np_xent(np_gpt(p, idx, pos, n_heads, max_ctx), y)
        want_loss = np_loss()
        grads = np_grads(np_loss, p, keys)
        with Tensor.train():
            opt.zero_grad()
            loss = model(it, pt).sparse_categorical_crossentropy(yt).backward()
            np.testing.assert_allclose(loss.item(), want_loss, rtol=1e-5, err_msg=f"step {step}")
            if step == 1:
                check_grads(params, grads)
            opt.step()
        np_adam(p, grads, st, step, lr=0.02, wd=0.1)
        for k in keys:
            np.testing.assert_allclose(params[k].numpy(), p[k], rtol=1e-4, atol=2e-5, err_msg=f"{k} step {step}")
    # decode: a prompt of 3 tokens eagerly, then one token at a time under TinyJit, start_pos a bound Variable
    jit_decode = TinyJit(model.decode)
    seq = np.array([[1, 5, 7], [2, 2, 9]])
    logits = model.decode(Tensor(seq.astype(np.int32)), 0)
    for i in range(5):
        pos_all = np.broadcast_to(np.arange(seq.shape[1]), seq.shape)
        want = np_gpt(p, seq, pos_all, n_heads, max_ctx)[:, -1]
        np.testing.assert_allclose(logits.numpy()[:, 0], want, rtol=1e-4, atol=1e-4, err_msg=f"decode {i}")
        nxt = want.argmax(-1)[:, None]
        sp = Variable("start_pos", 1, max_ctx - 1).bind(seq.shape[1])
        logits = jit_decode(Tensor(nxt.astype(np.int32)), sp)
        seq = np.concatenate([seq, nxt], 1)
    assert jit_decode.cnt == 5


# ---------------- GRU cell unrolled by hand over time, SGD with momentum and nesterov ----------------
class GRUCell:
    def __init__(self, n_in: int, n_hid: int) -> None:
        self.w_ih, self.w_hh = nn.Linear(n_in, 3 * n_hid), nn.Linear(n_hid, 3 * n_hid)
        self.n = n_hid

    def __call__(self, x: Tensor, h: Tensor) -> Tensor:
        gi, gh = self.w_ih(x).chunk(3, dim=-1), self.w_hh(h).chunk(3, dim=-1)
        r, z = (gi[0] + gh[0]).sigmoid(), (gi[1] + gh[1]).sigmoid()
        n = (gi[2] + r * gh[2]).tanh()
        return (1 - z) * n + z * h


class GRUClassifier:
    def __init__(self, n_in: int, n_hid: int, n_out: int) -> None:
        self.cell, self.head = GRUCell(n_in, n_hid), nn.Linear(n_hid, n_out)

    def __call__(self, xs: Tensor) -> Tensor:
        h = Tensor.zeros(xs.shape[0], self.cell.n)
        outs = []
        for t in range(xs.shape[1]):
            h = self.cell(xs[:, t], h)
            outs.append(h)
        return self.head(Tensor.stack(*outs, dim=1).mean(1))


def np_gru(p: P, xs: np.ndarray) -> np.ndarray:
    n = p["cell.w_hh.weight"].shape[1]
    h = np.zeros((xs.shape[0], n))
    outs = []
    for t in range(xs.shape[1]):
        gi = xs[:, t] @ p["cell.w_ih.weight"].T + p["cell.w_ih.bias"]
        gh = h @ p["cell.w_hh.weight"].T + p["cell.w_hh.bias"]
        r, z = np_sigmoid(gi[:, :n] + gh[:, :n]), np_sigmoid(gi[:, n : 2 * n] + gh[:, n : 2 * n])
        c = np.tanh(gi[:, 2 * n :] + r * gh[:, 2 * n :])
        h = (1 - z) * c + z * h
        outs.append(h)
    return np.mean(outs, 0) @ p["head.weight"].T + p["head.bias"]


def test_gru_cell_unrolled_over_time_trains_with_nesterov_sgd() -> None:
    model = GRUClassifier(3, 4, 3)
    p = init(model, seed=3, scale=0.6)
    sd = get_state_dict(model)
    keys = list(p)
    r = rng(4)
    xs, y = r.standard_normal((3, 5, 3)).astype(np.float32).astype(F64), np.array([0, 2, 1])
    xt, yt = Tensor(xs.astype(np.float32)), Tensor(y.astype(np.int32))
    lr, mom, wd = 0.1, 0.9, 0.01
    opt = SGD([sd[k] for k in keys], lr=lr, momentum=mom, nesterov=True, weight_decay=wd)
    buf: P = {}
    for step in range(3):
        np_loss = lambda: np_xent(np_gru(p, xs), y)
        grads = np_grads(np_loss, p, keys)
        with Tensor.train():
            opt.zero_grad()
            loss = model(xt).sparse_categorical_crossentropy(yt).backward()
            np.testing.assert_allclose(loss.item(), np_loss(), rtol=1e-5)
            if step == 0:
                check_grads({k: sd[k] for k in keys}, grads)
            opt.step()
        for k in keys:  # torch's SGD: weight decay into the gradient, then the momentum buffer, nesterov look-ahead
            g = grads[k] + wd * p[k]
            buf[k] = g if k not in buf else mom * buf[k] + g
            p[k] = p[k] - lr * (g + mom * buf[k])
            np.testing.assert_allclose(sd[k].numpy(), p[k], rtol=1e-4, atol=1e-5, err_msg=f"{k} step {step}")


# ---------------- ResNet basic block: BatchNorm statistics read before realize, under TinyJit, then eval ----------
class BasicBlock:
    def __init__(self, c_in: int, c: int) -> None:
        self.conv1 = nn.Conv2d(c_in, c, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.short = [nn.Conv2d(c_in, c, 1, stride=2, bias=False), nn.BatchNorm2d(c)]
        self.fc = nn.Linear(c, 2)

    def __call__(self, x: Tensor) -> Tensor:
        out = self.bn2(self.conv2(self.bn1(self.conv1(x)).relu()))
        return self.fc((out + x.sequential(self.short)).relu().mean((2, 3)))


BNS = ("bn1", "bn2", "short.1")
STATS = ("running_mean", "running_var", "num_batches_tracked")


def np_conv2d(x: np.ndarray, w: np.ndarray, stride: int = 1, pad: int = 0) -> np.ndarray:
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    kh, kw = w.shape[2:]
    ho, wo = (xp.shape[2] - kh) // stride + 1, (xp.shape[3] - kw) // stride + 1
    return sum(np.einsum("nchw,oc->nohw", xp[:, :, a : a + stride * ho : stride, b : b + stride * wo : stride],
                         w[:, :, a, b]) for a in range(kh) for b in range(kw))  # fmt: skip


def np_block(p: P, x: np.ndarray, train: bool, stats: dict | None = None) -> np.ndarray:
    def bn(y: np.ndarray, name: str) -> np.ndarray:
        if train:
            mean, var = y.mean((0, 2, 3)), y.var((0, 2, 3))
            if stats is not None:
                stats[name] = (mean, var * (y.size / y.shape[1]) / (y.size / y.shape[1] - 1))
        else:
            mean, var = p[f"{name}.running_mean"], p[f"{name}.running_var"]
        c = lambda a: a[None, :, None, None]
        return (y - c(mean)) / np.sqrt(c(var) + 1e-5) * c(p[f"{name}.weight"]) + c(p[f"{name}.bias"])

    out = bn(np_conv2d(np.maximum(bn(np_conv2d(x, p["conv1.weight"], 2, 1), "bn1"), 0), p["conv2.weight"], 1, 1), "bn2")
    out = np.maximum(out + bn(np_conv2d(x, p["short.0.weight"], 2), "short.1"), 0)
    return out.mean((2, 3)) @ p["fc.weight"].T + p["fc.bias"]


def test_resnet_block_batchnorm_stats_read_before_realize_under_jit_and_in_eval() -> None:
    model = BasicBlock(2, 2)
    p = init(model, seed=5, scale=0.5, skip=tuple(f"{b}.{s}" for b in BNS for s in STATS))
    for b in BNS:
        p[f"{b}.weight"] += 1.0  # gains near 1
        p.update({f"{b}.{s}": v for s, v in zip(STATS[:2], (np.zeros(2), np.ones(2)))})
    sd = get_state_dict(model)
    for b in BNS:
        load(sd[f"{b}.weight"], p[f"{b}.weight"])
    train_keys = [k for k in sd if not k.endswith(STATS)]
    r = rng(6)
    batches = [r.standard_normal((3, 2, 4, 4)).astype(np.float32).astype(F64) for _ in range(4)]
    y = np.array([1, 0, 1])
    yt = Tensor(y.astype(np.int32))
    opt = SGD([sd[k] for k in train_keys], lr=0.1)

    def np_update_stats(stats: dict) -> None:
        for b, (mean, var) in stats.items():
            p[f"{b}.running_mean"] = 0.9 * p[f"{b}.running_mean"] + 0.1 * mean
            p[f"{b}.running_var"] = 0.9 * p[f"{b}.running_var"] + 0.1 * var

    # 1) eagerly: the statistics read right after the training forward, before the loss (or anything) is realized
    x0 = batches[0]
    with Tensor.train():
        out = model(Tensor(x0.astype(np.float32)))
        got_mean = model.bn1.running_mean.numpy()  # tinygrad reads the updated value here
        got_var = model.short[1].running_var.numpy()
        stats: dict = {}
        np_loss = lambda: np_xent(np_block(p, x0, True), y)
        want_loss = np_xent(np_block(p, x0, True, stats), y)
        np_update_stats(stats)
        np.testing.assert_allclose(got_mean, p["bn1.running_mean"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got_var, p["short.1.running_var"], rtol=1e-5, atol=1e-6)
        grads = np_grads(np_loss, p, train_keys)
        opt.zero_grad()
        loss = out.sparse_categorical_crossentropy(yt).backward()
        np.testing.assert_allclose(loss.item(), want_loss, rtol=1e-5)
        check_grads({k: sd[k] for k in train_keys}, grads)
        opt.step()
    for k in train_keys:
        p[k] = p[k] - 0.1 * grads[k]
    for b in BNS:  # the statistics moved once, not once per read and once per realize
        for s in STATS[:2]:
            np.testing.assert_allclose(sd[f"{b}.{s}"].numpy(), p[f"{b}.{s}"], rtol=1e-5, atol=1e-6, err_msg=f"{b}.{s}")
        assert sd[f"{b}.num_batches_tracked"].item() == 1

    # 2) under TinyJit: each replay updates the statistics from its own batch
    @TinyJit
    @Tensor.train()
    def step(x: Tensor) -> Tensor:
        opt.zero_grad()
        loss = model(x).sparse_categorical_crossentropy(yt).backward()
        opt.step()
        return loss.realize()

    for i, xb in enumerate(batches[1:], 1):
        stats = {}
        want_loss = np_xent(np_block(p, xb, True, stats), y)
        grads = np_grads(lambda xb=xb: np_xent(np_block(p, xb, True), y), p, train_keys)
        np.testing.assert_allclose(step(Tensor(xb.astype(np.float32))).item(), want_loss, rtol=1e-5, err_msg=f"{i}")
        np_update_stats(stats)
        for k in train_keys:
            p[k] = p[k] - 0.1 * grads[k]
        for b in BNS:
            np.testing.assert_allclose(sd[f"{b}.running_mean"].numpy(), p[f"{b}.running_mean"], rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(sd[f"{b}.running_var"].numpy(), p[f"{b}.running_var"], rtol=1e-4, atol=1e-6)
            assert sd[f"{b}.num_batches_tracked"].item() == i + 1
    # 3) eval: the running statistics, no update
    xe = r.standard_normal((2, 2, 4, 4)).astype(np.float32).astype(F64)
    before = model.bn2.running_mean.numpy()
    np.testing.assert_allclose(model(Tensor(xe.astype(np.float32))).numpy(), np_block(p, xe, False), rtol=1e-4,
                               atol=1e-5)  # fmt: skip
    np.testing.assert_array_equal(model.bn2.running_mean.numpy(), before)


# ---------------- VAE: reparameterisation with seeded noise, BCE + KL, Adam ----------------
class VAE:
    def __init__(self, n_in: int, n_hid: int, n_z: int) -> None:
        self.enc, self.mu, self.logvar = nn.Linear(n_in, n_hid), nn.Linear(n_hid, n_z), nn.Linear(n_hid, n_z)
        self.dec1, self.dec2 = nn.Linear(n_z, n_hid), nn.Linear(n_hid, n_in)

    def __call__(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        h = self.enc(x).relu()
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + (logvar * 0.5).exp() * Tensor.randn(*mu.shape)
        return self.dec2(self.dec1(z).tanh()).sigmoid(), mu, logvar

    def loss(self, x: Tensor) -> Tensor:
        recon, mu, logvar = self(x)
        kl = -0.5 * (1 + logvar - mu.square() - logvar.exp()).sum()
        return (recon.binary_crossentropy(x, reduction="sum") + kl) / x.shape[0]


def np_vae_loss(p: P, x: np.ndarray, eps: np.ndarray) -> float:
    h = np.maximum(x @ p["enc.weight"].T + p["enc.bias"], 0)
    mu, logvar = h @ p["mu.weight"].T + p["mu.bias"], h @ p["logvar.weight"].T + p["logvar.bias"]
    z = mu + np.exp(0.5 * logvar) * eps
    rec = np_sigmoid(np.tanh(z @ p["dec1.weight"].T + p["dec1.bias"]) @ p["dec2.weight"].T + p["dec2.bias"])
    bce = -(x * np.log(rec) + (1 - x) * np.log(1 - rec)).sum()
    kl = -0.5 * (1 + logvar - mu**2 - np.exp(logvar)).sum()
    return float((bce + kl) / len(x))


def test_vae_reparameterisation_with_seeded_noise_trains_with_adam() -> None:
    model = VAE(6, 5, 2)
    p = init(model, seed=7, scale=0.5)
    sd = get_state_dict(model)
    keys = list(p)
    x = rng(8).random((4, 6)).astype(np.float32).astype(F64)  # pixel intensities in [0, 1)
    xt = Tensor(x.astype(np.float32))
    opt = Adam([sd[k] for k in keys], lr=0.01)
    st: dict = {}
    for step in range(1, 4):
        Tensor.manual_seed(100 + step)
        eps = Tensor.randn(4, 2).numpy().astype(F64)  # the noise the forward below draws
        Tensor.manual_seed(100 + step)
        opt.zero_grad()
        with Tensor.train():
            loss = model.loss(xt).backward()
            np_loss = lambda eps=eps: np_vae_loss(p, x, eps)
            np.testing.assert_allclose(loss.item(), np_loss(), rtol=1e-5, err_msg=f"step {step}")
            grads = np_grads(np_loss, p, keys)
            if step == 1:
                check_grads({k: sd[k] for k in keys}, grads)
            opt.step()
        np_adam(p, grads, st, step, lr=0.01)
        for k in keys:
            np.testing.assert_allclose(sd[k].numpy(), p[k], rtol=1e-4, atol=1e-5, err_msg=f"{k} step {step}")
    # same seed, same noise; another seed, other noise
    Tensor.manual_seed(7)
    a = model.loss(xt).item()
    Tensor.manual_seed(7)
    assert model.loss(xt).item() == a
    Tensor.manual_seed(8)
    assert model.loss(xt).item() != a


# ---------------- GAN: discriminator and generator steps with their own optimizers ----------------
class Generator:
    def __init__(self) -> None:
        self.l1, self.l2 = nn.Linear(3, 6), nn.Linear(6, 2)

    def __call__(self, z: Tensor) -> Tensor:
        return self.l2(self.l1(z).relu())


class Discriminator:
    def __init__(self) -> None:
        self.l1, self.l2 = nn.Linear(2, 6), nn.Linear(6, 1)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x).leaky_relu(0.2))


def np_gen(p: P, z: np.ndarray) -> np.ndarray:
    return np.maximum(z @ p["l1.weight"].T + p["l1.bias"], 0) @ p["l2.weight"].T + p["l2.bias"]


def np_disc(p: P, x: np.ndarray) -> np.ndarray:
    h = x @ p["l1.weight"].T + p["l1.bias"]
    return np.where(h > 0, h, 0.2 * h) @ p["l2.weight"].T + p["l2.bias"]


def np_bce_logits(z: np.ndarray, y: float) -> float:
    return float((np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))).mean())


def test_gan_step_with_two_optimizers_matches_numpy() -> None:
    G, D = Generator(), Discriminator()
    pg, pd = init(G, seed=9), init(D, seed=10)
    sg, sdd = get_state_dict(G), get_state_dict(D)
    opt_g = Adam(list(sg.values()), lr=0.01, b1=0.5)
    opt_d = SGD(list(sdd.values()), lr=0.05, momentum=0.5)
    r = rng(11)
    st: dict = {}
    buf: P = {}
    for step in range(1, 4):
        real = r.standard_normal((4, 2)).astype(np.float32).astype(F64) + 2
        z = r.standard_normal((4, 3)).astype(np.float32).astype(F64)
        rt, zt = Tensor(real.astype(np.float32)), Tensor(z.astype(np.float32))
        with Tensor.train():
            # discriminator: real vs fake, the generator's output detached
            fake = G(zt)
            opt_d.zero_grad()
            opt_g.zero_grad()
            d_loss = D(rt).binary_crossentropy_logits(Tensor.ones(4, 1)) + D(fake.detach()).binary_crossentropy_logits(
                Tensor.zeros(4, 1))  # fmt: skip
            d_loss.backward()
            fake_np = np_gen(pg, z)
            np_d = lambda r=real, f=fake_np: np_bce_logits(np_disc(pd, r), 1.0) + np_bce_logits(np_disc(pd, f), 0.0)
            np.testing.assert_allclose(d_loss.item(), np_d(), rtol=1e-5)
            gd = np_grads(np_d, pd, list(pd))
            for k, t in sg.items():  # the detached fake: zeros at most (tinygrad materialises them), no signal
                assert t.grad is None or not t.grad.numpy().any(), f"G {k} got a gradient through detach()"
            check_grads(sdd, gd)
            opt_d.step()
            for k in pd:
                buf[k] = gd[k] if k not in buf else 0.5 * buf[k] + gd[k]
                pd[k] = pd[k] - 0.05 * buf[k]
            # generator: fool the updated discriminator; D gets gradients too but only G steps
            opt_d.zero_grad()
            g_loss = D(G(zt)).binary_crossentropy_logits(Tensor.ones(4, 1)).backward()
            np_g = lambda z=z: np_bce_logits(np_disc(pd, np_gen(pg, z)), 1.0)
            np.testing.assert_allclose(g_loss.item(), np_g(), rtol=1e-5)
            gg = np_grads(np_g, pg, list(pg))
            check_grads(sg, gg)
            opt_g.step()
        np_adam(pg, gg, st, step, lr=0.01, b1=0.5)
        for k in pg:
            np.testing.assert_allclose(sg[k].numpy(), pg[k], rtol=1e-4, atol=1e-5, err_msg=f"G {k} step {step}")
        for k in pd:
            np.testing.assert_allclose(sdd[k].numpy(), pd[k], rtol=1e-4, atol=1e-5, err_msg=f"D {k} step {step}")


# ---------------- U-Net-ish: strided conv down, conv_transpose2d and bilinear/nearest interpolate up, skip cat -------
class TinyUNet:
    def __init__(self) -> None:
        self.inc = nn.Conv2d(2, 3, 3, padding=1)
        self.down = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(4, 3, 2, stride=2)
        self.out = nn.Conv2d(3 + 4, 2, 1)

    def __call__(self, x: Tensor) -> Tensor:
        s = self.inc(x).relu()
        d = self.down(s).relu()
        up_t = self.up(d)
        up_i = d.interpolate(size=(x.shape[2], x.shape[3]), mode="linear")
        up_n = d.interpolate(size=(x.shape[2], x.shape[3]), mode="nearest")
        return self.out(Tensor.cat(s + up_t, up_i, dim=1)) + up_n.mean(1, keepdim=True)


def np_conv_transpose2d(x: np.ndarray, w: np.ndarray, stride: int) -> np.ndarray:
    n, _, h, wd = x.shape
    k = w.shape[2]
    out = np.zeros((n, w.shape[1], (h - 1) * stride + k, (wd - 1) * stride + k))
    for a in range(k):
        for b in range(k):
            contrib = np.einsum("nchw,co->nohw", x, w[:, :, a, b])
            out[:, :, a : a + stride * h : stride, b : b + stride * wd : stride] += contrib
    return out


def np_bilinear_matrix(n_in: int, n_out: int) -> np.ndarray:
    """Rows of linear-interpolation weights, half-pixel centres (align_corners=False), clamped at the edges."""
    m = np.zeros((n_out, n_in))
    for o in range(n_out):
        src = max((o + 0.5) * n_in / n_out - 0.5, 0.0)
        i0 = min(int(math.floor(src)), n_in - 1)
        i1, f = min(i0 + 1, n_in - 1), src - i0
        m[o, i0] += 1 - f
        m[o, i1] += f
    return m


def np_unet(p: P, x: np.ndarray) -> np.ndarray:
    s = np.maximum(np_conv2d(x, p["inc.weight"], 1, 1) + p["inc.bias"][None, :, None, None], 0)
    d = np.maximum(np_conv2d(s, p["down.weight"], 2, 1) + p["down.bias"][None, :, None, None], 0)
    up_t = np_conv_transpose2d(d, p["up.weight"], 2) + p["up.bias"][None, :, None, None]
    mh, mw = np_bilinear_matrix(d.shape[2], x.shape[2]), np_bilinear_matrix(d.shape[3], x.shape[3])
    up_i = np.einsum("oh,nchw,pw->ncop", mh, d, mw)
    nh = np.floor(np.arange(x.shape[2]) * d.shape[2] / x.shape[2]).astype(int)
    nw = np.floor(np.arange(x.shape[3]) * d.shape[3] / x.shape[3]).astype(int)
    up_n = d[:, :, nh][:, :, :, nw]
    cat = np.concatenate([s + up_t, up_i], 1)
    return np_conv2d(cat, p["out.weight"]) + p["out.bias"][None, :, None, None] + up_n.mean(1, keepdims=True)


def test_unet_conv_transpose_and_interpolate_path_gradients_and_adamw() -> None:
    model = TinyUNet()
    p = init(model, seed=12, scale=0.4)
    sd = get_state_dict(model)
    keys = list(p)
    r = rng(13)
    x = r.standard_normal((2, 2, 6, 6)).astype(np.float32).astype(F64)
    target = r.standard_normal((2, 2, 6, 6))
    xt, tt = Tensor(x.astype(np.float32)), Tensor(target.astype(np.float32))
    opt = AdamW([sd[k] for k in keys], lr=0.01, weight_decay=0.05)
    st: dict = {}
    for step in range(1, 3):
        np_loss = lambda: float(((np_unet(p, x) - target) ** 2).mean())
        grads = np_grads(np_loss, p, keys)
        with Tensor.train():
            opt.zero_grad()
            out = model(xt)
            if step == 1:
                np.testing.assert_allclose(out.numpy(), np_unet(p, x), rtol=1e-4, atol=1e-5)
            loss = ((out - tt) ** 2).mean().backward()
            np.testing.assert_allclose(loss.item(), np_loss(), rtol=1e-5)
            if step == 1:
                check_grads({k: sd[k] for k in keys}, grads)
            opt.step()
        np_adam(p, grads, st, step, lr=0.01, wd=0.05)
        for k in keys:
            np.testing.assert_allclose(sd[k].numpy(), p[k], rtol=1e-4, atol=1e-5, err_msg=f"{k} step {step}")


# ---------------- char-RNN with nn.LSTMCell: truncated BPTT, the carried state detached, steps under TinyJit -------
class CharRNN:
    def __init__(self, vocab: int, n_hid: int) -> None:
        self.emb, self.cell, self.head = nn.Embedding(vocab, n_hid), nn.LSTMCell(n_hid, n_hid), nn.Linear(n_hid, vocab)

    def __call__(self, ids: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x, logits = self.emb(ids), []
        for t in range(ids.shape[1]):
            h, c = self.cell(x[:, t], (h, c))
            logits.append(self.head(h))
        return Tensor.stack(*logits, dim=1), h, c


def np_charrnn(p: P, ids: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x, logits = p["emb.weight"][ids], []
    for t in range(ids.shape[1]):
        g = x[:, t] @ p["cell.weight_ih"].T + p["cell.bias_ih"] + h @ p["cell.weight_hh"].T + p["cell.bias_hh"]
        i, f, gg, o = np.split(g, 4, axis=1)
        c = np_sigmoid(f) * c + np_sigmoid(i) * np.tanh(gg)
        h = np_sigmoid(o) * np.tanh(c)
        logits.append(h @ p["head.weight"].T + p["head.bias"])
    return np.stack(logits, 1), h, c


def test_char_rnn_truncated_bptt_with_detached_state_under_tinyjit() -> None:
    vocab, n_hid, chunk = 7, 5, 4
    model = CharRNN(vocab, n_hid)
    p = init(model, seed=14, scale=0.5)
    sd = get_state_dict(model)
    keys = list(p)
    opt = Adam([sd[k] for k in keys], lr=0.02)

    @TinyJit
    @Tensor.train()
    def step(ids: Tensor, tgt: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        opt.zero_grad()
        logits, h, c = model(ids, h, c)
        loss = logits.sparse_categorical_crossentropy(tgt).backward()
        opt.step()
        return loss.realize(), h.detach().realize(), c.detach().realize()  # the next chunk starts from these

    text = rng(15).integers(0, vocab, (2, 4 * chunk + 1))
    h, c = Tensor.zeros(2, n_hid).contiguous().realize(), Tensor.zeros(2, n_hid).contiguous().realize()
    nh, nc = np.zeros((2, n_hid)), np.zeros((2, n_hid))
    st: dict = {}
    for i in range(4):
        ids, tgt = text[:, i * chunk : (i + 1) * chunk], text[:, i * chunk + 1 : (i + 1) * chunk + 1]
        # the carried state is a constant of this chunk: no gradient flows back into the previous one
        np_loss = lambda ids=ids, tgt=tgt, nh=nh, nc=nc: np_xent(np_charrnn(p, ids, nh, nc)[0], tgt)
        want = np_loss()
        grads = np_grads(np_loss, p, keys)
        loss, h, c = step(Tensor(ids.astype(np.int32)), Tensor(tgt.astype(np.int32)), h, c)
        np.testing.assert_allclose(loss.item(), want, rtol=1e-5, err_msg=f"chunk {i}")
        _, nh, nc = np_charrnn(p, ids, nh, nc)
        np.testing.assert_allclose(h.numpy(), nh, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(c.numpy(), nc, rtol=1e-4, atol=1e-5)
        np_adam(p, grads, st, i + 1, lr=0.02)
        for k in keys:
            np.testing.assert_allclose(sd[k].numpy(), p[k], rtol=1e-4, atol=1e-5, err_msg=f"{k} chunk {i}")
    assert step.cnt == 4
