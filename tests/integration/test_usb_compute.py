"""Tensors compute on USB:SIM: a cross-section of the tensor op tests run on the simulated USB GPU (kernels from the
AMD backend, uploaded over the simulated link, dispatched with PM4 and run in the RDNA3 emulator) and compared with
the same ops on the CPU. Elementwise ops of every dtype the AMD backend supports, reduces, matmul, conv2d forward and
backward, softmax, indexing and scatter, random numbers, copies between CPU and USB, and an Adam step under TinyJit
whose replay is one submission (one indirect buffer behind one doorbell). Shapes are small: every kernel is emulated
instruction by instruction."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from speck.tensor import Device, GlobalCounters, Tensor, TinyJit, dtypes, nn
from speck.tensor.device import is_dtype_supported
from speck.tensor.nn.optim import Adam
from speck.tensor.nn.state import get_parameters
from speck.tensor.usb import UsbDevice
from speck.uop import DType

pytestmark = pytest.mark.usefixtures("two_simulated_bridges")

USB = "USB:SIM"  # under SPECK_USB_SIM (as in test_usb_tensor.py: the bridges are shared by the process) it is USB


def stats(d: UsbDevice) -> dict[str, int]:
    """The driver's compute-queue counters (submissions = doorbells of the compute ring, dispatches, batches)."""
    return dict(d.gpu._engine_compute().stats)


def both(fn: Callable[[str], Tensor]) -> tuple[np.ndarray, np.ndarray]:
    """fn on USB:SIM and on the CPU, read back."""
    return fn(USB).numpy(), fn("CPU").numpy()


def close(got: np.ndarray, want: np.ndarray, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    if np.issubdtype(want.dtype, np.floating) or want.dtype.kind == "V":
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)
    else:
        np.testing.assert_array_equal(got, want)


# ---------------- elementwise, every dtype ----------------
DTYPES = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32,
          dtypes.int64, dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]  # fmt: skip


def _data(dt: DType, seed: int) -> Any:
    rng = np.random.default_rng(seed)
    if dt == dtypes.bool:
        return rng.integers(0, 2, (3, 5)).astype(bool)
    if dtypes.is_float(dt):
        return (rng.standard_normal((3, 5)) * 4).astype(np.float32)
    lo = 0 if dtypes.is_unsigned(dt) else -60
    return rng.integers(lo, 60, (3, 5)).astype(np.int64)


def test_the_backend_supports_every_tested_dtype(dev: UsbDevice) -> None:
    assert all(is_dtype_supported(dt, USB) for dt in DTYPES)


@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_elementwise_matches_cpu(dev: UsbDevice, dt: DType) -> None:
    a, b = _data(dt, 1), _data(dt, 2)

    def ops(device: str) -> Tensor:
        x, y = Tensor(a, dtype=dt, device=device), Tensor(b, dtype=dt, device=device)
        if dt == dtypes.bool:
            outs = [x & y, x | y, x ^ y, x == y, x.where(y, ~y)]
        else:
            outs = [x + y, x * y, x.maximum(y), (x < y).cast(dt), (x == y).where(x, y), x - y]
            if dtypes.is_float(dt):
                outs += [x.abs().sqrt(), x / (y.abs() + 1)]
        return Tensor.stack(*[o.cast(dtypes.float32) if dtypes.is_float(dt) else o.cast(dt) for o in outs])

    before = stats(dev)["dispatches"]
    got, want = both(ops)
    close(got, want, rtol=1e-2 if dt in (dtypes.float16, dtypes.bfloat16) else 1e-6)
    assert stats(dev)["dispatches"] > before  # computed on the GPU, not on the host


def test_transcendentals_match_cpu(dev: UsbDevice) -> None:
    a = np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6)
    got, want = both(lambda d: Tensor.stack(*[f(Tensor(a, device=d)) for f in (
        Tensor.exp, Tensor.sigmoid, Tensor.tanh, Tensor.sin, lambda t: (t.abs() + 0.1).log())]))  # fmt: skip
    close(got, want, rtol=1e-5, atol=1e-5)


