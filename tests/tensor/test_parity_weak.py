"""Weak (literal) dtypes and device-less tensors (TENSOR_API 0.2, 0.3, 3.2, 3.3; issue 28 §2) and Python ints
that do not fit the default int (issue 32): the promotion lattice's properties (hypothesis), literal arithmetic
against numpy's (NEP 50: a Python scalar takes the array's dtype), the spec's table of joins, the raising cases, and
how device-less tensors take the device of what they meet."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.tensor import Context, Tensor, dtypes
from speck.tensor.dtype import strong_dtype
from speck.uop import DType, least_upper_dtype
from speck.uop.dtype import ALL_SCALARS, _upper_set

LATTICE = [d for d in ALL_SCALARS if d != dtypes.void]
NUMERIC = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32,
           dtypes.int64, dtypes.uint64, dtypes.float16, dtypes.float32, dtypes.float64]  # fmt: skip
NP = {d: np.dtype(d.fmt) for d in NUMERIC}
dts = st.sampled_from(LATTICE)


# ---------------- the lattice ----------------
@given(dts, dts)
def test_join_is_commutative_and_an_upper_bound(a: DType, b: DType) -> None:
    j = least_upper_dtype(a, b)
    assert j == least_upper_dtype(b, a)
    assert j in _upper_set(a) and j in _upper_set(b)


@given(dts, dts, dts)
def test_join_is_associative_and_least(a: DType, b: DType, c: DType) -> None:
    assert least_upper_dtype(least_upper_dtype(a, b), c) == least_upper_dtype(a, least_upper_dtype(b, c))
    assert least_upper_dtype(a, b, c) == least_upper_dtype(least_upper_dtype(a, b), c)
    j = least_upper_dtype(a, b)
    for u in _upper_set(a) & _upper_set(b):  # every common upper bound is above the join (fp8 pairs: a minimal one)
        assert u in _upper_set(j) or (dtypes.is_fp8(a) and dtypes.is_fp8(b) and a != b)


@given(dts)
def test_literals_take_the_dtype_they_meet(d: DType) -> None:
    assert least_upper_dtype(d, d) == d
    if dtypes.is_int(d) and not d.is_weak:
        assert least_upper_dtype(d, dtypes.weakint) == d and least_upper_dtype(d, dtypes.weakfloat) == dtypes.weakfloat
    if dtypes.is_float(d) and not d.is_weak:
        assert least_upper_dtype(d, dtypes.weakint) == d == least_upper_dtype(d, dtypes.weakfloat)


# ---------------- literal arithmetic against numpy ----------------
OPS = {"add": (lambda a, b: a + b), "sub": (lambda a, b: a - b), "mul": (lambda a, b: a * b),
       "max": (lambda a, b: a.maximum(b) if isinstance(a, Tensor) else np.maximum(a, b))}  # fmt: skip


@given(st.sampled_from([d for d in NUMERIC if d != dtypes.bool]), st.sampled_from(sorted(OPS)),
       st.lists(st.integers(-100, 100), min_size=1, max_size=5), st.integers(0, 100))  # fmt: skip
def test_int_literal_keeps_the_tensor_dtype(d: DType, op: str, xs: list[int], lit: int) -> None:
    arr = np.array(xs).astype(NP[d])
    t = Tensor(arr)
    with np.errstate(all="ignore"):
        want = OPS[op](arr, NP[d].type(lit))  # numpy 2: a Python int takes the array's dtype
    got = OPS[op](t, lit)
    assert got.dtype == d
    np.testing.assert_array_equal(got.numpy(), want.astype(NP[d]))


@given(st.sampled_from(NUMERIC), st.lists(st.integers(-50, 50), min_size=1, max_size=5),
       st.floats(-10, 10, allow_nan=False).filter(lambda f: f != int(f)))  # fmt: skip
def test_float_literal_on_ints_is_weakfloat_read_at_the_default_float(d: DType, xs: list[int], f: float) -> None:
    arr = np.array(xs).astype(NP[d])
    out = Tensor(arr) * f
    want_dt = d if dtypes.is_float(d) else dtypes.weakfloat
    assert out.dtype == want_dt
    read = np.float32 if want_dt == dtypes.weakfloat else NP[d].type
    np.testing.assert_allclose(out.numpy(), (arr.astype(read) * read(f)).astype(read), rtol=1e-3 if d ==
                               dtypes.float16 else 1e-6)  # fmt: skip
    assert out.numpy().dtype == read


def _t(d: DType) -> Tensor:
    return Tensor([1, 0, 1], dtype=d)


@pytest.mark.parametrize("make, want", [
    (lambda: _t(dtypes.int8) + 3, dtypes.int8),
    (lambda: _t(dtypes.int32) + 1.5, dtypes.weakfloat),
    (lambda: _t(dtypes.int32) * 0.5, dtypes.weakfloat),
    (lambda: _t(dtypes.bool) * 1.5, dtypes.weakfloat),
    (lambda: _t(dtypes.bool) + 1, dtypes.weakint),
    (lambda: _t(dtypes.half) + 0.5, dtypes.half),
    (lambda: _t(dtypes.half) + Tensor(2), dtypes.half),
    (lambda: Tensor(3) + _t(dtypes.int8), dtypes.int8),
    (lambda: (_t(dtypes.int32) * 0.5) + _t(dtypes.half), dtypes.half),
    (lambda: (_t(dtypes.int32) * 0.5) + _t(dtypes.int8), dtypes.weakfloat),
    (lambda: _t(dtypes.int64) + _t(dtypes.uint64), dtypes.weakfloat),
    (lambda: Tensor(2).exp(), dtypes.weakfloat),
    (lambda: _t(dtypes.int32).exp(), dtypes.float32),
    (lambda: (_t(dtypes.int32) * 0.5).sum(), dtypes.float32),
    (lambda: (_t(dtypes.bool) + 1).sum(), dtypes.int32),
    (lambda: _t(dtypes.bool).where(1, 0), dtypes.weakint),
    (lambda: Tensor(3) < 4.5, dtypes.bool),
])  # fmt: skip
def test_the_spec_joins(make: Any, want: DType) -> None:
    assert make().dtype == want


def test_weak_expressions_compute_in_the_dtype_they_meet() -> None:
    i, h = Tensor([1, 2, 3]), Tensor([0.25, 0.5, 1.0]).half()
    out = i * 0.5 + h  # the int tensor * 0.5 is computed in half, where it meets h
    assert out.dtype == dtypes.half
    np.testing.assert_array_equal(out.numpy(), np.array([1, 2, 3], np.float16) * np.float16(0.5) + h.numpy())
    b = Tensor([True, False])
    np.testing.assert_array_equal(((b + 1) * 0.5).numpy(), np.array([1.0, 0.5], np.float32))
    np.testing.assert_array_equal(((Tensor(7) // 2) * 0.5).numpy(), np.float32(1.5))  # int floordiv, then float
    np.testing.assert_array_equal(((Tensor(6) & 3) + h).numpy(), np.float16(2) + h.numpy())


def test_reads_materialize_at_the_default_dtype() -> None:
    w = Tensor([1, 2]) * 0.5
    w.realize()  # no storage: nothing to do
    assert w.dtype == dtypes.weakfloat and w.numpy().dtype == np.float32
    with Context(DEFAULT_FLOAT="float64"):
        assert w.numpy().dtype == np.float64 and Tensor(2.5).numpy().dtype == np.float64
    assert Tensor(3).numpy().dtype == np.int32 and Tensor(3).item() == 3
    c = w.clone()
    assert c.dtype == dtypes.float32 and c.device == w.device and c.tolist() == [0.5, 1.0]
    assert w.contiguous().uop is w.uop and w.contiguous().dtype == dtypes.weakfloat


@pytest.mark.parametrize("bad, exc", [
    (lambda: _t(dtypes.int8) + 200, OverflowError),
    (lambda: _t(dtypes.int32) + 2**40, OverflowError),
    (lambda: _t(dtypes.uint8) - Tensor(-1), OverflowError),
    (lambda: _t(dtypes.uint32) * -1, OverflowError),
    (lambda: Tensor([1, 2], dtype=dtypes.weakint), RuntimeError),
    (lambda: Tensor(np.ones(2), dtype=dtypes.weakfloat), RuntimeError),
    (lambda: Tensor(b"ab", dtype=dtypes.weakint), RuntimeError),
    (lambda: (Tensor([1, 2]) * 0.5).to("CPU:1"), RuntimeError),
    (lambda: (Tensor([1, 2]) * 0.5).as_param(0), RuntimeError),
    (lambda: (Tensor([1, 2]) * 0.5).bitcast(dtypes.int32), RuntimeError),
    (lambda: Tensor([1, 2]).bitcast(dtypes.weakint), RuntimeError),
    (lambda: Tensor(2.5).element_size(), RuntimeError),
    (lambda: (Tensor([1, 2]) * 0.5).nbytes(), RuntimeError),
    (lambda: Tensor.rand(3, dtype=dtypes.weakfloat), ValueError),
    (lambda: Tensor.empty(3, dtype=dtypes.weakint), RuntimeError),
])  # fmt: skip
def test_raising_cases(bad: Any, exc: type) -> None:
    with pytest.raises(exc):
        bad()


def test_setitem_into_a_weak_tensor_raises() -> None:
    w = Tensor([1, 2]) * 0.5
    with pytest.raises(RuntimeError, match="weak"):
        w[0] = 1.0


def test_gradient_wrt_a_weak_tensor_raises() -> None:
    x = Tensor([1.0, 2.0])
    w = Tensor([1, 2]) * 0.5
    with pytest.raises(RuntimeError, match="weak"):
        (x * w).sum().gradient(w)


def test_assign_casts_weak_values_only_when_the_join_is_the_target() -> None:
    f = Tensor([1.0, 2.0]).realize()
    f.assign(Tensor([1, 2]) * 0.5)  # weakfloat joins float32 into float32
    assert f.dtype == dtypes.float32 and f.tolist() == [0.5, 1.0]
    i8 = Tensor([1, 2], dtype=dtypes.int8).realize()
    with pytest.raises(RuntimeError, match="dtype mismatch"):
        i8.assign(Tensor([1, 2]) * 0.5)  # weakfloat into int8 would drop the fraction
    i8.assign(Tensor(7))
    assert i8.tolist() == [7, 7]
    c = Tensor(3)
    c.assign(5)  # a literal gets storage (the default int) first
    assert c.dtype == dtypes.int32 and c.device is not None and c.item() == 5


# ---------------- Python ints that don't fit the default int (issue 32) ----------------
@pytest.mark.parametrize("make, want", [
    (lambda: Tensor([2**31 + 1]), [2**31 + 1]),
    (lambda: Tensor([2**40, -3]), [2**40, -3]),
    (lambda: Tensor([-(2**31) - 1]), [-(2**31) - 1]),
    (lambda: Tensor.full((2,), 2**31), [2**31, 2**31]),
    (lambda: Tensor(2**40), 2**40),
    (lambda: Tensor(2**31) * 4, 2**33),
    (lambda: Tensor.arange(2**31 - 2, 2**31 + 2)[3], 2**31 + 1),
    (lambda: Tensor.arange(2**40, 2**40 + 4)[1:3], [2**40 + 1, 2**40 + 2]),
])  # fmt: skip
def test_big_python_ints_make_int64_never_wrap(make: Any, want: Any) -> None:
    t = make()
    assert t.numpy().dtype == np.int64
    assert t.tolist() == want


def test_ints_beyond_int64_raise() -> None:
    with pytest.raises(OverflowError):
        Tensor([2**64])
    with pytest.raises(OverflowError):
        Tensor(2**70).numpy()


def test_explicit_dtypes_convert_like_casts() -> None:
    assert Tensor([-1], dtype=dtypes.uint8).tolist() == [255]  # TENSOR_API 3.4: a requested dtype wraps
    assert Tensor(2**40).cast(dtypes.int32).item() == 0
    assert Tensor([2**40]).cast(dtypes.int32).tolist() == [0]


# ---------------- device-less tensors ----------------
@pytest.mark.parametrize("make", [
    lambda: Tensor(3), lambda: Tensor(2.5, device="CPU:1"), lambda: Tensor(True), lambda: Tensor(None),
    lambda: Tensor(np.float32(2)), lambda: Tensor(np.array(4, np.int16)), lambda: Tensor.arange(4),
    lambda: Tensor.linspace(0, 1, 5), lambda: Tensor.eye(3), lambda: Tensor.full((2,), 1.5, buffer=False),
    lambda: Tensor.arange(4) * 2 + Tensor(1), lambda: Tensor.const(7),
])  # fmt: skip
def test_device_less_tensors(make: Any) -> None:
    t = make()
    assert t.device is None
    t.realize()
    assert t.device is None and t.to("CPU:1") is t and t.shard(("CPU", "CPU:1")) is t
    assert t.contiguous().device is None and t.contiguous().uop is t.uop
    ref = t.numpy()
    on = t.clone("CPU:1")
    assert on.device == "CPU:1" and on.dtype == strong_dtype(t.dtype)
    np.testing.assert_array_equal(on.numpy(), ref)


def test_device_less_takes_the_device_it_meets() -> None:
    x = Tensor([1.0, 2.0, 3.0], device="CPU:1")
    for out in (x + Tensor.arange(3), Tensor.arange(3) + x, (Tensor.arange(3) < 2).where(x, 0.0),
                x.maximum(Tensor(2.0))):  # fmt: skip
        assert out.device == "CPU:1"
    np.testing.assert_array_equal((x + Tensor.arange(3)).numpy(), [1.0, 3.0, 5.0])
    np.testing.assert_array_equal((Tensor.arange(3) < 2).where(x, 0.0).numpy(), [1.0, 2.0, 0.0])
    s = Tensor([1.0, 2.0, 3.0, 4.0]).shard(("CPU", "CPU:1"), 0)
    np.testing.assert_array_equal((s * Tensor.arange(4)).numpy(), [0.0, 2.0, 6.0, 12.0])


def test_device_less_tensors_never_get_a_gradient() -> None:
    w, c = Tensor([1.0, 2.0]), Tensor(3.0)
    (w * c).sum().backward()
    assert w.grad is not None and c.grad is None
    np.testing.assert_array_equal(w.grad.numpy(), [3.0, 3.0])


def test_0d_array_ignores_device_and_keeps_its_dtype() -> None:
    for arr in (np.array(3, np.int8), np.array(2.5, np.float64), np.float16(1.5)):
        t = Tensor(arr, device="CPU:1")
        assert t.device is None and t.dtype.fmt == np.asarray(arr).dtype.char and t.item() == arr.item()


@pytest.mark.parametrize("a, b", list(itertools.combinations([3, 2.5, True], 2)))
def test_literal_tensors_combine_like_python(a: Any, b: Any) -> None:
    out = Tensor(a) + Tensor(b)
    assert out.device is None
    assert out.item() == pytest.approx(a + b)


# ---------------- int64 values through every backend (issue 32) ----------------
BACKENDS = ["CPU:LLVM", "CPU:CLANG", "CPU:X86", "PYTHON"]


@pytest.mark.parametrize("device", BACKENDS)
def test_int64_constants_and_positions_survive_every_backend(device: str) -> None:
    a = np.array([1, -5, 2**40, -(2**62)], np.int64)
    t = Tensor(a, device=device)
    with np.errstate(over="ignore"):
        cases = [(t + 2**40, a + 2**40), (t * 2**33, a * 2**33), (t & 0xFFFFFFFFFF, a & 0xFFFFFFFFFF),
                 (t < 2**35, a < 2**35), (t // 2**34, a // 2**34), (t.maximum(2**39), np.maximum(a, 2**39)),
                 (t - 2**62, a - 2**62)]  # fmt: skip
    for got, want in cases:
        np.testing.assert_array_equal(got.numpy(), want)
    u = np.array([1, 2**63, 2**64 - 1], np.uint64)
    tu = Tensor(u, device=device)
    np.testing.assert_array_equal((tu >> 1).numpy(), u >> 1)
    np.testing.assert_array_equal((tu > 2**62).numpy(), u > 2**62)
    big = Tensor.arange(2**31 + 5, dtype=dtypes.int64, device=device)  # positions past int32 (never allocated)
    assert big[2**31 + 1].item() == 2**31 + 1
    assert big[2**31 - 1 : 2**31 + 3].tolist() == [2**31 - 1, 2**31, 2**31 + 1, 2**31 + 2]
    assert Tensor.full((2,), 2**31, device=device).tolist() == [2**31] * 2
