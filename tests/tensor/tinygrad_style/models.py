"""A tinygrad-style unittest module (run through the alias by tests/tensor/test_parity_import_surface.py): small
model programs written the way tinygrad's examples and model files use the public API - a KV-cache GPT decoder
under TinyJit with a symbolic start_pos, a LLaMA block (RoPE, RMSNorm, grouped kv heads, top-k sampling), a
convolutional net trained with BatchNorm and a jitted step, EfficientNet/UNet/BERT/Whisper/YOLO pieces, an LSTM
stepped under TinyJit, half/bfloat16 training and checkpoints, and data-parallel sharded training. Each result is
checked against numpy or against the same model run without the JIT / cache / sharding."""

import math
import tempfile
import unittest

import numpy as np
from tinygrad import Device, Tensor, TinyJit, Variable, dtypes, nn
from tinygrad.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save
from tinygrad.uop.ops import UOp

DEVS = (f"{Device.DEFAULT}:0", f"{Device.DEFAULT}:1")


# ---------------- GPT-2 style decoder with a KV cache ----------------
class GPTAttention:
    def __init__(self, dim, n_heads, max_ctx):
        self.c_attn, self.c_proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.n_heads, self.dim, self.head_dim, self.max_ctx = n_heads, dim, dim // n_heads, max_ctx

    def __call__(self, x, start_pos, mask):
        if mask is not None or start_pos.val == 0:
            start_pos = start_pos.val
        xqkv = self.c_attn(x)
        xq, xk, xv = [
            xqkv.shrink((None, None, (i * self.dim, (i + 1) * self.dim))).reshape(
                None, None, self.n_heads, self.head_dim
            )
            for i in range(3)
        ]
        bsz, seqlen, _, _ = xq.shape
        if not hasattr(self, "cache_kv"):
            self.cache_kv = Tensor.zeros(2, bsz, self.max_ctx, self.n_heads, self.head_dim).contiguous().realize()
        self.cache_kv.shrink((None, None, (start_pos, start_pos + seqlen), None, None)).assign(
            Tensor.stack(xk, xv)
        ).realize()
        keys = self.cache_kv[0].shrink((None, (0, start_pos + seqlen), None, None))
        values = self.cache_kv[1].shrink((None, (0, start_pos + seqlen), None, None))
        xq, keys, values = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        out = xq.scaled_dot_product_attention(keys, values, mask).transpose(1, 2)
        return self.c_proj(out.reshape(bsz, seqlen, self.dim))


class GPT:
    def __init__(self, dim=16, n_heads=2, n_layers=2, vocab=23, max_ctx=12):
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(max_ctx, dim)
        self.attn = [GPTAttention(dim, n_heads, max_ctx) for _ in range(n_layers)]
        self.ln = [nn.LayerNorm(dim) for _ in range(n_layers)]
        self.mlp = [(nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)) for _ in range(n_layers)]
        self.ln_f, self.lm_head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)
        self.max_ctx = max_ctx
        self.forward_jit = TinyJit(self.forward)

    def forward(self, tokens, start_pos):
        if not hasattr(self, "allpos"):
            self.allpos = Tensor.arange(0, self.max_ctx).reshape(1, -1).realize()
        seqlen = tokens.shape[1]
        h = self.wte(tokens) + self.wpe(self.allpos.shrink((None, (start_pos, start_pos + seqlen))))
        mask = (
            Tensor.full((1, 1, seqlen, start_pos.val + seqlen), float("-inf")).triu(start_pos.val + 1)
            if seqlen > 1
            else None
        )
        for attn, ln, (fc, proj) in zip(self.attn, self.ln, self.mlp):
            h = h + attn(ln(h), start_pos, mask)
            h = (h + proj(fc(h).gelu())).contiguous()
        return self.lm_head(self.ln_f(h))[:, -1, :].argmax(-1).flatten().realize()

    def __call__(self, tokens, start_pos):
        fn = self.forward_jit if tokens.shape[1] == 1 else self.forward
        return fn(tokens, Variable("start_pos", 1 if start_pos else 0, self.max_ctx).bind(start_pos))


