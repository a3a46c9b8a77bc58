"""Floating-point helpers with the RDNA3 ISA's rules, on numpy arrays of lanes.

- Basic arithmetic is IEEE round-to-nearest-even (numpy's float32/float16/float64 ops are correctly rounded; float16
  goes through float32, which is exact enough for +, -, *, / and sqrt since 24 >= 2*11 + 2).
- Fused multiply-add is computed exactly: the product of two float32 (or float16) values is exact in float64, the sum
  is rounded to odd in float64 (TwoSum error term), and the final rounding to float32/float16 is then correct.
- NaNs: an arithmetic result takes the first NaN operand (src0, src1, src2 order), quieted (the ISA: "NaN + NaN =
  SRC0's NaN, converted to QNaN"); an invalid operation yields the ISA's default NaN 0xffc00000 (0xfe00 for f16,
  0xfff8000000000000 for f64), which is also what the ISA's examples show (e.g. V_LOG_F32(-1.0) => 0xffc00000).
- Denormals follow the MODE register's FP_DENORM fields (0 flush in+out, 1 flush out, 2 flush in, 3 keep both); the
  transcendental ops flush regardless, as the ISA notes say ("1ULP accuracy, denormals are flushed").
- Transcendentals (exp, log, rcp, rsq, sqrt, sin, cos) are evaluated in float64 and rounded once: within the ISA's
  documented 1 ULP (0.51 ULP for f16); sin/cos reduce the argument exactly in revolutions, so quarter turns are exact
  (the ISA's examples: V_SIN_F32(0.25) = 1.0, V_COS_F32(0.25) = +0.0).
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np

DType = np.dtype[Any]
F16: DType = np.dtype(np.float16)
F32: DType = np.dtype(np.float32)
F64: DType = np.dtype(np.float64)
U16: DType = np.dtype(np.uint16)
U32: DType = np.dtype(np.uint32)
U64: DType = np.dtype(np.uint64)
BITS: dict[DType, DType] = {F16: U16, F32: U32, F64: U64}
QUIET: dict[DType, Any] = {F16: np.uint16(0x0200), F32: np.uint32(0x00400000), F64: np.uint64(1 << 51)}
DEFAULT_NAN: dict[DType, Any] = {F16: np.uint16(0xFE00), F32: np.uint32(0xFFC00000), F64: np.uint64(0xFFF8000000000000)}
SIGN: dict[DType, Any] = {F16: np.uint16(0x8000), F32: np.uint32(0x80000000), F64: np.uint64(1 << 63)}
TINY: dict[DType, Any] = {F16: np.float16(2.0**-14), F32: np.float32(2.0**-126), F64: np.float64(2.0**-1022)}


_min = np.minimum.reduce


def quieted(x: np.ndarray) -> np.ndarray:
    """x with the quiet bit set on every NaN (other values unchanged)."""
    x = np.asarray(x)
    bits = x.view(BITS[x.dtype])
    return np.where(np.isnan(x), bits | QUIET[x.dtype], bits).view(x.dtype)


def nan_fix(res: np.ndarray, *srcs: np.ndarray) -> np.ndarray:
    """Give NaN results the ISA's NaN: the first NaN operand quieted, else the default NaN."""
    res = np.asarray(res)
    if not res.size or not np.isnan(_min(res, axis=None)):  # np.minimum propagates NaNs: one pass, no mask
        return res
    bad = np.isnan(res)
    dt = res.dtype
    out = np.broadcast_to(res.view(BITS[dt]), bad.shape).copy()
    todo = bad.copy()
    for s in srcs:
        s = np.broadcast_to(np.asarray(s, dtype=dt), bad.shape)
        hit = todo & np.isnan(s)
        out[hit] = s.view(BITS[dt])[hit] | QUIET[dt]
        todo &= ~hit
    out[todo] = DEFAULT_NAN[dt]
    return out.view(dt)


def flush(x: np.ndarray) -> np.ndarray:
    """Denormals replaced by a zero of the same sign."""
    x = np.asarray(x)
    tiny = (np.abs(x) < TINY[x.dtype]) & (x != 0)
    if not tiny.any():
        return x
    return np.where(tiny, (x.view(BITS[x.dtype]) & SIGN[x.dtype]).view(x.dtype), x)


def round_to_odd_f64(p: np.ndarray, c: np.ndarray) -> Any:
    """p + c (float64) rounded to odd: then one more rounding to a format of <= 51 bits is correctly rounded."""
    s = p + c
    t = s - p
    err = (p - (s - t)) + (c - t)  # TwoSum: s + err == p + c exactly (for finite s)
    fix = (err != 0) & np.isfinite(s) & np.isfinite(err) & ((s.view(U64) & np.uint64(1)) == 0)
    if fix.any():
        s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s


def fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Fused a*b+c rounded once (float16, float32 or float64 operands, all the same dtype)."""
    dt = np.result_type(a, b, c)
    if dt == F64:
        return _fma64(np.asarray(a, F64), np.asarray(b, F64), np.asarray(c, F64))
    p = np.asarray(a, F64) * np.asarray(b, F64)  # exact: 24+24 bits fit in 53
    c64 = np.asarray(c, F64)
    s = p + c64
    # Rounding s (already rounded once) to dt can only go wrong where s sits exactly on a midpoint of dt (or is so
    # small that dt's rounding point moves into the denormal range): only those lanes need the round-to-odd sum.
    drop = {F32: 29, F16: 42}[dt]
    low = s.view(U64) & np.uint64((1 << drop) - 1)
    risky = (low == np.uint64(1 << (drop - 1))) | (np.abs(s) < TINY[dt] * 4)
    if risky.any():
        s = np.where(risky, round_to_odd_f64(p, c64), s)
    return nan_fix(s.astype(dt), a, b, c)


def _fma64(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float64 fma: exact rational arithmetic per lane (float(Fraction) rounds correctly), numpy for the lanes with
    an infinity, a NaN or a zero product (where the plain expression is already exact)."""
    a, b, c = np.broadcast_arrays(a, b, c)
    with np.errstate(all="ignore"):
        res = np.array(a * b + c, dtype=F64)
    exact = np.isfinite(a) & np.isfinite(b) & np.isfinite(c) & (a != 0) & (b != 0)
    for k in zip(*np.nonzero(exact)):
        value = Fraction(float(a[k])) * Fraction(float(b[k])) + Fraction(float(c[k]))
        try:
            res[k] = float(value) if value != 0 else 0.0  # an exact cancellation is +0 in round-to-nearest
        except OverflowError:
            res[k] = np.inf if value > 0 else -np.inf
    return nan_fix(res, a, b, c)


def arith(op: str) -> Callable[[Any, Any], Any]:
    """An IEEE binary op with the ISA's NaN results."""
    f = getattr(np, op)

    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # (IEEE exceptions are silenced once, by dispatch())
        return nan_fix(f(a, b), a, b)

    return run


def minmax(a: np.ndarray, b: np.ndarray, want_max: bool, ieee: bool) -> np.ndarray:
    """V_MIN/V_MAX: -0 < +0; in IEEE mode a signaling NaN input gives that NaN quieted, otherwise a NaN input
    yields the other operand."""
    a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
    dt = a.dtype
    lt = (a < b) | ((a == 0) & (b == 0) & np.signbit(a) & ~np.signbit(b))
    gt = (a > b) | ((a == 0) & (b == 0) & ~np.signbit(a) & np.signbit(b))
    res = np.where(gt if want_max else lt, a, b)
    na, nb = np.isnan(a), np.isnan(b)
    if not (na.any() or nb.any()):
        return res
    res = np.where(nb, a, np.where(na, b, res))
    if ieee:
        qbit = QUIET[dt]
        sa = na & ((a.view(BITS[dt]) & qbit) == 0)
        sb = nb & ((b.view(BITS[dt]) & qbit) == 0)
        res = np.where(sa, quieted(a), np.where(sb, quieted(b), res))
    return res


def _to(dt: np.dtype, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(x).astype(dt)


def transcendental(name: str, x: np.ndarray) -> np.ndarray:
    """exp2, log2, rcp, rsq, sqrt (flushing denormal inputs/outputs for float32, as the ISA notes say) and sin/cos of
    x revolutions; result in x's dtype."""
    x = np.asarray(x)
    dt = x.dtype
    flush32 = dt == F32 and name in ("exp", "log", "rcp", "rsq", "sqrt")
    xin = flush(x) if flush32 else x
    d = xin.astype(F64)
    with np.errstate(all="ignore"):
        if name == "exp":
            r = np.exp2(d)
        elif name == "log":
            r = np.log2(d)
            r = np.where(d == 0, -np.inf, r)
        elif name == "rcp":
            r = 1.0 / d
        elif name == "rsq":
            r = np.where(d == 0, np.copysign(np.inf, d), 1.0 / np.sqrt(d))
        elif name == "sqrt":
            r = np.sqrt(d)
        else:
            r = _sincos(d, name == "sin")
    out = _to(dt, r)
    if flush32:
        out = flush(out)
    return nan_fix(out, x)


def _sincos(d: np.ndarray, sine: bool) -> np.ndarray:
    """sin/cos of d revolutions with exact argument reduction: r = d - round(4d)/4 in [-1/8, 1/8]."""
    with np.errstate(invalid="ignore"):
        q = np.rint(4.0 * d)
        f = d - q / 4.0  # exact for float32/float16 inputs
        quad = np.where(np.isfinite(q), q, 0).astype(np.int64) & 3
        s, c = np.sin(2 * np.pi * f), np.cos(2 * np.pi * f)
        if sine:
            r = np.choose(quad, [s, c, -s, -c])
        else:
            r = np.choose(quad, [c, -s, -c, s])
        r = np.where(r == 0, 0.0, r)  # an exact zero is +0 (ISA: V_SIN_F32(-MAX_FLOAT) = +0) ...
        if sine:
            r = np.where(d == 0, d, r)  # ... except sin(-0) = -0
        return np.where(np.isfinite(d), r, np.nan)


def f32_to_f16_rtz(x: np.ndarray) -> np.ndarray:
    """float32 -> float16 rounding toward zero (V_CVT_PK_RTZ_F16_F32): overflow gives the largest finite half."""
    x = np.asarray(x, F32)
    h = _to(F16, x)
    away = np.isfinite(x) & (np.abs(h.astype(F32)) > np.abs(x))
    if away.any():
        h = np.where(away, np.nextafter(h, np.float16(0)), h)
    return nan_fix(h, x)


def bf16_to_f32(bits16: np.ndarray) -> np.ndarray:
    return (np.asarray(bits16).astype(U32) << np.uint32(16)).view(F32)


def f32_to_int(x: np.ndarray, lo: int, hi: int, dtype: np.typing.DTypeLike) -> np.ndarray:
    """Truncate toward zero, saturate to [lo, hi], NaN -> 0 (the ISA's float-to-integer conversions)."""
    d = np.asarray(x).astype(F64)
    with np.errstate(invalid="ignore"):
        t = np.clip(np.trunc(np.where(np.isnan(d), 0.0, d)), lo, hi)
    return t.astype(np.int64).astype(dtype)
