"""Whole model programs, third set, written the way tinygrad's examples and user code write them (the names
`from tinygrad import ...` gives, here imported from speck.tensor): a GPT-2 decoder generating with a KV cache under
TinyJit (symbolic start_pos) and top-k/temperature sampling; a LLaMA block (RMSNorm, rotary embeddings as pairs,
SwiGLU, grouped-query causal attention) trained 20 steps with AdamW and clipping by the global gradient norm; a
ResNet-style network with BatchNorm in train and eval mode, strided convs and residual adds, trained and
round-tripped through safetensors; a UNet block (GroupNorm, SiLU, nearest upsampling, skip concat, timestep
embedding); a BERT encoder with padding masks, token types and a masked-LM loss with ignore_index; YOLO-style
post-processing; and an LSTMCell seq2seq (the training-loop programs are test_programs3_training.py). Each is
checked against a numpy float64 re-implementation of the same math (forward values, gradients by central
differences of the numpy forward, optimizer updates)."""

from __future__ import annotations

import math
import pathlib
from collections.abc import Callable

import numpy as np
from gradcheck import num_grad

from speck.tensor import Tensor, TinyJit, Variable, dtypes, nn
from speck.tensor.nn.optim import SGD, AdamW
from speck.tensor.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save

F64 = np.float64


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def f32(*xs: np.ndarray) -> list[np.ndarray]:
    """Rounded to float32 and back, so the float64 reference starts from the exact values speck holds."""
    return [np.asarray(x, np.float32).astype(F64) for x in xs]


def check_grads(np_loss: Callable[[], float], params: list[np.ndarray], tensors: list[Tensor], rtol: float = 2e-3,
                atol: float = 2e-4, most: int | None = None) -> None:  # fmt: skip
    """Every tensor's .grad against central differences of the numpy loss at the numpy copy of that tensor (at `most`
    random entries of each, when given: the numpy forward is the slow part)."""
    Tensor.realize(*[t.grad for t in tensors if t.grad is not None])  # one schedule for all of them
    pick = rng(0)
    for i, (p, t) in enumerate(zip(params, tensors)):
        assert t.grad is not None, f"parameter {i} has no gradient"
        at = None
        if most is not None and p.size > most:
            at = [np.unravel_index(j, p.shape) for j in pick.choice(p.size, most, replace=False)]
        want, got = num_grad(np_loss, p, at=at), t.grad.numpy()
        if at is not None:
            got, want = np.array([got[j] for j in at]), np.array([want[j] for j in at])
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"param {i}")


def np_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def np_layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps) * w + b


def np_gelu(x: np.ndarray) -> np.ndarray:  # the tanh approximation tinygrad's gelu() uses
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def np_silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


def np_sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def np_xent(logits: np.ndarray, y: np.ndarray, ignore: int | None = None) -> float:
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    keep = np.ones(len(y), bool) if ignore is None else y != ignore
    return float(-logp[np.arange(len(y))[keep], y[keep]].mean())


def load(t: Tensor, x: np.ndarray) -> Tensor:
    """Replace a layer's parameter with the given values (float32), the way a checkpoint loader would."""
    t.replace(Tensor(np.asarray(x, np.float32)).realize())
    return t


# ---------------- GPT-2: generate with a KV cache, symbolic start_pos, top-k / temperature sampling ----------------
class GPT2Attention:
    def __init__(self, dim: int, n_heads: int, max_ctx: int) -> None:
        self.c_attn, self.c_proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.n_heads, self.dim, self.head_dim, self.max_ctx = n_heads, dim, dim // n_heads, max_ctx

    def __call__(self, x: Tensor, start_pos: Variable | int, mask: Tensor | None) -> Tensor:
        xqkv = self.c_attn(x)
        xq, xk, xv = [xqkv.shrink((None, None, (i * self.dim, (i + 1) * self.dim))) for i in range(3)]
        xq, xk, xv = [y.reshape(None, None, self.n_heads, self.head_dim) for y in (xq, xk, xv)]
        bsz, seqlen, _, _ = xq.shape
        if not hasattr(self, "cache_kv"):
            self.cache_kv = Tensor.zeros(2, bsz, self.max_ctx, self.n_heads, self.head_dim).contiguous().realize()
        self.cache_kv.shrink((None, None, (start_pos, start_pos + seqlen), None, None)).assign(
            Tensor.stack(xk, xv)).realize()  # fmt: skip
        keys = self.cache_kv[0].shrink((None, (0, start_pos + seqlen), None, None))
        values = self.cache_kv[1].shrink((None, (0, start_pos + seqlen), None, None))
        xq, keys, values = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        return self.c_proj(xq.scaled_dot_product_attention(keys, values, mask).transpose(1, 2).reshape(bsz, seqlen, -1))


class GPT2Block:
    def __init__(self, dim: int, n_heads: int, max_ctx: int) -> None:
        self.attn = GPT2Attention(dim, n_heads, max_ctx)
        self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.c_fc, self.c_proj = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def __call__(self, x: Tensor, start_pos: Variable | int, mask: Tensor | None) -> Tensor:
        h = x + self.attn(self.ln_1(x), start_pos, mask)
        return (h + self.c_proj(self.c_fc(self.ln_2(h)).gelu())).contiguous()


class GPT2:
    def __init__(self, vocab: int, dim: int, n_heads: int, n_layers: int, max_ctx: int) -> None:
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(max_ctx, dim)
        self.h = [GPT2Block(dim, n_heads, max_ctx) for _ in range(n_layers)]
        self.ln_f = nn.LayerNorm(dim)
        self.max_ctx = max_ctx
        self.forward_jit = TinyJit(self.forward)

    def forward(self, tokens: Tensor, start_pos: Variable | int, temperature: float, top_k: int, u: Tensor
                ) -> tuple[Tensor, Tensor]:  # fmt: skip
        if not hasattr(self, "allpos"):
            self.allpos = Tensor.arange(0, self.max_ctx).reshape(1, -1).realize()
        seqlen = tokens.shape[1]
        pos_emb = self.wpe(self.allpos.shrink((None, (start_pos, start_pos + seqlen))))
        h = self.wte(tokens) + pos_emb
        mask = Tensor.full((1, 1, seqlen, seqlen), float("-inf")).triu(1) if seqlen > 1 else None
        for block in self.h:
            h = block(h, start_pos, mask)
        logits = self.ln_f(h)[:, -1, :] @ self.wte.weight.T  # tied output embedding
        # top-k, temperature, then inverse-CDF sampling with the caller's uniform number (a seeded RNG's draw)
        vals, idx = (logits / temperature).topk(top_k)
        cdf = vals.softmax(-1).cumsum(-1)
        pick = (cdf < u.reshape(-1, 1)).sum(-1, keepdim=True).minimum(top_k - 1)
        return logits.realize(), idx.gather(-1, pick).flatten().realize()

    def __call__(self, tokens: Tensor, start_pos: int, temperature: float, top_k: int, u: Tensor
                 ) -> tuple[Tensor, Tensor]:  # fmt: skip
        if tokens.shape[1] > 1:  # the prompt: plain ints, its own kernels
            return self.forward(tokens, start_pos, temperature, top_k, u)
        sp = Variable("start_pos", 1, self.max_ctx - 1).bind(start_pos)
        return self.forward_jit(tokens, sp, temperature, top_k, u)