# ---------------- reduces, matmul, conv, softmax ----------------
@pytest.mark.parametrize(
    "fn",
    [lambda t: t.sum(), lambda t: t.sum(1), lambda t: t.max(0), lambda t: t.mean(-1), lambda t: t.argmax(1),
     lambda t: t.cumsum(1), lambda t: t.std(0)],
    ids=["sum", "sum1", "max0", "mean", "argmax", "cumsum", "std"],
)  # fmt: skip
def test_reduces_match_cpu(dev: UsbDevice, fn: Callable[[Tensor], Tensor]) -> None:
    a = np.random.default_rng(3).standard_normal((7, 45)).astype(np.float32)
    got, want = both(lambda d: fn(Tensor(a, device=d)))
    close(got, want, rtol=1e-5, atol=1e-5)


def test_matmul_matches_cpu(dev: UsbDevice) -> None:
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((17, 33)).astype(np.float32), rng.standard_normal((33, 9)).astype(np.float32)
    got, want = both(lambda d: Tensor(a, device=d) @ Tensor(b, device=d))
    close(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4)


def test_conv2d_forward_and_backward_match_cpu(dev: UsbDevice) -> None:
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((2, 3, 7, 7)).astype(np.float32), rng.standard_normal((4, 3, 3, 3)).astype(np.float32)

    def run(d: str) -> list[np.ndarray]:
        xt, wt = Tensor(x, device=d, requires_grad=True), Tensor(w, device=d, requires_grad=True)
        out = xt.conv2d(wt, padding=1, stride=(1, 2))
        (out * out).sum().backward()
        assert xt.grad is not None and wt.grad is not None
        return [out.numpy(), xt.grad.numpy(), wt.grad.numpy()]

    for got, want in zip(run(USB), run("CPU")):
        close(got, want, rtol=1e-4, atol=1e-4)


def test_softmax_and_cross_entropy_match_cpu(dev: UsbDevice) -> None:
    rng = np.random.default_rng(6)
    logits, labels = rng.standard_normal((5, 10)).astype(np.float32), rng.integers(0, 10, 5).astype(np.int32)
    got, want = both(lambda d: Tensor(logits, device=d).softmax(-1))
    close(got, want, rtol=1e-5, atol=1e-6)
    got, want = both(lambda d: Tensor(logits, device=d).sparse_categorical_crossentropy(Tensor(labels, device=d)))
    close(got, want, rtol=1e-5, atol=1e-6)


# ---------------- indexing, scatter, random ----------------
def test_indexing_and_scatter_match_cpu(dev: UsbDevice) -> None:
    a = np.arange(40, dtype=np.float32).reshape(8, 5)
    idx = np.array([3, 0, 7, 3], np.int32)
    got, want = both(lambda d: Tensor(a, device=d)[Tensor(idx, device=d)])
    close(got, want)
    got, want = both(lambda d: Tensor(a, device=d)[1:7:2, ::-2].contiguous())
    close(got, want)
    src = np.ones((2, 5), np.float32)
    sidx = np.array([[0, 1, 2, 3, 4], [4, 3, 2, 1, 0]], np.int32)
    got, want = both(lambda d: Tensor(a, device=d).scatter(0, Tensor(sidx, device=d), Tensor(src, device=d)))
    close(got, want)

    def setitem(d: str) -> Tensor:
        t = Tensor(a, device=d).contiguous()
        t[2:4] = Tensor(np.full((2, 5), -1, np.float32), device=d)
        return t

    got, want = both(setitem)
    close(got, want)


def test_an_out_of_range_index_raises_at_synchronize(dev: UsbDevice) -> None:
    """On the GPU a realize does not wait for its kernels: the bounds record the kernel wrote in VRAM is read by the
    next Device[...].synchronize() (or data read), which raises; in-range indices still match the CPU."""
    from speck.tensor.errors import IndexOutOfBoundsError

    a = np.arange(40, dtype=np.float32).reshape(8, 5)
    Tensor(a, device=USB)[Tensor(np.array([1, 9], np.int32), device=USB)].realize()  # queued: nothing read yet
    with pytest.raises(IndexOutOfBoundsError, match=rf"^getitem: index 9 is out of bounds for dim 0 .* on {dev.name}"):
        Device[USB].synchronize()
    Device[USB].synchronize()  # reported once
    got = Tensor(a, device=USB)[Tensor(np.array([7, -8], np.int32), device=USB)].numpy()
    close(got, a[[7, -8]])


