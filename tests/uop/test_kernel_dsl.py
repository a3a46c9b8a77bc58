"""The UOp methods hand-written kernels are built with: placeholders indexed as C[i, j], slices, set/after,
contract, flatten, the two forms of sink; and pickling PatternMatchers by their module-level name."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.uop import AxisType, Ops, PatternMatcher, PtrDType, UOp, UPat, dtypes


def test_placeholder_shape_and_dtype() -> None:
    c = UOp.placeholder((3, 4), dtypes.float32, 2)
    assert c.op is Ops.PARAM and c.shape == (3, 4) and c.size == 12
    assert isinstance(c.dtype, PtrDType) and c.dtype.base is dtypes.float32 and c.dtype.size == 12
    assert UOp.placeholder((3, 4), dtypes.float32, 2) is c  # hash-consed like every node
    with pytest.raises(RuntimeError, match="concrete ints"):
        UOp.placeholder((UOp.variable("n", 1, 4),), dtypes.float32, 0)


def test_indexing_gives_elements() -> None:
    c = UOp.placeholder((3, 4), dtypes.int32, 0)
    i, j = UOp.range(3, 0), UOp.range(4, 1)
    e = c[i, j]
    assert e.op is Ops.INDEX and e.dtype is dtypes.int32 and e.src == (c, i, j)
    assert c[-1, 2].src[1:] == (UOp.const(dtypes.weakint, 2), UOp.const(dtypes.weakint, 2))
    assert (e + 1).dtype is dtypes.int32  # an element is a value
    st_ = e.store(5)
    assert st_.op is Ops.STORE and st_.src[1] is UOp.const(dtypes.int32, 5)
    with pytest.raises(IndexError, match="out of bounds"):
        c[3, 0]
    with pytest.raises(IndexError, match="3 indices"):
        c[i, j, i]
    with pytest.raises(IndexError, match="int UOp"):
        c[i.cast(dtypes.float32), j]
    with pytest.raises(RuntimeError, match="only a buffer view"):
        (i + 1)[0]
    with pytest.raises(TypeError, match="not iterable"):
        list(c)


def test_slices_give_views() -> None:
    c = UOp.placeholder((5, 6), dtypes.float32, 0)
    g = UOp.range(5, 0)
    row = c[g, :]
    assert row.shape == (6,) and isinstance(row.dtype, PtrDType)
    assert c[1:4].shape == (3, 6) and c[:, 2:].shape == (5, 4)
    assert row[UOp.range(6, 1)].op is Ops.INDEX
    with pytest.raises(IndexError, match="step 1"):
        c[::2]
    assert c.flatten().shape == (30,) and c.flatten()[0].op is Ops.INDEX


def test_set_and_after() -> None:
    c = UOp.placeholder((4,), dtypes.float32, 0)
    r = UOp.range(4, 0, AxisType.REDUCE)
    c1 = c[0].set(0.0)
    assert c1.op is Ops.AFTER and c1.src[0] is c and c1.src[1].op is Ops.STORE
    c2 = c1[0].set(c1.after(r)[0] + 1.0, end=r)
    assert c2.op is Ops.AFTER and c2.src[0] is c1 and c2.src[1].op is Ops.END and c2.src[1].src[1] is r
    assert c2.shape == (4,)
    with pytest.raises(RuntimeError, match="indexed buffer element"):
        c.set(1.0)


@given(n=st.integers(1, 6), m=st.integers(1, 4))
def test_contract_lanes(n: int, m: int) -> None:
    i, j, k = UOp.range(7, 0), UOp.range(n, 1, AxisType.UPCAST), UOp.range(m, 2, AxisType.UPCAST)
    x = i * 100 + j * 10 + k
    v = x.contract(j, k)
    assert v.dtype == dtypes.weakint.vec(n * m) if n * m > 1 else v.dtype is dtypes.weakint
    for a in range(n):
        for b in range(m):
            lane = v.gep(a * m + b) if n * m > 1 else v
            assert lane.simplify() is (i * 100 + a * 10 + b).simplify()
    with pytest.raises(RuntimeError, match="constant size"):
        x.contract(UOp.range(UOp.variable("vn", 1, 4), 3))


def test_sink_static_and_bound() -> None:
    a = UOp.placeholder((2,), dtypes.float32, 0)[0].store(1.0)
    b = UOp.placeholder((2,), dtypes.float32, 1)[1].store(2.0)
    assert a.sink(b, arg="k") is UOp.sink(a, b, arg="k")
    assert a.sink().src == (a,) and UOp.sink().src == ()


module_pm = PatternMatcher([(UPat(Ops.NEG, name="x"), lambda x: x.src[0] * -1)])


def test_pattern_matcher_pickles_by_name() -> None:
    from speck.uop.symbolic import symbolic

    assert pickle.loads(pickle.dumps(symbolic)) is symbolic
    assert pickle.loads(pickle.dumps(module_pm)) is module_pm
    with pytest.raises(pickle.PicklingError, match="no module-level name"):
        pickle.dumps(PatternMatcher([(UPat(Ops.NEG, name="x"), lambda x: x)]))
