"""dtypes: from_py, weak types, exact truncation and bitcasts (IR.md examples), the promotion lattice,
can_lossless_cast, and the property that fixed-width constant folding equals numpy for every int/float dtype."""

from __future__ import annotations

import math
import pickle
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.uop import (
    AddrSpace,
    DType,
    Ops,
    UOp,
    bitcast,
    can_lossless_cast,
    dtypes,
    least_upper_dtype,
    least_upper_float,
    sum_acc_dtype,
    to_dtype,
    truncate,
)
from speck.uop.dtype import MAX_VEC_COUNT
from speck.uop.errors import UOpTypeError, UOpValueError

INT_DTYPES = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
              dtypes.uint64]  # fmt: skip
FLOAT_DTYPES = [dtypes.float16, dtypes.float32, dtypes.float64]
NP = {d: np.dtype(d.fmt) for d in INT_DTYPES + FLOAT_DTYPES if d.fmt is not None}


def test_from_py() -> None:
    assert dtypes.from_py(True) is dtypes.bool
    assert dtypes.from_py(3) is dtypes.weakint
    assert dtypes.from_py(3.0) is dtypes.weakfloat
    # sequences give the dtype a tensor built from them gets: the strongest kind made concrete
    assert dtypes.from_py((1, 2.0)) is dtypes.default_float
    assert dtypes.from_py([1, True]) is dtypes.default_int
    assert dtypes.from_py([True]) is dtypes.bool
    assert dtypes.from_py([]) is dtypes.default_float
    with pytest.raises(RuntimeError, match="can't infer a dtype"):
        dtypes.from_py("x")


def test_weak_ints_never_overflow() -> None:
    c = (UOp.const(dtypes.weakint, 2**40) + 2**40).simplify()
    assert c.op is Ops.CONST and c.arg == 2**41
    big = (UOp.const(dtypes.weakint, 2**70) * 3).simplify()
    assert big.arg == 3 * 2**70


def test_aliases() -> None:
    assert dtypes.int is dtypes.int32 and dtypes.float is dtypes.float32 and dtypes.half is dtypes.float16
    assert dtypes.long is dtypes.int64 and dtypes.uchar is dtypes.uint8 and dtypes.double is dtypes.float64
    assert to_dtype("half") is dtypes.float16
    with pytest.raises(RuntimeError, match="unknown dtype"):
        to_dtype("float7")


# (dtype, repr, C-like name): repr shows the short attribute users type, `name` the C spelling
NAMES = [
    (dtypes.bool, "dtypes.bool", "bool"), (dtypes.int8, "dtypes.char", "signed char"),
    (dtypes.uint8, "dtypes.uchar", "unsigned char"), (dtypes.int16, "dtypes.short", "short"),
    (dtypes.uint16, "dtypes.ushort", "unsigned short"), (dtypes.int32, "dtypes.int", "int"),
    (dtypes.uint32, "dtypes.uint", "unsigned int"), (dtypes.int64, "dtypes.long", "long"),
    (dtypes.uint64, "dtypes.ulong", "unsigned long"), (dtypes.float16, "dtypes.half", "half"),
    (dtypes.bfloat16, "dtypes.bfloat16", "__bf16"), (dtypes.float32, "dtypes.float", "float"),
    (dtypes.float64, "dtypes.double", "double"), (dtypes.fp8e4m3, "dtypes.fp8e4m3", "float8_e4m3"),
    (dtypes.fp8e5m2fnuz, "dtypes.fp8e5m2fnuz", "float8_e5m2fnuz"),
]  # fmt: skip


@pytest.mark.parametrize("dt,rep,name", NAMES, ids=[n[1] for n in NAMES])
def test_repr_and_c_name(dt: DType, rep: str, name: str) -> None:
    assert repr(dt) == str(dt) == rep and dt.name == name
    assert eval(rep, {"dtypes": dtypes}) is dt  # the repr is the expression that gives the dtype back
    assert to_dtype(name) is dt and to_dtype(rep.removeprefix("dtypes.").upper()) is dt
    assert pickle.loads(pickle.dumps(dt)) is dt and pickle.loads(pickle.dumps(dt.vec(4))) is dt.vec(4)
    assert repr(dt.vec(4)) == f"{rep}.vec(4)"
    assert dt.short_name.isidentifier()  # renderers build helper names from it