def test_reshaped_sliced_indexed_usb_tensors_read_back(dev: UsbDevice) -> None:
    a = np.arange(12, dtype=np.float32)
    t = Tensor(a).to(USB).realize()
    np.testing.assert_array_equal(t.reshape(3, 4).numpy(), a.reshape(3, 4))
    np.testing.assert_array_equal(t.reshape(3, 4).T.numpy(), a.reshape(3, 4).T)
    np.testing.assert_array_equal(t[2:9:3].numpy(), a[2:9:3])
    np.testing.assert_array_equal(t.reshape(3, 4)[1].numpy(), a.reshape(3, 4)[1])
    assert t.reshape(3, 4)[2, 1].item() == 9.0


def test_random_matches_cpu_for_the_same_seed(dev: UsbDevice) -> None:
    def rand(d: str) -> Tensor:
        Tensor.manual_seed(11)
        return Tensor.stack(Tensor.rand(64, device=d), Tensor.randn(64, device=d))

    got, want = both(rand)
    close(got, want, rtol=1e-6, atol=1e-6)
    assert 0 <= got[0].min() and got[0].max() < 1 and got[0].std() > 0.1


# ---------------- copies ----------------
def test_copies_between_cpu_and_usb_around_compute(dev: UsbDevice) -> None:
    a = np.random.default_rng(8).standard_normal(1000).astype(np.float32)
    u = Tensor(a).to(USB)
    c = (u * 2).to("CPU") + 1  # USB kernel, copy out, CPU kernel
    back = (c.to(USB) - 1).to("CPU")  # copy in, USB kernel, copy out
    np.testing.assert_array_equal(back.numpy(), (a * 2 + np.float32(1)) - np.float32(1))
    assert back.device == "CPU" and u.device == Device.canonicalize(USB)


# ---------------- a training step under TinyJit ----------------
class _Net:
    def __init__(self) -> None:
        self.c = nn.Conv2d(1, 4, 3)
        self.l = nn.Linear(4 * 4 * 4, 10)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l(self.c(x).relu().max_pool2d().flatten(1))


def _train(device: str, steps: int, dev: UsbDevice | None = None) -> tuple[list[float], list[dict[str, int]]]:
    Tensor.manual_seed(0)
    net = _Net()
    params = get_parameters(net)
    for p in params:
        p.replace(p.to(device)).realize()
    opt = Adam(params, lr=3e-3)
    rng = np.random.default_rng(0)
    x = Tensor(rng.random((4, 1, 10, 10), dtype=np.float32)).to(device).realize()
    y = Tensor(rng.integers(0, 10, 4).astype(np.int32)).to(device).realize()

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = net(x).sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step()
        return loss.realize()

    losses, counts = [], []
    for _ in range(steps):
        losses.append(step(x, y).item())
        if dev is not None:
            counts.append(stats(dev))
    return losses, counts


def test_adam_step_under_tinyjit_matches_cpu_and_replays_with_one_doorbell(dev: UsbDevice) -> None:
    usb, counts = _train(USB, 4, dev)
    cpu, _ = _train("CPU", 4)
    np.testing.assert_allclose(usb, cpu, rtol=1e-4, atol=1e-5)
    assert usb[-1] < usb[0]
    # steps 3 and 4 are replays: the whole step (kernels and in-VRAM copies) is one batch submission, and
    # .item() copies the loss out without another compute submission
    for before, after in zip(counts[1:], counts[2:]):
        assert after["batches"] - before["batches"] == 1
        assert after["submissions"] - before["submissions"] == 1
        assert after["dispatches"] - before["dispatches"] > 10


def test_kernel_counts_as_on_cpu(dev: UsbDevice) -> None:
    a = np.ones((4, 4), np.float32)
    t = Tensor(a).to(USB).realize()
    GlobalCounters.reset()
    (t + 1).sum(1).realize()
    usb_kernels = GlobalCounters.kernel_count
    c = Tensor(a).realize()
    GlobalCounters.reset()
    (c + 1).sum(1).realize()
    assert usb_kernels == GlobalCounters.kernel_count >= 1
