"""End to end across every package: a Tensor expression is scheduled into kernel ASTs, lowered and compiled by
speck.codegen, and run by speck.hcq on the CPU device; results match numpy."""

import numpy as np
import pytest

from speck.tensor import Tensor


@pytest.mark.parametrize("shape", [(1,), (7,), (33, 5), (4, 9, 3)])
def test_fused_elementwise_and_reduce_matches_numpy(shape):
    rng = np.random.default_rng(len(shape))
    a, b = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
    out = ((Tensor(a) + Tensor(b)) * 2 - 1).relu().sum(axis=-1).numpy()
    np.testing.assert_allclose(out, np.maximum((a + b) * 2 - 1, 0).sum(axis=-1), rtol=1e-5, atol=1e-5)


def test_matmul_bias_relu_matches_numpy():
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((8, 16), (16, 4), (4,)))
    out = (Tensor(x) @ Tensor(w) + Tensor(b)).relu().numpy()
    np.testing.assert_allclose(out, np.maximum(x @ w + b, 0), rtol=1e-4, atol=1e-5)


def test_integer_wraparound_is_exact():
    a = np.array([2**31 - 1, -(2**31), 7, -7], dtype=np.int32)
    out = (Tensor(a) + 1).numpy()
    np.testing.assert_array_equal(out, a + np.int32(1))
