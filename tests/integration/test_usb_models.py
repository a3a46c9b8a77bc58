"""Small models trained under TinyJit on USB:SIM follow the CPU's loss curve: a 2-layer MLP with SGD (momentum,
weight decay), a tiny CNN with BatchNorm and AdamW, and a one-block transformer (embedding, causal attention,
LayerNorm, GELU) with Adam. Every step after the second is a TinyJit replay: one batch submission on the GPU. The data
are synthetic (no dataset needed) and the batches change every step, so the replays read new inputs."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from speck.tensor import Device, Tensor, TinyJit, nn
from speck.tensor.nn.optim import SGD, Adam, AdamW, Optimizer
from speck.tensor.nn.state import get_parameters
from speck.tensor.usb import UsbDevice

pytestmark = pytest.mark.usefixtures("two_simulated_bridges")

USB = "USB:SIM"
STEPS = 6


class MLP:
    def __init__(self) -> None:
        self.l1, self.l2 = nn.Linear(12, 32), nn.Linear(32, 5)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x).relu())


class TinyCNN:
    def __init__(self) -> None:
        self.c1, self.bn, self.c2 = nn.Conv2d(2, 6, 3, padding=1), nn.BatchNorm2d(6), nn.Conv2d(6, 8, 3)
        self.fc = nn.Linear(8 * 2 * 2, 5)

    def __call__(self, x: Tensor) -> Tensor:
        x = self.bn(self.c1(x)).relu().max_pool2d()
        return self.fc(self.c2(x).relu().flatten(1))


class TinyTransformer:
    def __init__(self) -> None:
        self.emb, self.ln1, self.ln2 = nn.Embedding(11, 16), nn.LayerNorm(16), nn.LayerNorm(16)
        self.qkv, self.proj = nn.Linear(16, 48), nn.Linear(16, 16)
        self.ff1, self.ff2, self.out = nn.Linear(16, 32), nn.Linear(32, 16), nn.Linear(16, 5)

    def __call__(self, tokens: Tensor) -> Tensor:
        x = self.emb(tokens)
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).reshape(b, t, 3, 2, 8).permute(2, 0, 3, 1, 4)
        att = q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(b, t, 16)
        x = x + self.proj(att)
        x = x + self.ff2(self.ff1(self.ln2(x)).gelu())
        return self.out(x.mean(1))


MODELS: dict[str, tuple[Callable[[], object], Callable[[list[Tensor]], Optimizer], Callable[[np.random.Generator],
                                                                                               np.ndarray]]] = {
    "mlp_sgd": (MLP, lambda p: SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-4),
                lambda r: r.standard_normal((16, 12)).astype(np.float32)),
    "cnn_batchnorm_adamw": (TinyCNN, lambda p: AdamW(p, lr=3e-3, weight_decay=0.01),
                            lambda r: r.standard_normal((8, 2, 8, 8)).astype(np.float32)),
    "transformer_adam": (TinyTransformer, lambda p: Adam(p, lr=3e-3),
                         lambda r: r.integers(0, 11, (4, 7)).astype(np.int32)),
}  # fmt: skip


def _train(name: str, device: str) -> list[float]:
    make, optim, data = MODELS[name]
    Tensor.manual_seed(0)
    model = make()
    params = get_parameters(model)
    for p in params:
        p.replace(p.to(device)).realize()
    opt = optim(params)

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss: Tensor = model(x).sparse_categorical_crossentropy(y)  # type: ignore[operator]
            loss.backward()
            opt.step()
        return loss.realize()

    rng = np.random.default_rng(1)
    losses = []
    for _ in range(STEPS):
        x = data(rng)
        y = rng.integers(0, 5, x.shape[0]).astype(np.int32)
        losses.append(step(Tensor(x).to(device).realize(), Tensor(y).to(device).realize()).item())
    return losses


@pytest.mark.parametrize("name", list(MODELS))
def test_small_model_trains_on_usb_like_on_cpu(name: str) -> None:
    dev = Device[USB]
    assert isinstance(dev, UsbDevice)
    before = dict(dev.gpu._engine_compute().stats)
    usb = _train(name, USB)
    after = dev.gpu._engine_compute().stats
    cpu = _train(name, "CPU")
    np.testing.assert_allclose(usb, cpu, rtol=2e-4, atol=1e-5)
    assert all(np.isfinite(usb)) and after["dispatches"] - before["dispatches"] > 10 * STEPS
    assert after["batches"] - before["batches"] >= STEPS - 2  # the replays: one batch submission each
