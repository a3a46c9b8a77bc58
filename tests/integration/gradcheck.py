"""Central-difference gradients for the model-program tests (their float64 numpy references)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np


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