@pytest.mark.parametrize(
    "v,src,dst,want",
    [(3000000000, dtypes.int32, dtypes.uint32, 3000000000), (70000, dtypes.int16, dtypes.uint16, 4464),
     (-5, dtypes.uint32, dtypes.int32, -5), (1.0, dtypes.float32, dtypes.uint32, 0x3F800000),
     (0x3C00, dtypes.uint16, dtypes.float16, 1.0), (-1, dtypes.int8, dtypes.uint8, 255)],
)  # fmt: skip
def test_bitcast_truncates_source_first(v: int, src: DType, dst: DType, want: float) -> None:
    assert bitcast(v, src, dst) == want
    folded = UOp.const(dtypes.weakint if isinstance(v, int) else dtypes.weakfloat, v)
    # folding a BITCAST of a CONST gives the same value
    c = UOp(Ops.BITCAST, dst, (UOp(Ops.CONST, src, (), v),)).simplify()
    assert c.op is Ops.CONST and c.arg == want, folded


def test_bitcast_needs_equal_sizes() -> None:
    with pytest.raises(RuntimeError, match="equal size"):
        bitcast(1, dtypes.int16, dtypes.int32)


def test_truncate_examples() -> None:
    assert truncate[dtypes.int8](200) == -56
    assert truncate[dtypes.uint8](-1) == 255
    assert truncate[dtypes.int32](2**31) == -(2**31)
    assert truncate[dtypes.float16](65520.0) == math.inf  # rounds past the largest half
    assert truncate[dtypes.float32](0.1) == float(np.float32(0.1))
    assert truncate[dtypes.bfloat16](1.0 + 2**-9) == 1.0  # round to nearest even at 8 bits of mantissa
    assert truncate[dtypes.fp8e4m3](1000.0) == 448.0  # e4m3 saturates
    assert truncate[dtypes.fp8e5m2](1e6) == 57344.0  # finite overflow saturates in every fp8 format
    assert truncate[dtypes.fp8e5m2](-math.inf) == -math.inf  # e5m2 keeps infinities
    assert math.isnan(truncate[dtypes.fp8e4m3](math.inf))  # the others have none: NaN


def test_promotion_lattice() -> None:
    assert least_upper_dtype(dtypes.int8, dtypes.weakint) is dtypes.int8
    assert least_upper_dtype(dtypes.int8, dtypes.uint8) is dtypes.int16
    assert least_upper_dtype(dtypes.uint32, dtypes.int32) is dtypes.int64
    assert least_upper_dtype(dtypes.int32, dtypes.weakfloat) is dtypes.weakfloat
    assert least_upper_dtype(dtypes.float16, dtypes.bfloat16) is dtypes.float32
    assert least_upper_dtype(dtypes.bool, dtypes.bool) is dtypes.bool
    assert least_upper_dtype(dtypes.uint64, dtypes.int64) is dtypes.weakfloat
    assert least_upper_float(dtypes.int32) is dtypes.float32
    assert least_upper_float(dtypes.float16) is dtypes.float16
    assert sum_acc_dtype(dtypes.int8) is dtypes.int32 and sum_acc_dtype(dtypes.uint8) is dtypes.uint32
    assert sum_acc_dtype(dtypes.float16) is dtypes.float32


def test_promotion_is_a_lattice() -> None:
    ds = [d for d in dtypes.fields().values() if d is not dtypes.void]
    for a in ds:
        for b in ds:
            u = least_upper_dtype(a, b)
            assert u is least_upper_dtype(b, a)
            assert least_upper_dtype(u, a) is u and least_upper_dtype(u, b) is u


def test_can_lossless_cast() -> None:
    assert can_lossless_cast(dtypes.int8, dtypes.int16)
    assert can_lossless_cast(dtypes.uint8, dtypes.int16)
    assert not can_lossless_cast(dtypes.int8, dtypes.uint16)
    assert not can_lossless_cast(dtypes.int32, dtypes.float32)
    assert can_lossless_cast(dtypes.int16, dtypes.float32)
    assert can_lossless_cast(dtypes.float16, dtypes.float32)
    assert not can_lossless_cast(dtypes.bfloat16, dtypes.float16)
    assert can_lossless_cast(dtypes.bool, dtypes.int8)
    assert not can_lossless_cast(dtypes.weakint, dtypes.int64)


@pytest.mark.parametrize("a", INT_DTYPES + FLOAT_DTYPES)
@pytest.mark.parametrize("b", INT_DTYPES + FLOAT_DTYPES)
def test_can_lossless_cast_against_numpy(a: DType, b: DType) -> None:
    # numpy's can_cast "safe" agrees except that numpy lets int64/uint64 into float64 (lossy) and calls int->float16
    # for int8/uint8 safe (exact: 11 bits of mantissa)
    want = np.can_cast(NP[a], NP[b], "safe")
    if dtypes.is_int(a) and dtypes.is_float(b):
        want = 8 * a.itemsize - (0 if dtypes.is_unsigned(a) else 1) <= dtypes.finfo(b)[1] + 1
    assert can_lossless_cast(a, b) == want, (a, b)


