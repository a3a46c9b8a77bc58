"""Matrix factorizations built from Tensor ops: QR (Householder), SVD (one-sided Jacobi) and Newton-Schulz
orthogonalization. All batch over leading dims and run a fixed number of steps (not to a tolerance read back from
the device). QR stays lazy (min(m-1, n) contiguous steps), so gradients flow through it as through tinygrad's; SVD
realizes each of its many rotations so the graph stays small, and gets its gradient from the closed-form SVD derivative
instead (`_svd_with_gradient`)."""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING

from speck.tensor.dims import as_int, whole
from speck.tensor.errors import TensorAssertionError, TensorTypeError

if TYPE_CHECKING:
    from speck.tensor.tensor import Tensor

JACOBI_SWEEPS = 12  # one-sided Jacobi converges quadratically: 12 sweeps is float64 precision for small matrices


def _need_matrix(x: Tensor, what: str) -> tuple[int, int]:
    if x.ndim < 2:
        raise TensorAssertionError(f"{what} needs a matrix (or a batch of them), got shape {x.shape}")
    return as_int(x.shape[-2]), as_int(x.shape[-1])


def _eye_like(x: Tensor, n: int) -> Tensor:
    return type(x).eye(n, dtype=x.dtype, device=x.device).expand(*x.shape[:-2], n, n)


def qr(x: Tensor) -> tuple[Tensor, Tensor]:
    """(Q, R) with Q (..., m, m) orthogonal and R (..., m, n) upper triangular, by Householder reflections."""
    m, n = _need_matrix(x, "qr")
    r = x._float()
    q = _eye_like(r, m)
    rows = type(x).arange(m, device=x.device).reshape(m, 1)
    for k in range(min(m - 1, n)):
        col = (rows >= k).where(r[..., :, k : k + 1], 0.0)  # (..., m, 1): column k below the diagonal
        norm = col.square().sum(-2, keepdim=True).sqrt()
        x0 = r[..., k : k + 1, k : k + 1]
        alpha = -(x0 >= 0).where(norm, -norm)  # reflect onto -sign(x0) * ||x|| e_k (no cancellation)
        v = col - (rows == k).where(alpha, 0.0)
        vn = v.square().sum(-2, keepdim=True).sqrt()
        v = (vn > 0).where(v / vn.maximum(1e-300), 0.0)  # a zero column needs no reflection
        r = (r - 2 * v @ (v.transpose(-1, -2) @ r)).contiguous()
        q = (q - 2 * (q @ v) @ v.transpose(-1, -2)).contiguous()
    return q, r.triu()


