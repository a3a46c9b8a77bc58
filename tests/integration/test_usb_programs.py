"""Whole (small) model programs on USB:SIM against the CPU: a GPT-style decoder trained a step and then generating with
a KV cache (float32 and float16), an LSTM recurrence with its gradients, an int8 quantized linear layer with
dequantization and bfloat16/float16 conversions, megabyte copies in both directions interleaved with compute (views
and a second bridge included), and VRAM that many tensors allocate and free. Each program is what a user writes; the
kernels are compiled by the AMD backend and run instruction by instruction in the RDNA3 emulator, so shapes are tiny."""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from speck.tensor import Tensor, dtypes, nn
from speck.tensor.nn.optim import SGD
from speck.tensor.nn.state import get_parameters
from speck.tensor.usb import UsbDevice
from speck.uop import DType

pytestmark = pytest.mark.usefixtures("two_simulated_bridges")

USB = "USB:SIM"
Program = Callable[[str], Sequence["Tensor | np.ndarray"]]


def same_as_cpu(fn: Program, rtol: float, atol: float) -> None:
    """fn on USB:SIM equals fn on the CPU: exact for integers, within rtol/atol for floats."""
    want = [w.numpy() if isinstance(w, Tensor) else w for w in fn("CPU")]
    got = [g.numpy() if isinstance(g, Tensor) else g for g in fn(USB)]
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert (g.shape, g.dtype) == (w.shape, w.dtype), (i, g.shape, g.dtype, w.shape, w.dtype)
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol, err_msg=f"{i}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"output {i}")


class TinyGPT:
    """Token + position embeddings, one pre-norm block (causal multi-head attention, GELU MLP), a vocabulary head;
    `cache` (keys, values of shape (batch, heads, positions, head size)) holds the positions before `start`."""

    def __init__(self, vocab: int = 11, dim: int = 8, heads: int = 2, ctx: int = 6) -> None:
        self.dim, self.heads = dim, heads
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.up, self.down = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def __call__(self, idx: Tensor, start: int = 0, cache: tuple[Tensor, Tensor] | None = None,
                 dtype: DType = dtypes.float32) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        b, t = idx.shape
        assert isinstance(b, int) and isinstance(t, int)
        x = (self.tok(idx) + self.pos(Tensor.arange(start, start + t, device=idx.device).reshape(1, t))).cast(dtype)
        q, k, v = self.qkv(self.ln1(x)).reshape(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        if cache is not None and start:
            k, v = cache[0][:, :, :start].cat(k, dim=2), cache[1][:, :, :start].cat(v, dim=2)
        att = q.scaled_dot_product_attention(k, v, is_causal=t > 1)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, self.dim))
        x = x + self.down(self.up(self.ln2(x)).gelu())
        return self.head(x).float(), k, v


def _gpt_program(dtype: DType) -> Program:
    def run(d: str) -> list[Tensor | np.ndarray]:
        Tensor.manual_seed(0)
        m = TinyGPT()
        for p in get_parameters(m):  # the matrices in `dtype`; embeddings and norms stay float32
            p.replace(p.to(d).cast(dtype) if p.ndim == 2 and p is not m.tok.weight and p is not m.pos.weight
                      else p.to(d)).realize()  # fmt: skip
        rng = np.random.default_rng(0)
        x, y = (Tensor(rng.integers(0, 11, (2, 6)).astype(np.int32)).to(d) for _ in range(2))
        # (SGD: Adam's first step turns the rounding noise of an exactly-zero gradient, such as the key bias's,
        # into a step of up to lr, which differs between any two correct implementations)
        opt = SGD(get_parameters(m), lr=0.1, momentum=0.9)
        with Tensor.train():
            opt.zero_grad()
            loss = m(x, dtype=dtype)[0].sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step()
        # greedy generation: the prompt's keys and values fill the cache, then one position per step
        logits, k, v = m(x[:1, :3], dtype=dtype)
        ck, cv = (Tensor.zeros(1, 2, 6, 4, device=d, dtype=k.dtype).contiguous().realize() for _ in range(2))
        ck[:, :, :3].assign(k).realize()
        cv[:, :, :3].assign(v).realize()
        tokens = []
        for pos in range(3, 5):
            nxt = logits[:, -1].argmax(-1).reshape(1, 1).cast(dtypes.int32)
            tokens.append(nxt.numpy())
            logits, k, v = m(nxt, start=pos, cache=(ck, cv), dtype=dtype)
            ck[:, :, pos : pos + 1].assign(k[:, :, -1:]).realize()
            cv[:, :, pos : pos + 1].assign(v[:, :, -1:]).realize()
        return [loss, m.qkv.weight.float(), np.concatenate(tokens), logits, ck.float()]

    return run


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16], ids=str)
def test_gpt_trains_a_step_and_generates_with_a_kv_cache(dev: UsbDevice, dtype: DType) -> None:
    tol = 1e-4 if dtype == dtypes.float32 else 3e-2
    same_as_cpu(_gpt_program(dtype), rtol=tol, atol=tol)


