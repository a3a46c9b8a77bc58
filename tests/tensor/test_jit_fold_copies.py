"""A TinyJit capture folds Tensor.assign's copies of whole new values into the kernels computing them
(speck.hcq.runner.fold_copies): the kernel stores into the target directly when that is exact. Replays must equal
numpy, and the copy stays where folding would change what is observed (a returned or later-read value, a kernel
reading the target elsewhere than where it stores)."""

from __future__ import annotations

import numpy as np
import pytest

from speck.hcq.runner import Copy
from speck.tensor import Tensor, TinyJit
from speck.tensor.nn.optim import Adam

RNG = np.random.default_rng(7)


def _copies(step: TinyJit) -> int:
    assert step.captured is not None
    return sum(1 for c, _ in step.captured.entries if type(c) is Copy)


def _xs(n: int, shape: tuple[int, ...]) -> list[np.ndarray]:
    return [RNG.standard_normal(shape).astype(np.float32) for _ in range(n)]


def test_update_in_place_is_folded_and_exact() -> None:
    w0 = RNG.standard_normal((8, 16)).astype(np.float32)
    w = Tensor(w0.copy()).contiguous().realize()

    @TinyJit
    def step(x: Tensor) -> Tensor:
        w.assign(w * 0.5 + x)
        return (w * 1.0).sum()

    ref = w0.copy()
    for x in _xs(5, (8, 16)):
        got = step(Tensor(x)).numpy()
        ref = ref * np.float32(0.5) + x
        np.testing.assert_array_equal(w.numpy(), ref)
        np.testing.assert_allclose(got, ref.sum(), rtol=1e-5)
    assert _copies(step) == 0


def test_kernel_reading_the_target_elsewhere_keeps_its_copy() -> None:
    """w.T read while w is written: in place, later elements would read already-updated ones."""
    w0 = RNG.standard_normal((8, 8)).astype(np.float32)
    w = Tensor(w0.copy()).contiguous().realize()

    @TinyJit
    def step(x: Tensor) -> Tensor:
        w.assign(w.T + x)
        return w.sum()

    ref = w0.copy()
    for x in _xs(5, (8, 8)):
        step(Tensor(x))
        ref = ref.T + x
        np.testing.assert_array_equal(w.numpy(), ref)
    assert _copies(step) == 1


@pytest.mark.parametrize("deferred", [False, True])
def test_returned_new_value_keeps_its_copy(deferred: bool) -> None:
    w0 = RNG.standard_normal(32).astype(np.float32)
    w = Tensor(w0.copy()).contiguous().realize()

    @TinyJit
    def step(x: Tensor) -> Tensor:
        n = w + x
        if deferred:
            w.assign_deferred(n)
        else:
            n = n.realize()
            w.assign(n)
        return n

    ref = w0.copy()
    for x in _xs(5, (32,)):
        out = step(Tensor(x))
        ref = ref + x
        np.testing.assert_array_equal(out.numpy(), ref)
        np.testing.assert_array_equal(w.numpy(), ref)
    assert _copies(step) == 1


def test_value_read_after_the_copy_keeps_it_exact() -> None:
    w0, v0 = (RNG.standard_normal(32).astype(np.float32) for _ in range(2))
    w, v = (Tensor(a.copy()).contiguous().realize() for a in (w0, v0))

    @TinyJit
    def step(x: Tensor) -> Tensor:
        n = (w * 2 + x).realize()
        w.assign(n)
        v.assign(v + n)  # reads the new value after it was copied over w
        return v.sum()

    rw, rv = w0.copy(), v0.copy()
    for x in _xs(5, (32,)):
        step(Tensor(x))
        rw = rw * np.float32(2) + x
        rv = rv + rw
        np.testing.assert_array_equal(w.numpy(), rw)
        np.testing.assert_array_equal(v.numpy(), rv)


def test_adam_step_writes_parameters_and_moments_directly() -> None:
    """The optimizer's updates (moments, then the parameter from the new moments) need no copies, and replays
    match numpy's Adam."""
    w0 = RNG.standard_normal((4, 6)).astype(np.float32)
    w = Tensor(w0.copy(), requires_grad=True).contiguous().realize()
    opt = Adam([w], lr=0.01)

    @TinyJit
    def step(x: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = (w * x).sum()
            loss.backward()
            opt.step(loss)
        return loss

    m = np.zeros_like(w0)
    v = np.zeros_like(w0)
    ref = w0.astype(np.float64)
    for t, x in enumerate(_xs(5, (4, 6)), 1):
        step(Tensor(x))
        g = x.astype(np.float64)
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        ref = ref - 0.01 * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
        np.testing.assert_allclose(w.numpy(), ref, rtol=1e-4, atol=1e-5)
    assert _copies(step) == 0
