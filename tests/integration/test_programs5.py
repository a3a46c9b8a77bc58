"""Whole model programs, fifth set, written the way tinygrad user code writes them (the names `from tinygrad import
...` gives, here from speck.tensor): beam search over a small recurrent language model, one jitted step per token
(log_softmax, topk over beams x vocabulary, the parents' states gathered), and nucleus sampling from seeded uniform
draws; a transformer encoder-decoder with bool key-padding and causal masks, cross-attention, label-smoothed
cross-entropy that ignores padding, and greedy decoding under TinyJit; a RealNVP normalising flow (affine coupling
layers, log-determinants, exact inverse, sampling); a WaveNet-style stack of dilated causal convolutions with gated
activations, residual and skip paths; a causal-attention classifier trained on batches of varying size and length
under one TinyJit capture (two bound Variables shrink the data buffers). Each is checked against a numpy float64
re-implementation of the same math: forward values, gradients by central differences of the numpy forward, and the
optimizer's update rule."""

from __future__ import annotations

import math

import numpy as np
from gradcheck import F64, P, check_grads, init, np_adam, num_grad, rng

from speck.tensor import Tensor, TinyJit, Variable, dtypes, nn
from speck.tensor.nn.optim import Adam
from speck.tensor.nn.state import get_parameters, get_state_dict


def np_log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    z = x - x.max(axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis, keepdims=True))


def np_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.exp(np_log_softmax(x, axis))


def np_layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps) * w + b


def np_sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


