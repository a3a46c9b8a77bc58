"""Model programs (fifth set, with test_programs5.py), vision and attention variants written the way tinygrad users
write them: a Swin-style block (window partition, cyclic shift with roll, a relative-position bias gathered from a
learned table, the shifted-window mask); a MobileNetV3-style inverted residual (depthwise conv, BatchNorm in training,
hardswish, squeeze-excitation) whose BatchNorms are then folded into the convolutions for inference; causal linear
attention computed in parallel with cumsum and step by step with a carried state under TinyJit. Each is checked
against a numpy float64 re-implementation: forward values, gradients by central differences, optimizer updates."""

from __future__ import annotations

import math

import numpy as np
from gradcheck import F64, P, check_grads, init, load, np_adam, num_grad, rng

from speck.tensor import Tensor, TinyJit, nn
from speck.tensor.nn.optim import SGD, Adam
from speck.tensor.nn.state import get_parameters, get_state_dict


def np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps) * w + b


def np_gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


# ---------------- Swin block: windows, cyclic shift by roll, relative position bias, shifted-window mask ----------
def relative_index(ws: int) -> np.ndarray:
    """(ws*ws, ws*ws) indices into the ((2ws-1)^2, heads) bias table: the pair's offset in rows and columns."""
    coords = np.stack(np.meshgrid(np.arange(ws), np.arange(ws), indexing="ij")).reshape(2, -1)
    rel = (coords[:, :, None] - coords[:, None, :]).transpose(1, 2, 0) + (ws - 1)
    return rel[..., 0] * (2 * ws - 1) + rel[..., 1]


