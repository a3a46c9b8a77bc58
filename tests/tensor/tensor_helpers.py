"""Shared helpers for the speck.tensor differential tests: strategies for shapes/values and a numpy comparison
that is exact for ints and bools and uses a per-op tolerance for floats."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st

# Each distinct (op, shape, dtype) compiles a kernel (~0.1 s), so examples draw shapes from a small pool that
# covers 0-d, 0-size and 1-size dims, and tests keep their example counts low: the whole tests/tensor run must stay
# within a few minutes on 2 cores. HYPOTHESIS_PROFILE=dev raises the counts.
FEW = settings(max_examples=5, deadline=None)
SOME = settings(max_examples=8, deadline=None)

SHAPE_POOL: tuple[tuple[int, ...], ...] = ((), (0,), (1,), (5,), (2, 3), (3, 1), (1, 4), (2, 0, 3), (2, 1, 3))
BROADCAST_POOL: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = (
    ((2, 3), (2, 3)), ((2, 3), (3,)), ((3, 1), (1, 4)), ((), (2, 3)), ((0, 3), (1, 3)), ((1,), (5,)),
    ((2, 1, 3), (4, 1)),
)  # fmt: skip


def shapes(
    min_dims: int = 0, max_dims: int = 3, min_side: int = 0, max_side: int = 5
) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes from SHAPE_POOL within the bounds (0-size and 1-size dims included)."""
    ok = [s for s in SHAPE_POOL if min_dims <= len(s) <= max_dims and all(min_side <= d <= max_side for d in s)]
    return st.sampled_from(ok)


def broadcast_shapes() -> st.SearchStrategy[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Pairs of shapes that broadcast together."""
    return st.sampled_from(BROADCAST_POOL)


def arrays(shape: tuple[int, ...], dtype: Any, seed: int, lo: float = -3, hi: float = 3) -> np.ndarray:
    """Deterministic random values of dtype in [lo, hi] (ints: the integers in that range)."""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(max(int(lo), info.min), min(int(hi), info.max) + 1, shape).astype(dtype)
    return rng.uniform(lo, hi, shape).astype(dtype)


def assert_matches(got: np.ndarray, ref: Any, atol: float = 1e-6, rtol: float = 1e-5, check_dtype: Any = None) -> None:
    """Same shape; exact for int/bool results, within (atol, rtol) for floats (NaN matches NaN)."""
    ref = np.asarray(ref)
    assert got.shape == ref.shape, f"shape {got.shape} != numpy's {ref.shape}"
    if check_dtype is not None:
        assert got.dtype == np.dtype(check_dtype), f"dtype {got.dtype} != expected {np.dtype(check_dtype)}"
    if np.issubdtype(got.dtype, np.floating) or np.issubdtype(ref.dtype, np.floating):
        np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), atol=atol, rtol=rtol, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, ref)