def test_dtype_pickle_and_identity() -> None:
    for d in [dtypes.int32, dtypes.float32.vec(4), dtypes.float16.ptr(16), dtypes.weakint]:
        assert pickle.loads(pickle.dumps(d)) is d
    assert dtypes.float32.vec(4) is dtypes.float32.vec(4)


# ---------------- property 3: const folding equals numpy ----------------
INT_OPS = [Ops.ADD, Ops.SUB, Ops.MUL, Ops.CDIV, Ops.CMOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR,
           Ops.XOR, Ops.SHL, Ops.SHR, Ops.NEG]  # fmt: skip
FLOAT_OPS = [Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.NEG, Ops.SQRT,
             Ops.RECIPROCAL, Ops.TRUNC]  # fmt: skip


def _np_alu(op: Ops, a: np.generic, b: np.generic) -> object:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        if op is Ops.ADD:
            return a + b
        if op is Ops.SUB:
            return a - b
        if op is Ops.MUL:
            return a * b
        if op is Ops.FDIV:
            return np.divide(a, b)
        if op is Ops.CDIV:  # C truncating division, from numpy's floor division
            q = np.floor_divide(a, b)
            return q + (1 if (np.remainder(a, b) != 0 and (a < 0) != (b < 0)) else 0) * np.ones_like(q)
        if op is Ops.CMOD:
            return np.fmod(a, b)
        if op is Ops.MAX:
            return np.maximum(a, b)
        if op is Ops.CMPLT:
            return a < b
        if op is Ops.CMPNE:
            return a != b
        if op is Ops.CMPEQ:
            return a == b
        if op is Ops.AND:
            return a & b
        if op is Ops.OR:
            return a | b
        if op is Ops.XOR:
            return a ^ b
        if op is Ops.SHL:
            return np.left_shift(a, b)
        if op is Ops.SHR:
            return np.right_shift(a, b)
        if op is Ops.NEG:
            return np.negative(a)
        if op is Ops.SQRT:
            return np.sqrt(a)
        if op is Ops.RECIPROCAL:
            return np.reciprocal(a)
        if op is Ops.TRUNC:
            return np.trunc(a)
    raise AssertionError(op)


def _same(x: object, y: object) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    return x == y


@st.composite
def int_case(draw: st.DrawFn) -> tuple[Ops, DType, int, int]:
    dt = draw(st.sampled_from(INT_DTYPES))
    op = draw(st.sampled_from(INT_OPS))
    lo, hi = int(dtypes.min(dt)), int(dtypes.max(dt))
    val = st.integers(lo, hi) | st.sampled_from([lo, hi, 0, 1, -1 if lo < 0 else 2])
    a, b = draw(val), draw(val)
    if op in (Ops.CDIV, Ops.CMOD) and b == 0:
        b = 3
    if op in (Ops.SHL, Ops.SHR):
        b = draw(st.integers(0, 8 * dt.itemsize - 1))
    return op, dt, a, b


@given(int_case())
def test_int_const_folding_equals_numpy(case: tuple[Ops, DType, int, int]) -> None:
    op, dt, a, b = case
    na, nb = NP[dt].type(a), NP[dt].type(b)
    srcs = (UOp.const(dt, a),) if op is Ops.NEG else (UOp.const(dt, a), UOp.const(dt, b))
    out_dt = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else dt
    folded = UOp(op, out_dt, srcs).simplify()
    assert folded.op is Ops.CONST, folded
    want = _np_alu(op, na, nb)
    want_py = bool(want) if out_dt is dtypes.bool else int(NP[dt].type(want))  # type: ignore[call-overload]
    assert folded.arg == want_py, (op, dt, a, b, folded.arg, want_py)


@st.composite
def float_case(draw: st.DrawFn) -> tuple[Ops, DType, float, float]:
    dt = draw(st.sampled_from(FLOAT_DTYPES))
    op = draw(st.sampled_from(FLOAT_OPS))
    width = {dtypes.float16: 16, dtypes.float32: 32, dtypes.float64: 64}[dt]
    val = st.floats(width=width, allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 1.0, -1.5])  # type: ignore[arg-type]
    return op, dt, draw(val), draw(val)


