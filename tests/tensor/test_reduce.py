"""Reductions, scans, sorting and linear algebra against numpy.

Tolerances (float32): sums/means 1e-5 abs + 1e-5 rel (accumulation order differs from numpy's pairwise sum);
var/std 1e-4; softmax/logsumexp 1e-5 (composed exp/log); matmul/einsum 1e-4. Ints, bools, argmax/argmin and
sort indices are exact."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.tensor import Tensor
from tensor_helpers import FEW, SOME, arrays, assert_matches, shapes


def _axes(shape: tuple[int, ...]) -> st.SearchStrategy[Any]:
    nd = len(shape)
    if nd == 0:
        return st.just(None)
    return st.one_of(st.none(), st.integers(-nd, nd - 1), st.lists(st.integers(0, nd - 1), min_size=1, max_size=nd,
                                                                     unique=True).map(tuple))  # fmt: skip


@st.composite
def shape_axis(draw: Any, min_side: int = 0) -> tuple[tuple[int, ...], Any, bool]:
    shape = draw(shapes(min_side=min_side))
    return shape, draw(_axes(shape)), draw(st.booleans())


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint8, np.bool_])
@given(sak=shape_axis(), seed=st.integers(0, 2**16))
@SOME
def test_sum_prod_any_all(dtype: Any, sak: tuple[tuple[int, ...], Any, bool], seed: int) -> None:
    shape, axis, keep = sak
    a = arrays(shape, dtype, seed, 0, 3)
    t = Tensor(a)
    acc = {np.dtype(np.float32): np.float32, np.dtype(np.int32): np.int32, np.dtype(np.uint8): np.uint32,
           np.dtype(np.bool_): np.int32}[np.dtype(dtype)]  # fmt: skip
    assert_matches(t.sum(axis, keepdim=keep).numpy(), np.sum(a, axis=axis, keepdims=keep, dtype=acc), atol=1e-5,
                   check_dtype=acc)  # fmt: skip
    if dtype != np.bool_:
        assert_matches(t.prod(axis, keepdim=keep).numpy(), np.prod(a, axis=axis, keepdims=keep, dtype=acc), atol=1e-4)
    assert_matches(t.any(axis, keepdim=keep).numpy(), np.any(a, axis=axis, keepdims=keep))
    assert_matches(t.all(axis, keepdim=keep).numpy(), np.all(a, axis=axis, keepdims=keep))


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int8, np.uint8])
@given(sak=shape_axis(min_side=1), seed=st.integers(0, 2**16))
@SOME
def test_max_min_argmax_argmin(dtype: Any, sak: tuple[tuple[int, ...], Any, bool], seed: int) -> None:
    shape, axis, keep = sak
    a = arrays(shape, dtype, seed, -5 if dtype != np.uint8 else 0, 5)
    t = Tensor(a)
    assert_matches(t.max(axis, keepdim=keep).numpy(), np.max(a, axis=axis, keepdims=keep))
    assert_matches(t.min(axis, keepdim=keep).numpy(), np.min(a, axis=axis, keepdims=keep))
    ax = axis if isinstance(axis, int) or axis is None else None
    assert_matches(t.argmax(ax, keepdim=keep).numpy(), np.argmax(a, axis=ax, keepdims=keep).astype(np.int32))
    assert_matches(t.argmin(ax, keepdim=keep).numpy(), np.argmin(a, axis=ax, keepdims=keep).astype(np.int32))


@given(sak=shape_axis(min_side=1), seed=st.integers(0, 2**16), corr=st.sampled_from([0, 1]))
@SOME
def test_mean_var_std(sak: tuple[tuple[int, ...], Any, bool], seed: int, corr: int) -> None:
    shape, axis, keep = sak
    a = arrays(shape, np.float32, seed)
    t = Tensor(a)
    n = int(np.prod([shape[i] for i in (range(len(shape)) if axis is None else np.atleast_1d(axis))]))
    assert_matches(t.mean(axis, keepdim=keep).numpy(), np.mean(a, axis=axis, keepdims=keep), atol=1e-5)
    if n - corr > 0:
        assert_matches(t.var(axis, keepdim=keep, correction=corr).numpy(),
                       np.var(a, axis=axis, keepdims=keep, ddof=corr), atol=1e-4, rtol=1e-4)  # fmt: skip
        s, m = t.std_mean(axis, keepdim=keep, correction=corr)
        assert_matches(s.numpy(), np.std(a, axis=axis, keepdims=keep, ddof=corr), atol=1e-4, rtol=1e-4)
        assert_matches(m.numpy(), np.mean(a, axis=axis, keepdims=keep), atol=1e-5)
    assert_matches(Tensor(a.astype(np.int32)).mean(axis).numpy(), np.mean(a.astype(np.int32), axis=axis), atol=1e-5)


@given(shape=shapes(1, 3, 1), seed=st.integers(0, 2**16), data=st.data())
@SOME
def test_softmax_family(shape: tuple[int, ...], seed: int, data: Any) -> None:
    a = arrays(shape, np.float32, seed, -4, 4)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    t = Tensor(a)
    e = np.exp(a - a.max(axis=axis, keepdims=True))
    sm = e / e.sum(axis=axis, keepdims=True)
    assert_matches(t.softmax(axis).numpy(), sm, atol=1e-6)
    assert_matches(t.log_softmax(axis).numpy(), np.log(sm), atol=1e-5)
    em = np.exp(-a - (-a).max(axis=axis, keepdims=True))
    assert_matches(t.softmin(axis).numpy(), em / em.sum(axis=axis, keepdims=True), atol=1e-6)
    lse = np.log(np.exp(a.astype(np.float64)).sum(axis=axis))
    assert_matches(t.logsumexp(axis).numpy(), lse, atol=1e-5, rtol=1e-5)
    nrm = a / np.maximum(np.sqrt((a * a).sum(axis=axis, keepdims=True)), 1e-12)
    assert_matches(t.normalize(dim=axis).numpy(), nrm, atol=1e-5)


@given(shape=shapes(1, 3), seed=st.integers(0, 2**16), data=st.data())
@SOME
def test_scans(shape: tuple[int, ...], seed: int, data: Any) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    a = arrays(shape, np.float32, seed, -2, 2)
    ai = arrays(shape, np.int32, seed, -5, 5)
    t, ti = Tensor(a), Tensor(ai)
    assert_matches(t.cumsum(axis).numpy(), np.cumsum(a, axis=axis), atol=1e-5)
    assert_matches(ti.cumsum(axis).numpy(), np.cumsum(ai, axis=axis).astype(np.int32))
    assert_matches(t.cumprod(axis).numpy(), np.cumprod(a, axis=axis), atol=1e-4)
    assert_matches(t.cummax(axis)[0].numpy(), np.maximum.accumulate(a, axis=axis) if a.size else a)
    assert_matches(ti.cummin(axis)[0].numpy(), np.minimum.accumulate(ai, axis=axis) if ai.size else ai)
    if a.size:
        assert_matches(t.logcumsumexp(axis).numpy(), np.logaddexp.accumulate(a.astype(np.float64), axis=axis),
                       atol=1e-5, rtol=1e-5)  # fmt: skip


@given(shape=shapes(1, 3), seed=st.integers(0, 2**16), desc=st.booleans(), data=st.data())
@FEW
def test_sort_argsort_topk(shape: tuple[int, ...], seed: int, desc: bool, data: Any) -> None:
    """Stable: ties keep their order (values drawn from a few integers to force ties)."""
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    a = arrays(shape, np.int32, seed, 0, 3).astype(np.float32)
    v, i = Tensor(a).sort(dim, descending=desc)
    order = np.argsort(-a if desc else a, axis=dim, kind="stable")
    assert_matches(i.numpy(), order.astype(np.int32))
    assert_matches(v.numpy(), np.take_along_axis(a, order, axis=dim))
    assert_matches(Tensor(a).argsort(dim, desc).numpy(), order.astype(np.int32))
    n = a.shape[dim]
    k = data.draw(st.integers(0, n))
    tv, ti = Tensor(a).topk(k, dim)
    ref = np.argsort(-a, axis=dim, kind="stable").take(range(k), axis=dim)
    assert_matches(ti.numpy(), ref.astype(np.int32))
    assert_matches(tv.numpy(), np.take_along_axis(a, ref, axis=dim))


MATMUL_SHAPES = [((3,), (3,)), ((2, 3), (3,)), ((3,), (3, 4)), ((2, 3), (3, 4)), ((5, 2, 3), (3, 4)),
                 ((2, 1, 2, 3), (4, 3, 2)), ((0, 3), (3, 2)), ((2, 0), (0, 3)), ((1, 1), (1, 1))]  # fmt: skip


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_matmul_dot(sa: tuple[int, ...], sb: tuple[int, ...], dtype: Any) -> None:
    a, b = arrays(sa, dtype, 1), arrays(sb, dtype, 2)
    assert_matches((Tensor(a) @ Tensor(b)).numpy(), np.matmul(a, b), atol=1e-4, rtol=1e-4)
    assert_matches(Tensor(a).dot(Tensor(b)).numpy(), np.matmul(a, b), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("formula,shapes_", [
    ("ij,jk->ik", [(2, 3), (3, 4)]), ("bij,bjk->bik", [(2, 2, 3), (2, 3, 2)]), ("i,i->", [(4,), (4,)]),
    ("ij->ji", [(2, 3)]), ("ij->j", [(2, 3)]), ("i,j->ij", [(2,), (3,)]), ("ij,kj", [(2, 3), (4, 3)]),
])  # fmt: skip
def test_einsum(formula: str, shapes_: list[tuple[int, ...]]) -> None:
    arrs = [arrays(s, np.float32, i) for i, s in enumerate(shapes_)]
    got = Tensor.einsum(formula, *[Tensor(x) for x in arrs]).numpy()
    assert_matches(got, np.einsum(formula, *arrs), atol=1e-5)


@given(shape=shapes(2, 3, 0), seed=st.integers(0, 2**16), k=st.integers(-3, 3))
@FEW
def test_tril_triu(shape: tuple[int, ...], seed: int, k: int) -> None:
    a = arrays(shape, np.float32, seed)
    assert_matches(Tensor(a).tril(k).numpy(), np.tril(a, k))
    assert_matches(Tensor(a).triu(k).numpy(), np.triu(a, k))


def test_reduce_errors_name_axes() -> None:
    t = Tensor.ones(2, 3)
    with pytest.raises(IndexError, match="out of range"):
        t.sum(2)
    with pytest.raises(RuntimeError, match="repeats"):
        t.sum((0, 0))
    with pytest.raises(RuntimeError, match="matmul shape mismatch"):
        t @ Tensor.ones(2, 3)
    assert t.sum().item() == 6.0
