"""Shared helpers for the speck.tensor differential tests: strategies for shapes/values and a numpy comparison
that is exact for ints and bools and uses a per-op tolerance for floats."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st

# per-test bound on examples: each example compiles/runs a few kernels, and the whole tests/tensor run must stay
# within a few minutes on 2 cores
FEW = settings(max_examples=15, deadline=None)
SOME = settings(max_examples=25, deadline=None)

FLOAT_DTYPES = (np.float32,)
INT_DTYPES = (np.int32, np.int8, np.uint8, np.int64)


def shapes(min_dims: int = 0, max_dims: int = 3, min_side: int = 0, max_side: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes including 0-size and 1-size dims."""
    return st.lists(st.integers(min_side, max_side), min_size=min_dims, max_size=max_dims).map(tuple)


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