@given(float_case())
def test_float_const_folding_equals_numpy(case: tuple[Ops, DType, float, float]) -> None:
    op, dt, a, b = case
    na, nb = NP[dt].type(a), NP[dt].type(b)
    unary = op in (Ops.NEG, Ops.SQRT, Ops.RECIPROCAL, Ops.TRUNC)
    srcs = (UOp.const(dt, a),) if unary else (UOp.const(dt, a), UOp.const(dt, b))
    out_dt = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else dt
    folded = UOp(op, out_dt, srcs).simplify()
    assert folded.op is Ops.CONST, folded
    want = _np_alu(op, na, nb)
    want_py = bool(want) if out_dt is dtypes.bool else float(NP[dt].type(want))  # type: ignore[arg-type]
    assert _same(folded.arg, want_py), (op, dt, a, b, folded.arg, want_py)


@given(st.sampled_from(INT_DTYPES + FLOAT_DTYPES), st.sampled_from(INT_DTYPES + FLOAT_DTYPES), st.data())
def test_cast_folding_equals_numpy(src: DType, dst: DType, data: st.DataObject) -> None:
    if dtypes.is_float(src):
        v = data.draw(st.floats(-1e4, 1e4, width=32))  # in range of every destination (float->int is UB outside)
        if dtypes.is_unsigned(dst):
            v = abs(v)
        if dst.itemsize == 1:
            v = math.fmod(v, 100.0)
    else:
        v = data.draw(st.integers(int(dtypes.min(src)), int(dtypes.max(src))))
    c = UOp.const(src, v).cast(dst).simplify()
    assert c.op is Ops.CONST
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        want = NP[src].type(UOp.const(src, v).arg).astype(NP[dst])
    want_py = float(want) if dtypes.is_float(dst) else int(want)
    assert _same(c.arg, want_py), (src, dst, v, c.arg, want_py)


@pytest.mark.parametrize("dt", [d for d in dtypes.all if d not in dtypes.fp8s] + [dtypes.bool])
def test_dtype_min_max_attributes_are_the_range_numpy_gives(dt: DType) -> None:
    """`dt.min`/`dt.max` (attributes, as tinygrad code reads them) agree with numpy's range of the same type."""
    if dt == dtypes.bool:
        assert (dt.min, dt.max) == (False, True)
        return
    if dtypes.is_float(dt):
        assert (dt.min, dt.max) == (-math.inf, math.inf)
        return
    info = np.iinfo(np.dtype(dt.fmt))
    assert (dt.min, dt.max) == (int(info.min), int(info.max)) == (dtypes.min(dt), dtypes.max(dt))


@pytest.mark.parametrize("count", [-1, 0, 2**40, MAX_VEC_COUNT + 1])
@pytest.mark.parametrize("of", [dtypes.float, dtypes.int8, dtypes.float.ptr()], ids=["float", "int8", "ptr"])
def test_vec_of_a_lane_count_below_1_or_absurd_is_a_uop_value_error(of: DType, count: int) -> None:
    with pytest.raises(UOpValueError, match="lane count must be between 1 and"):
        of.vec(count)


@pytest.mark.parametrize("count", ["a", 2.0, True, None, [4]])
@pytest.mark.parametrize("of", [dtypes.float, dtypes.float.ptr()], ids=["float", "ptr"])
def test_vec_of_a_lane_count_that_is_no_int_is_a_uop_type_error(of: DType, count: object) -> None:
    with pytest.raises(UOpTypeError, match="lane count must be an int"):
        of.vec(count)  # type: ignore[arg-type]


@given(st.integers(1, 64))
def test_vec_takes_any_lane_count_in_range_and_integer_likes(n: int) -> None:
    v = dtypes.float.vec(n)
    assert v.count == n and v.scalar() == dtypes.float and dtypes.float.vec(np.int64(n)) is v  # type: ignore[arg-type]
    assert dtypes.float.vec(MAX_VEC_COUNT).count == MAX_VEC_COUNT


@pytest.mark.parametrize(("size", "space", "err"), [(-2, AddrSpace.GLOBAL, UOpValueError), ("a", AddrSpace.GLOBAL,
                         UOpTypeError), (2.0, AddrSpace.GLOBAL, UOpTypeError), (True, AddrSpace.GLOBAL, UOpTypeError),
                         (4, "GLOBAL", UOpTypeError)])  # fmt: skip
def test_ptr_of_a_bad_size_or_addrspace_is_a_uop_error(size: object, space: object, err: type[Exception]) -> None:
    with pytest.raises(err, match=r"\.ptr: "):
        dtypes.float.ptr(size, space)  # type: ignore[arg-type]
    assert dtypes.float.ptr(np.int64(4)) is dtypes.float.ptr(4)  # type: ignore[arg-type]
    assert dtypes.float.ptr(0).size == 0 and dtypes.float.ptr().size == -1
