"""The LLVM backend compiles small kernels with a cheaper compile (speck.codegen.compiler.llvm.QUICK_OPT): the same
expression must give the same bits in a small kernel and in a big one (multiply-adds fused into FMAs alike)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import Tensor
from speck.uop import Context


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from(["mad", "poly", "dot"]))
def test_small_and_big_kernels_round_alike(seed: int, form: str) -> None:
    rng = np.random.default_rng(seed)
    a, b, c = (rng.standard_normal(64).astype(np.float32) for _ in range(3))

    def f(x: Tensor, y: Tensor, z: Tensor) -> Tensor:
        if form == "mad":
            return x * y + z
        if form == "poly":
            return (x * y + z) * x + y
        return (x * y).reshape(-1, 8).sum(axis=1).repeat_interleave(8) + z

    small = f(Tensor(a), Tensor(b), Tensor(c)).numpy()
    reps = 20_000  # past the quick compile's limits (QUICK_OPS, QUICK_BYTES)
    big = f(*(Tensor(np.tile(v, reps)) for v in (a, b, c))).numpy()[:64]
    np.testing.assert_array_equal(small, big)
    with Context(LLVM_QUICK=0):  # and the same as with the quick compile off
        np.testing.assert_array_equal(f(Tensor(a), Tensor(b), Tensor(c)).numpy(), small)
