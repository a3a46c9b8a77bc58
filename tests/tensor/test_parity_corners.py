"""Properties behind tests/tensor/tinygrad_style/corners.py: valid input at the edges of its dtype (narrow floats,
unsigned and small ints) gives the value numpy/float64 gives, never a wrapped or overflowed one - random draws in
half/bf16, int lerp/isclose/clip/interpolate, half statistics - checked with hypothesis against numpy."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from speck.tensor import Tensor, dtypes
from speck.uop import DType

INTS = {dtypes.int8: np.int8, dtypes.uint8: np.uint8, dtypes.int16: np.int16, dtypes.uint16: np.uint16}
int_dts = st.sampled_from(list(INTS))


def int_arrays(dt: DType, n: int = 6) -> st.SearchStrategy[np.ndarray]:
    lo, hi = dtypes.min(dt), dtypes.max(dt)
    return st.lists(st.integers(lo, hi), min_size=n, max_size=n).map(lambda v: np.array(v, INTS[dt]))


@given(st.sampled_from([dtypes.half, dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2]), st.integers(0, 2**31))
def test_rand_in_narrow_floats_is_below_one(dt: DType, seed: int) -> None:
    Tensor.manual_seed(seed)
    r = Tensor.rand(4096, dtype=dt).numpy()
    assert (r >= 0).all() and (r < 1).all(), r.max()


@given(int_dts.flatmap(lambda dt: st.tuples(int_arrays(dt), int_arrays(dt))), st.integers(0, 300))
def test_isclose_of_ints_matches_numpy(ab: tuple[np.ndarray, np.ndarray], atol: int) -> None:
    a, b = ab
    np.testing.assert_equal(Tensor(a).isclose(Tensor(b), atol=atol).numpy(), np.isclose(a, b, atol=atol))


@given(int_dts.flatmap(lambda dt: st.tuples(int_arrays(dt), int_arrays(dt))), st.floats(0, 1))
def test_lerp_of_int_ends_matches_float(ab: tuple[np.ndarray, np.ndarray], w: float) -> None:
    a, b = ab
    ref = a.astype(np.float64) + (b.astype(np.float64) - a) * w
    np.testing.assert_allclose(Tensor(a).lerp(Tensor(b), w).numpy(), ref, rtol=1e-5, atol=1e-2)


@given(int_dts.flatmap(lambda dt: st.tuples(st.just(dt), int_arrays(dt))), st.integers(-70000, 70000),
       st.integers(-70000, 70000))  # fmt: skip
def test_clip_with_int_bounds_matches_numpy(da: tuple[DType, np.ndarray], lo: int, hi: int) -> None:
    dt, a = da
    # a bound inside the dtype's range is a literal of that dtype; one beyond it clips nothing (numpy's rule)
    if lo > dtypes.max(dt) or hi < dtypes.min(dt) or lo > hi:
        return
    got = Tensor(a).clip(lo, hi)
    assert got.dtype == dt
    np.testing.assert_equal(got.numpy(), np.clip(a, lo, hi))


@given(st.lists(st.integers(0, 255), min_size=6, max_size=6), st.integers(1, 7), st.integers(1, 7), st.booleans())
def test_interpolate_uint8_is_the_float_result_cast_back(v: list[int], h: int, w: int, ac: bool) -> None:
    img = np.array(v, np.uint8).reshape(1, 1, 2, 3)
    got = Tensor(img).interpolate((h, w), align_corners=ac)
    ref = Tensor(img.astype(np.float32)).interpolate((h, w), align_corners=ac).numpy().astype(np.uint8)
    assert got.dtype == dtypes.uint8
    np.testing.assert_equal(got.numpy(), ref)


@given(st.floats(-2, 2), st.floats(1, 200), st.integers(0, 1000))  # (a variance up to 40000: it fits half)
def test_half_mean_and_var_match_float64(shift: float, scale: float, seed: int) -> None:
    a = ((np.random.default_rng(seed).standard_normal(20000) + shift) * scale).astype(np.float16)
    af = a.astype(np.float64)
    t = Tensor(a)
    assert t.mean().dtype == t.var().dtype == dtypes.half
    np.testing.assert_allclose(t.mean().item(), af.mean(), rtol=2e-3, atol=scale * 2e-3)
    np.testing.assert_allclose(t.var().item(), af.var(ddof=1), rtol=2e-3)
    np.testing.assert_allclose(t.std(correction=0).item(), af.std(), rtol=2e-3)