def svd(x: Tensor, full_matrices: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """(U, S, Vh) with x = U[..., :k] * S @ Vh[..., :k, :] (k = min(m, n)), singular values descending, by one-sided
    Jacobi rotations of the columns (each rotation a small matmul)."""
    m, n = _need_matrix(x, "svd")
    if m < n:  # work on the transpose: its columns are the rows here
        u, s, vh = svd(x.transpose(-1, -2), full_matrices)
        return vh.transpose(-1, -2), s, u.transpose(-1, -2)
    a = x._float().detach().contiguous().realize()
    v = _eye_like(a, n).contiguous().realize()
    eye = type(x).eye(n, dtype=a.dtype, device=x.device)
    for _ in range(JACOBI_SWEEPS):
        for i in range(n - 1):
            for j in range(i + 1, n):
                ci, cj = a[..., :, i], a[..., :, j]
                al, be, ga = ci.square().sum(-1), cj.square().sum(-1), (ci * cj).sum(-1)
                zeta = (be - al) / (2 * ga + (ga == 0).where(1.0, 0.0))
                t = (zeta >= 0).where(1.0, -1.0) / (zeta.abs() + (1 + zeta.square()).sqrt())
                t = (ga == 0).where(0.0, t)
                cs = (1 + t.square()).rsqrt()
                sn = cs * t
                g = eye.expand(*a.shape[:-2], n, n)
                onehot = {(p, q_): ((type(x).arange(n, device=x.device).reshape(n, 1) == p) &
                                    (type(x).arange(n, device=x.device).reshape(1, n) == q_))
                          for p, q_ in ((i, i), (j, j), (i, j), (j, i))}  # fmt: skip
                c2, s2 = cs.reshape(*cs.shape, 1, 1), sn.reshape(*sn.shape, 1, 1)
                g = onehot[(i, i)].where(c2, onehot[(j, j)].where(c2, g))
                g = onehot[(i, j)].where(s2, onehot[(j, i)].where(-s2, g))
                a = (a @ g).contiguous().realize()
                v = (v @ g).contiguous().realize()
    s = a.square().sum(-2).sqrt()  # (..., n): the column norms
    order = s.argsort(-1, descending=True)
    s_sorted = s.gather(-1, order)
    idx = order.unsqueeze(-2).expand(*a.shape[:-2], m, n)
    u = a.gather(-1, idx) / s_sorted.unsqueeze(-2).maximum(1e-30)
    vs = v.gather(-1, order.unsqueeze(-2).expand(*v.shape[:-2], n, n))
    u_thin, s_out, v_out = _svd_with_gradient(x._float(), u, s_sorted, vs)
    if full_matrices and m > n:  # complete U to an orthonormal basis: Q of [U | I] has U (up to signs) first
        q, _ = qr(u.cat(_eye_like(u, m), dim=-1))
        u_thin = u_thin.cat(q[..., :, n:m].detach(), dim=-1)
    return u_thin, s_out, v_out.transpose(-1, -2)


def _svd_with_gradient(x: Tensor, u: Tensor, s: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(U, S, V) of x (m >= n; U thin, V's columns the right singular vectors), computed without a graph back to x,
    given the gradient of the SVD: each output plus a term that is zero in value and linear in dA = x - x.detach(),
    the first-order change of that output (dS = diag(P), dU = U (F o (P S + S P^T)) + (I - U U^T) dA V S^-1,
    dV = V (F o (S P + P^T S)) with P = U^T dA V and F_ij = 1 / (s_j^2 - s_i^2) off the diagonal). As for torch,
    equal or zero singular values make the U/V gradients undefined: those terms are left out rather than inf."""
    u, s, v = u.detach(), s.detach(), v.detach()
    n = as_int(s.shape[-1])
    da = x - x.detach()
    p = u.transpose(-1, -2) @ da @ v  # (..., n, n)
    sr, sc = s.unsqueeze(-1), s.unsqueeze(-2)  # s_i down the rows, s_j along the columns
    eye = _eye_like(p, n)
    gap = (sc - sr) * (sc + sr)
    off = (gap != 0) & (eye == 0)  # the diagonal by position: a fused s_j^2 - s_i^2 need not be exactly 0 there
    f = off.where(1.0 / off.where(gap, 1.0), 0.0)
    ps = p * sc  # P S
    sp = sr * p  # S P
    s_inv = (s != 0).where(1.0 / (s != 0).where(s, 1.0), 0.0)
    u_out = u + u @ (f * (ps + ps.transpose(-1, -2))) + (da @ v - u @ p) * s_inv.unsqueeze(-2)
    v_out = v + v @ (f * (sp + sp.transpose(-1, -2)))
    s_out = s + (p * eye).sum(-1)
    return u_out, s_out, v_out


def newton_schulz(x: Tensor, steps: int, params: tuple[float, ...], eps: float = 1e-7) -> Tensor:
    """Odd-polynomial orthogonalization (the polar factor, approximately): X <- a X + (b A + c A^2) X with A = X X^T,
    after scaling X to unit Frobenius norm; a tall matrix is iterated transposed."""
    _need_matrix(x, "newton_schulz")
    if not (
        isinstance(params, (tuple, list)) and len(params) == 3 and all(isinstance(v, numbers.Real) for v in params)
    ):
        raise TensorTypeError(f"newton_schulz: params must be three numbers (a, b, c), got {params!r:.60}")
    steps = whole("newton_schulz", "steps", steps)
    a, b, c = params
    tall = as_int(x.shape[-2]) > as_int(x.shape[-1])
    y = x.transpose(-1, -2) if tall else x
    y = y / (y.square().sum((-2, -1), keepdim=True).sqrt() + eps)
    for _ in range(steps):
        s = y @ y.transpose(-1, -2)
        y = y * a + (s * b + (s @ s) * c) @ y
    return y.transpose(-1, -2) if tall else y
