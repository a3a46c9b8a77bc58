"""cat and constant pad with symbolic sizes (bound Variables): values against numpy (read back through a concrete
shrink), the symbolic result shape, one compiled kernel for every bound value, and a clear error for pad modes that
need concrete sizes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import Tensor, TinyJit, Variable
from speck.tensor.errors import TensorNotImplementedError

VI, VJ = Variable("i", 1, 8), Variable("j", 1, 8)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 8), m=st.integers(1, 8), dim=st.integers(0, 1), first_symbolic=st.booleans())
def test_cat_of_symbolic_parts_matches_numpy(n: int, m: int, dim: int, first_symbolic: bool) -> None:
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    X = Tensor(x)
    cut = (slice(None, n), slice(None)) if dim == 0 else (slice(None), slice(None, n))
    a = X[(slice(None, VI.bind(n)), slice(None)) if dim == 0 else (slice(None), slice(None, VI.bind(n)))]
    b_np = x[:m] * 2 if dim == 0 else x[:, :m] * 2
    b = (X * 2)[(slice(None, VJ.bind(m)), slice(None)) if dim == 0 else (slice(None), slice(None, VJ.bind(m)))]
    parts, parts_np = ([a, b], [x[cut], b_np]) if first_symbolic else ([b, a], [b_np, x[cut]])
    c = parts[0].cat(parts[1], dim=dim)
    assert not isinstance(c.shape[dim], int) and c.shape[1 - dim] == 8
    concrete = tuple((0, n + m) if i == dim else None for i in range(2))
    np.testing.assert_array_equal(c.shrink(concrete).numpy(), np.concatenate(parts_np, axis=dim))
    assert c.sum().item() == float(np.concatenate(parts_np, axis=dim).sum())


def test_cat_orders_symbolic_sums_the_same_way() -> None:
    # i+j and j+i are one dim: the padded parts broadcast together
    a, b = Tensor.ones(8)[: VI.bind(3)], Tensor.ones(8)[: VJ.bind(2)]
    assert a.cat(b).shape == b.cat(a).shape
    assert (a.cat(b) + b.cat(a)).sum().item() == 10.0


def test_symbolic_constant_pad_matches_numpy() -> None:
    x = np.arange(1, 7, dtype=np.float32)
    for n in (1, 3, 5):
        t = Tensor(x).pad(((VI.bind(n), 2),), value=-1.0)
        assert not isinstance(t.shape[0], int)
        want = np.concatenate([np.full(n, -1.0), x, [-1.0, -1.0]])
        np.testing.assert_array_equal(t.shrink(((0, n + 8),)).numpy(), want)


def test_jit_serves_every_bound_value_with_one_capture() -> None:
    from speck.tensor.realize import compiled_program_count

    f = TinyJit(lambda a, b: a.cat(b).sum().realize())
    base, tail = Tensor.arange(8).float().clone().realize(), Tensor.ones(3).contiguous().realize()
    got, counts = [], []
    for n in range(2, 8):
        got.append(f(base[: VI.bind(n)], tail).item())
        counts.append(compiled_program_count())
    assert got == [float(sum(range(n)) + 3) for n in range(2, 8)]
    assert len(set(counts[1:])) == 1  # after the capture, no new kernels for new values


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_non_constant_pad_needs_int_sizes(mode: str) -> None:
    with pytest.raises(TensorNotImplementedError, match="symbolic"):
        Tensor.ones(8).pad(((VI.bind(2), 1),), mode=mode)