# ---------------- beam search and nucleus sampling over a small recurrent LM, one jitted step per token ----------
class RecurrentLM:
    def __init__(self, vocab: int, dim: int) -> None:
        self.emb, self.wh, self.out = nn.Embedding(vocab, dim), nn.Linear(dim, dim), nn.Linear(dim, vocab)

    def __call__(self, tok: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        h = (self.emb(tok) + self.wh(h)).tanh()
        return self.out(h).log_softmax(-1), h


def np_lm(p: P, tok: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h = np.tanh(p["emb.weight"][tok] + h @ p["wh.weight"].T + p["wh.bias"])
    return np_log_softmax(h @ p["out.weight"].T + p["out.bias"]), h


def np_beam_search(p: P, bos: int, k: int, steps: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    seqs, scores = np.full((k, 1), bos), np.array([0.0] + [-np.inf] * (k - 1))
    tok, h = seqs[:, 0], np.zeros((k, dim))
    for _ in range(steps):
        logp, h = np_lm(p, tok, h)
        cand = (scores[:, None] + logp).reshape(-1)
        best = np.argsort(-cand, kind="stable")[:k]
        parent, tok = best // logp.shape[1], best % logp.shape[1]
        scores, h, seqs = cand[best], h[parent], np.concatenate([seqs[parent], tok[:, None]], 1)
    return seqs, scores


def test_beam_search_and_nucleus_sampling_with_jitted_steps_match_numpy() -> None:
    vocab, dim, k, steps = 9, 6, 3, 6
    model = RecurrentLM(vocab, dim)
    p = init(model, seed=3, scale=0.8)

    @TinyJit
    def beam_step(tok: Tensor, h: Tensor, scores: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        logp, h = model(tok, h)
        cand = (scores.unsqueeze(1) + logp).flatten()
        top, idx = cand.topk(k)
        parent = idx // vocab
        hh = h.gather(0, parent.unsqueeze(1).expand(k, dim))
        return top.realize(), parent.realize(), (idx % vocab).realize(), hh.contiguous().realize()

    seqs = np.full((k, 1), 0)
    tok, h = Tensor(seqs[:, 0].astype(np.int32)), Tensor.zeros(k, dim).contiguous()
    scores = Tensor([0.0] + [-math.inf] * (k - 1))  # every beam starts as the same prefix: only beam 0 is alive
    for _ in range(steps):
        scores, parent, tok, h = beam_step(tok, h, scores)
        seqs = np.concatenate([seqs[parent.numpy()], tok.numpy()[:, None]], 1)
    want_seqs, want_scores = np_beam_search(p, 0, k, steps, dim)
    np.testing.assert_array_equal(seqs, want_seqs)
    np.testing.assert_allclose(scores.numpy(), want_scores, rtol=1e-5)
    assert beam_step.cnt == steps and len(set(map(tuple, seqs))) == k  # k distinct hypotheses, best first
    assert np.all(np.diff(scores.numpy()) <= 0)

    # nucleus (top-p) sampling, the way generation loops write it: sort, cumsum, cut, renormalise, inverse CDF
    @TinyJit
    def sample_step(tok: Tensor, h: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
        logp, h = model(tok, h)
        probs = (logp / 0.8).softmax(-1)
        sp, order = probs.sort(-1, descending=True)
        keep = (sp.cumsum(-1) - sp) < 0.7  # the smallest prefix whose mass reaches top_p (the first always kept)
        sp = keep.where(sp, 0.0)
        cdf = (sp / sp.sum(-1, keepdim=True)).cumsum(-1)
        pick = (cdf < u.unsqueeze(1)).sum(-1).clip(0, vocab - 1)  # inverse CDF of the kept, renormalised mass
        nxt = order.gather(1, pick.unsqueeze(1)).squeeze(1)
        return nxt.cast(dtypes.int32).realize(), h.contiguous().realize()

    def sample(seed: int) -> np.ndarray:
        Tensor.manual_seed(seed)
        draws = [Tensor.rand(2).realize() for _ in range(steps)]
        tok, h, out = Tensor([1, 4], dtype=dtypes.int32), Tensor.zeros(2, dim).contiguous(), []
        for u in draws:
            tok, h = sample_step(tok, h, u)
            out.append(tok.numpy())
        return np.stack(out, 1)

    got = sample(11)
    Tensor.manual_seed(11)
    us = [Tensor.rand(2).numpy().astype(F64) for _ in range(steps)]
    tok, hn, want = np.array([1, 4]), np.zeros((2, dim)), []
    for u in us:
        logp, hn = np_lm(p, tok, hn)
        probs = np_softmax(logp / 0.8)
        order = np.argsort(-probs, -1, kind="stable")
        sp = np.take_along_axis(probs, order, -1)
        sp = np.where(np.cumsum(sp, -1) - sp < 0.7, sp, 0.0)
        cdf = np.cumsum(sp / sp.sum(-1, keepdims=True), -1)
        tok = order[np.arange(2), np.minimum((cdf < u[:, None]).sum(-1), vocab - 1)]
        assert np.all(sp[np.arange(2), np.argmax(order == tok[:, None], -1)] > 0)  # sampled inside the nucleus
        want.append(tok)
    np.testing.assert_array_equal(got, np.stack(want, 1))
    np.testing.assert_array_equal(sample(11), got)  # same seed, same text


# ---------------- transformer encoder-decoder: padding masks, cross-attention, label smoothing, greedy decode -----
class MHA:
    def __init__(self, dim: int, heads: int) -> None:
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.heads, self.hd = heads, dim // heads

    def split(self, x: Tensor) -> Tensor:
        return x.reshape(x.shape[0], x.shape[1], self.heads, self.hd).transpose(1, 2)

    def __call__(self, x: Tensor, mem: Tensor, mask: Tensor) -> Tensor:
        a = self.split(self.q(x)).scaled_dot_product_attention(self.split(self.k(mem)), self.split(self.v(mem)), mask)
        return self.o(a.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))


class EncDec:
    PAD, BOS = 0, 1

    def __init__(self, vocab: int, dim: int, heads: int, max_len: int) -> None:
        self.emb, self.pos = nn.Embedding(vocab, dim), nn.Embedding(max_len, dim)
        self.enc_attn, self.dec_self, self.dec_cross = MHA(dim, heads), MHA(dim, heads), MHA(dim, heads)
        self.ln = [nn.LayerNorm(dim) for _ in range(4)]
        self.ff1, self.ff2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.head = nn.Linear(dim, vocab)

    def embed(self, ids: Tensor) -> Tensor:
        return self.emb(ids) + self.pos(Tensor.arange(ids.shape[1]).reshape(1, -1))

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        key_ok = (src != self.PAD).reshape(src.shape[0], 1, 1, src.shape[1])  # bool (B, 1, 1, S)
        x = self.embed(src)
        x = self.ln[0](x + self.enc_attn(x, x, key_ok))
        return x, key_ok

    def decode(self, tgt: Tensor, mem: Tensor, src_ok: Tensor) -> Tensor:
        t = tgt.shape[1]
        causal = Tensor.ones(t, t, dtype=dtypes.bool).tril()
        self_ok = causal.reshape(1, 1, t, t) & (tgt != self.PAD).reshape(tgt.shape[0], 1, 1, t)
        y = self.embed(tgt)
        y = self.ln[1](y + self.dec_self(y, y, self_ok))
        y = self.ln[2](y + self.dec_cross(y, mem, src_ok))
        y = self.ln[3](y + self.ff2(self.ff1(y).relu()))
        return self.head(y)

    def __call__(self, src: Tensor, tgt: Tensor) -> Tensor:
        mem, ok = self.encode(src)
        return self.decode(tgt, mem, ok)


def np_mha(p: P, n: str, x: np.ndarray, mem: np.ndarray, ok: np.ndarray, heads: int) -> np.ndarray:
    lin = lambda z, m: z @ p[f"{n}.{m}.weight"].T + p[f"{n}.{m}.bias"]
    b, t, d = x.shape
    sp = lambda z: z.reshape(b, z.shape[1], heads, d // heads).transpose(0, 2, 1, 3)
    q, k, v = sp(lin(x, "q")), sp(lin(mem, "k")), sp(lin(mem, "v"))
    s = np.where(ok, q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // heads), -np.inf)
    return lin((np_softmax(s) @ v).transpose(0, 2, 1, 3).reshape(b, t, d), "o")


def np_encdec(p: P, src: np.ndarray, tgt: np.ndarray, heads: int) -> np.ndarray:
    ln = lambda z, i: np_layernorm(z, p[f"ln.{i}.weight"], p[f"ln.{i}.bias"])
    emb = lambda ids: p["emb.weight"][ids] + p["pos.weight"][: ids.shape[1]][None]
    src_ok = (src != 0)[:, None, None, :]
    x = emb(src)
    x = ln(x + np_mha(p, "enc_attn", x, x, src_ok, heads), 0)
    t = tgt.shape[1]
    self_ok = np.tril(np.ones((t, t), bool))[None, None] & (tgt != 0)[:, None, None, :]
    y = emb(tgt)
    y = ln(y + np_mha(p, "dec_self", y, y, self_ok, heads), 1)
    y = ln(y + np_mha(p, "dec_cross", y, x, src_ok, heads), 2)
    y = ln(y + np.maximum(y @ p["ff1.weight"].T + p["ff1.bias"], 0) @ p["ff2.weight"].T + p["ff2.bias"], 3)
    return y @ p["head.weight"].T + p["head.bias"]


def np_smoothed_xent(logits: np.ndarray, y: np.ndarray, eps: float, ignore: int) -> float:
    lp = np_log_softmax(logits.reshape(-1, logits.shape[-1]))
    y = y.reshape(-1)
    per = -(1 - eps) * lp[np.arange(len(y)), y] - eps * lp.mean(-1)
    keep = y != ignore
    return float(per[keep].sum() / keep.sum())


def test_encoder_decoder_with_padding_masks_label_smoothing_and_jitted_greedy_decode() -> None:
    vocab, dim, heads, max_len = 10, 8, 2, 8
    model = EncDec(vocab, dim, heads, max_len)
    p = init(model, seed=21, scale=0.4)
    params = get_state_dict(model)
    src = np.array([[4, 7, 3, 9, 2], [5, 8, 2, 0, 0]])  # the second sentence padded
    tgt_in = np.array([[1, 6, 3, 5, 7], [1, 9, 4, 0, 0]])
    tgt_out = np.array([[6, 3, 5, 7, 2], [9, 4, 2, 0, 0]])  # padding positions are ignored by the loss
    st, sst, ot = (Tensor(a.astype(np.int32)) for a in (src, tgt_in, tgt_out))
    opt = Adam(get_parameters(model), lr=0.01)

    @TinyJit
    def train_step(s: Tensor, ti: Tensor, to: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = model(s, ti).sparse_categorical_crossentropy(to, ignore_index=0, label_smoothing=0.1).backward()
            opt.step()
        return loss.realize()

    # step 1 eagerly: loss and every gradient against numpy
    np_loss = lambda: np_smoothed_xent(np_encdec(p, src, tgt_in, heads), tgt_out, 0.1, 0)
    grads = {k: num_grad(np_loss, p[k]) for k in p}
    with Tensor.train():
        loss = model(st, sst).sparse_categorical_crossentropy(ot, ignore_index=0, label_smoothing=0.1).backward()
    np.testing.assert_allclose(loss.item(), np_loss(), rtol=1e-5)
    check_grads(params, grads)
    opt.zero_grad()
    # the padded query rows still attend to their earlier tokens: their logits are finite, and the pad embedding
    # row gets no gradient from the loss (the padded targets are ignored, the padded keys masked)
    assert np.isfinite(model(st, sst).numpy()).all()
    ad: dict = {}
    losses = []
    for step in range(1, 5):
        lo = np_loss()
        g = {k: num_grad(np_loss, p[k]) for k in p} if step > 1 else grads
        losses.append(train_step(st, sst, ot).item())
        np.testing.assert_allclose(losses[-1], lo, rtol=1e-4, err_msg=f"step {step}")
        np_adam(p, g, ad, step, lr=0.01)
    for k, t in params.items():
        np.testing.assert_allclose(t.numpy(), p[k], rtol=1e-3, atol=1e-4, err_msg=k)
    assert losses[-1] < losses[0]

    # greedy decode: the whole fixed-size target buffer each step under TinyJit, the next token read at position i
    @TinyJit
    def dec_step(s: Tensor, buf: Tensor) -> Tensor:
        return model(s, buf).argmax(-1).realize()

    buf = np.zeros((2, max_len), np.int64)
    buf[:, 0] = 1
    for i in range(max_len - 1):
        nxt = dec_step(st, Tensor(buf.astype(np.int32))).numpy()[:, i]
        want = np_encdec(p, src, buf, heads).argmax(-1)[:, i]
        np.testing.assert_array_equal(nxt, want, err_msg=f"position {i}")
        buf[:, i + 1] = nxt
    assert dec_step.cnt == max_len - 1


# ---------------- RealNVP: affine coupling layers, log-determinant, exact inverse, sampling ----------------
class Coupling:
    def __init__(self, dim: int, hidden: int, mask: np.ndarray) -> None:
        self.np_mask = mask.astype(np.float32)  # numpy, not a Tensor: get_state_dict would list it as a weight
        self.l1, self.s, self.t = nn.Linear(dim, hidden), nn.Linear(hidden, dim), nn.Linear(hidden, dim)

    @property
    def mask(self) -> Tensor:
        return Tensor(self.np_mask)

    def st(self, xm: Tensor) -> tuple[Tensor, Tensor]:
        h = self.l1(xm).relu()
        return self.s(h).tanh() * (1 - self.mask), self.t(h) * (1 - self.mask)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        s, t = self.st(x * self.mask)
        return x * self.mask + (1 - self.mask) * (x * s.exp() + t), s.sum(-1)

    def inverse(self, y: Tensor) -> Tensor:
        s, t = self.st(y * self.mask)
        return y * self.mask + (1 - self.mask) * ((y - t) * (-s).exp())


class RealNVP:
    def __init__(self, dim: int, hidden: int, n: int) -> None:
        half = np.arange(dim) < dim // 2
        self.layers = [Coupling(dim, hidden, half if i % 2 == 0 else ~half) for i in range(n)]

    def log_prob(self, x: Tensor) -> Tensor:
        logdet = Tensor.zeros(x.shape[0])
        for layer in self.layers:
            x, ld = layer.forward(x)
            logdet = logdet + ld
        return (-0.5 * x.square() - 0.5 * math.log(2 * math.pi)).sum(-1) + logdet

    def sample(self, z: Tensor) -> Tensor:
        for layer in reversed(self.layers):
            z = layer.inverse(z)
        return z


def np_flow_logp(p: P, x: np.ndarray, n: int) -> np.ndarray:
    dim = x.shape[1]
    half = (np.arange(dim) < dim // 2).astype(F64)
    logdet = np.zeros(len(x))
    for i in range(n):
        m = half if i % 2 == 0 else 1 - half
        lin = lambda z, nm, i=i: z @ p[f"layers.{i}.{nm}.weight"].T + p[f"layers.{i}.{nm}.bias"]
        h = np.maximum(lin(x * m, "l1"), 0)
        s, t = np.tanh(lin(h, "s")) * (1 - m), lin(h, "t") * (1 - m)
        x = x * m + (1 - m) * (x * np.exp(s) + t)
        logdet += s.sum(-1)
    return (-0.5 * x**2 - 0.5 * math.log(2 * math.pi)).sum(-1) + logdet


def test_realnvp_flow_log_prob_gradients_inverse_and_training() -> None:
    dim, hidden, n = 4, 6, 3
    model = RealNVP(dim, hidden, n)
    p = init(model, seed=31, scale=0.4)
    params = get_state_dict(model)
    r = rng(32)
    x = r.standard_normal((16, dim)) @ np.array([[1, 0.5, 0, 0], [0, 1, 0.3, 0], [0, 0, 1, -0.4], [0, 0, 0, 0.5]])
    xt = Tensor(x.astype(np.float32))
    np.testing.assert_allclose(model.log_prob(xt).numpy(), np_flow_logp(p, x, n), rtol=1e-5, atol=1e-5)
    # the inverse undoes the forward exactly (to float32 rounding)
    z = xt
    for layer in model.layers:
        z = layer.forward(z)[0]
    np.testing.assert_allclose(model.sample(z).numpy(), x, rtol=1e-4, atol=1e-5)

    opt = Adam(get_parameters(model), lr=0.02)

    @TinyJit
    def step(xb: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = (-model.log_prob(xb).mean()).backward()
            opt.step()
        return loss.realize()

    np_nll = lambda: float(-np_flow_logp(p, x, n).mean())
    with Tensor.train():
        (-model.log_prob(xt).mean()).backward()
    grads = {k: num_grad(np_nll, p[k]) for k in p}
    check_grads(params, grads)
    ad: dict = {}
    losses = []
    for i in range(1, 7):
        g = grads if i == 1 else {k: num_grad(np_nll, p[k]) for k in p}
        want = np_nll()
        losses.append(step(xt).item())
        np.testing.assert_allclose(losses[-1], want, rtol=1e-4, err_msg=f"step {i}")
        np_adam(p, g, ad, i, lr=0.02)
    assert losses[-1] < losses[0] - 0.05
    # seeded sampling: the inverse pushed over N(0, 1) draws, same seed same samples; the log-density of a sample
    # evaluated through the forward pass agrees with numpy at the trained parameters
    Tensor.manual_seed(7)
    s1 = model.sample(Tensor.randn(5, dim)).numpy()
    Tensor.manual_seed(7)
    s2 = model.sample(Tensor.randn(5, dim)).numpy()
    np.testing.assert_array_equal(s1, s2)
    lp = model.log_prob(Tensor(s1)).numpy()
    np.testing.assert_allclose(lp, np_flow_logp(p, s1.astype(F64), n), rtol=1e-3, atol=1e-3)


# ---------------- WaveNet: dilated causal convolutions, gated activations, residual and skip paths ----------------
class WaveNet:
    def __init__(self, classes: int, ch: int, dilations: tuple[int, ...]) -> None:
        self.inp = nn.Conv1d(1, ch, 1)
        self.dil = dilations
        self.filt = [nn.Conv1d(ch, ch, 2, dilation=d) for d in dilations]
        self.gate = [nn.Conv1d(ch, ch, 2, dilation=d) for d in dilations]
        self.res = [nn.Conv1d(ch, ch, 1) for _ in dilations]
        self.skip = [nn.Conv1d(ch, ch, 1) for _ in dilations]
        self.out = nn.Conv1d(ch, classes, 1)

    def __call__(self, x: Tensor) -> Tensor:
        h, skips = self.inp(x), None
        for d, f, g, r, s in zip(self.dil, self.filt, self.gate, self.res, self.skip, strict=True):
            hp = h.pad((d, 0))  # left padding only: the output at t sees inputs <= t
            z = f(hp).tanh() * g(hp).sigmoid()
            h = h + r(z)
            skips = s(h) if skips is None else skips + s(h)
        assert skips is not None
        return self.out(skips.relu())  # (B, classes, L)


def np_conv1d(x: np.ndarray, w: np.ndarray, b: np.ndarray, d: int = 1) -> np.ndarray:
    k = w.shape[2]
    n = x.shape[2] - d * (k - 1)
    return sum(np.einsum("oc,bcl->bol", w[:, :, j], x[:, :, j * d : j * d + n]) for j in range(k)) + b[None, :, None]


def np_wavenet(p: P, x: np.ndarray, dil: tuple[int, ...]) -> np.ndarray:
    c = lambda z, n, d=1: np_conv1d(z, p[f"{n}.weight"], p[f"{n}.bias"], d)
    h, skips = c(x, "inp"), 0.0
    for i, d in enumerate(dil):
        hp = np.pad(h, ((0, 0), (0, 0), (d, 0)))
        z = np.tanh(c(hp, f"filt.{i}", d)) * np_sigmoid(c(hp, f"gate.{i}", d))
        h = h + c(z, f"res.{i}")
        skips = skips + c(h, f"skip.{i}")
    return c(np.maximum(skips, 0), "out")


def test_wavenet_dilated_causal_convs_are_causal_and_train_like_numpy() -> None:
    classes, ch, dil, length = 5, 4, (1, 2, 4), 12
    model = WaveNet(classes, ch, dil)
    p = init(model, seed=41, scale=0.5)
    params = get_state_dict(model)
    r = rng(42)
    wave = np.sin(np.arange(length + 1) * 0.7)[None] * np.array([[1.0], [0.6]]) + 0.05 * r.standard_normal((2, 13))
    x = wave[:, None, :-1]
    y = np.clip(((wave[:, 1:] + 1) / 2 * classes).astype(np.int64), 0, classes - 1)  # next sample's bin
    xt, yt = Tensor(x.astype(np.float32)), Tensor(y.astype(np.int32))
    out = model(xt)
    assert out.shape == (2, classes, length)
    np.testing.assert_allclose(out.numpy(), np_wavenet(p, x, dil), rtol=1e-4, atol=1e-5)
    # causality: changing the input from time 7 on leaves the outputs before 7 unchanged, and changes one after
    x2 = x.copy()
    x2[:, :, 7:] += 1.0
    out2 = model(Tensor(x2.astype(np.float32))).numpy()
    np.testing.assert_array_equal(out2[..., :7], out.numpy()[..., :7])
    assert not np.allclose(out2[..., 7:], out.numpy()[..., 7:])

    def np_loss() -> float:
        lp = np_log_softmax(np_wavenet(p, x, dil).transpose(0, 2, 1))
        return float(-np.take_along_axis(lp, y[..., None], -1).mean())

    opt = Adam(get_parameters(model), lr=0.01)

    @TinyJit
    def step(xb: Tensor, yb: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = model(xb).transpose(1, 2).sparse_categorical_crossentropy(yb).backward()
            opt.step()
        return loss.realize()

    with Tensor.train():
        model(xt).transpose(1, 2).sparse_categorical_crossentropy(yt).backward()
    grads = {k: num_grad(np_loss, p[k]) for k in p}
    check_grads(params, grads)
    ad: dict = {}
    losses = []
    for i in range(1, 5):
        g = grads if i == 1 else {k: num_grad(np_loss, p[k]) for k in p}
        want = np_loss()
        losses.append(step(xt, yt).item())
        np.testing.assert_allclose(losses[-1], want, rtol=1e-4, err_msg=f"step {i}")
        np_adam(p, g, ad, i, lr=0.01)
    for k, t in params.items():
        np.testing.assert_allclose(t.numpy(), p[k], rtol=1e-3, atol=1e-4, err_msg=k)
    assert losses[-1] < losses[0]


# ---------------- variable batch size and sequence length: one TinyJit capture, two bound Variables ----------------
class AttnClassifier:
    def __init__(self, vocab: int, dim: int, classes: int) -> None:
        self.emb, self.head = nn.Embedding(vocab, dim), nn.Linear(dim, classes)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)  # (a key bias has a zero gradient: Adam would amplify noise)

    def __call__(self, tok: Tensor) -> Tensor:
        h = self.emb(tok)
        q, k, v = self.qkv(h).chunk(3, -1)
        return self.head((h + q.scaled_dot_product_attention(k, v, is_causal=True)).mean(1))


def np_attn_classifier(p: P, tok: np.ndarray) -> np.ndarray:
    h = p["emb.weight"][tok]
    q, k, v = np.split(h @ p["qkv.weight"].T, 3, -1)
    t = tok.shape[1]
    s = np.where(np.tril(np.ones((t, t), bool)), q @ k.transpose(0, 2, 1) / math.sqrt(h.shape[-1]), -np.inf)
    return (h + np_softmax(s) @ v).mean(1) @ p["head.weight"].T + p["head.bias"]


def test_variable_batch_and_length_training_under_one_capture_matches_numpy() -> None:
    vocab, dim, classes, b_max, t_max = 11, 6, 3, 6, 9
    model = AttnClassifier(vocab, dim, classes)
    p = init(model, seed=51, scale=0.5)
    params = get_state_dict(model)
    r = rng(52)
    tok, y = r.integers(0, vocab, (b_max, t_max)), r.integers(0, classes, b_max)
    tok_t, y_t = Tensor(tok.astype(np.int32)).realize(), Tensor(y.astype(np.int32)).realize()
    opt = Adam(get_parameters(model), lr=0.02)

    @TinyJit
    def step(n: Variable, t: Variable) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            logits = model(tok_t.shrink(((0, n), (0, t))))
            loss = logits.sparse_categorical_crossentropy(y_t.shrink(((0, n),))).backward()
            opt.step()
        return loss.realize()

    ad: dict = {}
    for i, (n, t) in enumerate([(2, 3), (4, 5), (6, 9), (3, 2), (5, 7), (6, 1)], start=1):

        def np_loss(n: int = n, t: int = t) -> float:
            lp = np_log_softmax(np_attn_classifier(p, tok[:n, :t]))
            return float(-lp[np.arange(n), y[:n]].mean())

        want = np_loss()
        g = {k: num_grad(np_loss, p[k]) for k in p}
        got = step(Variable("n", 1, b_max).bind(n), Variable("t", 1, t_max).bind(t)).item()
        np.testing.assert_allclose(got, want, rtol=1e-4, err_msg=f"step {i} (n={n}, t={t})")
        np_adam(p, g, ad, i, lr=0.02)
        for k, tt in params.items():
            np.testing.assert_allclose(tt.numpy(), p[k], rtol=1e-3, atol=1e-4, err_msg=f"{k} step {i}")
        if i == 2:
            cap = step.captured
    assert step.cnt == 6 and cap is not None and step.captured is cap  # the second call's capture served every shape
