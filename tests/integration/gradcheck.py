"""What the model-program tests share: central-difference gradients for their float64 numpy references, seeded
parameters, gradient checks and numpy's Adam."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from speck.tensor import Tensor
from speck.tensor.nn.state import get_state_dict

F64 = np.float64
P = dict[str, np.ndarray]


def num_grad(f: Callable[[], float], x: np.ndarray, eps: float = 1e-6,
             at: Iterable[tuple[int, ...]] | None = None) -> np.ndarray:  # fmt: skip
    """Central differences of f with respect to x (changed in place and restored), at the given entries (all)."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape) if at is None else at:
        old = x[i]
        x[i] = old + eps
        hi = f()
        x[i] = old - eps
        lo = f()
        x[i] = old
        g[i] = (hi - lo) / (2 * eps)
    return g


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def load(t: Tensor, x: np.ndarray) -> Tensor:
    t.replace(Tensor(np.asarray(x, np.float32)).realize())
    return t


def init(model: object, seed: int, scale: float = 0.5, skip: tuple[str, ...] = ()) -> P:
    """Every parameter (but those whose name holds one of `skip`) replaced by seeded normals (float32); the
    float64 copies the numpy reference works on."""
    r, p = rng(seed), {}
    for k, t in get_state_dict(model).items():
        if any(s in k for s in skip):
            continue
        load(t, r.standard_normal(t.shape) * scale)
        p[k] = t.numpy().astype(F64)
    return p


def check_grads(got: dict[str, Tensor], want: P, rtol: float = 2e-3, atol: float = 2e-5) -> None:
    Tensor.realize(*[t.grad for t in got.values() if t.grad is not None])
    for k, t in got.items():
        assert t.grad is not None, f"{k} has no gradient"
        np.testing.assert_allclose(t.grad.numpy(), want[k], rtol=rtol, atol=atol, err_msg=k)


def np_adam(p: P, g: P, st: dict, t: int, lr: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> None:
    for k, gk in g.items():
        m = st.setdefault(("m", k), np.zeros_like(gk))
        v = st.setdefault(("v", k), np.zeros_like(gk))
        m[...] = b1 * m + (1 - b1) * gk
        v[...] = b2 * v + (1 - b2) * gk * gk
        p[k] = p[k] - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
