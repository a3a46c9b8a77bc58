"""TENSOR_API 3.2 exhaustively: the promotion lattice is rebuilt here from the spec's edge list, and for every pair
(and, by hypothesis, every longer list) of the 19 dtypes least_upper_dtype must be the least common ancestor (the
one two fp8 kinds have two of, float16 and bfloat16, resolves to float16). Every binary op between tensors of any
two concrete dtypes has that dtype and numpy's values; Python literals join as weakint/weakfloat/bool."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.tensor import Tensor, dtypes
from speck.uop import DType, least_upper_dtype

d = dtypes
FP8 = (d.fp8e4m3, d.fp8e5m2, d.fp8e4m3fnuz, d.fp8e5m2fnuz)
EDGES: dict[DType, tuple[DType, ...]] = {  # TENSOR_API 3.2, edge for edge
    d.bool: (d.weakint,),
    d.weakint: (d.int8, d.uint8),
    d.int8: (d.int16,), d.int16: (d.int32,), d.int32: (d.int64,), d.int64: (d.weakfloat,),
    d.uint8: (d.int16, d.uint16), d.uint16: (d.int32, d.uint32), d.uint32: (d.int64, d.uint64),
    d.uint64: (d.weakfloat,),
    d.weakfloat: FP8,
    **{f: (d.float16, d.bfloat16) for f in FP8},
    d.float16: (d.float32,), d.bfloat16: (d.float32,), d.float32: (d.float64,), d.float64: (),
}  # fmt: skip
ALL = tuple(EDGES)


def ancestors(dt: DType) -> set[DType]:
    out = {dt}
    for p in EDGES[dt]:
        out |= ancestors(p)
    return out


def expected_join(*dts: DType) -> DType:
    common = set.intersection(*(ancestors(x) for x in dts))
    minimal = [c for c in common if not any(o != c and c in ancestors(o) for o in common)]
    if len(minimal) == 1:
        return minimal[0]
    assert set(minimal) == {d.float16, d.bfloat16}, minimal  # only distinct fp8 kinds meet twice
    return d.float16


def test_lattice_covers_every_dtype_and_the_spec_examples() -> None:
    assert set(d.all) | {d.weakint, d.weakfloat} == set(ALL) and len(d.all) == 17
    for a, b, want in [(d.int8, d.uint8, d.int16), (d.int32, d.uint32, d.int64), (d.int64, d.uint64, d.weakfloat),
                       (d.int32, d.half, d.half), (d.uint64, d.bfloat16, d.bfloat16), (d.int8, d.fp8e5m2, d.fp8e5m2),
                       (d.fp8e4m3, d.fp8e5m2fnuz, d.half), (d.half, d.bfloat16, d.float32), (d.bool, d.bool, d.bool),
                       (d.weakint, d.weakfloat, d.weakfloat), (d.bool, d.weakint, d.weakint)]:  # fmt: skip
        assert expected_join(a, b) is want and least_upper_dtype(a, b) is want, (a, b)


@pytest.mark.parametrize("a", ALL, ids=str)
def test_least_upper_dtype_of_every_pair(a: DType) -> None:
    for b in ALL:
        assert least_upper_dtype(a, b) is expected_join(a, b), (a, b)
        assert least_upper_dtype(a, b) is least_upper_dtype(b, a)


@given(st.lists(st.sampled_from(ALL), min_size=1, max_size=5))
def test_least_upper_dtype_of_any_list_is_the_fold(dts: list[DType]) -> None:
    got = least_upper_dtype(*dts)
    assert got is expected_join(*dts)
    # pairwise folding agrees except where two fp8 kinds fold to half first (half's ancestors then decide)
    if not any(x in FP8 for x in dts):
        acc = dts[0]
        for x in dts[1:]:
            acc = least_upper_dtype(acc, x)
        assert acc is got


def _operand(values: list[int], dt: DType) -> tuple[Tensor, np.ndarray]:
    v = np.array(values) % 2 if dt == d.bool else np.array(values)
    return Tensor(v.tolist(), dtype=dt), v.astype(bool) if dt == d.bool else v


@pytest.mark.parametrize("a", d.all, ids=str)
def test_binary_ops_between_every_pair_of_dtypes(a: DType) -> None:
    """Small ints exact in every dtype (fp8 e5m2 holds 0..8): sums, products, maxima and comparisons."""
    for b in d.all:
        ta, va = _operand([0, 1, 2, 3], a)
        tb, vb = _operand([1, 2, 1, 2], b)
        join = expected_join(a, b)
        for name, got, ref in [
            ("add", ta + tb, np.logical_or(va, vb) if join == d.bool else va.astype(float) + vb),
            ("mul", ta * tb, va.astype(float) * vb),
            ("maximum", ta.maximum(tb), np.maximum(va.astype(float), vb)),
            ("lt", ta < tb, va.astype(float) < vb),
        ]:
            assert got.dtype is (d.bool if name == "lt" else join), (a, b, name, got.dtype)
            np.testing.assert_array_equal(got.numpy().astype(float), np.asarray(ref, float), err_msg=f"{a} {b} {name}")


@pytest.mark.parametrize("a", d.all, ids=str)
@pytest.mark.parametrize("lit", [2, 0.5, True], ids=["int", "float", "bool"])
def test_python_literals_join_as_weak_dtypes(a: DType, lit: int | float | bool) -> None:
    t = Tensor([1, 0, 1] if a == d.bool else [1, 2, 3], dtype=a)
    want = expected_join(a, {int: d.weakint, float: d.weakfloat, bool: d.bool}[type(lit)])
    for r in (t + lit, lit + t, t * lit, lit * t, Tensor(lit) + t, t.maximum(lit), (t != 0).where(t, lit)):
        assert r.dtype is want, (a, lit, r.dtype)


def test_all_pairs_are_checked() -> None:
    assert len(list(itertools.product(ALL, ALL))) == 19 * 19