class TestGPTDecode(unittest.TestCase):
    def test_kv_cache_jit_matches_full_recompute(self):
        Tensor.manual_seed(1)
        m = GPT()
        toks, start_pos = [3, 7, 11], 0
        for _ in range(5):
            tok = m(Tensor([toks[start_pos:]]), start_pos).item()
            start_pos = len(toks)
            toks.append(tok)
        ref = GPT()
        load_state_dict(ref, get_state_dict(m), strict=False, verbose=False)
        want = [3, 7, 11]
        for _ in range(5):
            for a in ref.attn:
                if hasattr(a, "cache_kv"):
                    del a.cache_kv
            want.append(ref.forward(Tensor([want]), Variable("start_pos", 0, ref.max_ctx).bind(0)).item())
        self.assertEqual(toks, want)


# ---------------- LLaMA pieces ----------------
def precompute_freqs_cis(dim, end, theta=10000.0):
    freqs = 1.0 / (theta ** (Tensor.arange(0, dim, 2)[: (dim // 2)] / dim))
    freqs = Tensor.arange(end).unsqueeze(dim=1) * freqs.unsqueeze(dim=0)
    return Tensor.stack(freqs.cos(), freqs.sin(), dim=-1).reshape(1, end, 1, dim // 2, 2)


def apply_rotary_emb(x, freqs_cis):
    x = x.reshape(*x.shape[0:-1], -1, 2)
    a, b = x[..., 0:1], x[..., 1:2]
    c, d = freqs_cis[..., 0:1], freqs_cis[..., 1:2]
    return (a * c - b * d).cat(a * d + b * c, dim=-1).flatten(3)


class TestLlama(unittest.TestCase):
    def test_rope_matches_complex_numpy(self):
        x = Tensor.randn(1, 5, 2, 8)
        got = apply_rotary_emb(x, precompute_freqs_cis(8, 10)[:, 2:7]).numpy()
        xn = x.numpy().reshape(1, 5, 2, 4, 2)
        ang = np.arange(2, 7)[:, None] * (1.0 / 10000 ** (np.arange(0, 8, 2) / 8))[None]
        z = (xn[..., 0] + 1j * xn[..., 1]) * np.exp(1j * ang)[None, :, None, :]
        np.testing.assert_allclose(got, np.stack([z.real, z.imag], -1).reshape(1, 5, 2, 8), atol=1e-4)

    def test_gqa_attention_with_repeated_kv_heads(self):
        n_heads, n_kv, hd = 4, 2, 8
        q, k, v = Tensor.randn(1, 6, n_heads, hd), Tensor.randn(1, 6, n_kv, hd), Tensor.randn(1, 6, n_kv, hd)
        rep = n_heads // n_kv
        kr = k.repeat((1, 1, 1, rep)).reshape(1, 6, n_kv * rep, hd)
        vr = v.repeat((1, 1, 1, rep)).reshape(1, 6, n_kv * rep, hd)
        got = q.transpose(1, 2).scaled_dot_product_attention(kr.transpose(1, 2), vr.transpose(1, 2), is_causal=True)
        qn, kn = q.numpy(), np.tile(k.numpy(), (1, 1, 1, rep)).reshape(1, 6, 4, hd)
        vn = np.tile(v.numpy(), (1, 1, 1, rep)).reshape(1, 6, 4, hd)
        s = np.einsum("bqhd,bkhd->bhqk", qn, kn) / math.sqrt(hd)
        s = np.where(np.tril(np.ones((6, 6), bool)), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        np.testing.assert_allclose(got.numpy(), np.einsum("bhqk,bkhd->bhqd", p, vn), atol=1e-5)

    def test_rmsnorm_swiglu(self):
        norm, w1, w2, w3 = (
            nn.RMSNorm(8, 1e-5),
            nn.Linear(8, 12, False),
            nn.Linear(12, 8, False),
            nn.Linear(8, 12, False),
        )
        x = Tensor.randn(2, 3, 8)
        h = norm(x)
        out = w2(w1(h).silu() * w3(h)).numpy()
        xn = x.numpy()
        hn = xn / np.sqrt((xn**2).mean(-1, keepdims=True) + 1e-5) * norm.weight.numpy()
        a = hn @ w1.weight.numpy().T
        ref = ((a / (1 + np.exp(-a))) * (hn @ w3.weight.numpy().T)) @ w2.weight.numpy().T
        np.testing.assert_allclose(out, ref, atol=1e-4)

    def test_topk_sampling_stays_in_the_top_k(self):
        logits = Tensor([0.1, 3.0, -1.0, 2.5, 0.0, 2.9, -3.0])
        Tensor.manual_seed(0)
        vals, idx = (logits / 0.7).softmax().topk(3)
        self.assertEqual(sorted(idx.tolist()), [1, 3, 5])
        for _ in range(4):
            tok = idx[vals.multinomial()].item()
            self.assertIn(tok, (1, 3, 5))


# ---------------- training a CNN ----------------
class TinyCNN:
    def __init__(self):
        self.layers = [nn.Conv2d(1, 4, 3), Tensor.relu, nn.BatchNorm(4), Tensor.max_pool2d,
                       lambda x: x.flatten(1), nn.Linear(4 * 4 * 4, 5)]  # fmt: skip

    def __call__(self, x):
        return x.sequential(self.layers)


class TestTrainCNN(unittest.TestCase):
    def test_jitted_train_step_lowers_loss_and_checkpoint_round_trips(self):
        Tensor.manual_seed(2)
        model = TinyCNN()
        X, Y = Tensor.randn(16, 1, 10, 10), Tensor.randint(16, high=5)
        opt = nn.optim.Adam(get_parameters(model), lr=0.02)

        @TinyJit
        @Tensor.train()
        def step():
            opt.zero_grad()
            loss = model(X).sparse_categorical_crossentropy(Y).backward()
            return loss.realize(*opt.schedule_step())

        losses = [step().item() for _ in range(6)]
        self.assertLess(losses[-1], losses[0])
        self.assertEqual(model.layers[2].num_batches_tracked.item(), 6)
        with tempfile.TemporaryDirectory() as d:
            safe_save(get_state_dict(model), f"{d}/m.safetensors")
            m2 = TinyCNN()
            load_state_dict(m2, safe_load(f"{d}/m.safetensors"), verbose=False)
        np.testing.assert_allclose(m2(X[:3]).numpy(), model(X[:3]).numpy(), atol=1e-5)


# ---------------- EfficientNet / UNet / BERT / Whisper / YOLO pieces ----------------
class TestBlocks(unittest.TestCase):
    def test_depthwise_conv_squeeze_excite(self):
        x = Tensor.randn(2, 6, 7, 5)
        w = Tensor.randn(6, 1, 3, 3)
        y = x.conv2d(w, padding=1, groups=6).swish()
        s = y.avg_pool2d(kernel_size=y.shape[2:4])
        out = (y * s.sigmoid()).numpy()
        xp, wn = np.pad(x.numpy(), ((0, 0), (0, 0), (1, 1), (1, 1))), w.numpy()
        ref = sum(xp[:, :, i : i + 7, j : j + 5] * wn[None, :, 0, i, j, None, None] for i in range(3) for j in range(3))
        ref = ref / (1 + np.exp(-ref))
        sn = ref.mean((2, 3), keepdims=True)
        np.testing.assert_allclose(out, ref / (1 + np.exp(-sn)), atol=1e-4)

    def test_timestep_embedding_groupnorm_upsample(self):
        half = 8
        freqs = (-math.log(10000) * Tensor.arange(half, dtype=dtypes.float32) / half).exp()
        args = Tensor([1.0, 500.0]).unsqueeze(1) * freqs.unsqueeze(0)
        emb = Tensor.cat(args.cos(), args.sin(), dim=-1).cast(dtypes.float16)
        an = np.array([1.0, 500.0])[:, None] * np.exp(-math.log(10000) * np.arange(8) / 8)[None]
        np.testing.assert_allclose(emb.numpy(), np.concatenate([np.cos(an), np.sin(an)], -1), atol=2e-3)
        x = Tensor.randn(2, 8, 3, 4)
        g = nn.GroupNorm(2, 8)(x).numpy().reshape(2, 2, -1)
        np.testing.assert_allclose(g.mean(-1), 0, atol=1e-5)
        bs, c, py, px = x.shape
        up = x.reshape(bs, c, py, 1, px, 1).expand(bs, c, py, 2, px, 2).reshape(bs, c, py * 2, px * 2)
        np.testing.assert_equal(up.numpy(), x.interpolate((6, 8), mode="nearest").numpy())

    def test_bert_attention_mask_and_pooler(self):
        emb, ln = nn.Embedding(20, 8), nn.LayerNorm(8, eps=1e-12)
        ids = Tensor([[1, 5, 7, 0], [1, 9, 3, 3]])
        mask = Tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=dtypes.float32)
        ext = (1.0 - mask.unsqueeze(1).unsqueeze(2)) * -10000.0
        h = ln(emb(ids) + emb(Tensor.arange(4).unsqueeze(0).expand(2, 4)))
        q = h.reshape(2, 4, 2, 4).transpose(1, 2)
        ctx = Tensor.scaled_dot_product_attention(q, q, q, ext).transpose(1, 2).reshape(2, 4, 8).gelu()
        pooled = ctx[:, 0].tanh().numpy()
        ids2 = Tensor([[1, 5, 7, 19], [1, 9, 3, 3]])  # a masked token changes nothing
        h2 = ln(emb(ids2) + emb(Tensor.arange(4).unsqueeze(0).expand(2, 4)))
        q2 = h2.reshape(2, 4, 2, 4).transpose(1, 2)
        ctx2 = Tensor.scaled_dot_product_attention(q2, q2, q2, ext).transpose(1, 2).reshape(2, 4, 8).gelu()
        np.testing.assert_allclose(ctx2[:, 0].tanh().numpy(), pooled, atol=1e-5)

    def test_log_mel_like_spectrogram(self):
        n_fft, hop = 16, 8
        sig = np.random.RandomState(0).randn(100).astype(np.float32)
        frames = Tensor(sig).pad(((n_fft // 2, n_fft // 2),), mode="reflect")
        nfr = 1 + (frames.shape[0] - n_fft) // hop
        idx = Tensor.arange(nfr).unsqueeze(1) * hop + Tensor.arange(n_fft).unsqueeze(0)
        window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)).astype(np.float32)
        fr = frames[idx] * Tensor(window)
        k = np.arange(n_fft // 2 + 1)[:, None] * np.arange(n_fft)[None] * 2 * np.pi / n_fft
        re, im = fr @ Tensor(np.cos(k).T.astype(np.float32)), fr @ Tensor(-np.sin(k).T.astype(np.float32))
        spec = (re * re + im * im).clip(1e-10, None).log10()
        spec = spec.maximum(spec.max() - 8.0)
        ps = np.pad(sig, n_fft // 2, mode="reflect")
        ref = np.abs(np.fft.rfft(np.stack([ps[i * hop : i * hop + n_fft] for i in range(nfr)]) * window, axis=-1)) ** 2
        ref = np.log10(np.clip(ref, 1e-10, None))
        np.testing.assert_allclose(spec.numpy(), np.maximum(ref, ref.max() - 8.0), atol=2e-3, rtol=1e-3)
        out = nn.Conv1d(9, 4, 3, padding=1)(spec.T.unsqueeze(0)).gelu()
        self.assertEqual(out.shape, (1, 4, nfr))

    def test_yolo_sppf_and_anchors(self):
        x = Tensor.randn(1, 3, 6, 5)
        p = x.pad((2, 2, 2, 2), value=float("-inf")).max_pool2d(kernel_size=5, stride=1)
        xp = np.pad(x.numpy(), ((0, 0), (0, 0), (2, 2), (2, 2)), constant_values=-np.inf)
        ref = np.stack(
            [np.stack([xp[:, :, i : i + 5, j : j + 5].max((2, 3)) for j in range(5)], -1) for i in range(6)], -2
        )
        np.testing.assert_allclose(p.numpy(), ref)
        y = x.cat(p, dim=1).leaky_relu(0.1).sigmoid()
        self.assertEqual(y.shape, (1, 6, 6, 5))
        sx = (Tensor.arange(4) + 0.5).reshape(1, -1).repeat([3, 1]).reshape(-1)
        sy = (Tensor.arange(3) + 0.5).reshape(-1, 1).repeat([1, 4]).reshape(-1)
        gx, gy = np.meshgrid(np.arange(4) + 0.5, np.arange(3) + 0.5)
        np.testing.assert_equal(Tensor.stack(sx, sy, dim=-1).numpy(), np.stack([gx.ravel(), gy.ravel()], -1))


# ---------------- LSTM under TinyJit ----------------
class TestLSTM(unittest.TestCase):
    def test_jitted_cell_steps_match_numpy(self):
        cell = nn.LSTMCell(5, 6)
        step = TinyJit(lambda x, h, c: tuple(t.realize() for t in cell(x, (h, c))))
        xs = Tensor.randn(4, 3, 5).realize()
        h, c = Tensor.zeros(3, 6).contiguous().realize(), Tensor.zeros(3, 6).contiguous().realize()
        for t in range(4):
            h, c = step(xs[t].contiguous().realize(), h, c)
        wih, whh = cell.weight_ih.numpy(), cell.weight_hh.numpy()
        b = cell.bias_ih.numpy() + cell.bias_hh.numpy()
        hn, cn = np.zeros((3, 6), np.float32), np.zeros((3, 6), np.float32)
        sig = lambda z: 1 / (1 + np.exp(-z))
        for t in range(4):
            i, f, g, o = np.split(xs.numpy()[t] @ wih.T + hn @ whh.T + b, 4, 1)
            cn = sig(f) * cn + sig(i) * np.tanh(g)
            hn = sig(o) * np.tanh(cn)
        np.testing.assert_allclose(h.numpy(), hn, atol=1e-5)
        np.testing.assert_allclose(c.numpy(), cn, atol=1e-5)


# ---------------- mixed precision and sharding ----------------
class TestPrecisionAndSharding(unittest.TestCase):
    def test_half_and_bfloat16_training_keeps_dtypes(self):
        for dt in (dtypes.half, dtypes.bfloat16):
            Tensor.manual_seed(0)
            l1, l2 = nn.Linear(6, 10), nn.Linear(10, 3)
            for p in get_parameters([l1, l2]):
                p.replace(p.cast(dt).realize())
            x, y = Tensor.randn(8, 6, dtype=dt), Tensor.randint(8, high=3)
            opt = nn.optim.Adam(get_parameters([l1, l2]), lr=1e-2)
            losses = []
            with Tensor.train():
                for _ in range(5):
                    opt.zero_grad()
                    loss = l2(l1(x).relu()).float().sparse_categorical_crossentropy(y).backward()
                    opt.step()
                    losses.append(loss.item())
            self.assertLess(losses[-1], losses[0])
            self.assertEqual((l1.weight.dtype, l1.weight.grad.dtype), (dt, dt))

    def test_data_parallel_training_matches_one_device(self):
        Tensor.manual_seed(4)
        m, r = [nn.Linear(6, 8), nn.Linear(8, 3)], [nn.Linear(6, 8), nn.Linear(8, 3)]
        for a, b in zip(get_parameters(m), get_parameters(r)):
            b.replace(a.detach().clone().realize())
        for p in get_parameters(m):
            p.to_(DEVS)
        x, y = Tensor.randn(8, 6).realize(), Tensor.randint(8, high=3).realize()
        om, orr = nn.optim.SGD(get_parameters(m), lr=0.1), nn.optim.SGD(get_parameters(r), lr=0.1)
        with Tensor.train():
            for _ in range(3):
                om.zero_grad()
                lm = m[1](m[0](x.shard(DEVS, axis=0)).relu()).sparse_categorical_crossentropy(y.shard(DEVS, axis=0))
                lm.backward().realize(*om.schedule_step())  # the loss before the step (tinygrad's idiom)
                orr.zero_grad()
                lr = r[1](r[0](x).relu()).sparse_categorical_crossentropy(y)
                lr.backward().realize(*orr.schedule_step())
                np.testing.assert_allclose(lm.item(), lr.item(), atol=1e-5)
        np.testing.assert_allclose(m[0].weight.numpy(), r[0].weight.numpy(), atol=1e-5)

    def test_symbolic_start_pos_in_jit(self):
        cache = Tensor.randn(1, 10, 4).realize()
        q = Tensor.randn(1, 1, 4).realize()

        @TinyJit
        def attend(q, sp):
            return q.scaled_dot_product_attention(cache[:, :sp], cache[:, :sp]).realize()

        for i in (3, 4, 7, 5):
            sp = Variable("sp", 1, 10).bind(i)
            self.assertIsInstance(sp, UOp)
            ref = q.scaled_dot_product_attention(cache[:, :i], cache[:, :i])
            np.testing.assert_allclose(attend(q, sp).numpy(), ref.numpy(), atol=1e-5)


# ---------------- schedulers, sharded batch-norm statistics, half-precision inference ----------------
class TestTrainingExtras(unittest.TestCase):
    def test_lr_tensor_schedule_drives_a_jitted_step(self):
        w = Tensor([1.0, 2.0]).contiguous().realize()
        opt = nn.optim.SGD([w], lr=0.1)
        counter = Tensor([0], device=opt.device)

        @TinyJit
        def step():
            with Tensor.train():
                opt.zero_grad()
                (w * w).sum().backward()
                opt.step()
            return w.realize()

        ref = np.array([1.0, 2.0])
        for _ in range(4):
            counter.assign(counter + 1)
            opt.lr.assign((counter < 3).where(counter * 0.05, 0.2 - counter * 0.02).cast(opt.lr.dtype))
            Tensor.realize(counter, opt.lr)
            c = counter.item()
            ref = ref - (c * 0.05 if c < 3 else 0.2 - c * 0.02) * 2 * ref
            np.testing.assert_allclose(step().numpy(), ref, rtol=1e-5)
        opt.lr *= 0.5
        self.assertAlmostEqual(opt.lr.item(), 0.06, places=6)

    def test_unsynced_batchnorm_statistics_per_device(self):
        n = len(DEVS)
        running_mean = Tensor.zeros(n, 3).contiguous().shard(DEVS, axis=0)
        x = Tensor.randn(4, 3, 2, 2)
        xr = x.shard(DEVS, axis=0).reshape(n, -1, *x.shape[1:])
        mean = xr.mean(axis=(1, 3, 4))
        y = xr - mean.reshape(n, 1, -1, 1, 1)
        var = (y * y).mean(axis=(1, 3, 4))
        out = (y * (var + 1e-5).rsqrt().reshape(n, 1, -1, 1, 1)).reshape(x.shape)
        running_mean.assign(0.9 * running_mean + 0.1 * mean.detach()).realize()
        halves = x.numpy().reshape(n, -1, 3, 2, 2)
        m, v = halves.mean((1, 3, 4)), halves.var((1, 3, 4))
        ref = (halves - m[:, None, :, None, None]) / np.sqrt(v[:, None, :, None, None] + 1e-5)
        np.testing.assert_allclose(out.numpy(), ref.reshape(4, 3, 2, 2), atol=1e-5)
        np.testing.assert_allclose(running_mean.numpy(), 0.1 * m, atol=1e-6)

    def test_half_inference_matches_float(self):
        c1, c2, gn = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 4, 3, stride=2), nn.GroupNorm(2, 8)
        x = Tensor.randn(1, 3, 9, 9)
        ref = c2(gn(c1(x)).silu()).numpy()
        for p in get_parameters([c1, c2, gn]):
            p.replace(p.half())
        out = c2(gn(c1(x.half())).silu())
        self.assertEqual(out.dtype, dtypes.half)
        np.testing.assert_allclose(out.float().numpy(), ref, atol=3e-2, rtol=3e-2)
        old = dtypes.default_float
        dtypes.default_float = dtypes.float16
        try:
            emb, ln = nn.Embedding(5, 4), nn.LayerNorm(4)
            y = ln(emb(Tensor([[1, 2]]))).softmax(-1)
            self.assertEqual((emb.weight.dtype, y.dtype), (dtypes.half, dtypes.half))
            np.testing.assert_allclose(y.float().sum(-1).numpy(), 1, atol=1e-2)
        finally:
            dtypes.default_float = old


class TestShardedBuffersAreTheirOwn(unittest.TestCase):
    """A shard placed on the device its source buffer already lives on is a copy, not a view of the source: writes
    through either one must not show in the other (tinygrad copies; the sharded tensor owns its memory)."""

    def test_assign_to_a_replicated_copy_leaves_the_source(self):
        x = Tensor([1.0, 2, 3, 4]).realize()
        xs = x.to(DEVS).realize()
        xs.assign(xs * 10).realize()
        self.assertEqual(x.tolist(), [1.0, 2, 3, 4])
        self.assertEqual(xs.tolist(), [10.0, 20, 30, 40])

    def test_assign_to_a_sharded_copy_leaves_the_source(self):
        y = Tensor([1.0, 2, 3, 4]).realize()
        ys = y.shard(DEVS, axis=0).realize()
        ys.assign(ys * 10).realize()
        self.assertEqual(y.tolist(), [1.0, 2, 3, 4])

    def test_backward_after_training_another_model_on_the_same_device(self):
        # the broadcast constant of `* 1.0` is one interned node in both graphs (it failed with "all buffers must be
        # on the same device" in the second sharded backward)
        em = Tensor.randn(10, 8, requires_grad=True).realize().shard_(DEVS)
        er = Tensor.randn(10, 8, requires_grad=True).realize()
        head_m, head_r = Tensor.randn(8, 10).contiguous().shard(DEVS), Tensor.randn(8, 10).realize()
        for _ in range(2):
            lm = ((em * 1.0)[:3] @ head_m).sum()
            lm.backward()
            em.assign(em - 0.01 * em.grad).realize()
            em.grad = None
            lr = ((er * 1.0)[:3] @ head_r).sum()
            lr.backward()
            er.assign(er - 0.01 * er.grad).realize()
            er.grad = None
        self.assertEqual(em.shape, (10, 8))


if __name__ == "__main__":
    unittest.main()