def shift_mask(h: int, w: int, ws: int, s: int) -> np.ndarray:
    """(windows, N, N) additive mask: -100 between tokens the cyclic shift brought together from different regions."""
    region = np.zeros((h, w))
    cnt = 0
    for hs in (slice(0, -ws), slice(-ws, -s), slice(-s, None)):
        for wsl in (slice(0, -ws), slice(-ws, -s), slice(-s, None)):
            region[hs, wsl] = cnt
            cnt += 1
    win = region.reshape(h // ws, ws, w // ws, ws).transpose(0, 2, 1, 3).reshape(-1, ws * ws)
    return np.where(win[:, None, :] != win[:, :, None], -100.0, 0.0)


class SwinBlock:
    def __init__(self, dim: int, heads: int, ws: int, shift: int, h: int, w: int) -> None:
        self.dim, self.heads, self.ws, self.shift, self.h, self.w = dim, heads, ws, shift, h, w
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.bias_table = Tensor.zeros((2 * ws - 1) ** 2, heads)
        self.np_index, self.np_mask = relative_index(ws), shift_mask(h, w, ws, shift)  # constants, kept as numpy

    def windows(self, x: Tensor) -> Tensor:
        b, ws = x.shape[0], self.ws
        x = x.reshape(b, self.h // ws, ws, self.w // ws, ws, self.dim).permute(0, 1, 3, 2, 4, 5)
        return x.reshape(-1, ws * ws, self.dim)

    def merge(self, x: Tensor, b: int) -> Tensor:
        ws = self.ws
        x = x.reshape(b, self.h // ws, self.w // ws, ws, ws, self.dim).permute(0, 1, 3, 2, 4, 5)
        return x.reshape(b, self.h, self.w, self.dim)

    def __call__(self, x: Tensor) -> Tensor:
        b, n_win, n = x.shape[0], (self.h // self.ws) * (self.w // self.ws), self.ws * self.ws
        y = self.norm1(x).roll((-self.shift, -self.shift), (1, 2))
        win = self.windows(y)
        hd = self.dim // self.heads
        q, k, v = self.qkv(win).reshape(-1, n, 3, self.heads, hd).permute(2, 0, 3, 1, 4)
        bias = self.bias_table[Tensor(self.np_index.astype(np.int32))].permute(2, 0, 1)  # (heads, N, N)
        mask = Tensor(self.np_mask.astype(np.float32)).reshape(1, n_win, 1, n, n)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd) + bias
        att = (att.reshape(b, n_win, self.heads, n, n) + mask).reshape(-1, self.heads, n, n)
        out = (att.softmax(-1) @ v).transpose(1, 2).reshape(-1, n, self.dim)
        y = self.merge(self.proj(out), b).roll((self.shift, self.shift), (1, 2))
        x = x + y
        return x + self.fc2(self.fc1(self.norm2(x)).gelu())


def np_swin(p: P, x: np.ndarray, heads: int, ws: int, s: int, masked: bool = True) -> np.ndarray:
    b, h, w, d = x.shape
    n, hd = ws * ws, d // heads
    lin = lambda z, nm: z @ p[f"{nm}.weight"].T + p[f"{nm}.bias"]
    y = np.roll(np_layernorm(x, p["norm1.weight"], p["norm1.bias"]), (-s, -s), (1, 2))
    win = y.reshape(b, h // ws, ws, w // ws, ws, d).transpose(0, 1, 3, 2, 4, 5).reshape(-1, n, d)
    q, k, v = lin(win, "qkv").reshape(-1, n, 3, heads, hd).transpose(2, 0, 3, 1, 4)
    bias = p["bias_table"][relative_index(ws)].transpose(2, 0, 1)
    att = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd) + bias
    nw = (h // ws) * (w // ws)
    mask = shift_mask(h, w, ws, s)[None, :, None] if masked else 0.0
    att = (att.reshape(b, nw, heads, n, n) + mask).reshape(-1, heads, n, n)
    out = (np_softmax(att) @ v).transpose(0, 2, 1, 3).reshape(-1, n, d)
    out = lin(out, "proj").reshape(b, h // ws, w // ws, ws, ws, d).transpose(0, 1, 3, 2, 4, 5).reshape(b, h, w, d)
    x = x + np.roll(out, (s, s), (1, 2))
    return x + lin(np_gelu(lin(np_layernorm(x, p["norm2.weight"], p["norm2.bias"]), "fc1")), "fc2")


def test_swin_block_shifted_windows_relative_bias_gradients_and_adam() -> None:
    dim, heads, ws, s, h, w = 8, 2, 2, 1, 4, 4
    model = SwinBlock(dim, heads, ws, s, h, w)
    p = init(model, seed=61, scale=0.4)
    params = get_state_dict(model)
    assert set(params) == set(p) and "bias_table" in p
    r = rng(62)
    x, target = r.standard_normal((2, h, w, dim)), r.standard_normal((2, h, w, dim))
    xt, tt = Tensor(x.astype(np.float32)), Tensor(target.astype(np.float32))
    out = model(xt).numpy()
    np.testing.assert_allclose(out, np_swin(p, x, heads, ws, s), rtol=1e-4, atol=1e-4)
    # the mask is applied: tokens the cyclic shift wrapped around attend only within their own region
    assert np.abs(out - np_swin(p, x, heads, ws, s, masked=False)).max() > 1e-2

    def np_loss() -> float:
        return float(((np_swin(p, x, heads, ws, s) - target) ** 2).mean())

    opt = Adam(get_parameters(model), lr=0.01)

    @TinyJit
    def step(xb: Tensor, yb: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = (model(xb) - yb).square().mean().backward()
            opt.step()
        return loss.realize()

    with Tensor.train():
        (model(xt) - tt).square().mean().backward()
    grads = {k: num_grad(np_loss, p[k]) for k in p}
    check_grads(params, grads)
    assert np.abs(grads["bias_table"]).max() > 1e-4  # the gathered table is trained (duplicate indices summed)
    opt.zero_grad()
    ad: dict = {}
    losses = []
    for i in range(1, 5):
        g = grads if i == 1 else {k: num_grad(np_loss, p[k]) for k in p}
        want = np_loss()
        losses.append(step(xt, tt).item())
        np.testing.assert_allclose(losses[-1], want, rtol=1e-4, err_msg=f"step {i}")
        np_adam(p, g, ad, i, lr=0.01)
    # the key bias shifts every score of a query row alike (softmax ignores it): its gradient is 0, and Adam's
    # update of that 0 is rounding noise scaled up, so it is left out of the comparison
    np.testing.assert_allclose(grads["qkv.bias"][dim : 2 * dim], 0, atol=1e-8)
    for k, t in params.items():
        got, want = t.numpy(), p[k]
        if k == "qkv.bias":
            got, want = np.delete(got, np.s_[dim : 2 * dim]), np.delete(want, np.s_[dim : 2 * dim])
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4, err_msg=k)
    assert losses[-1] < losses[0]


# ---------------- MobileNetV3-style inverted residual: depthwise conv, BatchNorm, hardswish, SE; BN folding --------
class InvertedResidual:
    def __init__(self, c: int, e: int, classes: int) -> None:
        self.expand, self.bn1 = nn.Conv2d(c, e, 1, bias=False), nn.BatchNorm2d(e)
        self.dw, self.bn2 = nn.Conv2d(e, e, 3, padding=1, groups=e, bias=False), nn.BatchNorm2d(e)
        self.se1, self.se2 = nn.Linear(e, max(e // 4, 1)), nn.Linear(max(e // 4, 1), e)
        self.project, self.bn3 = nn.Conv2d(e, c, 1, bias=False), nn.BatchNorm2d(c)
        self.head = nn.Linear(c, classes)

    def __call__(self, x: Tensor) -> Tensor:
        h = self.bn1(self.expand(x)).hardswish()
        h = self.bn2(self.dw(h)).hardswish()
        s = self.se2(self.se1(h.mean((2, 3))).relu()).hardsigmoid()
        h = h * s.reshape(*s.shape, 1, 1)
        h = x + self.bn3(self.project(h))
        return self.head(h.mean((2, 3)))


BN_STATS = ("running_mean", "running_var", "num_batches_tracked")


def np_conv(x: np.ndarray, w: np.ndarray, groups: int = 1, pad: int = 0) -> np.ndarray:
    n, c, hh, ww = x.shape
    o, cg, k, _ = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = hh + 2 * pad - k + 1, ww + 2 * pad - k + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for g in range(groups):
        xs, ws_ = xp[:, g * cg : (g + 1) * cg], w[g * og : (g + 1) * og]
        for i in range(k):
            for j in range(k):
                out[:, g * og : (g + 1) * og] += np.einsum(
                    "nchw,oc->nohw", xs[:, :, i : i + oh, j : j + ow], ws_[:, :, i, j]
                )
    return out


def np_bn(x: np.ndarray, p: P, name: str, stats: P | None, eps: float = 1e-5) -> np.ndarray:
    """Training mode when `stats` is given (batch statistics, the running ones updated in it), eval otherwise."""
    if stats is not None:
        m, v = x.mean((0, 2, 3)), x.var((0, 2, 3))
        n = x.size / x.shape[1]
        stats[f"{name}.running_mean"] = 0.9 * stats[f"{name}.running_mean"] + 0.1 * m
        stats[f"{name}.running_var"] = 0.9 * stats[f"{name}.running_var"] + 0.1 * v * n / (n - 1)
    else:
        m, v = p[f"{name}.running_mean"], p[f"{name}.running_var"]
    sh = (1, -1, 1, 1)
    return (x - m.reshape(sh)) / np.sqrt(v.reshape(sh) + eps) * p[f"{name}.weight"].reshape(sh) + p[
        f"{name}.bias"
    ].reshape(sh)


def np_hswish(x: np.ndarray) -> np.ndarray:
    return x * np.clip(x + 3, 0, 6) / 6


def np_mobile(p: P, x: np.ndarray, stats: P | None) -> np.ndarray:
    e = p["expand.weight"].shape[0]
    h = np_hswish(np_bn(np_conv(x, p["expand.weight"]), p, "bn1", stats))
    h = np_hswish(np_bn(np_conv(h, p["dw.weight"], groups=e, pad=1), p, "bn2", stats))
    s = np.maximum(h.mean((2, 3)) @ p["se1.weight"].T + p["se1.bias"], 0) @ p["se2.weight"].T + p["se2.bias"]
    h = h * (np.clip(s + 3, 0, 6) / 6)[..., None, None]
    h = x + np_bn(np_conv(h, p["project.weight"]), p, "bn3", stats)
    return h.mean((2, 3)) @ p["head.weight"].T + p["head.bias"]


def fold(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    """The conv with the eval-mode BatchNorm after it folded in: w * g / sqrt(var + eps), b = beta - mean * scale."""
    out = nn.Conv2d(conv.weight.shape[1] * conv.groups, conv.weight.shape[0], conv.weight.shape[2],
                    padding=conv.padding, groups=conv.groups)  # fmt: skip
    assert bn.weight is not None and bn.bias is not None and bn.running_var is not None
    scale = bn.weight / (bn.running_var + bn.eps).sqrt()
    out.weight = (conv.weight * scale.reshape(-1, 1, 1, 1)).realize()
    out.bias = (bn.bias - bn.running_mean * scale).realize()
    return out


def test_mobilenet_block_trains_with_batchnorm_then_folds_it_into_the_convs() -> None:
    c, e, classes = 4, 8, 3
    model = InvertedResidual(c, e, classes)
    p = init(model, seed=71, scale=0.5, skip=BN_STATS)
    for k, t in get_state_dict(model).items():
        if "bn" in k and k.endswith(".weight"):  # gains near 1 (a random sign would be legal, just unusual)
            load(t, 1 + 0.2 * rng(72).standard_normal(t.shape))
            p[k] = t.numpy().astype(F64)
    stats = {k: t.numpy().astype(F64) for k, t in get_state_dict(model).items() if k.endswith(BN_STATS[:2])}
    params = {k: t for k, t in get_state_dict(model).items() if k in p}
    r = rng(73)
    x, y = r.standard_normal((4, c, 5, 5)), r.integers(0, classes, 4)
    xt, yt = Tensor(x.astype(np.float32)), Tensor(y.astype(np.int32))

    def np_loss() -> float:
        z = np_mobile(p, x, {k: v.copy() for k, v in stats.items()})
        lp = z - z.max(-1, keepdims=True)
        lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
        return float(-lp[np.arange(4), y].mean())

    opt = SGD(get_parameters(model), lr=0.05, momentum=0.9)
    assert len(opt.params) == len(p)  # the running statistics are not trained

    @TinyJit
    def step(xb: Tensor, yb: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = model(xb).sparse_categorical_crossentropy(yb).backward()
            opt.step()
        return loss.realize()

    with Tensor.train():
        model(xt).sparse_categorical_crossentropy(yt).backward()
    grads = {k: num_grad(np_loss, p[k]) for k in p}
    check_grads(params, grads, rtol=3e-3, atol=5e-5)
    # the eager backward above ran a training forward: the running statistics moved once; start numpy there too
    np_mobile(p, x, stats)
    mom = {k: np.zeros_like(v) for k, v in p.items()}
    for i in range(4):
        g = grads if i == 0 else {k: num_grad(np_loss, p[k]) for k in p}
        np.testing.assert_allclose(step(xt, yt).item(), np_loss(), rtol=1e-4, err_msg=f"step {i}")
        np_mobile(p, x, stats)
        for k in p:
            mom[k] = 0.9 * mom[k] + g[k]
            p[k] = p[k] - 0.05 * mom[k]
    sd = get_state_dict(model)
    for k in p:
        np.testing.assert_allclose(sd[k].numpy(), p[k], rtol=1e-3, atol=1e-4, err_msg=k)
    for k in stats:
        np.testing.assert_allclose(sd[k].numpy(), stats[k], rtol=1e-4, atol=1e-5, err_msg=k)
    assert sd["bn1.num_batches_tracked"].item() == 5

    # inference: eval-mode BatchNorm against numpy, then the folded convolutions give the same logits
    p_eval = {**p, **stats}
    np.testing.assert_allclose(model(xt).numpy(), np_mobile(p_eval, x, None), rtol=1e-4, atol=1e-4)
    f1, f2, f3 = fold(model.expand, model.bn1), fold(model.dw, model.bn2), fold(model.project, model.bn3)

    @TinyJit
    def folded(xb: Tensor) -> Tensor:
        h = f2(f1(xb).hardswish()).hardswish()
        s = model.se2(model.se1(h.mean((2, 3))).relu()).hardsigmoid()
        h = xb + f3(h * s.reshape(*s.shape, 1, 1))
        return model.head(h.mean((2, 3))).realize()

    for i in range(3):
        xb = r.standard_normal((2, c, 5, 5))
        got = folded(Tensor(xb.astype(np.float32))).numpy()
        np.testing.assert_allclose(got, model(Tensor(xb.astype(np.float32))).numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got, np_mobile(p_eval, xb, None), rtol=1e-4, atol=1e-4, err_msg=f"batch {i}")


# ---------------- causal linear attention: parallel (cumsum) form, recurrent form under TinyJit, numpy quadratic ---
class LinearAttentionLM:
    def __init__(self, vocab: int, dim: int) -> None:
        self.emb = nn.Embedding(vocab, dim)
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.head = nn.Linear(dim, vocab)

    @staticmethod
    def phi(x: Tensor) -> Tensor:
        return x.elu() + 1

    def __call__(self, idx: Tensor) -> Tensor:
        """All positions at once: S_t = sum_{s<=t} phi(k_s) v_s^T and z_t = sum_{s<=t} phi(k_s) by cumsum over time."""
        x = self.emb(idx)
        q, k, v = self.phi(self.q(x)), self.phi(self.k(x)), self.v(x)
        s = (k.unsqueeze(-1) * v.unsqueeze(-2)).cumsum(1)  # (B, T, d, d)
        z = k.cumsum(1)
        num = (q.unsqueeze(-2) @ s).squeeze(-2)
        att = num / (q * z).sum(-1, keepdim=True)
        return self.head(x + self.o(att))

    def step(self, tok: Tensor, s: Tensor, z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One token with the carried state (S, z): the same logits as the parallel form at that position."""
        x = self.emb(tok)
        q, k, v = self.phi(self.q(x)), self.phi(self.k(x)), self.v(x)
        s = s + k.unsqueeze(-1) * v.unsqueeze(-2)
        z = z + k
        att = (q.unsqueeze(-2) @ s).squeeze(-2) / (q * z).sum(-1, keepdim=True)
        return self.head(x + self.o(att)).realize(), s.realize(), z.realize()


def np_linear_attention(p: P, idx: np.ndarray) -> np.ndarray:
    phi = lambda a: np.where(a > 0, a + 1, np.exp(a))
    x = p["emb.weight"][idx]
    q, k, v = phi(x @ p["q.weight"].T), phi(x @ p["k.weight"].T), x @ p["v.weight"].T
    t = idx.shape[1]
    a = np.einsum("btd,bsd->bts", q, k) * np.tril(np.ones((t, t)))  # the quadratic form: no state at all
    att = (a @ v) / a.sum(-1, keepdims=True)
    return (x + att @ p["o.weight"].T) @ p["head.weight"].T + p["head.bias"]


def test_causal_linear_attention_parallel_and_recurrent_forms_match_numpy() -> None:
    vocab, dim, t = 9, 6, 7
    model = LinearAttentionLM(vocab, dim)
    p = init(model, seed=81, scale=0.5)
    params = get_state_dict(model)
    r = rng(82)
    idx, y = r.integers(0, vocab, (2, t)), r.integers(0, vocab, (2, t))
    it, yt = Tensor(idx.astype(np.int32)), Tensor(y.astype(np.int32))
    np.testing.assert_allclose(model(it).numpy(), np_linear_attention(p, idx), rtol=1e-4, atol=1e-5)

    def np_loss() -> float:
        z = np_linear_attention(p, idx).reshape(-1, vocab)
        lp = z - z.max(-1, keepdims=True)
        lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
        return float(-lp[np.arange(z.shape[0]), y.reshape(-1)].mean())

    with Tensor.train():
        model(it).sparse_categorical_crossentropy(yt).backward()
    grads = {k: num_grad(np_loss, p[k]) for k in p}
    check_grads(params, grads)
    opt = Adam(get_parameters(model), lr=0.02)
    opt.zero_grad()
    ad: dict = {}
    for i in range(1, 4):
        g = grads if i == 1 else {k: num_grad(np_loss, p[k]) for k in p}
        with Tensor.train():
            opt.zero_grad()
            loss = model(it).sparse_categorical_crossentropy(yt).backward()
            opt.step()
        np.testing.assert_allclose(loss.item(), np_loss(), rtol=1e-4, err_msg=f"step {i}")
        np_adam(p, g, ad, i, lr=0.02)
    # generation: the recurrent form, one token per jitted call, carries (S, z) and equals the parallel logits
    jstep = TinyJit(model.step)
    s, z = Tensor.zeros(2, dim, dim).contiguous(), Tensor.zeros(2, dim).contiguous()
    want = np_linear_attention(p, idx)
    for j in range(t):
        logits, s, z = jstep(Tensor(idx[:, j].astype(np.int32)), s, z)
        np.testing.assert_allclose(logits.numpy(), want[:, j], rtol=1e-4, atol=1e-4, err_msg=f"position {j}")
    assert jstep.cnt == t
