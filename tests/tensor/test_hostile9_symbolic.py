"""Hostile round 9, Variables bound out of bounds. A shrink or slice whose bound Variable reaches past the dim
(x[:n] of 4 elements with n bound to 6) was taken: the tensor had 6 rows, 2 of them zeros nobody stored (its mean,
count and reshape were wrong); a dim a Variable made negative (ones(q.bind(-2))) summed to 0. Inside a TinyJit
capture a slice by a Variable whose range reaches past the dim let a replay bind such a value with no check at all (a
replay builds no graph): it read past the buffer (9.8e33 from 4 ones). Each is now a TensorValueError naming the
Variables' values (a replay: a JitError, the capture keeps its slices' bounds and checks them at each call's values);
a message shows a symbolic size as its expression and bound values, not the node graph."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from speck.tensor import Tensor, TinyJit, Variable
from speck.tensor.errors import JitError


def _x() -> Tensor:
    return Tensor(np.arange(4, dtype=np.float32)).realize()


@pytest.mark.parametrize(
    "make",
    [lambda x, n: x.shrink(((0, n.bind(6)),)), lambda x, n: x[: n.bind(5)], lambda x, n: x[n.bind(6) :],
     lambda x, n: x.shrink(((n.bind(3), n.bind(3) + 2),))],
)  # fmt: skip
def test_a_slice_past_the_dim_at_the_bound_values_is_refused(make: Any) -> None:
    with pytest.raises(ValueError, match=r"out of bounds for shape \(4,\): at the bound Variables' values it keeps"):
        make(_x(), Variable("n", 1, 8))


@pytest.mark.parametrize("k", [1, 2, 4])
def test_a_slice_inside_the_dim_reads_like_numpy(k: int) -> None:
    n, ref = Variable("n", 1, 8), np.arange(4, dtype=np.float32)
    t = _x()[: n.bind(k)]
    assert t.sum().item() == ref[:k].sum() and (t * 0 + 1).sum().item() == k
    np.testing.assert_array_equal(t.reshape(k).numpy(), ref[:k])


def test_a_dim_a_variable_makes_negative_is_refused() -> None:
    q = Variable("q", -3, 4)
    for make in (
        lambda: Tensor.ones(q.bind(-2)),
        lambda: Tensor.zeros(q.bind(-1), 2),
        lambda: Tensor.empty(q.bind(-3)),
    ):
        with pytest.raises(ValueError, match=r"shape \(q \[q=-\d\].*has a negative dimension"):
            make()
    assert Tensor.ones(q.bind(2)).sum().item() == 2.0


def test_a_jit_replay_binding_a_slice_past_the_dim_is_refused() -> None:
    x, wide = _x(), Variable("n", 1, 4096)  # (a range past the dim, as tinygrad's GPT-2 declares start_pos)

    @TinyJit
    def f(x: Tensor, n: Any) -> Tensor:
        return (x.shrink(((0, n),)) * 2).sum().realize()

    for k in (2, 3, 3, 4):  # eager, capture, replays: within the dim
        assert f(x, wide.bind(k)).item() == 2 * np.arange(k).sum()
    for k in (5, 4096):  # a replay builds no graph: it read past the buffer (9.8e33 from 4 values at 4096)
        with pytest.raises(JitError, match=rf"keeps \[0, {k}\) of a dim of 4 at this call's Variable values"):
            f(x, wide.bind(k))
    assert f(x, wide.bind(1)).item() == 0.0


def test_a_jitted_slice_within_the_dim_replays_every_value_exactly() -> None:
    x, n = _x(), Variable("n", 1, 4)

    @TinyJit
    def f(x: Tensor, n: Any) -> Tensor:
        return (x.shrink(((0, n),)) * 2).sum().realize()

    for k in (2, 3, 1, 4, 2):
        assert f(x, n.bind(k)).item() == 2 * np.arange(k).sum()


def test_messages_show_a_symbolic_size_as_its_expression() -> None:
    n = Variable("n", 1, 8)
    with pytest.raises(ValueError, match=r"reshape \(n \[n=4\],\) to \(3, -1\): -1 can't be inferred") as e:
        Tensor.ones(8)[: n.bind(4)].reshape(3, -1)
    assert "DEFINE_VAR" not in str(e.value)
    with pytest.raises(AssertionError, match=r"can't read symbolic shape \(\(n\*2\) \[n=3\],\); .reshape\(6,\) it"):
        Tensor.ones(8)[: n.bind(3)].repeat(2).tolist()
