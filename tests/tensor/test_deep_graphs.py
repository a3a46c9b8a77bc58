"""Deep fused graphs: lowering recurses once per graph level, so the scheduler cuts a chain deeper than
FUSE_DEPTH_LIMIT into several kernels instead of overflowing the Python stack (RecursionError)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import numpy as np
import pytest

from speck.tensor import Context, GlobalCounters, Tensor, fusion


@pytest.fixture
def low_recursion_limit() -> Iterator[None]:
    """A stack of 2000 frames: a 60-layer sin chain (~16 graph levels a layer, three frames a level) needs more."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(2000)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def _chain(x: Tensor, layers: int) -> Tensor:
    for _ in range(layers):
        x = x.sin() * 0.01 + x
    return x


def _chain_np(x: np.ndarray, layers: int) -> tuple[np.ndarray, np.ndarray]:
    g = np.ones_like(x)
    for _ in range(layers):
        g = g * (1 + 0.01 * np.cos(x))
        x = np.sin(x) * 0.01 + x
    return x, g


def test_a_chain_deeper_than_the_limit_is_cut_and_matches_numpy(low_recursion_limit: None) -> None:
    x = Tensor([0.5, 1.0, -2.0], requires_grad=True)
    out = _chain(x, 60)
    GlobalCounters.reset()
    got = out.numpy()
    assert GlobalCounters.kernel_count >= 2  # one kernel would fuse ~1000 levels
    out.sum().backward()
    want, grad = _chain_np(np.array([0.5, 1.0, -2.0]), 60)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert x.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), grad, rtol=1e-4)


@pytest.mark.parametrize("limit", [4, 16, 64])
def test_the_cut_depth_does_not_change_values(monkeypatch: pytest.MonkeyPatch, limit: int) -> None:
    data = np.linspace(-3, 3, 7).astype(np.float32)
    with Context(SCACHE=0):  # (both runs planned afresh, not taken from the schedule cache)
        want = _chain(Tensor(data), 6).numpy()
        monkeypatch.setattr(fusion, "FUSE_DEPTH_LIMIT", limit)
        GlobalCounters.reset()
        got = _chain(Tensor(data), 6).numpy()
    assert GlobalCounters.kernel_count > 1
    np.testing.assert_array_equal(got, want)


def test_a_shallow_graph_stays_one_kernel() -> None:
    data = np.linspace(-3, 3, 7).astype(np.float32)
    GlobalCounters.reset()
    got = _chain(Tensor(data), 3).numpy()
    assert GlobalCounters.kernel_count == 1
    np.testing.assert_allclose(got, _chain_np(data.astype(np.float64), 3)[0], rtol=1e-5)


def test_the_cut_stays_on_its_kernels_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The depth walk stops at a COPY: a chain computed on CPU:1 and copied to CPU is not cut into CPU kernels
    reading CPU:1 buffers (a sharded TinyJit training step failed with ProgramArgumentError)."""
    data = np.linspace(-3, 3, 7).astype(np.float32)
    monkeypatch.setattr(fusion, "FUSE_DEPTH_LIMIT", 4)
    with Context(SCACHE=0):
        got = (_chain(Tensor(data, device="CPU:1"), 4).to("CPU") + 1).numpy()
    want = _chain_np(data.astype(np.float64), 4)[0] + 1
    np.testing.assert_allclose(got, want, rtol=1e-5)
