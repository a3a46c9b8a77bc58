"""Polynomial approximations of EXP2, LOG2 and SIN (and POW built on them) for renderers that lack the ops.

Built only from ADD/SUB/MUL/FDIV/MAX/TRUNC/WHERE/CMPLT/CMPNE, integer AND/SHL/SHR and BITCAST/CAST, on scalar or
vector float32/float64 values. Accuracy (max error in units in the last place against a float64/longer reference,
measured by tests/codegen/test_decompositions.py over the stated ranges, specials exact):

  exp2   float32: <= 2 ulp for all x (overflow to inf above 128, 0 below -150, subnormal results within 2 ulp of
                  the subnormal grid); float64: <= 2 ulp.
         Method: x = n + f with |f| <= 1/2, 2**f by its Taylor polynomial (degree 7 / 13), times 2**n assembled
         from exponent bits in two halves (so subnormal and near-overflow scales stay representable).
  log2   float32: <= 3 ulp for x > 0 (subnormals included); float64: <= 3 ulp. log2(0) = -inf, log2(x<0) = NaN,
         log2(inf) = inf. Method: x = m * 2**e with m in [sqrt(1/2), sqrt(2)), log2(m) = 2/ln2 * atanh((m-1)/(m+1))
         by its odd series (to t**11 / t**23).
  sin    float32: <= 1 ulp for |x| <= 6e6 (argument reduced in float64); float64: <= 2 ulp for |x| <= 6e6 (three-part
         Cody-Waite reduction by pi/2; accuracy degrades gradually beyond). sin(inf) = sin(NaN) = NaN.
  pow    exp2(y * log2(|x|)) with the C sign rules (negative base: odd integer y gives a negative result, non-integer
         y NaN; pow(x, 0) = 1; pow(0, y<0) = inf). Error grows with |y * log2(x)|: relative error <= ~|y log2 x| *
         2**-23 (float32).
"""

from __future__ import annotations

import math

from speck.uop import DType, UOp, dtypes


def _c(x: UOp, v: float) -> UOp:
    return UOp.const(x.dtype, v)


def _poly(x: UOp, coeffs: list[float]) -> UOp:
    """Horner evaluation, coefficients from the highest degree down."""
    out = _c(x, coeffs[0])
    for c in coeffs[1:]:
        out = out * x + _c(x, c)
    return out


def _round_half_away(x: UOp) -> UOp:
    half = _c(x, 0.5)
    return (x < _c(x, 0.0)).where((x - half).trunc(), (x + half).trunc())


def _int_dt(dt: DType) -> DType:
    base = dtypes.int64 if dt.scalar() == dtypes.float64 else dtypes.int32
    return base.vec(dt.count)


def _fmt(dt: DType) -> tuple[int, int]:
    """(mantissa bits, exponent bias) of float32/float64."""
    return (52, 1023) if dt.scalar() == dtypes.float64 else (23, 127)


def _pow2i(n: UOp, dt: DType) -> UOp:
    """2**n for an integer-valued float n within the normal exponent range, built from exponent bits."""
    mbits, bias = _fmt(dt)
    it = _int_dt(dt)
    e = n.cast(it) + UOp.const(it, bias)
    return (e << UOp.const(it, mbits)).bitcast(dt)


def exp2(x: UOp) -> UOp:
    """2**x (see the module docstring for the accuracy)."""
    dt = x.dtype
    f64 = dt.scalar() == dtypes.float64
    hi, lo = (1024.0, -1080.0) if f64 else (128.0, -150.0)
    xc = x.maximum(_c(x, lo - 2)) * _c(x, -1.0)
    xc = (xc.maximum(_c(x, -(hi + 2)))) * _c(x, -1.0)  # clamp to [lo-2, hi+2] so the scale stays finite
    n = _round_half_away(xc)
    f = xc - n
    ln2 = math.log(2)
    deg = 13 if f64 else 7
    coeffs = [ln2**k / math.factorial(k) for k in range(deg, -1, -1)]
    p = _poly(f, coeffs)
    h = (n * _c(x, 0.5)).trunc()
    r = p * _pow2i(h, dt) * _pow2i(n - h, dt)
    r = (x < _c(x, hi)).where(r, _c(x, math.inf))
    r = (x < _c(x, lo)).where(_c(x, 0.0), r)
    return x.ne(x).where(x, r)


