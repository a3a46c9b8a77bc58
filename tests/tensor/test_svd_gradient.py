"""Tensor.svd passes gradients (tinygrad's SVD is lazy Tensor ops, so backward() reaches its input; speck's realizes
its Jacobi rotations and attaches the closed-form SVD derivative instead). Checked against float64 central
differences of numpy's SVD through losses that do not depend on the sign or order freedom of singular vectors."""

from __future__ import annotations

import numpy as np
import pytest

from speck.tensor import Tensor, dtypes

Array = np.ndarray


def _loss_np(a: Array, w: Array, r1: Array, r2: Array, full: bool) -> float:
    u, s, vh = np.linalg.svd(a, full_matrices=full)
    k = min(a.shape[-2:])
    uk, vk = u[..., :, :k], np.swapaxes(vh[..., :k, :], -1, -2)
    pu = (uk * w[..., None, :]) @ np.swapaxes(uk, -1, -2)  # sign-free: sum_i w_i u_i u_i^T
    pv = (vk * w[..., None, :]) @ np.swapaxes(vk, -1, -2)
    return float((s * w).sum() + (pu * r1).sum() + (pv * r2).sum())


def _loss_t(a: Tensor, w: Tensor, r1: Tensor, r2: Tensor, full: bool) -> Tensor:
    u, s, vh = a.svd(full_matrices=full)
    k = min(a.shape[-2:])
    uk, vk = u[..., :, :k], vh[..., :k, :].transpose(-1, -2)
    pu = (uk * w.unsqueeze(-2)) @ uk.transpose(-1, -2)
    pv = (vk * w.unsqueeze(-2)) @ vk.transpose(-1, -2)
    return (s * w).sum() + (pu * r1).sum() + (pv * r2).sum()


@pytest.mark.parametrize("full", [True, False])
@pytest.mark.parametrize("shape", [(3, 3), (4, 3), (3, 5), (2, 4, 3)])
def test_svd_gradient_matches_finite_differences(shape: tuple[int, ...], full: bool) -> None:
    rng = np.random.default_rng(sum(shape) + full)
    a = rng.standard_normal(shape)
    k, batch = min(shape[-2:]), shape[:-2]
    w = rng.standard_normal(batch + (k,))
    r1, r2 = rng.standard_normal(batch + (shape[-2],) * 2), rng.standard_normal(batch + (shape[-1],) * 2)
    x = Tensor(a.astype(np.float32))
    consts = [Tensor(v.astype(np.float32)) for v in (w, r1, r2)]
    _loss_t(x, *consts, full).backward()
    assert x.grad is not None
    want = np.zeros_like(a)
    eps = 1e-6
    for i in np.ndindex(a.shape):
        up, dn = a.copy(), a.copy()
        up[i] += eps
        dn[i] -= eps
        want[i] = (_loss_np(up, w, r1, r2, full) - _loss_np(dn, w, r1, r2, full)) / (2 * eps)
    np.testing.assert_allclose(x.grad.numpy(), want, atol=5e-4, rtol=1e-3)


def test_svd_values_unchanged_by_the_gradient_terms_and_half_input_gets_a_half_gradient() -> None:
    a = np.random.default_rng(7).standard_normal((4, 3)).astype(np.float32)
    u, s, vh = (t.numpy() for t in Tensor(a).svd(full_matrices=False))
    np.testing.assert_allclose(s, np.linalg.svd(a)[1], atol=1e-5)
    np.testing.assert_allclose((u * s) @ vh, a, atol=1e-5)
    x = Tensor(a, dtype=dtypes.half)
    x.svd()[1].sum().backward()  # d(sum of singular values)/dA = U V^T
    assert x.grad is not None and x.grad.dtype == dtypes.half
    un, _, vhn = np.linalg.svd(a.astype(np.float16).astype(np.float64), full_matrices=False)
    np.testing.assert_allclose(x.grad.numpy().astype(np.float64), un @ vhn, atol=2e-2)
