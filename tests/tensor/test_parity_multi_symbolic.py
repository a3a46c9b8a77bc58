"""TENSOR_API 12.4: "symbolic shapes always use naive" - an allreduce of a sharded tensor whose other dims are
symbolic (a bound Variable) sums like numpy's, eager and as a TinyJit input whose size changes between calls (the
scheduler sized its buffers with int() of a symbolic size: a TypeError); shard_like and resharding (12.1)."""

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


def test_shard_like_an_identical_placement_is_a_no_op() -> None:
    """TENSOR_API 12.1: shard_like(y) of a tensor already sharded like y is a no-op (it gave a new tensor)."""
    x = Tensor(A).shard(DEVS, axis=0)
    assert x.shard_like(Tensor(A).shard(DEVS, axis=0)) is x
    b = np.arange(18, dtype=np.float32).reshape(3, 6)
    y = Tensor(b).shard(DEVS, axis=0)
    moved = y.shard_like(Tensor(b).shard(DEVS, axis=1))
    assert moved is not y and moved.uop.axis == 1
    np.testing.assert_array_equal(moved.numpy(), b)


def test_resharding_to_an_uneven_axis_is_a_sharding_error() -> None:
    """TENSOR_API 12.1: uneven shards are a RuntimeError "multi axis uneven" - also when a sharded tensor is
    resharded (shard_like, to a tuple on another axis), which failed an internal assert."""
    x = Tensor(A).shard(DEVS, axis=0)  # (3, 8): axis 1 doesn't split over 3
    with pytest.raises(RuntimeError, match="multi axis uneven"):
        x.shard_like(Tensor(np.zeros((3, 6), np.float32)).shard(DEVS, axis=1))


def test_jit_refuses_a_sharded_input_on_another_axis_with_alike_shards() -> None:
    """TENSOR_API 11.3: an input's view structure changing is an args mismatch. (4, 4) sharded on axis 0 and (2, 8)
    sharded on axis 1 both have (2, 4) shards: the replay ran the (4, 4) program on the (2, 8) data, silently."""
    from speck.tensor.errors import JitError

    f = TinyJit(lambda x: (x * 2).sum(0))
    a = np.arange(16, dtype=np.float32)
    for _ in range(3):
        out = f(Tensor(a.reshape(4, 4)).shard(DEVS[:2], axis=0))
    np.testing.assert_array_equal(out.numpy(), (a.reshape(4, 4) * 2).sum(0))
    with pytest.raises(JitError, match="args mismatch"):
        f(Tensor(a.reshape(2, 8)).shard(DEVS[:2], axis=1))
    with pytest.raises(JitError, match="args mismatch"):
        f(Tensor(a.reshape(4, 4)).shard(DEVS[:2]))  # replicated: (4, 4) per device