def test_lstm_recurrence_and_its_gradients(dev: UsbDevice) -> None:
    def run(d: str) -> list[Tensor]:
        rng = np.random.default_rng(1)
        wx, wh = (Tensor((rng.standard_normal(s) * 0.4).astype(np.float32)).to(d).requires_grad_()
                  for s in ((5, 24), (6, 24)))  # fmt: skip
        xs = Tensor(rng.standard_normal((2, 3, 5)).astype(np.float32)).to(d)
        h = c = Tensor.zeros(3, 6, device=d)
        for t in range(2):  # (the second step reads the first's state: a recurrence, and its gradient flows back)
            i, f, g, o = (xs[t] @ wx + h @ wh).chunk(4, dim=1)
            c = f.sigmoid() * c + i.sigmoid() * g.tanh()
            h = o.sigmoid() * c.tanh()
        loss = h.square().mean()
        loss.backward()
        assert wx.grad is not None and wh.grad is not None
        return [loss, h, wx.grad, wh.grad]

    same_as_cpu(run, rtol=1e-4, atol=1e-6)


def test_int8_quantized_linear_and_16_bit_conversions(dev: UsbDevice) -> None:
    def run(d: str) -> list[Tensor]:
        rng = np.random.default_rng(2)
        a = Tensor(rng.integers(-128, 128, (9, 40)).astype(np.int8)).to(d)
        w = Tensor(rng.integers(-128, 128, (40, 7)).astype(np.int8)).to(d)
        scale = Tensor((rng.random(7) * 0.01).astype(np.float32)).to(d)
        acc = a.matmul(w, dtype=dtypes.int32)  # exact int32 accumulation (v_dot4_i32_iu8 on RDNA3)
        deq = acc.float() * scale
        requant = (deq / 0.05).round().clip(-128, 127).cast(dtypes.int8)
        x = Tensor(rng.standard_normal((9, 40)).astype(np.float32) * 100).to(d)
        return [acc, deq, requant, (x.half() @ w.half()).float(), x.cast(dtypes.bfloat16).float(),
                x.cast(dtypes.bfloat16).cast(dtypes.half), x.half().cast(dtypes.int16)]  # fmt: skip

    same_as_cpu(run, rtol=1e-2, atol=1e-2)


def test_megabyte_copies_both_ways_interleaved_with_compute(dev: UsbDevice) -> None:
    """8 MB in (several 240 KiB G3 chunks and staged copies), computed on, read back through views at odd offsets,
    moved to the second bridge, fed back in: every byte as on the CPU."""

    def run(d: str) -> list[Tensor | np.ndarray]:
        host = (np.arange(2 << 20, dtype=np.float32) % 1009).reshape(1024, 2048)
        t = Tensor(host).to(d).realize()
        outs: list[Tensor | np.ndarray] = []
        for i in range(2):
            t = (t * 0.5 + i).realize()
            back = t.to("CPU").numpy()  # out, then in again: a new host array
            t = Tensor(back[:, ::-1].copy()).to(d) + t
            outs.append(t[3::97, 5::211].to("CPU"))
        other = "USB:1" if d != "CPU" else "CPU"
        u8 = Tensor((np.arange(1_000_003) % 251).astype(np.uint8)).to(d)
        outs += [t.sum(1), u8[1:].to(other).to("CPU"), u8[262_143:524_290].to("CPU"), t.permute(1, 0)[::4].to(other)]
        return outs

    same_as_cpu(run, rtol=1e-6, atol=1e-3)


def test_vram_of_freed_tensors_is_reused(dev: UsbDevice) -> None:
    """Tensors of a few sizes allocated, kept for a while and freed over and over: the allocator hands the VRAM out
    again (the heap does not grow past what is alive at once), and every result is right."""
    gc.collect()
    start = dev.allocator.mem_used
    peak = 0
    keep: list[Tensor] = []
    ones = {k: Tensor.ones((1 + k) * 60_000, device=USB).contiguous().realize() for k in range(4)}
    start = dev.allocator.mem_used
    for i in range(24):
        y = (ones[i % 4] * Tensor([float(i)], device=USB) + 1).realize()
        keep.append(y)
        if len(keep) > 3:
            old = keep.pop(0)
            j = i - 3
            assert old.sum().item() == pytest.approx((j + 1) * (1 + j % 4) * 60_000)
            del old  # (its refcount frees it: no collection needed)
        peak = max(peak, dev.allocator.mem_used - start)
    assert peak <= 4 * 4 * 240_000 + (1 << 20), peak  # the live tensors (and a few scalars), not 24 of them
    del keep, y, ones
    gc.collect()
    assert dev.allocator.mem_used - start <= 0
