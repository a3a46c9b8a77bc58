"""SPLIT_REDUCEOP: a reduction of many inputs into few outputs runs as two kernels (partials, then the partials
reduced) so the CPU workers can split the first one. Results must match numpy either way."""

from __future__ import annotations

import numpy as np
import pytest

from speck.tensor import Tensor
from speck.tensor.reduce import SPLIT_REDUCE_PARTS
from speck.tensor.schedule import assert_kernel_count
from speck.uop import Context

RNG = np.random.default_rng(20)


@pytest.mark.parametrize("split", [0, 1])
@pytest.mark.parametrize(
    ("shape", "axis"),
    [((1 << 16,), None), ((4, 4096, 3), (0, 1)), ((6, 8192), 1), ((3, 5, 4096), None), ((4099 * 9,), None)],
)
def test_split_reductions_match_numpy(shape: tuple[int, ...], axis: int | tuple[int, ...] | None, split: int) -> None:
    x = RNG.standard_normal(shape, dtype=np.float32)
    with Context(SPLIT_REDUCEOP=split, REDUCEOP_SPLIT_THRESHOLD=1024):
        t = Tensor(x)
        np.testing.assert_allclose(t.sum(axis).numpy(), x.sum(axis, dtype=np.float64), rtol=1e-4, atol=1e-3)
        np.testing.assert_array_equal(t.max(axis, keepdim=True).numpy(), x.max(axis, keepdims=True))
        np.testing.assert_array_equal(t.min(axis).numpy(), x.min(axis))
        p = Tensor(1 + x / 4096)  # a product that stays finite
        np.testing.assert_allclose(p.prod(axis).numpy(), np.prod(1 + x.astype(np.float64) / 4096, axis), rtol=1e-3)


def test_split_integer_sum_is_exact() -> None:
    x = RNG.integers(-1000, 1000, 1 << 17, dtype=np.int32)
    with Context(REDUCEOP_SPLIT_THRESHOLD=1024):
        assert Tensor(x).sum().item() == int(x.sum())


@pytest.mark.parametrize(("split", "kernels"), [(1, 2), (0, 1)])
def test_large_sum_runs_as_two_kernels(split: int, kernels: int) -> None:
    t = Tensor(RNG.standard_normal(1 << 16, dtype=np.float32)).realize()
    with Context(SPLIT_REDUCEOP=split, REDUCEOP_SPLIT_THRESHOLD=1024), assert_kernel_count(kernels):
        t.sum().realize()


def test_below_threshold_is_one_kernel() -> None:
    t = Tensor(RNG.standard_normal((64, 1024), dtype=np.float32)).realize()
    with Context(REDUCEOP_SPLIT_THRESHOLD=1 << 17), assert_kernel_count(1):
        t.sum().realize()  # 65536 inputs per output: below the threshold
    with Context(REDUCEOP_SPLIT_THRESHOLD=2048), assert_kernel_count(1):
        t.sum(1).realize()  # 1024 inputs per output
    with Context(REDUCEOP_SPLIT_THRESHOLD=1024), assert_kernel_count(2):
        t.sum(1).realize()  # 1024 inputs per output, at the threshold


def test_split_sum_gradient() -> None:
    x = RNG.standard_normal((8, 4096), dtype=np.float32)
    w = RNG.standard_normal((8, 4096), dtype=np.float32)
    with Context(REDUCEOP_SPLIT_THRESHOLD=1024):
        t = Tensor(x, requires_grad=True)
        (t * Tensor(w)).sum().backward()
        assert t.grad is not None
        np.testing.assert_allclose(t.grad.numpy(), w, rtol=1e-6)


def test_prime_length_is_not_split() -> None:
    n = 65537  # prime: no divisor for the partials
    x = RNG.standard_normal(n, dtype=np.float32)
    t = Tensor(x).realize()
    with Context(REDUCEOP_SPLIT_THRESHOLD=1024), assert_kernel_count(1):
        np.testing.assert_allclose(t.sum().item(), x.sum(dtype=np.float64), rtol=1e-4, atol=1e-2)
    assert SPLIT_REDUCE_PARTS >= 8