def np_gpt2_logits(p: dict[str, np.ndarray], tokens: np.ndarray, n_heads: int, n_layers: int) -> np.ndarray:
    t = len(tokens)
    h = p["wte.weight"][tokens] + p["wpe.weight"][:t]
    for i in range(n_layers):
        g = lambda k, i=i: p[f"h.{i}.{k}"]
        x = np_layernorm(h, g("ln_1.weight"), g("ln_1.bias"))
        qkv = x @ g("attn.c_attn.weight").T + g("attn.c_attn.bias")
        d = h.shape[1]
        q, k, v = (qkv[:, j * d : (j + 1) * d].reshape(t, n_heads, -1) for j in range(3))
        s = np.einsum("ihd,jhd->hij", q, k) / math.sqrt(d // n_heads)
        s = np.where(np.tril(np.ones((t, t), bool))[None], s, -np.inf)
        a = np.einsum("hij,jhd->ihd", np_softmax(s), v).reshape(t, d)
        h = h + a @ g("attn.c_proj.weight").T + g("attn.c_proj.bias")
        x = np_layernorm(h, g("ln_2.weight"), g("ln_2.bias"))
        h = h + np_gelu(x @ g("c_fc.weight").T + g("c_fc.bias")) @ g("c_proj.weight").T + g("c_proj.bias")
    return np_layernorm(h, p["ln_f.weight"], p["ln_f.bias"]) @ p["wte.weight"].T


def np_sample(logits: np.ndarray, temperature: float, top_k: int, u: float) -> tuple[int, float]:
    """The token the top-k/temperature inverse-CDF sampler picks, and how far u is from the nearest CDF step."""
    z = logits / temperature
    idx = np.argsort(-z, kind="stable")[:top_k]
    cdf = np.cumsum(np_softmax(z[idx]))
    return int(idx[min(int((cdf < u).sum()), top_k - 1)]), float(np.abs(cdf[:-1] - u).min())


def test_gpt2_generate_with_kv_cache_jit_and_topk_temperature_sampling() -> None:
    vocab, dim, n_heads, n_layers, max_ctx = 37, 16, 2, 2, 16
    Tensor.manual_seed(3)
    model = GPT2(vocab, dim, n_heads, n_layers, max_ctx)
    r = rng(1)
    for t in get_parameters(model):  # bigger than the default init, so the logits are far from uniform
        load(t, r.standard_normal(t.shape) * 0.4)
    params = {k: v.numpy().astype(F64) for k, v in get_state_dict(model).items() if "cache_kv" not in k}
    temperature, top_k = 0.8, 5
    toks = [3, 17, 4, 29]
    uniforms = rng(7).random(10)  # the seeded RNG's draws, one per generated token
    start_pos = 0
    for step, u in enumerate(uniforms):
        logits, tok = model(Tensor([toks[start_pos:]], dtype=dtypes.int32), start_pos, temperature, top_k,
                            Tensor([u], dtype=dtypes.float32))  # fmt: skip
        want = np_gpt2_logits(params, np.array(toks), n_heads, n_layers)[-1]
        np.testing.assert_allclose(logits.numpy()[0], want, rtol=1e-4, atol=1e-4, err_msg=f"step {step}")
        want_tok, margin = np_sample(want, temperature, top_k, float(u))
        assert margin > 1e-4, "the seed puts u on a CDF step; pick another seed"
        assert tok.tolist() == [want_tok], f"step {step}"
        start_pos = len(toks)
        toks.append(want_tok)
    assert model.forward_jit.cnt >= 2  # the decode steps ran as jit replays
    assert len(set(toks[4:])) > 1  # sampling, not argmax of a constant


# ---------------- LLaMA: RMSNorm, RoPE as pairs, SwiGLU, GQA; AdamW with clipping by the global norm ----------------
def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0) -> Tensor:
    freqs = 1.0 / (theta ** (Tensor.arange(0, dim, 2)[: (dim // 2)] / dim))
    freqs = Tensor.arange(end).unsqueeze(dim=1) * freqs.unsqueeze(dim=0)
    return Tensor.stack(freqs.cos(), freqs.sin(), dim=-1).reshape(1, end, 1, dim // 2, 2)


def complex_mult(a: Tensor, c: Tensor, d: Tensor) -> Tensor:
    ar, ai = a[..., 0:1], a[..., 1:2]
    return (ar * c - ai * d).cat(ar * d + ai * c, dim=-1)


def apply_rotary_emb(xq: Tensor, xk: Tensor, freqs_cis: Tensor) -> tuple[Tensor, Tensor]:
    xq, xk = xq.reshape(*xq.shape[0:-1], -1, 2), xk.reshape(*xk.shape[0:-1], -1, 2)
    c, d = freqs_cis[..., 0:1], freqs_cis[..., 1:2]
    return complex_mult(xq, c, d).flatten(3), complex_mult(xk, c, d).flatten(3)


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    bs, seqlen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return x.repeat((1, 1, 1, n_rep)).reshape(bs, seqlen, n_kv_heads * n_rep, head_dim)


class LlamaAttention:
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int) -> None:
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.n_rep = n_heads // n_kv_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def __call__(self, x: Tensor, freqs_cis: Tensor, mask: Tensor) -> Tensor:
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).reshape(bsz, seqlen, self.n_heads, self.head_dim)
        xk = self.wk(x).reshape(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xv = self.wv(x).reshape(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        keys, values = repeat_kv(xk, self.n_rep), repeat_kv(xv, self.n_rep)
        xq, keys, values = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        attn = xq.scaled_dot_product_attention(keys, values, mask).transpose(1, 2)
        return self.wo(attn.reshape(bsz, seqlen, -1))


class FeedForward:
    def __init__(self, dim: int, hidden_dim: int) -> None:
        self.w1, self.w2 = nn.Linear(dim, hidden_dim, bias=False), nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def __call__(self, x: Tensor) -> Tensor:
        return self.w2(self.w1(x).silu() * self.w3(x))


class TinyLlama:
    def __init__(self, vocab: int, dim: int, n_heads: int, n_kv_heads: int, hidden: int, max_ctx: int) -> None:
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.attention_norm, self.ffn_norm, self.norm = (nn.RMSNorm(dim, 1e-5) for _ in range(3))
        self.attention, self.feed_forward = LlamaAttention(dim, n_heads, n_kv_heads), FeedForward(dim, hidden)
        self.output = nn.Linear(dim, vocab, bias=False)
        self.freqs_cis = precompute_freqs_cis(dim // n_heads, max_ctx).contiguous().realize()

    def __call__(self, tokens: Tensor) -> Tensor:
        seqlen = tokens.shape[1]
        h = self.tok_embeddings(tokens)
        mask = Tensor.full((1, 1, seqlen, seqlen), float("-inf")).triu(1)
        freqs = self.freqs_cis.shrink((None, (0, seqlen), None, None, None))
        h = h + self.attention(self.attention_norm(h), freqs, mask)
        h = h + self.feed_forward(self.ffn_norm(h))
        return self.output(self.norm(h))


LLAMA_KEYS = ["tok_embeddings.weight", "attention_norm.weight", "ffn_norm.weight", "norm.weight", "attention.wq.weight",
              "attention.wk.weight", "attention.wv.weight", "attention.wo.weight", "feed_forward.w1.weight",
              "feed_forward.w2.weight", "feed_forward.w3.weight", "output.weight"]  # fmt: skip


def np_llama_loss(p: list[np.ndarray], tokens: np.ndarray, targets: np.ndarray, n_heads: int, n_kv: int) -> float:
    emb, an, fn, norm, wq, wk, wv, wo, w1, w2, w3, out = p
    bs, t = tokens.shape
    rms = lambda x, w: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * w
    h = emb[tokens]
    x = rms(h, an)
    hd = wq.shape[0] // n_heads
    q, k, v = (x @ wq.T).reshape(bs, t, n_heads, hd), (x @ wk.T).reshape(bs, t, n_kv, hd), (x @ wv.T)
    v = v.reshape(bs, t, n_kv, hd)
    ang = np.arange(t)[:, None] * (1.0 / 10000.0 ** (np.arange(0, hd, 2) / hd))[None]  # (t, hd/2)
    rot = np.exp(1j * ang)[None, :, None, :]

    def rope(y: np.ndarray) -> np.ndarray:
        z = (y[..., 0::2] + 1j * y[..., 1::2]) * rot
        return np.stack([z.real, z.imag], -1).reshape(y.shape)

    q, k = rope(q), np.repeat(rope(k), n_heads // n_kv, axis=2)
    v = np.repeat(v, n_heads // n_kv, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(hd)
    s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
    a = np.einsum("bhij,bjhd->bihd", np_softmax(s), v).reshape(bs, t, -1)
    h = h + a @ wo.T
    x = rms(h, fn)
    h = h + (np_silu(x @ w1.T) * (x @ w3.T)) @ w2.T
    logits = rms(h, norm) @ out.T
    return np_xent(logits.reshape(bs * t, -1), targets.reshape(-1))


def test_llama_block_trains_20_steps_with_adamw_and_global_norm_clipping() -> None:
    vocab, dim, n_heads, n_kv, hidden, t = 11, 8, 2, 1, 12, 6
    Tensor.manual_seed(5)
    model = TinyLlama(vocab, dim, n_heads, n_kv, hidden, max_ctx=8)
    sd = get_state_dict(model)
    r = rng(11)
    for k in LLAMA_KEYS:
        if "norm" in k:  # the norms' gains are trained too: start them away from 1
            load(sd[k], 1 + 0.2 * r.standard_normal(sd[k].shape))
    params = [sd[k] for k in LLAMA_KEYS]
    assert len(get_parameters(model)) == len(params) + 1  # (+ the freqs_cis buffer, not trained)
    data = r.integers(0, vocab, (2, t + 1))
    x, y = Tensor(data[:, :-1].astype(np.int32)), Tensor(data[:, 1:].astype(np.int32))
    lr, wd, max_norm = 1e-2, 0.1, 0.5
    opt = AdamW(params, lr=lr, b1=0.9, b2=0.95, eps=1e-8, weight_decay=wd)
    npp = [p.numpy().astype(F64) for p in params]
    m, v = [np.zeros_like(q) for q in npp], [np.zeros_like(q) for q in npp]
    loss_fn = lambda: np_llama_loss(npp, data[:, :-1], data[:, 1:], n_heads, n_kv)
    losses, norms = [], []

    @TinyJit
    @Tensor.train()
    def train_step() -> tuple[Tensor, ...]:
        opt.zero_grad()
        loss = model(x).flatten(0, 1).sparse_categorical_crossentropy(y.flatten()).backward()
        grads = [p.grad for p in params if p.grad is not None]
        # clip by the global norm the way tinygrad's training scripts do it
        global_norm = Tensor.stack(*[g.square().sum() for g in grads]).sum().sqrt()
        for p, g in zip(params, grads):
            p.grad = g * (max_norm / (global_norm + 1e-6)).minimum(1.0)
        Tensor.realize(loss, global_norm, *grads, *opt.schedule_step())
        return loss, global_norm, *grads

    for step in range(1, 21):
        loss, global_norm, *gt = train_step()
        grads = [g.numpy().astype(F64) for g in gt]  # (the gradients before clipping)
        if step == 1:  # the gradients themselves, against central differences of the numpy loss
            for i, g in enumerate(grads):
                np.testing.assert_allclose(g, num_grad(loss_fn, npp[i]), rtol=2e-3, atol=2e-4, err_msg=f"param {i}")
        np.testing.assert_allclose(loss.item(), loss_fn(), rtol=1e-5, err_msg=f"step {step}")
        gn = math.sqrt(sum(float((g * g).sum()) for g in grads))
        np.testing.assert_allclose(global_norm.item(), gn, rtol=1e-5)
        losses.append(loss.item())
        norms.append(gn)
        scale = min(1.0, max_norm / (gn + 1e-6))
        for i, g in enumerate(grads):
            g = g * scale
            m[i] = 0.9 * m[i] + 0.1 * g
            v[i] = 0.95 * v[i] + 0.05 * g * g
            upd = (m[i] / (1 - 0.9**step)) / (np.sqrt(v[i] / (1 - 0.95**step)) + 1e-8) + wd * npp[i]
            npp[i] = npp[i] - lr * upd
            # each step against numpy's update of the same gradients; then carry speck's float32 values on
            np.testing.assert_allclose(params[i].numpy(), npp[i], rtol=1e-4, atol=1e-5, err_msg=f"step {step} p{i}")
            npp[i] = params[i].numpy().astype(F64)
    assert train_step.cnt == 20  # replays from the third step on
    assert max(norms) > max_norm  # the clipping was active
    assert losses[-1] < losses[0] - 0.3


# ---------------- ResNet: BatchNorm train/eval, strided convs, residual adds, safetensors round trip ----------------
class BasicBlock:
    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, padding=1, stride=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: list[Callable[[Tensor], Tensor]] = []
        if stride != 1 or in_planes != planes:
            self.downsample = [nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=False),
                               nn.BatchNorm2d(planes)]  # fmt: skip

    def __call__(self, x: Tensor) -> Tensor:
        out = self.bn1(self.conv1(x)).relu()
        out = self.bn2(self.conv2(out))
        return (out + x.sequential(self.downsample)).relu()


class ResNet:
    def __init__(self, num_classes: int) -> None:
        self.conv1 = nn.Conv2d(3, 4, kernel_size=3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.layer1 = [BasicBlock(4, 4)]
        self.layer2 = [BasicBlock(4, 8, stride=2)]
        self.fc = nn.Linear(8, num_classes)

    def __call__(self, x: Tensor) -> Tensor:
        out = self.bn1(self.conv1(x)).relu()
        out = out.sequential(self.layer1).sequential(self.layer2)
        return self.fc(out.mean((2, 3)))


BN_NAMES = ["bn1", "layer1.0.bn1", "layer1.0.bn2", "layer2.0.bn1", "layer2.0.bn2", "layer2.0.downsample.1"]


def np_conv2d(x: np.ndarray, w: np.ndarray, stride: int = 1, pad: int = 0) -> np.ndarray:
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    kh, kw = w.shape[2:]
    ho, wo = (xp.shape[2] - kh) // stride + 1, (xp.shape[3] - kw) // stride + 1
    return sum(np.einsum("nchw,oc->nohw", xp[:, :, a : a + stride * ho : stride, b : b + stride * wo : stride],
                         w[:, :, a, b]) for a in range(kh) for b in range(kw))  # fmt: skip


def np_resnet(p: dict[str, np.ndarray], x: np.ndarray, train: bool, stats: list | None = None) -> np.ndarray:
    def bn(y: np.ndarray, name: str) -> np.ndarray:
        if train:
            mean, var = y.mean((0, 2, 3)), y.var((0, 2, 3))
            if stats is not None:
                n = y.size / y.shape[1]
                stats.append((mean, var * n / (n - 1)))
        else:
            mean, var = p[f"{name}.running_mean"], p[f"{name}.running_var"]
        r = lambda a: a[None, :, None, None]
        return (y - r(mean)) / np.sqrt(r(var) + 1e-5) * r(p[f"{name}.weight"]) + r(p[f"{name}.bias"])

    def block(y: np.ndarray, pre: str, stride: int) -> np.ndarray:
        out = np.maximum(bn(np_conv2d(y, p[f"{pre}.conv1.weight"], stride, 1), f"{pre}.bn1"), 0)
        out = bn(np_conv2d(out, p[f"{pre}.conv2.weight"], 1, 1), f"{pre}.bn2")
        if f"{pre}.downsample.0.weight" in p:
            y = bn(np_conv2d(y, p[f"{pre}.downsample.0.weight"], stride), f"{pre}.downsample.1")
        return np.maximum(out + y, 0)

    out = np.maximum(bn(np_conv2d(x, p["conv1.weight"], 1, 1), "bn1"), 0)
    out = block(block(out, "layer1.0", 1), "layer2.0", 2)
    return out.mean((2, 3)) @ p["fc.weight"].T + p["fc.bias"]


def test_resnet_batchnorm_train_eval_and_safetensors_round_trip(tmp_path: pathlib.Path) -> None:
    Tensor.manual_seed(9)
    model = ResNet(num_classes=3)
    sd = get_state_dict(model)
    r = rng(21)
    for k, t in sd.items():  # gains and shifts away from 1 and 0 so their gradients are not symmetric
        if k.endswith(("bn1.weight", "bn2.weight", "downsample.1.weight")):
            load(t, 1 + 0.3 * r.standard_normal(t.shape))
        elif k.endswith(("bn1.bias", "bn2.bias", "downsample.1.bias")):
            load(t, 0.2 * r.standard_normal(t.shape))
    train_keys = [k for k in sd if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))]
    params = [sd[k] for k in train_keys]
    opt = SGD(params, lr=0.05, momentum=0.9)
    X = r.standard_normal((4, 3, 8, 8))
    Y = np.array([0, 2, 1, 2])
    xt, yt = Tensor(X.astype(np.float32)), Tensor(Y.astype(np.int32))
    p = {k: v.numpy().astype(F64) for k, v in sd.items()}

    @TinyJit
    @Tensor.train()
    def train_step() -> Tensor:
        opt.zero_grad()
        loss = model(xt).sparse_categorical_crossentropy(yt).backward()
        return loss.realize(*opt.schedule_step())

    for step in range(4):
        stats: list = []
        want = np_xent(np_resnet(p, f32(X)[0], True, stats), Y)
        if step == 0:  # unjitted once, to read the gradients before the update
            with Tensor.train():
                opt.zero_grad()
                model(xt).sparse_categorical_crossentropy(yt).backward()
                np_loss = lambda: np_xent(np_resnet(p, f32(X)[0], True), Y)
                check_grads(np_loss, [p[k] for k in train_keys], params, most=12)
                for n in BN_NAMES:  # (that forward updated the running stats too: put them back)
                    load(sd[f"{n}.running_mean"], np.zeros(sd[f"{n}.running_mean"].shape))
                    load(sd[f"{n}.running_var"], np.ones(sd[f"{n}.running_var"].shape))
                    sd[f"{n}.num_batches_tracked"].assign(Tensor(0, dtype=dtypes.int64)).realize()
        loss = train_step().item()
        np.testing.assert_allclose(loss, want, rtol=1e-4, err_msg=f"step {step}")
        for n, (mean, var) in zip(BN_NAMES, stats):
            p[f"{n}.running_mean"] = 0.9 * p[f"{n}.running_mean"] + 0.1 * mean
            p[f"{n}.running_var"] = 0.9 * p[f"{n}.running_var"] + 0.1 * var
            np.testing.assert_allclose(sd[f"{n}.running_mean"].numpy(), p[f"{n}.running_mean"], rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(sd[f"{n}.running_var"].numpy(), p[f"{n}.running_var"], rtol=1e-4, atol=1e-5)
            assert sd[f"{n}.num_batches_tracked"].item() == step + 1
        p.update({k: sd[k].numpy().astype(F64) for k in train_keys})  # carry speck's updated weights on
    # eval mode uses the running statistics, not the batch's
    Xe = r.standard_normal((2, 3, 8, 8))
    want_eval = np_resnet(p, f32(Xe)[0], train=False)
    got_eval = model(Tensor(Xe.astype(np.float32))).numpy()
    np.testing.assert_allclose(got_eval, want_eval, rtol=1e-4, atol=1e-5)
    assert not np.allclose(np_resnet(p, f32(Xe)[0], train=True), want_eval, atol=1e-2)
    safe_save(get_state_dict(model), str(tmp_path / "resnet.safetensors"))
    fresh = ResNet(num_classes=3)
    load_state_dict(fresh, safe_load(str(tmp_path / "resnet.safetensors")), verbose=False)
    np.testing.assert_array_equal(fresh(Tensor(Xe.astype(np.float32))).numpy(), got_eval)
    assert fresh.layer2[0].downsample[1].num_batches_tracked.item() == 4  # type: ignore[attr-defined]


# ---------------- UNet block: GroupNorm, SiLU, timestep embedding, strided down, nearest up, skip concat -------
def timestep_embedding(timesteps: Tensor, dim: int, max_period: int = 10000) -> Tensor:
    half = dim // 2
    freqs = (-math.log(max_period) * Tensor.arange(half, dtype=dtypes.float32) / half).exp()
    args = timesteps.unsqueeze(1) * freqs.unsqueeze(0)
    return Tensor.cat(args.cos(), args.sin(), dim=-1)


class ResBlock:
    def __init__(self, channels: int, emb_channels: int, out_channels: int) -> None:
        self.in_layers = [nn.GroupNorm(2, channels), Tensor.silu, nn.Conv2d(channels, out_channels, 3, padding=1)]
        self.emb_layers = [Tensor.silu, nn.Linear(emb_channels, out_channels)]
        self.out_layers = [nn.GroupNorm(2, out_channels), Tensor.silu,
                           nn.Conv2d(out_channels, out_channels, 3, padding=1)]  # fmt: skip
        self.skip_connection = nn.Conv2d(channels, out_channels, 1) if channels != out_channels else lambda x: x

    def __call__(self, x: Tensor, emb: Tensor) -> Tensor:
        h = x.sequential(self.in_layers)
        h = h + emb.sequential(self.emb_layers).reshape(*emb.shape[:1], -1, 1, 1)
        return self.skip_connection(x) + h.sequential(self.out_layers)


class TinyUNet:
    def __init__(self) -> None:
        self.time_embed = [nn.Linear(8, 16), Tensor.silu, nn.Linear(16, 16)]
        self.conv_in = nn.Conv2d(2, 4, 3, padding=1)
        self.down = nn.Conv2d(4, 4, 3, stride=2, padding=1)
        self.mid = ResBlock(4, 16, 8)
        self.up = nn.Conv2d(8, 4, 3, padding=1)
        self.dec = ResBlock(8, 16, 4)
        self.out = [nn.GroupNorm(2, 4), Tensor.silu, nn.Conv2d(4, 2, 3, padding=1)]

    def __call__(self, x: Tensor, timesteps: Tensor) -> Tensor:
        emb = timestep_embedding(timesteps, 8).sequential(self.time_embed)
        skip = self.conv_in(x)
        h = self.mid(self.down(skip), emb)
        h = self.up(h.interpolate(size=(h.shape[2] * 2, h.shape[3] * 2), mode="nearest"))
        h = self.dec(Tensor.cat(h, skip, dim=1), emb)
        return h.sequential(self.out)


def np_groupnorm(x: np.ndarray, groups: int, w: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    g = x.reshape(x.shape[0], groups, -1)
    g = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + eps)
    return g.reshape(x.shape) * w[None, :, None, None] + b[None, :, None, None]


def np_unet(p: dict[str, np.ndarray], x: np.ndarray, t: np.ndarray) -> np.ndarray:
    conv = lambda y, k, stride=1, pad=1: np_conv2d(y, p[f"{k}.weight"], stride, pad) + p[f"{k}.bias"][:, None, None]
    lin = lambda y, k: y @ p[f"{k}.weight"].T + p[f"{k}.bias"]
    gn = lambda y, k: np_groupnorm(y, 2, p[f"{k}.weight"], p[f"{k}.bias"])

    def res(y: np.ndarray, emb: np.ndarray, k: str) -> np.ndarray:
        h = conv(np_silu(gn(y, f"{k}.in_layers.0")), f"{k}.in_layers.2")
        h = h + lin(np_silu(emb), f"{k}.emb_layers.1")[:, :, None, None]
        h = conv(np_silu(gn(h, f"{k}.out_layers.0")), f"{k}.out_layers.2")
        return conv(y, f"{k}.skip_connection", 1, 0) + h

    args = t[:, None] * np.exp(-math.log(10000) * np.arange(4) / 4)[None]
    emb = lin(np_silu(lin(np.concatenate([np.cos(args), np.sin(args)], -1), "time_embed.0")), "time_embed.2")
    skip = conv(x, "conv_in")
    h = res(conv(skip, "down", 2), emb, "mid")
    h = conv(h.repeat(2, axis=2).repeat(2, axis=3), "up")
    return conv(np_silu(gn(res(np.concatenate([h, skip], 1), emb, "dec"), "out.0")), "out.2")


def test_unet_block_training_step_matches_numpy() -> None:
    Tensor.manual_seed(13)
    model = TinyUNet()
    sd = get_state_dict(model)
    r = rng(31)
    for k, t in sd.items():
        if ".0.weight" in k and ("layers" in k or k.startswith("out")):  # the GroupNorm gains
            load(t, 1 + 0.3 * r.standard_normal(t.shape))
        elif k.endswith("bias"):
            load(t, 0.1 * r.standard_normal(t.shape))
    names = list(sd)
    params = [sd[k] for k in names]
    assert len(params) == len(get_parameters(model))
    X, noise, T = r.standard_normal((2, 2, 8, 8)), r.standard_normal((2, 2, 8, 8)), np.array([3.0, 250.0])
    xt, nt, tt = (Tensor(a.astype(np.float32)) for a in (X, noise, T))
    p = {k: v.numpy().astype(F64) for k, v in sd.items()}
    np_loss = lambda: float(((np_unet(p, f32(X)[0], T) - f32(noise)[0]) ** 2).mean())
    opt = AdamW(params, lr=1e-2, weight_decay=0.0)
    with Tensor.train():
        opt.zero_grad()
        loss = (model(xt, tt) - nt).square().mean().backward()
        np.testing.assert_allclose(loss.item(), np_loss(), rtol=1e-5)
        check_grads(np_loss, [p[k] for k in names], params, most=10)
        opt.step()

    @TinyJit
    @Tensor.train()
    def step() -> Tensor:
        opt.zero_grad()
        loss = (model(xt, tt) - nt).square().mean().backward()
        return loss.realize(*opt.schedule_step())

    losses = []
    for _ in range(3):
        p.update({k: v.numpy().astype(F64) for k, v in sd.items()})
        losses.append(step().item())
        np.testing.assert_allclose(losses[-1], np_loss(), rtol=1e-5)
    assert losses[-1] < losses[0]


# ---------------- BERT: padding masks, token types, masked-LM loss with ignore_index ----------------
class BertLayer:
    def __init__(self, dim: int, heads: int) -> None:
        self.query, self.key, self.value, self.dense = (nn.Linear(dim, dim) for _ in range(4))
        self.attn_ln, self.out_ln = nn.LayerNorm(dim, eps=1e-12), nn.LayerNorm(dim, eps=1e-12)
        self.intermediate, self.output = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.heads = heads

    def __call__(self, h: Tensor, ext_mask: Tensor) -> Tensor:
        bs, t, d = h.shape
        split = lambda y: y.reshape(bs, t, self.heads, d // self.heads).transpose(1, 2)
        q, k, v = split(self.query(h)), split(self.key(h)), split(self.value(h))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads) + ext_mask
        ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(bs, t, d)
        h = self.attn_ln(h + self.dense(ctx))
        return self.out_ln(h + self.output(self.intermediate(h).gelu()))


class TinyBertForMLM:
    def __init__(self, vocab: int, dim: int, heads: int, max_pos: int) -> None:
        self.word_embeddings, self.position_embeddings = nn.Embedding(vocab, dim), nn.Embedding(max_pos, dim)
        self.token_type_embeddings = nn.Embedding(2, dim)
        self.emb_ln = nn.LayerNorm(dim, eps=1e-12)
        self.layer = BertLayer(dim, heads)
        self.transform, self.transform_ln = nn.Linear(dim, dim), nn.LayerNorm(dim, eps=1e-12)
        self.decoder_bias = Tensor.zeros(vocab).contiguous()

    def __call__(self, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor) -> Tensor:
        bs, t = input_ids.shape
        pos = Tensor.arange(t).unsqueeze(0).expand(bs, t)
        h = self.emb_ln(self.word_embeddings(input_ids) + self.position_embeddings(pos)
                        + self.token_type_embeddings(token_type_ids))  # fmt: skip
        ext = (1.0 - attention_mask.unsqueeze(1).unsqueeze(2).float()) * -10000.0
        h = self.layer(h, ext)
        h = self.transform_ln(self.transform(h).gelu())
        return h @ self.word_embeddings.weight.T + self.decoder_bias  # tied decoder


def np_bert_logits(p: dict[str, np.ndarray], ids: np.ndarray, types: np.ndarray, mask: np.ndarray, heads: int
                   ) -> np.ndarray:  # fmt: skip
    lin = lambda y, k: y @ p[f"{k}.weight"].T + p[f"{k}.bias"]
    ln = lambda y, k: np_layernorm(y, p[f"{k}.weight"], p[f"{k}.bias"], 1e-12)
    bs, t = ids.shape
    h = p["word_embeddings.weight"][ids] + p["position_embeddings.weight"][:t]
    h = h + p["token_type_embeddings.weight"][types]
    h = ln(h, "emb_ln")
    d = h.shape[-1]
    split = lambda y: y.reshape(bs, t, heads, d // heads)
    q, k, v = split(lin(h, "layer.query")), split(lin(h, "layer.key")), split(lin(h, "layer.value"))
    s = np.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(d // heads) + ((1.0 - mask) * -10000.0)[:, None, None, :]
    ctx = np.einsum("bhij,bjhd->bihd", np_softmax(s), v).reshape(bs, t, d)
    h = ln(h + lin(ctx, "layer.dense"), "layer.attn_ln")
    h = ln(h + lin(np_gelu(lin(h, "layer.intermediate")), "layer.output"), "layer.out_ln")
    h = ln(np_gelu(lin(h, "transform")), "transform_ln")
    return h @ p["word_embeddings.weight"].T + p["decoder_bias"]


def test_bert_masked_lm_with_padding_token_types_and_ignore_index() -> None:
    vocab, dim, heads, t = 13, 8, 2, 6
    Tensor.manual_seed(17)
    model = TinyBertForMLM(vocab, dim, heads, max_pos=8)
    sd = get_state_dict(model)
    r = rng(41)
    for k, v in sd.items():
        if "ln" in k:
            load(v, (1.0 if k.endswith("weight") else 0.0) + 0.2 * r.standard_normal(v.shape))
        elif k == "decoder_bias":
            load(v, 0.1 * r.standard_normal(v.shape))
    ids = np.array([[1, 5, 2, 7, 0, 0], [1, 9, 4, 3, 8, 2]])
    types = np.array([[0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1]])
    mask = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=F64)
    labels = np.full((2, t), -100)
    labels[0, 2], labels[1, 1], labels[1, 4] = 6, 11, 3  # the [MASK]ed positions
    ids[0, 2], ids[1, 1], ids[1, 4] = 12, 12, 12
    it, tt, mt = Tensor(ids.astype(np.int32)), Tensor(types.astype(np.int32)), Tensor(mask.astype(np.int32))
    p = {k: v.numpy().astype(F64) for k, v in sd.items()}
    np_loss = lambda: np_xent(np_bert_logits(p, ids, types, mask, heads).reshape(-1, vocab), labels.reshape(-1), -100)
    with Tensor.train():
        logits = model(it, tt, mt)
        loss = logits.reshape(-1, vocab).sparse_categorical_crossentropy(Tensor(labels.reshape(-1)), ignore_index=-100)
        loss.backward()
    np.testing.assert_allclose(logits.numpy(), np_bert_logits(p, ids, types, mask, heads), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(loss.item(), np_loss(), rtol=1e-5)
    names = list(sd)
    check_grads(np_loss, [p[k] for k in names], [sd[k] for k in names], most=10)
    # what padding hides does not matter: another token id under the mask leaves the real positions' logits alone
    ids2 = ids.copy()
    ids2[0, 4:] = [3, 9]
    out2 = model(Tensor(ids2.astype(np.int32)), tt, mt).numpy()
    np.testing.assert_allclose(out2[0, :4], logits.numpy()[0, :4], rtol=1e-5, atol=1e-5)
    # the token types are real inputs
    assert not np.allclose(model(it, Tensor.zeros(2, t, dtype=dtypes.int32), mt).numpy(), logits.numpy(), atol=1e-3)


# ---------------- YOLO-style post-processing: decode, scores, IoU, fast NMS ----------------
def yolo_decode(p: Tensor, anchors: Tensor, stride: int, n_cls: int) -> tuple[Tensor, Tensor, Tensor]:
    bs, _, ny, nx = p.shape
    na = anchors.shape[0]
    p = p.reshape(bs, na, 5 + n_cls, ny, nx).permute(0, 1, 3, 4, 2)
    gy, gx = Tensor.arange(ny).reshape(ny, 1).expand(ny, nx), Tensor.arange(nx).reshape(1, nx).expand(ny, nx)
    grid = Tensor.stack(gx, gy, dim=-1).reshape(1, 1, ny, nx, 2)
    xy = (p[..., :2].sigmoid() + grid) * stride
    wh = p[..., 2:4].exp() * anchors.reshape(1, na, 1, 1, 2)
    boxes = Tensor.cat(xy - wh / 2, xy + wh / 2, dim=-1).reshape(bs, -1, 4)
    scores = (p[..., 4:5].sigmoid() * p[..., 5:].sigmoid()).reshape(bs, -1, n_cls)
    return boxes, scores.max(-1), scores.argmax(-1)


def box_iou(a: Tensor, b: Tensor) -> Tensor:
    area = lambda x: (x[..., 2] - x[..., 0]) * (x[..., 3] - x[..., 1])
    lt = a[:, None, :2].maximum(b[None, :, :2])
    rb = a[:, None, 2:].minimum(b[None, :, 2:])
    inter = (rb - lt).relu().prod(-1)
    return inter / (area(a)[:, None] + area(b)[None, :] - inter)


def fast_nms(boxes: Tensor, conf: Tensor, labels: Tensor, conf_thres: float, iou_thres: float) -> Tensor:
    """Keep a box when it is confident and no more confident box of its class overlaps it by more than iou_thres."""
    iou = box_iou(boxes, boxes)
    better = conf[None, :] > conf[:, None]  # [i, j]: j beats i
    same = labels[:, None] == labels[None, :]
    suppressed = ((iou > iou_thres) & better & same).any(-1)
    return (conf > conf_thres) & suppressed.logical_not()


def np_yolo(p: np.ndarray, anchors: np.ndarray, stride: int, n_cls: int, conf_thres: float, iou_thres: float
            ) -> tuple[np.ndarray, ...]:  # fmt: skip
    bs, _, ny, nx = p.shape
    na = len(anchors)
    p = p.reshape(bs, na, 5 + n_cls, ny, nx).transpose(0, 1, 3, 4, 2)
    gx, gy = np.meshgrid(np.arange(nx), np.arange(ny))
    xy = (np_sigmoid(p[..., :2]) + np.stack([gx, gy], -1)[None, None]) * stride
    wh = np.exp(p[..., 2:4]) * anchors[None, :, None, None, :]
    boxes = np.concatenate([xy - wh / 2, xy + wh / 2], -1).reshape(bs, -1, 4)[0]
    scores = (np_sigmoid(p[..., 4:5]) * np_sigmoid(p[..., 5:])).reshape(bs, -1, n_cls)[0]
    conf, label = scores.max(-1), scores.argmax(-1)
    lt, rb = np.maximum(boxes[:, None, :2], boxes[None, :, :2]), np.minimum(boxes[:, None, 2:], boxes[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(-1)
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    iou = inter / (area[:, None] + area[None, :] - inter)
    sup = ((iou > iou_thres) & (conf[None, :] > conf[:, None]) & (label[:, None] == label[None, :])).any(-1)
    return boxes, conf, label, iou, (conf > conf_thres) & ~sup


def test_yolo_postprocess_decode_iou_and_fast_nms() -> None:
    n_cls, stride, conf_thres, iou_thres = 3, 8, 0.25, 0.3
    anchors = np.array([[10.0, 13.0], [23.0, 17.0]])
    pred = rng(51).standard_normal((1, 2 * (5 + n_cls), 4, 4)) * 1.5
    pred = f32(pred)[0]
    boxes, conf, label, iou, keep = np_yolo(pred, anchors, stride, n_cls, conf_thres, iou_thres)
    # no value sits on a threshold, so float32 and float64 must agree on every decision
    assert np.abs(conf - conf_thres).min() > 1e-4 and np.abs(iou - iou_thres).min() > 1e-4
    gb, gc, gl = yolo_decode(Tensor(pred.astype(np.float32)), Tensor(anchors.astype(np.float32)), stride, n_cls)
    gb, gc, gl = gb[0], gc[0], gl[0]
    np.testing.assert_allclose(gb.numpy(), boxes, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(gc.numpy(), conf, rtol=1e-5)
    np.testing.assert_array_equal(gl.numpy(), label)
    np.testing.assert_allclose(box_iou(gb, gb).numpy(), iou, rtol=1e-4, atol=1e-6)
    got_keep = fast_nms(gb, gc, gl, conf_thres, iou_thres)
    np.testing.assert_array_equal(got_keep.numpy(), keep)
    assert 0 < keep.sum() < (conf > conf_thres).sum()  # both thresholds did something
    # the detections as a padded top-k list, the way a jitted postprocess returns them
    k = 6
    vals, idx = got_keep.where(gc, -1.0).topk(k)
    order = np.argsort(-np.where(keep, conf, -1.0), kind="stable")[:k]
    np.testing.assert_array_equal(idx.numpy(), order)
    np.testing.assert_allclose(gb[idx].numpy(), boxes[order], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(vals.numpy(), np.where(keep, conf, -1.0)[order], rtol=1e-5)


# ---------------- seq2seq with LSTMCell: teacher-forced training loss, greedy decoding ----------------
class Seq2Seq:
    def __init__(self, in_dim: int, hidden: int, vocab: int) -> None:
        self.encoder, self.decoder = nn.LSTMCell(in_dim, hidden), nn.LSTMCell(hidden, hidden)
        self.embed, self.out = nn.Embedding(vocab, hidden), nn.Linear(hidden, vocab)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        hc = None
        for t in range(src.shape[1]):
            hc = self.encoder(src[:, t], hc)
        assert hc is not None
        return hc

    def __call__(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        hc, logits = self.encode(src), []
        for t in range(tgt_in.shape[1]):
            hc = self.decoder(self.embed(tgt_in[:, t]), hc)
            logits.append(self.out(hc[0]))
        return Tensor.stack(*logits, dim=1)

    def greedy(self, src: Tensor, bos: int, steps: int) -> list[list[int]]:
        hc, tok, out = self.encode(src), Tensor.full((src.shape[0],), bos, dtype=dtypes.int32), []
        for _ in range(steps):
            hc = self.decoder(self.embed(tok), hc)
            tok = self.out(hc[0]).argmax(-1)
            out.append(tok)
        return Tensor.stack(*out, dim=1).tolist()


def np_lstm(x: np.ndarray, h: np.ndarray, c: np.ndarray, p: dict[str, np.ndarray], k: str
            ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    z = x @ p[f"{k}.weight_ih"].T + p[f"{k}.bias_ih"] + h @ p[f"{k}.weight_hh"].T + p[f"{k}.bias_hh"]
    i, f, g, o = np.split(z, 4, axis=1)
    c = np_sigmoid(f) * c + np_sigmoid(i) * np.tanh(g)
    return np_sigmoid(o) * np.tanh(c), c


def np_seq2seq(p: dict[str, np.ndarray], src: np.ndarray, tgt_in: np.ndarray | None, bos: int = 0, steps: int = 0
               ) -> np.ndarray:  # fmt: skip
    """Logits (teacher forcing, tgt_in given) or the greedy tokens with their top-2 logit gaps."""
    hid = p["encoder.weight_hh"].shape[1]
    h = c = np.zeros((src.shape[0], hid))
    for t in range(src.shape[1]):
        h, c = np_lstm(src[:, t], h, c, p, "encoder")
    if tgt_in is not None:
        out = []
        for t in range(tgt_in.shape[1]):
            h, c = np_lstm(p["embed.weight"][tgt_in[:, t]], h, c, p, "decoder")
            out.append(h @ p["out.weight"].T + p["out.bias"])
        return np.stack(out, 1)
    tok, toks, gaps = np.full(src.shape[0], bos), [], []
    for _ in range(steps):
        h, c = np_lstm(p["embed.weight"][tok], h, c, p, "decoder")
        lg = h @ p["out.weight"].T + p["out.bias"]
        tok = lg.argmax(-1)
        top2 = np.sort(lg, -1)[:, -2:]
        toks.append(tok)
        gaps.append(top2[:, 1] - top2[:, 0])
    return np.stack([np.stack(toks, 1), np.stack(gaps, 1)])


def test_lstm_seq2seq_teacher_forcing_gradients_and_greedy_decode() -> None:
    in_dim, hidden, vocab, bos = 3, 5, 7, 0
    Tensor.manual_seed(19)
    model = Seq2Seq(in_dim, hidden, vocab)
    sd = get_state_dict(model)
    r = rng(61)
    for k, v in sd.items():
        load(v, r.standard_normal(v.shape) * (0.8 if "weight" in k else 0.3))
    src = f32(r.standard_normal((2, 4, in_dim)))[0]
    tgt = r.integers(1, vocab, (2, 3))
    tgt_in = np.concatenate([np.full((2, 1), bos), tgt[:, :-1]], 1)
    p = {k: v.numpy().astype(F64) for k, v in sd.items()}
    np_loss = lambda: np_xent(np_seq2seq(p, src, tgt_in).reshape(-1, vocab), tgt.reshape(-1))
    st = Tensor(src.astype(np.float32))
    with Tensor.train():
        logits = model(st, Tensor(tgt_in.astype(np.int32)))
        loss = logits.reshape(-1, vocab).sparse_categorical_crossentropy(Tensor(tgt.reshape(-1).astype(np.int32)))
        loss.backward()
    np.testing.assert_allclose(logits.numpy(), np_seq2seq(p, src, tgt_in), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(loss.item(), np_loss(), rtol=1e-5)
    names = list(sd)
    check_grads(np_loss, [p[k] for k in names], [sd[k] for k in names], most=12)
    toks, gaps = np_seq2seq(p, src, None, bos, steps=5)
    assert gaps.min() > 1e-4  # no near-tie in an argmax
    assert model.greedy(st, bos, 5) == toks.astype(int).tolist()
