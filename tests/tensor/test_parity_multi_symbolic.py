"""TENSOR_API 12.4: "symbolic shapes always use naive" - an allreduce of a sharded tensor whose other dims are
symbolic (a bound Variable) sums like numpy's, eager and as a TinyJit input whose size changes between calls (the
scheduler sized its buffers with int() of a symbolic size: a TypeError)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.tensor import Tensor, TinyJit, Variable
from speck.tensor.allreduce import choose_algorithm
from speck.tensor.helpers import Context

DEVS = ("CPU", "CPU:1", "CPU:2")
A = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)


@pytest.mark.parametrize("ring", [0, 2])
@given(st.integers(1, 8))
def test_allreduce_over_a_symbolic_shape_is_naive_and_exact(ring: int, n: int) -> None:
    v = Variable("cols", 1, 8)
    with Context(RING=ring):
        x = Tensor(A).shard(DEVS, axis=0)
        s = x.shrink(((0, 3), (0, v.bind(n)))).sum(0)  # reduces the sharded axis: an allreduce, replicated
        assert s.uop.axis is None and s.device == DEVS
        assert choose_algorithm(3, s.shape[0]) == "naive"
        np.testing.assert_allclose((s * s).sum().item(), (A[:, :n].sum(0) ** 2).sum(), rtol=1e-5)
        s.realize()
        np.testing.assert_allclose(s.max().item(), A[:, :n].sum(0).max(), rtol=1e-6)


def test_jit_with_a_sharded_symbolic_input_rebinds_per_call() -> None:
    v = Variable("cols", 1, 8)
    x = Tensor(A).shard(DEVS, axis=0).realize()
    calls = 0

    @TinyJit
    def f(t: Tensor) -> Tensor:
        nonlocal calls
        calls += 1
        return (t.sum(0) * t.sum(0)).sum()

    for n in (2, 3, 5, 8, 1):
        got = f(x.shrink(((0, 3), (0, v.bind(n))))).item()
        np.testing.assert_allclose(got, (A[:, :n].sum(0) ** 2).sum(), rtol=1e-5)
    assert calls == 2  # warm-up and capture; sizes change without recapture
