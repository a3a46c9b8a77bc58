"""A tinygrad-style unittest module (run through the alias by tests/tensor/test_parity_import_surface.py): whole
programs as tinygrad's examples write them - GPT-2 generation with a KV cache under TinyJit (symbolic start_pos) and
temperature/top-k multinomial sampling, a LLaMA block trained with AdamW and global-norm clipping in a jitted step,
a ResNet with BatchNorm trained, switched to eval and round-tripped through safetensors, gradient accumulation with
an EMA of the weights, a tensor-parallel MLP over two devices, YOLO box post-processing, a UNet block trained in a
jitted step, a BERT masked-LM loss with ignore_index, and an LSTMCell seq2seq decoded greedily under TinyJit. The
numpy float64 references of these programs are tests/integration/test_programs3*.py; here they are checked against
the same program without the jit / the cache / the sharding / the accumulation, against invariants, and against
short numpy forms."""

import math
import tempfile
import unittest

import numpy as np
from tinygrad import Device, Tensor, TinyJit, Variable, dtypes, nn
from tinygrad.nn.optim import SGD, AdamW
from tinygrad.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save


# ---------------- GPT-2: KV cache, symbolic start_pos, temperature + top-k sampling ----------------
class Attention:
    def __init__(self, dim, n_heads, max_ctx):
        self.c_attn, self.c_proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.n_heads, self.dim, self.head_dim, self.max_ctx = n_heads, dim, dim // n_heads, max_ctx

    def __call__(self, x, start_pos, mask, use_cache):
        xq, xk, xv = [y.reshape(None, None, self.n_heads, self.head_dim) for y in self.c_attn(x).chunk(3, dim=2)]
        bsz, seqlen, _, _ = xq.shape
        if use_cache:
            if not hasattr(self, "cache_kv"):
                self.cache_kv = Tensor.zeros(2, bsz, self.max_ctx, self.n_heads, self.head_dim).contiguous().realize()
            self.cache_kv[:, :, start_pos : start_pos + seqlen].assign(Tensor.stack(xk, xv)).realize()
            xk, xv = self.cache_kv[0, :, : start_pos + seqlen], self.cache_kv[1, :, : start_pos + seqlen]
        out = xq.transpose(1, 2).scaled_dot_product_attention(xk.transpose(1, 2), xv.transpose(1, 2), mask)
        return self.c_proj(out.transpose(1, 2).reshape(bsz, seqlen, self.dim))


class GPT2:
    def __init__(self, vocab=29, dim=16, n_heads=2, n_layers=2, max_ctx=16):
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(max_ctx, dim)
        self.h = [(nn.LayerNorm(dim), Attention(dim, n_heads, max_ctx), nn.LayerNorm(dim), nn.Linear(dim, 4 * dim),
                   nn.Linear(4 * dim, dim)) for _ in range(n_layers)]  # fmt: skip
        self.ln_f, self.max_ctx = nn.LayerNorm(dim), max_ctx
        self.allpos = Tensor.arange(0, max_ctx).reshape(1, -1).realize()
        self.decode = TinyJit(self.forward)

    def forward(self, tokens, start_pos, temperature, use_cache=True):
        seqlen = tokens.shape[1]
        h = self.wte(tokens) + self.wpe(self.allpos.shrink((None, (start_pos, start_pos + seqlen))))
        mask = Tensor.full((1, 1, seqlen, seqlen), float("-inf")).triu(1) if seqlen > 1 else None
        for ln1, attn, ln2, fc, proj in self.h:
            h = h + attn(ln1(h), start_pos, mask, use_cache)
            h = (h + proj(fc(ln2(h)).gelu())).contiguous()
        logits = (self.ln_f(h[:, -1, :]) @ self.wte.weight.T).realize()
        vals, idx = (logits / temperature).topk(4)
        return logits, idx.gather(-1, vals.softmax(-1).multinomial()).flatten().realize()

    def generate(self, prompt, n, temperature):
        toks, start_pos, logits_seen = list(prompt), 0, []
        for _ in range(n):
            tokens = Tensor([toks[start_pos:]])
            if tokens.shape[1] == 1:
                logits, tok = self.decode(tokens, Variable("start_pos", 1, self.max_ctx - 1).bind(start_pos),
                                          temperature)  # fmt: skip
            else:
                logits, tok = self.forward(tokens, start_pos, temperature)
            logits_seen.append(logits.numpy()[0])
            start_pos = len(toks)
            toks.append(tok.item())
        return toks, logits_seen


