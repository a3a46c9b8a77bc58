"""Small model programs written the way tinygrad users write them, checked against an eager run or numpy: a
KV-cache transformer generating under TinyJit with a bound Variable, a GAN-style step calling one BatchNorm twice,
a loader reusing one numpy buffer, and a cache update inside @function."""

from __future__ import annotations

import numpy as np

from speck.tensor import Tensor, TinyJit, Variable, function, nn
from speck.tensor.nn import optim
from speck.tensor.nn.state import get_parameters, get_state_dict, load_state_dict


class _Attention:
    def __init__(self, dim: int, heads: int, ctx: int) -> None:
        self.heads, self.hd = heads, dim // heads
        self.qkv, self.out = nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.cache = Tensor.zeros(2, 1, ctx, heads, self.hd).contiguous().realize()

    def __call__(self, x: Tensor, start: int | Variable, mask: Tensor | None) -> Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, self.heads, self.hd).permute(2, 0, 1, 3, 4)
        self.cache.shrink((None, None, (start, start + s), None, None)).assign(Tensor.stack(k, v)).realize()
        keys = self.cache[0].shrink((None, (0, start + s), None, None)).transpose(1, 2)
        vals = self.cache[1].shrink((None, (0, start + s), None, None)).transpose(1, 2)
        att = q.transpose(1, 2).scaled_dot_product_attention(keys, vals, mask)
        return self.out(att.transpose(1, 2).reshape(b, s, -1))


class _TinyLM:
    def __init__(self, vocab: int = 40, dim: int = 32, heads: int = 4, ctx: int = 16) -> None:
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
        self.attn, self.norm, self.head = _Attention(dim, heads, ctx), nn.RMSNorm(dim), nn.Linear(dim, vocab)
        self.ctx = ctx

    def __call__(self, tokens: Tensor, start: int | Variable) -> Tensor:
        s = tokens.shape[1]
        mask = Tensor.full((1, 1, s, s), float("-inf")).triu(1) if s > 1 else None
        pos = Tensor.arange(self.ctx).reshape(1, -1)[:, start : start + s]
        h = self.tok(tokens) + self.pos(pos)
        h = h + self.attn(self.norm(h), start, mask)
        return self.head(h)[:, -1, :].argmax(-1)


def test_kv_cache_generation_under_tinyjit_matches_eager() -> None:
    Tensor.manual_seed(3)
    model = _TinyLM()
    prompt = [[1, 5, 7]]
    tok = model(Tensor(prompt), 0).item()
    jitted = [tok]
    step = TinyJit(lambda t, sp: model(t, sp).realize())
    pos = Variable("start_pos", 1, 15)
    for i in range(3, 11):
        tok = step(Tensor([[tok]]), pos.bind(i)).item()
        jitted.append(tok)
    ref_model = _TinyLM()
    weights = {k: v for k, v in get_state_dict(model).items() if "cache" not in k}
    load_state_dict(ref_model, weights, strict=False, verbose=False)
    tok = ref_model(Tensor(prompt), 0).item()
    eager = [tok]
    for i in range(3, 11):
        tok = ref_model(Tensor([[tok]]), i).item()
        eager.append(tok)
    assert jitted == eager


def test_gan_style_step_calls_one_batchnorm_twice() -> None:
    Tensor.manual_seed(0)
    disc_lin, disc_bn = nn.Linear(4, 3), nn.BatchNorm(3)
    opt = optim.Adam(get_parameters(disc_lin) + [disc_bn.weight, disc_bn.bias], lr=1e-3)
    real = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    fake = np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32) * 3 + 1
    w, b = disc_lin.weight.numpy(), disc_lin.bias.numpy()
    with Tensor.train():
        opt.zero_grad()
        d_real = disc_bn(disc_lin(Tensor(real))).sigmoid()
        d_fake = disc_bn(disc_lin(Tensor(fake))).sigmoid()
        loss = d_real.binary_crossentropy(Tensor.ones(8, 3)) + d_fake.binary_crossentropy(Tensor.zeros(8, 3))
        loss.backward()
        opt.step()
    rm, rv = np.zeros(3), np.ones(3)
    for x in (real, fake):  # both calls update the running statistics, in order
        h = x @ w.T + b
        rm = 0.9 * rm + 0.1 * h.mean(0)
        rv = 0.9 * rv + 0.1 * h.var(0, ddof=1)
    np.testing.assert_allclose(disc_bn.running_mean.numpy(), rm, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(disc_bn.running_var.numpy(), rv, rtol=1e-5, atol=1e-6)


def test_loader_reusing_one_buffer_realizes_each_batch() -> None:
    buf = np.empty((4, 3), np.float32)
    batches, sums = [], []
    for i in range(3):
        buf[:] = np.arange(12, dtype=np.float32).reshape(4, 3) * (i + 1)
        batches.append(Tensor(buf).realize())  # realized: the next fill of buf is not seen
        sums.append(float(buf.sum()))
    got = [float(t.sum().item()) for t in batches]
    assert got == sums


def test_cache_update_inside_function_writes_through() -> None:
    @function
    def append(cache: Tensor, pos: Tensor, row: Tensor) -> Tensor:
        cache[pos] = row
        return cache.sum(axis=1)

    cache = Tensor.zeros(4, 2).contiguous().realize()
    ref = np.zeros((4, 2), np.float32)
    for i in range(4):
        row = np.array([i + 1.0, -i], np.float32)
        sums = append(cache, Tensor([i]), Tensor(row.reshape(1, 2)))
        ref[i] = row
        np.testing.assert_array_equal(sums.numpy(), ref.sum(axis=1))
    np.testing.assert_array_equal(cache.numpy(), ref)
