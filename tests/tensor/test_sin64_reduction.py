"""float64 sin/cos/tan for any finite x: beyond the SIN op's own reduction (|x| <= 6e6) the argument is reduced by
Payne-Hanek (speck.tensor.precise.quarter_turns64), so sin(1e20) is sin(1e20) (it was ~1e31) and huge inputs stay in
[-1, 1]."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import Tensor


def _values(draw_exp: list[int], mant: list[float], signs: list[bool]) -> np.ndarray:
    return np.array([(-m if s else m) * 2.0**e for e, m, s in zip(draw_exp, mant, signs)], dtype=np.float64)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(-60, 1020), min_size=8, max_size=8),
       st.lists(st.floats(1.0, 2.0, exclude_max=True), min_size=8, max_size=8),
       st.lists(st.booleans(), min_size=8, max_size=8))  # fmt: skip
def test_float64_sin_cos_tan_match_numpy_at_every_magnitude(
    exps: list[int], mant: list[float], signs: list[bool]
) -> None:
    x = _values(exps, mant, signs)
    for name in ("sin", "cos"):
        got = getattr(Tensor(x), name)().numpy()
        np.testing.assert_allclose(got, getattr(np, name)(x), rtol=0, atol=4e-15, err_msg=name)
    # tan near a pole magnifies the reduced angle's ulp: compare the angles it stands for
    t = Tensor(x).tan().numpy()
    np.testing.assert_allclose(np.arctan(t), np.arctan(np.tan(x)), rtol=0, atol=4e-15)


def test_huge_float64_arguments_stay_in_range_and_differentiate() -> None:
    x = np.array([1e20, -1e20, 1e100, 1.7e308, 2.0**60, 6.5e6, 3.0, 0.0], dtype=np.float64)
    got = Tensor(x).sin().numpy()
    assert np.all(np.abs(got) <= 1.0)
    np.testing.assert_allclose(got, np.sin(x), rtol=0, atol=4e-15)
    t = Tensor(x, requires_grad=True)
    t.sin().sum().backward()
    assert t.grad is not None
    np.testing.assert_allclose(t.grad.numpy(), np.cos(x), rtol=0, atol=4e-15)