class TestGPT2Generate(unittest.TestCase):
    def test_seeded_sampling_with_cache_matches_recompute_and_repeats(self):
        Tensor.manual_seed(7)
        model = GPT2()
        for p in get_parameters(model):
            if p.shape != (1, model.max_ctx):
                p.assign(p * 3).realize()  # sharper logits than the default init
        Tensor.manual_seed(100)
        toks, seen = model.generate([5, 11, 2], 8, temperature=0.9)
        for i, logits in enumerate(seen):  # the cached, jitted decode against a full forward without the cache
            full, _ = model.forward(Tensor([toks[: 3 + i]]), 0, 0.9, use_cache=False)
            np.testing.assert_allclose(logits, full.numpy()[0], atol=1e-4, rtol=1e-4)
            top4 = np.argsort(-logits)[:4]
            self.assertIn(toks[3 + i], top4)  # top-k: only the 4 best tokens are ever drawn
        self.assertGreater(model.decode.cnt, 2)
        for blk in model.h:
            del blk[1].cache_kv
        model.decode = TinyJit(model.forward)
        Tensor.manual_seed(100)
        self.assertEqual(model.generate([5, 11, 2], 8, temperature=0.9)[0], toks)  # the seed decides the draws


# ---------------- LLaMA block: RoPE, RMSNorm, GQA, SwiGLU; AdamW + clipping in a jitted step ----------------
def precompute_freqs_cis(dim, end, theta=10000.0):
    freqs = 1.0 / (theta ** (Tensor.arange(0, dim, 2)[: (dim // 2)] / dim))
    freqs = Tensor.arange(end).unsqueeze(dim=1) * freqs.unsqueeze(dim=0)
    return Tensor.stack(freqs.cos(), freqs.sin(), dim=-1).reshape(1, end, 1, dim // 2, 2)


def apply_rotary_emb(x, freqs_cis):
    x = x.reshape(*x.shape[0:-1], -1, 2)
    a, b, c, d = x[..., 0:1], x[..., 1:2], freqs_cis[..., 0:1], freqs_cis[..., 1:2]
    return (a * c - b * d).cat(a * d + b * c, dim=-1).flatten(3)


class LlamaBlock:
    def __init__(self, vocab=13, dim=16, n_heads=4, n_kv_heads=2, hidden=24, max_ctx=8):
        self.tok_embeddings, self.output = nn.Embedding(vocab, dim), nn.Linear(dim, vocab, bias=False)
        self.attention_norm, self.ffn_norm, self.norm = nn.RMSNorm(dim), nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.wq, self.wo = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * dim // n_heads, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * dim // n_heads, bias=False)
        self.w1, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.freqs_cis = precompute_freqs_cis(self.head_dim, max_ctx).contiguous().realize()

    def __call__(self, tokens):
        bsz, seqlen = tokens.shape
        h = self.tok_embeddings(tokens)
        x = self.attention_norm(h)
        xq = self.wq(x).reshape(bsz, seqlen, self.n_heads, self.head_dim)
        xk = self.wk(x).reshape(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xv = self.wv(x).reshape(bsz, seqlen, self.n_kv_heads, self.head_dim)
        fc = self.freqs_cis[:, :seqlen]
        xq, xk = apply_rotary_emb(xq, fc), apply_rotary_emb(xk, fc)
        rep = self.n_heads // self.n_kv_heads
        xk, xv = [t.repeat((1, 1, 1, rep)).reshape(bsz, seqlen, self.n_heads, self.head_dim) for t in (xk, xv)]
        attn = xq.transpose(1, 2).scaled_dot_product_attention(xk.transpose(1, 2), xv.transpose(1, 2), is_causal=True)
        h = h + self.wo(attn.transpose(1, 2).reshape(bsz, seqlen, -1))
        x = self.ffn_norm(h)
        h = h + self.w2(self.w1(x).silu() * self.w3(x))
        return self.output(self.norm(h))


def llama_run(jit, steps=20, max_norm=0.3):
    Tensor.manual_seed(3)
    model = LlamaBlock()
    params = [p for p in get_parameters(model) if p is not model.freqs_cis]
    opt = AdamW(params, lr=3e-3, weight_decay=0.1)
    data = Tensor.randint(3, 7, high=13).realize()

    def step():
        with Tensor.train():
            opt.zero_grad()
            loss = model(data[:, :-1]).sparse_categorical_crossentropy(data[:, 1:]).backward()
            total_norm = Tensor([0.0], dtype=dtypes.float32)
            for p in params:
                total_norm += p.grad.float().square().sum()
            total_norm = total_norm.sqrt()
            for p in params:
                p.grad = p.grad * (max_norm / (total_norm + 1e-6)).clamp(max_=1.0)
            clipped = Tensor.stack(*[p.grad.square().sum() for p in params]).sum().sqrt()
            return loss.realize(total_norm, clipped, *opt.schedule_step()), total_norm, clipped

    if jit:
        step = TinyJit(step)
    out = [[t.item() for t in step()] for _ in range(steps)]
    return out, [p.numpy() for p in params]


class TestLlamaTrain(unittest.TestCase):
    def test_jitted_adamw_with_global_norm_clipping(self):
        jitted, jp = llama_run(True)
        eager, ep = llama_run(False)
        np.testing.assert_allclose(np.array(jitted), np.array(eager), rtol=1e-4, atol=1e-5)
        for a, b in zip(jp, ep):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
        for _loss, norm, clipped in jitted:
            self.assertAlmostEqual(clipped, min(norm, 0.3), delta=1e-5)  # clipped to the max norm, never grown
        self.assertGreater(jitted[0][1], 0.3)
        self.assertLess(jitted[-1][0], jitted[0][0])


# ---------------- ResNet: BatchNorm train/eval, residuals, strided convs, safetensors ----------------
class Block:
    def __init__(self, cin, cout, stride):
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn1, self.bn2 = nn.BatchNorm2d(cout), nn.BatchNorm2d(cout)
        self.downsample = [] if stride == 1 and cin == cout else [nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                                                   nn.BatchNorm2d(cout)]  # fmt: skip

    def __call__(self, x):
        out = self.bn2(self.conv2(self.bn1(self.conv1(x)).relu()))
        return (out + x.sequential(self.downsample)).relu()


class ResNet:
    def __init__(self):
        self.conv1, self.bn1 = nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.layers = [Block(4, 4, 1), Block(4, 8, 2)]
        self.fc = nn.Linear(8, 3)

    def __call__(self, x):
        return self.fc(self.bn1(self.conv1(x)).relu().sequential(self.layers).mean((2, 3)))


class TestResNet(unittest.TestCase):
    def test_train_eval_and_checkpoint(self):
        Tensor.manual_seed(2)
        model = ResNet()
        X, Y = Tensor.randn(6, 3, 8, 8).realize(), Tensor.randint(6, high=3).realize()
        opt = SGD(get_parameters(model), lr=0.05, momentum=0.9)

        @TinyJit
        @Tensor.train()
        def step():
            opt.zero_grad()
            return model(X).sparse_categorical_crossentropy(Y).backward().realize(*opt.schedule_step())

        bn = model.layers[1].downsample[1]
        mean_before = bn.running_mean.numpy()
        losses = [step().item() for _ in range(5)]
        self.assertLess(losses[-1], losses[0])
        self.assertEqual(bn.num_batches_tracked.item(), 5)
        self.assertFalse(np.allclose(bn.running_mean.numpy(), mean_before))
        eval_out = model(X).numpy()
        np.testing.assert_array_equal(model(X).numpy(), eval_out)  # eval mode changes no state
        stem = model.conv1(X).numpy()
        with Tensor.train():  # train mode: batch statistics, and the running ones move again
            self.assertFalse(np.allclose(model(X).numpy(), eval_out, atol=1e-3))
        self.assertEqual(bn.num_batches_tracked.item(), 6)
        rm, rv = model.bn1.running_mean.numpy(), model.bn1.running_var.numpy()
        w, b = model.bn1.weight.numpy(), model.bn1.bias.numpy()
        got = model.bn1(Tensor(stem)).numpy()
        r = lambda a: a[None, :, None, None]
        np.testing.assert_allclose(got, (stem - r(rm)) / np.sqrt(r(rv) + 1e-5) * r(w) + r(b), atol=1e-5, rtol=1e-5)
        eval_out = model(X).numpy()
        with tempfile.TemporaryDirectory() as d:
            safe_save(get_state_dict(model), f"{d}/resnet.safetensors")
            fresh = ResNet()
            load_state_dict(fresh, safe_load(f"{d}/resnet.safetensors"), verbose=False)
            for a, b in zip(get_state_dict(fresh).values(), get_state_dict(model).values()):
                np.testing.assert_array_equal(a.numpy(), b.numpy())
            # (equal up to float32 rounding: two instances' kernels can round 1 ulp apart, tracked in models3 report)
            np.testing.assert_allclose(fresh(X).numpy(), eval_out, rtol=1e-6, atol=1e-7)


# ---------------- gradient accumulation, EMA ----------------
class TestAccumulationAndEMA(unittest.TestCase):
    def test_micro_batches_equal_one_batch_and_ema_tracks(self):
        Tensor.manual_seed(5)
        X, Y = Tensor.randn(12, 5).realize(), Tensor.randint(12, high=4).realize()
        m1, m2 = [nn.Linear(5, 7), nn.Linear(7, 4)], [nn.Linear(5, 7), nn.Linear(7, 4)]
        for a, b in zip(get_parameters(m1), get_parameters(m2)):
            b.assign(a.detach()).realize()
        o1, o2 = SGD(get_parameters(m1), lr=0.1), SGD(get_parameters(m2), lr=0.1)
        ema = [p.detach().clone().realize() for p in get_parameters(m1)]
        ema_np = [p.numpy().astype(np.float64) for p in get_parameters(m1)]
        fwd = lambda m, x: m[1](m[0](x).gelu())
        for _ in range(3):
            with Tensor.train():
                o1.zero_grad()
                for i in range(3):
                    (fwd(m1, X[i * 4 : i * 4 + 4]).sparse_categorical_crossentropy(Y[i * 4 : i * 4 + 4]) / 3).backward()
                o2.zero_grad()
                fwd(m2, X).sparse_categorical_crossentropy(Y).backward()
                for a, b in zip(get_parameters(m1), get_parameters(m2)):
                    np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), atol=1e-6, rtol=1e-5)
                o1.step()
                o2.step()
            for e, p, en in zip(ema, get_parameters(m1), ema_np):
                e.assign(0.9 * e + 0.1 * p.detach()).realize()
                en *= 0.9
                en += 0.1 * p.numpy()
        for e, en in zip(ema, ema_np):
            np.testing.assert_allclose(e.numpy(), en, atol=1e-6)


# ---------------- tensor parallel over two devices ----------------
class TestTensorParallel(unittest.TestCase):
    def test_column_then_row_parallel_mlp_trains_like_one_device(self):
        devs = (f"{Device.DEFAULT}:0", f"{Device.DEFAULT}:1")
        Tensor.manual_seed(6)
        a, b = [nn.Linear(6, 8), nn.Linear(8, 4)], [nn.Linear(6, 8), nn.Linear(8, 4)]
        for p, q in zip(get_parameters(a), get_parameters(b)):
            q.assign(p.detach()).realize()
        a[0].weight.shard_(devs, axis=0)
        a[0].bias.shard_(devs, axis=0)
        a[1].weight.shard_(devs, axis=1)
        a[1].bias.shard_(devs)
        x, y = Tensor.randn(8, 6).realize(), Tensor.randint(8, high=4).realize()
        oa, ob = AdamW(get_parameters(a), lr=1e-2), AdamW(get_parameters(b), lr=1e-2)
        for _ in range(3):
            with Tensor.train():
                oa.zero_grad()
                la = a[1](a[0](x.shard(devs)).relu()).sparse_categorical_crossentropy(y.shard(devs)).backward()
                la.realize(*oa.schedule_step())
                ob.zero_grad()
                lb = b[1](b[0](x).relu()).sparse_categorical_crossentropy(y).backward()
                lb.realize(*ob.schedule_step())
            self.assertAlmostEqual(la.item(), lb.item(), places=5)
        for p, q in zip(get_parameters(a), get_parameters(b)):
            np.testing.assert_allclose(p.numpy(), q.numpy(), atol=1e-5)


# ---------------- YOLO post-processing ----------------
class TestYoloPostprocess(unittest.TestCase):
    def test_decode_and_nms_mask(self):
        rng = np.random.default_rng(3)
        raw = rng.standard_normal((1, 2 * 7, 3, 3)).astype(np.float32)
        anchors = np.array([[8.0, 10.0], [20.0, 14.0]], np.float32)
        p = Tensor(raw).reshape(1, 2, 7, 3, 3).permute(0, 1, 3, 4, 2)
        gy, gx = Tensor.arange(3).reshape(3, 1).expand(3, 3), Tensor.arange(3).reshape(1, 3).expand(3, 3)
        xy = (p[..., :2].sigmoid() + Tensor.stack(gx, gy, dim=-1)) * 8
        wh = p[..., 2:4].exp() * Tensor(anchors).reshape(1, 2, 1, 1, 2)
        boxes = Tensor.cat(xy - wh / 2, xy + wh / 2, dim=-1).reshape(-1, 4)
        scores = (p[..., 4:5].sigmoid() * p[..., 5:].sigmoid()).reshape(-1, 2)
        conf, cls = scores.max(-1), scores.argmax(-1)
        lt, rb = boxes[:, None, :2].maximum(boxes[None, :, :2]), boxes[:, None, 2:].minimum(boxes[None, :, 2:])
        inter = (rb - lt).relu().prod(-1)
        area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        iou = inter / (area[:, None] + area[None, :] - inter)
        keep = (conf > 0.2) & ~((iou > 0.4) & (conf[None] > conf[:, None]) & (cls[:, None] == cls[None])).any(-1)
        # numpy: the same decode, IoU and suppression, greedily in score order
        q = raw.reshape(1, 2, 7, 3, 3).transpose(0, 1, 3, 4, 2).astype(np.float64)
        sg = lambda z: 1 / (1 + np.exp(-z))
        gxn, gyn = np.meshgrid(np.arange(3), np.arange(3))
        c = (sg(q[..., :2]) + np.stack([gxn, gyn], -1)) * 8
        s = np.exp(q[..., 2:4]) * anchors[None, :, None, None, :]
        bx = np.concatenate([c - s / 2, c + s / 2], -1).reshape(-1, 4)
        sc = (sg(q[..., 4:5]) * sg(q[..., 5:])).reshape(-1, 2)
        np.testing.assert_allclose(boxes.numpy(), bx, rtol=1e-5, atol=1e-4)
        np.testing.assert_array_equal(cls.numpy(), sc.argmax(-1))
        cn, ln = sc.max(-1), sc.argmax(-1)
        want = np.zeros(len(bx), bool)
        for i in range(len(bx)):
            lo, hi = np.maximum(bx[i, :2], bx[:, :2]), np.minimum(bx[i, 2:], bx[:, 2:])
            it = np.clip(hi - lo, 0, None).prod(-1)
            ar = (bx[:, 2] - bx[:, 0]) * (bx[:, 3] - bx[:, 1])
            io = it / (ar[i] + ar - it)
            want[i] = cn[i] > 0.2 and not ((io > 0.4) & (cn > cn[i]) & (ln == ln[i])).any()
        np.testing.assert_array_equal(keep.numpy(), want)
        self.assertTrue(0 < want.sum() < len(want))
        self.assertTrue(math.isfinite(iou.sum().item()))


# ---------------- UNet block, BERT masked LM, LSTMCell seq2seq ----------------
class UNetBlock:
    def __init__(self, up_with_repeat=False):
        self.temb = [nn.Linear(8, 16), Tensor.silu, nn.Linear(16, 8)]
        self.down, self.up = nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.Conv2d(8, 4, 3, padding=1)
        self.norm, self.out = nn.GroupNorm(2, 8), nn.Conv2d(8, 4, 3, padding=1)
        self.up_with_repeat = up_with_repeat

    def __call__(self, x, t):
        half = (-math.log(10000) * Tensor.arange(4) / 4).exp()
        emb = Tensor.cat((t.unsqueeze(1) * half).cos(), (t.unsqueeze(1) * half).sin(), dim=-1).sequential(self.temb)
        h = self.norm(self.down(x)).silu() + emb.reshape(-1, 8, 1, 1)
        bs, c, py, px = h.shape
        if self.up_with_repeat:
            h = h.reshape(bs, c, py, 1, px, 1).expand(bs, c, py, 2, px, 2).reshape(bs, c, py * 2, px * 2)
        else:
            h = h.interpolate((py * 2, px * 2), mode="nearest")
        return self.out(Tensor.cat(self.up(h), x, dim=1))


class TestMoreBlocks(unittest.TestCase):
    def test_unet_block_jitted_training_and_upsampling_two_ways(self):
        Tensor.manual_seed(8)
        a, b = UNetBlock(), UNetBlock(up_with_repeat=True)
        for p, q in zip(get_parameters(a), get_parameters(b)):
            q.assign(p.detach()).realize()
        x, t, noise = Tensor.randn(2, 4, 8, 8).realize(), Tensor([5.0, 700.0]).realize(), Tensor.randn(2, 4, 8, 8)
        noise = noise.realize()
        np.testing.assert_allclose(a(x, t).numpy(), b(x, t).numpy(), rtol=1e-6, atol=1e-6)  # (fused differently)
        opt = AdamW(get_parameters(a), lr=1e-2)

        @TinyJit
        @Tensor.train()
        def step():
            opt.zero_grad()
            return ((a(x, t) - noise) ** 2).mean().backward().realize(*opt.schedule_step())

        ob = AdamW(get_parameters(b), lr=1e-2)
        for _ in range(4):
            la = step().item()
            with Tensor.train():
                ob.zero_grad()
                lb = ((b(x, t) - noise) ** 2).mean().backward()
                ob.step()
            self.assertAlmostEqual(la, lb.item(), places=5)

    def test_bert_mlm_loss_ignores_padding_and_unmasked_positions(self):
        Tensor.manual_seed(9)
        word, pos, typ, ln = nn.Embedding(11, 8), nn.Embedding(6, 8), nn.Embedding(2, 8), nn.LayerNorm(8, eps=1e-12)
        ids = Tensor([[1, 10, 4, 10, 0, 0], [1, 5, 10, 7, 2, 3]])
        types = Tensor([[0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1]])
        mask = Tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
        labels = Tensor([[-100, 3, -100, 6, -100, -100], [-100, -100, 9, -100, -100, -100]])

        def logits(ids):
            h = ln(word(ids) + pos(Tensor.arange(6).reshape(1, 6).expand(2, 6)) + typ(types))
            q = h.reshape(2, 6, 2, 4).transpose(1, 2)
            ext = (1.0 - mask.reshape(2, 1, 1, 6).float()) * -10000.0
            h = h + q.scaled_dot_product_attention(q, q, ext).transpose(1, 2).reshape(2, 6, 8)
            return h.gelu() @ word.weight.T

        lg = logits(ids)
        loss = lg.reshape(-1, 11).sparse_categorical_crossentropy(labels.reshape(-1), ignore_index=-100).item()
        ln_np = lg.numpy().reshape(-1, 11).astype(np.float64)
        lp = ln_np - ln_np.max(-1, keepdims=True)
        lp -= np.log(np.exp(lp).sum(-1, keepdims=True))
        y = labels.numpy().reshape(-1)
        keep = y != -100
        self.assertAlmostEqual(loss, -lp[keep, y[keep]].mean(), places=5)
        other = logits(Tensor([[1, 10, 4, 10, 7, 8], [1, 5, 10, 7, 2, 3]]))  # the padded ids change nothing unpadded
        np.testing.assert_allclose(other.numpy()[0, :4], lg.numpy()[0, :4], atol=1e-5)

    def test_lstm_seq2seq_greedy_decode_jitted_step_matches_eager(self):
        Tensor.manual_seed(10)
        enc, dec, emb, out = nn.LSTMCell(3, 6), nn.LSTMCell(6, 6), nn.Embedding(7, 6), nn.Linear(6, 7)
        src = Tensor.randn(2, 5, 3).realize()
        hc = None
        for i in range(5):
            hc = enc(src[:, i], hc)

        def dec_step(tok, h, c):
            h, c = dec(emb(tok), (h, c))
            return out(h).argmax(-1).realize(), h.realize(), c.realize()

        jstep = TinyJit(dec_step)
        res = {}
        for name, f in (("jit", jstep), ("eager", dec_step)):
            tok, h, c = Tensor([0, 0]).realize(), hc[0].contiguous().realize(), hc[1].contiguous().realize()
            toks = []
            for _ in range(6):
                tok, h, c = f(tok, h, c)
                toks.append(tok.tolist())
            res[name] = toks
        self.assertEqual(res["jit"], res["eager"])
        self.assertGreaterEqual(jstep.cnt, 6)


if __name__ == "__main__":
    unittest.main()