def log2(x: UOp) -> UOp:
    """log2(x) (see the module docstring for the accuracy)."""
    dt = x.dtype
    f64 = dt.scalar() == dtypes.float64
    mbits, bias = _fmt(dt)
    it = _int_dt(dt)
    tiny = 2.0 ** (-1022 if f64 else -126)
    sub = x < _c(x, tiny)
    xs = sub.where(x * _c(x, 2.0**64), x)
    bits = xs.bitcast(it)
    e = ((bits >> UOp.const(it, mbits)) & UOp.const(it, (1 << (63 - mbits if f64 else 8)) - 1)) - UOp.const(it, bias)
    mant_mask = (1 << mbits) - 1
    m = ((bits & UOp.const(it, mant_mask)) | UOp.const(it, bias << mbits)).bitcast(dt)
    big = _c(x, math.sqrt(2.0)) < m
    m = big.where(m * _c(x, 0.5), m)
    ef = e.cast(dt) + big.where(_c(x, 1.0), _c(x, 0.0)) - sub.where(_c(x, 64.0), _c(x, 0.0))
    t = (m - _c(x, 1.0)) / (m + _c(x, 1.0))
    t2 = t * t
    nterms = 12 if f64 else 6
    series = [1.0 / (2 * k + 1) for k in range(nterms - 1, -1, -1)]
    r = ef + t * _poly(t2, series) * _c(x, 2.0 / math.log(2))
    r = (x < _c(x, 0.0)).where(_c(x, math.nan), r)
    r = x.eq(_c(x, 0.0)).where(_c(x, -math.inf), r)
    r = x.eq(_c(x, math.inf)).where(x, r)
    return x.ne(x).where(x, r)


def _split_pio2() -> tuple[float, float, float]:
    """pi/2 as c1 + c2 + c3 (from 60 exact digits), c1 and c2 with 28 significant bits so k*c1 and k*c2 are exact
    for |k| < 2**24: the Cody-Waite reduction x - k*pi/2 then loses nothing for |x| up to ~1e7."""
    from fractions import Fraction

    pio2 = Fraction("1.570796326794896619231321691639751442098584699687552910487472")
    parts: list[float] = []
    rest = pio2
    for _ in range(2):
        m, e = math.frexp(float(rest))
        c = math.ldexp(math.floor(m * 2**28) / 2**28, e)
        parts.append(c)
        rest -= Fraction(c)
    parts.append(float(rest))
    return parts[0], parts[1], parts[2]


_PIO2_SPLIT = _split_pio2()


def sin(x: UOp) -> UOp:
    """sin(x) (see the module docstring for the accuracy); float32 inputs are reduced and evaluated in float64."""
    dt = x.dtype
    if dt.scalar() == dtypes.float32:
        return sin(x.cast(dtypes.float64.vec(dt.count))).cast(dt)
    k = _round_half_away(x * _c(x, 2.0 / math.pi))
    c1, c2, c3 = _PIO2_SPLIT
    r = ((x - k * _c(x, c1)) - k * _c(x, c2)) - k * _c(x, c3)
    r2 = r * r
    s = r + r * r2 * _poly(r2, [(-1) ** (j + 1) / math.factorial(2 * j + 3) for j in range(6, -1, -1)])
    c = _c(x, 1.0) + r2 * _poly(r2, [(-1) ** (j + 1) / math.factorial(2 * j + 2) for j in range(7, -1, -1)])
    it = _int_dt(dt)
    q = k.cast(it) & UOp.const(it, 3)
    odd = (q & UOp.const(it, 1)).ne(UOp.const(it, 0))
    neg = (q & UOp.const(it, 2)).ne(UOp.const(it, 0))
    v = odd.where(c, s)
    v = neg.where(v * _c(x, -1.0), v)
    bad = x.ne(x) | x.eq(_c(x, math.inf)) | x.eq(_c(x, -math.inf))
    return bad.where(_c(x, math.nan), v)


def pow_via_exp2(x: UOp, y: UOp) -> UOp:
    """x**y for floats through EXP2/LOG2 (which are decomposed in turn when the renderer lacks them)."""
    zero, one = _c(x, 0.0), _c(x, 1.0)
    r = (y * x.maximum(x * _c(x, -1.0)).log2()).exp2()
    yint = y.trunc().eq(y)
    yodd = yint & (y * _c(x, 0.5)).trunc().ne(y * _c(x, 0.5))
    negb = x < zero
    r = (negb & yodd).where(r * _c(x, -1.0), r)
    r = (negb & yint.logical_not()).where(_c(x, math.nan), r)
    r = x.eq(zero).where((y < zero).where(_c(x, math.inf), (zero < y).where(zero, one)), r)
    return y.eq(zero).where(one, r)
