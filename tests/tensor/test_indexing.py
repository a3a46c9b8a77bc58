"""Indexing against numpy: basic (ints, slices with any step, None, Ellipsis), advanced (integer arrays/tensors,
boolean masks) and their mixes, setitem, gather/scatter, masked_select/nonzero, one_hot. All exact."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.tensor import Tensor
from tensor_helpers import FEW, SOME, arrays, assert_matches

A = np.arange(60, dtype=np.int32).reshape(3, 4, 5)


@st.composite
def basic_index(draw: Any) -> tuple[Any, ...]:
    out: list[Any] = []
    for n in A.shape:
        kind = draw(st.sampled_from(["int", "slice", "none", "full"]))
        if kind == "int":
            out.append(draw(st.integers(-n, n - 1)))
        elif kind == "slice":
            out.append(slice(draw(st.one_of(st.none(), st.integers(-n - 1, n + 1))),
                             draw(st.one_of(st.none(), st.integers(-n - 1, n + 1))),
                             draw(st.sampled_from([None, 1, 2, 3, -1, -2]))))  # fmt: skip
        elif kind == "none":
            out.extend([None, slice(None)])
        else:
            out.append(slice(None))
    if draw(st.booleans()) and len(out) > 1:
        out = [Ellipsis] + out[draw(st.integers(1, len(out) - 1)) :]
    return tuple(out)


@given(idx=basic_index())
@SOME
def test_basic_indexing(idx: tuple[Any, ...]) -> None:
    assert_matches(Tensor(A)[idx].numpy(), A[idx])


@pytest.mark.parametrize("idx", [
    (np.array([0, 2, 2]),), (slice(None), np.array([3, -1])), (np.array([0, 1]), np.array([2, 3])),
    (np.array([[0], [2]]), slice(None), np.array([1, 4])), (1, np.array([0, 3]), slice(1, 3)),
    (Ellipsis, np.array([4, 0, 1])), (np.array([[1, 2], [0, 0]]),), (slice(None), np.array([1, 2]), np.array([0, 4])),
    (A[..., 0] > 20,), (A > 30,), (1, A[1, :, 0] % 2 == 0), (None, np.array([0, 2])),
])  # fmt: skip
def test_advanced_indexing(idx: tuple[Any, ...]) -> None:
    tidx = tuple(Tensor(i) if isinstance(i, np.ndarray) else i for i in idx)
    assert_matches(Tensor(A)[tidx].numpy(), A[idx])
    lidx = tuple(i.tolist() if isinstance(i, np.ndarray) and i.dtype != np.bool_ else i for i in idx)
    # a bare list is one index only when flat: a nested one is split per dim (tinygrad's rule, test below)
    flat = len(lidx) == 1 and isinstance(lidx[0], list) and all(isinstance(x, int) for x in lidx[0])
    assert_matches(Tensor(A)[lidx[0] if flat else lidx].numpy(), A[idx])


def test_a_bare_nested_list_index_is_a_sequence_of_per_dim_indices() -> None:
    # TENSOR_API 6.1 (tinygrad's rule, unlike numpy): a list holding a non-int is indexed like a tuple, so
    # t[[[0], [2]]] is t[[0], [2]]; t[[[0], [2]],] is the one 2-d index numpy reads it as
    b = np.arange(24).reshape(2, 3, 4)
    assert_matches(Tensor(b)[[[0], [2]]].numpy(), b[[0], [2]])
    assert_matches(Tensor(b)[[[1, 0], [2, 2]]].numpy(), b[[1, 0], [2, 2]])
    assert_matches(Tensor(b)[[[0], [1]],].numpy(), b[[[0], [1]],])
    assert_matches(Tensor(b)[[1, slice(None), None]].numpy(), b[1, :, None])
    assert_matches(Tensor(b)[[1, 0]].numpy(), b[[1, 0]])  # all ints: one advanced index
    t = Tensor(np.zeros((3, 4), np.float32)).realize()
    t[[[0], [2]]] = 5.0
    ref = np.zeros((3, 4), np.float32)
    ref[[0], [2]] = 5.0
    assert_matches(t.numpy(), ref)


@pytest.mark.parametrize("idx", [
    [True, False, True], ([False, True, True], 0), (slice(None), [True, False, True, False]), (Ellipsis, [False] * 5),
])  # fmt: skip
def test_python_bool_lists_index_as_numpy_masks(idx: Any) -> None:
    # tinygrad refuses bool indices (IndexError); speck follows numpy, as for bool tensors (tensor README)
    assert_matches(Tensor(A)[idx].numpy(), A[idx])
    t, want = Tensor(A).contiguous().realize(), A.copy()
    t[idx], want[idx] = -1, -1
    assert_matches(t.numpy(), want)
    with pytest.raises(IndexError, match="boolean index did not match"):
        Tensor(A)[[True, False]]


def test_index_errors() -> None:
    t = Tensor(A)
    with pytest.raises(IndexError, match="index 3 is out of bounds for dim 0 with size 3"):
        t[3]
    with pytest.raises(IndexError, match="too many indices"):
        t[0, 0, 0, 0]
    with pytest.raises(IndexError, match="single ellipsis"):
        t[..., ...]
    with pytest.raises(IndexError, match="int or bool"):
        t[Tensor([0.5])]
    assert t[2, 3, 4].item() == 59


@given(idx=basic_index(), seed=st.integers(0, 2**16))
@FEW
def test_setitem_basic(idx: tuple[Any, ...], seed: int) -> None:
    ref = A.copy()
    t = Tensor(A.copy()).realize()
    shape = ref[idx].shape
    v = arrays(shape, np.int32, seed, -9, 9)
    ref[idx] = v
    t[idx] = Tensor(v)
    assert_matches(t.numpy(), ref)


def test_setitem_scalar_advanced_and_views() -> None:
    ref = A.copy()
    t = Tensor(A.copy()).realize()
    view = t.reshape(60)
    ref[1, 2:4] = -1
    t[1, 2:4] = -1
    ref[np.array([0, 2]), 0, np.array([1, 3])] = 7
    t[Tensor([0, 2]), 0, Tensor([1, 3])] = 7
    assert_matches(t.numpy(), ref)
    assert_matches(view.numpy(), ref.reshape(60))


@given(seed=st.integers(0, 2**16), dim=st.integers(-3, 2))
@FEW
def test_gather(seed: int, dim: int) -> None:
    rng = np.random.default_rng(seed)
    d = dim % 3
    ishape = list(A.shape)
    ishape[d] = 6
    ishape = [min(s, x) for s, x in zip(ishape, (2, 3, 4))] if seed % 2 else ishape
    ishape[d] = 6
    idx = rng.integers(0, A.shape[d], ishape).astype(np.int32)
    assert_matches(Tensor(A).gather(dim, Tensor(idx)).numpy(), np.take_along_axis(A[tuple(slice(0, s) if i != d else
                                                                                          slice(None) for i, s in
                                                                                          enumerate(ishape))], idx,
                                                                                    d))  # fmt: skip


def _np_scatter(x: np.ndarray, dim: int, idx: np.ndarray, src: np.ndarray, mode: str, include_self: bool = True
                ) -> np.ndarray:  # fmt: skip
    out = x.astype(np.float64).copy()
    touched = np.zeros(x.shape, bool)
    acc: dict[tuple[int, ...], list[float]] = {}
    for p in np.ndindex(*idx.shape):
        q = list(p)
        q[dim] = idx[p]
        acc.setdefault(tuple(q), []).append(float(src[p]))
    for q, vals in acc.items():
        base = [out[q]] if include_self else []
        allv = base + vals
        touched[q] = True
        reduced = {"set": vals[-1], "sum": sum(allv), "prod": float(np.prod(allv)), "amax": max(allv),
                   "amin": min(allv), "mean": sum(allv) / len(allv)}  # fmt: skip
        out[q] = reduced[mode]
    return out.astype(x.dtype)


@pytest.mark.parametrize("mode", ["set", "sum", "prod", "amax", "amin", "mean"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_and_scatter_reduce(mode: str, include_self: bool) -> None:
    rng = np.random.default_rng(3)
    x = rng.integers(-5, 5, (3, 5)).astype(np.float32)
    idx = rng.integers(0, 5, (3, 3)).astype(np.int32)
    src = rng.integers(-5, 5, (3, 3)).astype(np.float32)
    if mode == "set":
        if not include_self:
            return
        idx = np.stack([rng.permutation(5)[:3] for _ in range(3)]).astype(np.int32)  # distinct: torch leaves ties open
        got = Tensor(x).scatter(1, Tensor(idx), Tensor(src))
    else:
        got = Tensor(x).scatter_reduce(1, Tensor(idx), Tensor(src), mode, include_self=include_self)
    assert_matches(got.numpy(), _np_scatter(x, 1, idx, src, mode, include_self), atol=1e-6)
    if mode in ("sum", "prod") and include_self:
        got2 = Tensor(x).scatter(1, Tensor(idx), Tensor(src), reduce="add" if mode == "sum" else "multiply")
        assert_matches(got2.numpy(), _np_scatter(x, 1, idx, src, mode))


@given(seed=st.integers(0, 2**16))
@FEW
def test_masked_select_nonzero_one_hot(seed: int) -> None:
    a = arrays((3, 4), np.float32, seed)
    m = a > 0
    assert_matches(Tensor(a).masked_select(Tensor(m)).numpy(), a[m])
    assert_matches(Tensor(a).masked_select(Tensor(m[0])).numpy(), a[np.broadcast_to(m[0], a.shape)])
    assert_matches(Tensor(m).nonzero().numpy(), np.argwhere(m).astype(np.int32))
    labels = arrays((5,), np.int32, seed, 0, 3)
    assert_matches(Tensor(labels).one_hot(4).numpy(), np.eye(4, dtype=np.int32)[labels])
    assert Tensor(labels).one_hot().shape == (5, int(labels.max()) + 1)


def test_integer_tensor_index_of_a_realized_tensor_is_one_direct_load() -> None:
    """x[idx] (a batch drawn from a dataset) loads the selected rows directly: one kernel with no reduction over the
    indexed axis (the one-hot compare-and-sum form would read the whole axis for every output element)."""
    from speck.uop import Ops

    rng = np.random.default_rng(3)
    xn = rng.integers(0, 255, (50, 2, 3)).astype(np.uint8)
    ix = rng.integers(-50, 50, 17).astype(np.int32)
    x, idx = Tensor(xn).realize(), Tensor(ix).realize()
    items = x[idx].contiguous().schedule()
    assert len(items) == 1 and not any(u.op is Ops.REDUCE for u in items[0].ast.toposort())
    np.testing.assert_array_equal(x[idx].numpy(), xn[ix])
    fx = Tensor(xn.astype(np.float32)).realize()
    np.testing.assert_array_equal(fx[idx, 1].numpy(), xn.astype(np.float32)[ix, 1])
