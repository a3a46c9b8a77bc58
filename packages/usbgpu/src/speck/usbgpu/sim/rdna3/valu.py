"""Vector ALU semantics and the VOP1, VOP2, VOP3, VOPC, VOP3P and VOPD opcode tables (RDNA3 ISA chapter 16.7-16.12).

A VOp names the mnemonic, the destination and source operand types (which decide register width, which half of a
register a 16-bit operand lives in, how inline constants read, and whether VOP3's abs/neg apply) and the semantics:
fn(w, *sources) over whole (n, 32) lane arrays, returning the destination value in the destination's type. `kind`
says how the executor wires the instruction (see decode.py): "plain", "mac" (the destination is also the addend),
"cmp"/"cmpx" (a lane mask result), "carry" (a second, lane-mask result), "carry_in" (reads a lane mask too),
"cndmask", "div_fmas", "lane" (cross-lane reads/writes), "sat" (integer results that VOP3's clamp saturates),
"dot_iu" (an integer dot product whose NEG bits say which sources are signed).
`fn=None`: known by name, not implemented (EmulationError when executed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from speck.usbgpu.sim.rdna3 import floats as fl
from speck.usbgpu.sim.rdna3.wave import LANE_IDS, Waves

F16, F32, F64 = fl.F16, fl.F32, fl.F64
U32, I32, U64, I64, U16, I16 = np.uint32, np.int32, np.uint64, np.int64, np.uint16, np.int16


@dataclass(frozen=True)
class VOp:
    name: str
    dst: str | None
    srcs: tuple[str, ...]
    fn: Callable[..., Any] | None
    kind: str = "plain"
    float_mode: bool = True  # denormal flushing per MODE applies to float operands and results
    wrap: Callable[..., Any] | None = None  # "sat" ops: the same result without clamp, in the operand type (faster)


def _op(name: str, dst: str | None, srcs: str, fn: Callable[..., Any] | None, kind: str = "plain", **kw: Any) -> VOp:
    return VOp(name, dst, tuple(srcs.split()) if srcs else (), fn, kind, **kw)


# ---------------------------------------------------------------- helpers
def _arith(op: str) -> Callable[..., Any]:
    f, nan_fix = getattr(np, op), fl.nan_fix  # fl.arith without its errstate (dispatch() silences IEEE flags)
    return lambda w, a, b: nan_fix(f(a, b), a, b)


def _minmax(want_max: bool) -> Callable[..., Any]:
    return lambda w, a, b: fl.minmax(a, b, want_max, w.mode.ieee)


def _minmax3(first_max: bool, second_max: bool) -> Callable[..., Any]:
    return lambda w, a, b, c: fl.minmax(fl.minmax(a, b, first_max, w.mode.ieee), c, second_max, w.mode.ieee)


def _med3_f(w: Waves, a: Any, b: Any, c: Any) -> Any:
    ieee = w.mode.ieee
    a, b, c = np.broadcast_arrays(a, b, c)
    mx = fl.minmax(fl.minmax(a, b, True, ieee), c, True, ieee)
    res = np.where(
        mx == a,
        fl.minmax(b, c, True, ieee),
        np.where(mx == b, fl.minmax(a, c, True, ieee), fl.minmax(a, b, True, ieee)),
    )
    nan = np.isnan(a) | np.isnan(b) | np.isnan(c)
    if nan.any():
        res = np.where(nan, fl.minmax(fl.minmax(a, b, False, ieee), c, False, ieee), res)
    return res


def _med3_i(w: Waves, a: Any, b: Any, c: Any) -> Any:
    return np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c))


def _sext24(x: Any) -> Any:
    return ((np.asarray(x).astype(U32) << U32(8)).view(I32) >> I32(8)).astype(I64)


def _u24(x: Any) -> Any:
    return (np.asarray(x).astype(U32) & U32(0xFFFFFF)).astype(U64)


def _shift_amount(x: Any, bits: int) -> Any:
    return np.asarray(x).astype(U32) & U32(bits - 1)


# (copy=False: operands already of the type are used in place; every result is a new array)
def _lshl(bits: int, ut: type) -> Callable[..., Any]:
    return lambda w, s, v: (np.asarray(v).astype(ut, copy=False) << _shift_amount(s, bits).astype(ut)).astype(
        ut, copy=False
    )


def _lshr(bits: int, ut: type) -> Callable[..., Any]:
    return lambda w, s, v: (np.asarray(v).astype(ut, copy=False) >> _shift_amount(s, bits).astype(ut)).astype(
        ut, copy=False
    )


def _ashr(bits: int, it: type) -> Callable[..., Any]:
    return lambda w, s, v: (np.asarray(v).astype(it, copy=False) >> _shift_amount(s, bits).astype(it)).astype(
        it, copy=False
    )


def _wide(x: Any) -> Any:
    return np.asarray(x).astype(I64)


def _add3(w: Waves, a: Any, b: Any, c: Any) -> Any:
    return _wide(a) + _wide(b) + _wide(c)


def _wrap(op: str, dt: type) -> Callable[..., Any]:
    """Integer add/sub of all sources modulo 2**bits in `dt` (what a "sat" op computes without clamp)."""

    def run(w: Waves, *xs: Any) -> Any:
        vals: list[Any] = [np.asarray(x, dt) for x in xs]
        a, rest = vals[0], vals[1:]
        if op == "r-":
            return rest[0] - a
        for b in rest:
            a = a + b if op == "+" else a - b
        return a

    return run


def _fma(w: Waves, a: Any, b: Any, c: Any) -> Any:
    return fl.fma(a, b, c)


def _trans(name: str) -> Callable[..., Any]:
    return lambda w, a: fl.transcendental(name, a)


def _rounding(kind: str) -> Callable[..., Any]:
    f = {"trunc": np.trunc, "ceil": np.ceil, "floor": np.floor, "rndne": np.rint}[kind]

    def run(w: Waves, a: Any) -> Any:
        return fl.nan_fix(f(a), a)

    return run


def _fract(w: Waves, a: Any) -> Any:
    a = np.asarray(a)
    below_one = np.nextafter(a.dtype.type(1), a.dtype.type(0))
    r = np.minimum(a - np.floor(a), below_one)  # the ISA clamps to the largest value below 1.0
    r = np.where(np.isinf(a), a.dtype.type(np.nan), r)
    return fl.nan_fix(r, a)


def _frexp_mant(w: Waves, a: Any) -> Any:
    a = np.asarray(a)
    m, _ = np.frexp(a)
    return np.where(np.isfinite(a), m.astype(a.dtype), a)


def _frexp_exp(w: Waves, a: Any) -> Any:
    a = np.asarray(a)
    _, e = np.frexp(np.where(np.isfinite(a), a, 0))
    return e.astype(I32)


def _ldexp(w: Waves, a: Any, e: Any) -> Any:
    a = np.asarray(a)
    e = np.clip(np.asarray(e).astype(I64), -2000, 2000)
    r = np.ldexp(a.astype(F64), e)  # exact in float64 for f32/f16 inputs; one rounding to the result type below
    return fl.nan_fix(r.astype(a.dtype), a)


def _cvt_int(lo: int, hi: int, dt: type, how: str = "trunc") -> Callable[..., Any]:
    def run(w: Waves, a: Any) -> Any:
        x = np.asarray(a).astype(F64)
        if how == "floor":
            x = np.floor(x)
        elif how == "nearest":
            x = np.floor(x + 0.5)
        return fl.f32_to_int(x, lo, hi, dt)

    return run


def _to_float(dt: np.dtype) -> Callable[..., Any]:
    return lambda w, a: np.asarray(a).astype(dt)


def _f_to_f(dt: np.dtype) -> Callable[..., Any]:
    def run(w: Waves, a: Any) -> Any:
        return fl.nan_fix(np.asarray(a).astype(dt), a)

    return run


def _ubyte(k: int) -> Callable[..., Any]:
    return lambda w, a: ((np.asarray(a).astype(U32) >> U32(8 * k)) & U32(0xFF)).astype(F32)


def _clz(w: Waves, a: Any) -> Any:
    x = np.asarray(a).astype(U64)
    top = np.floor(np.log2(np.where(x == 0, 1, x).astype(F64))).astype(I64)
    return np.where(x == 0, -1, 31 - top).astype(I32)


def _cls(w: Waves, a: Any) -> Any:
    """Leading bits equal to the sign bit, counted from bit 30 (-1 when all 32 bits are equal)."""
    x = np.asarray(a).astype(I32)
    return _clz(w, (x ^ (x >> I32(31))).view(U32))


def _ctz(w: Waves, a: Any) -> Any:
    x = np.asarray(a).astype(U64)
    low = x & (~x + U64(1))
    return np.where(x == 0, -1, np.log2(np.where(low == 0, 1, low).astype(F64)).astype(I64)).astype(I32)


def _bfrev(w: Waves, a: Any) -> Any:
    x = np.ascontiguousarray(np.broadcast_to(np.asarray(a, dtype=U32), (w.n, 32)))
    bits = np.unpackbits(x.view(np.uint8).reshape(w.n, 32, 4), axis=2, bitorder="little")[..., ::-1]
    return np.packbits(bits, axis=2, bitorder="little").reshape(w.n, 32, 4).view(U32)[..., 0]


def _bfe(signed: bool) -> Callable[..., Any]:
    def run(w: Waves, a: Any, off: Any, width: Any) -> Any:
        o = np.asarray(off).astype(U32) & U32(31)
        n = (np.asarray(width).astype(U32) & U32(31)).astype(U64)
        x = (np.asarray(a).astype(U32) >> o).astype(U64) & ((U64(1) << n) - U64(1))
        if signed:
            top = U64(1) << np.where(n == 0, U64(0), n - U64(1))
            x = np.where(n == 0, U64(0), (x ^ top) - top)
        return x.astype(U32)

    return run


def _popcount32(x: Any) -> Any:
    x = np.ascontiguousarray(np.asarray(x, dtype=U32))
    return np.unpackbits(x.view(np.uint8).reshape(*x.shape, 4), axis=-1).sum(axis=-1).astype(U32)


def _mbcnt(hi: bool) -> Callable[..., Any]:
    below = (U64(1) << LANE_IDS.astype(U64)) - U64(1)
    lo_mask = (below & U64(0xFFFFFFFF)).astype(U32)

    def run(w: Waves, a: Any, b: Any) -> Any:
        if hi:  # wave32: lanes 32-63 do not exist, so the high pass adds nothing
            return np.asarray(b).astype(U32)
        return (np.asarray(b).astype(U32) + _popcount32(np.asarray(a).astype(U32) & lo_mask)).astype(U32)

    return run


def _perm(w: Waves, a: Any, b: Any, sel: Any) -> Any:
    data = (np.asarray(a).astype(U64) << U64(32)) | np.asarray(b).astype(U64)
    sel = np.asarray(sel).astype(U32)
    out = np.zeros(np.broadcast(data, sel).shape, dtype=U32)
    for k in range(4):
        s = ((sel >> U32(8 * k)) & U32(0xFF)).astype(U64)
        byte = (data >> (np.minimum(s, U64(7)) * U64(8))) & U64(0xFF)
        for sel_value, src_byte in ((8, 1), (9, 3), (10, 5), (11, 7)):  # replicate a byte's sign bit
            byte = np.where(s == sel_value, ((data >> U64(8 * src_byte + 7)) & U64(1)) * U64(0xFF), byte)
        byte = np.where(s == 12, U64(0), np.where(s >= 13, U64(0xFF), byte))
        out |= byte.astype(U32) << U32(8 * k)
    return out


def _alignbit(w: Waves, a: Any, b: Any, c: Any) -> Any:
    x = (np.asarray(a).astype(U64) << U64(32)) | np.asarray(b).astype(U64)
    return (x >> (np.asarray(c).astype(U64) & U64(31))).astype(U32)


def _alignbyte(w: Waves, a: Any, b: Any, c: Any) -> Any:
    x = (np.asarray(a).astype(U64) << U64(32)) | np.asarray(b).astype(U64)
    return (x >> ((np.asarray(c).astype(U64) & U64(3)) * U64(8))).astype(U32)


def _div_fixup(w: Waves, q: Any, d: Any, n: Any) -> Any:
    """V_DIV_FIXUP_F32/F16/F64: the special cases of n/d on top of the macro's quotient q (RDNA3 ISA 16.12).

    Once the earlier cases have run, the reference's "exponent(S1) == 255 -> OVERFLOW" can never hold (S1 is finite
    there); the quotient's exponent is what signals an overflowed macro, so we test S0. UNDERFLOW is a signed zero
    (an exponent gap beyond the format's smallest denormal rounds to zero)."""
    q, d, n = np.broadcast_arrays(np.asarray(q), np.asarray(d), np.asarray(n))
    dt = q.dtype
    sign = np.signbit(d) ^ np.signbit(n)
    inf, zero = dt.type(np.inf), dt.type(0)
    res = np.where(sign, -np.abs(q), np.abs(q))
    if dt != F16 and _ordinary_fixup(q, d, n):  # no special case applies to any lane: the signed quotient
        return res.astype(dt)
    if dt != F16:
        max_exp = {F32: 255, F64: 2047}[dt]
        gap = {F32: -150, F64: -1075}[dt]
        res = np.where(_exponent(q) == max_exp, np.where(sign, -inf, inf), res)
        res = np.where(_exponent(n) - _exponent(d) < gap, np.where(sign, -zero, zero), res)
    res = np.where(np.isinf(d) | (n == 0), np.where(sign, -zero, zero), res)
    res = np.where((d == 0) | np.isinf(n), np.where(sign, -inf, inf), res)
    bad = ((d == 0) & (n == 0)) | (np.isinf(d) & np.isinf(n))
    res = np.where(bad, fl.DEFAULT_NAN[dt].view(dt), res)
    res = np.where(np.isnan(d), fl.quieted(d), res)
    return np.where(np.isnan(n), fl.quieted(n), res).astype(dt)


# per format: (exponent bias, "quotient underflows" exponent gap of V_DIV_FIXUP, "numerator tiny" of V_DIV_SCALE)
_BIAS = {F32: (127, -150, 23), F64: (1023, -1075, 53)}


def _ordinary_fixup(q: np.ndarray, d: np.ndarray, n: np.ndarray) -> bool:
    """No lane of V_DIV_FIXUP meets a special case: d and n normal (neither zero, denormal, infinite nor NaN), q
    finite, and the exponent gap above the underflow limit. Then every np.where of the general path keeps the
    signed quotient."""
    bias, gap, _ = _BIAS[q.dtype]
    ed, en = _exponent(d), _exponent(n)
    top = 2 * bias  # the largest finite exponent field
    return bool(((ed >= 1) & (ed <= top) & (en >= 1) & (en <= top) & (_exponent(q) <= top) & (en - ed >= gap)).all())


def _ordinary_scale(d: np.ndarray, n: np.ndarray) -> bool:
    """No lane of V_DIV_SCALE needs scaling: d normal with |d| < 2**(bias-1) (so 1/d is not tiny), n normal and
    finite above the "tiny numerator" exponent, and n/d within (2**-(bias-1), 2**gap). Each step's condition is then
    false (|n/d| > 2**(en-ed-1), and rounding to the format keeps it at or above the smallest normal)."""
    bias, _, tiny_exp = _BIAS[d.dtype]
    gap = _DIV_LIMITS[d.dtype][0]
    ed, en = _exponent(d), _exponent(n)
    diff = en - ed
    return bool(
        (
            (ed >= 1) & (ed <= 2 * bias - 2) & (en > tiny_exp) & (en <= 2 * bias) & (diff >= 2 - bias) & (diff < gap)
        ).all()
    )


def _exponent(x: np.ndarray) -> Any:
    """The biased exponent field."""
    bits = {F32: (23, 0xFF), F64: (52, 0x7FF), F16: (10, 0x1F)}[x.dtype]
    return ((x.view(fl.BITS[x.dtype]) >> fl.BITS[x.dtype].type(bits[0])) & fl.BITS[x.dtype].type(bits[1])).astype(I64)


# V_DIV_SCALE / V_DIV_FMAS per format: (exponent gap meaning "quotient near overflow", scale exponent, smallest
# normal, "numerator tiny" exponent)
_DIV_LIMITS = {F32: (96, 64, 2.0**-126, 23), F64: (768, 128, 2.0**-1022, 53)}


def _div_scale(w: Waves, s0: Any, d: Any, n: Any) -> tuple[Any, Any]:
    """V_DIV_SCALE_F32/F64 (S0 = the operand to scale, S1 = denominator, S2 = numerator): scale n/d away from
    denormal intermediates; VCC says the quotient needs post-scaling by V_DIV_FMAS.

    The reference's pseudo-code tests "1/S1 == DENORM.f64", which never holds for a float32 S1, and scales the huge-
    denominator case up; neither would let LLVM's division macro divide by values above 2**126 (V_RCP_F32 flushes a
    denormal reciprocal). We test the format's denormal range instead and scale such a denominator down: the choice
    that makes LLVM's macro correctly rounded (tests/usbgpu checks the macro against exact division)."""
    s0, d, n = np.broadcast_arrays(np.asarray(s0), np.asarray(d), np.asarray(n))
    dt = s0.dtype
    if _ordinary_scale(d, n):  # the common case: nothing to scale, VCC clear
        return s0.copy(), np.zeros(s0.shape, dtype=bool)
    gap, scale, tiny_f, tiny_exp = _DIV_LIMITS[dt]
    ed, en = _exponent(d), _exponent(n)
    tiny = np.float64(tiny_f)
    d64, n64 = d.astype(F64), n.astype(F64)
    with np.errstate(all="ignore"):
        rcp_tiny = np.abs(1.0 / d64) < tiny
        quot = np.abs((n / d).astype(F64))
    quot_tiny = (quot < tiny) & (quot != 0)
    d_tiny = (np.abs(d64) < tiny) & (d != 0)
    up = np.ldexp(s0, scale).astype(dt)
    down = np.ldexp(s0, -scale).astype(dt)
    bits = fl.BITS[dt]
    is_d, is_n = s0.view(bits) == d.view(bits), s0.view(bits) == n.view(bits)
    res = s0.copy()
    vcc = np.zeros(s0.shape, dtype=bool)
    done = (n64 == 0) | (d64 == 0)
    res = np.where(done, dt.type(np.nan), res)
    steps = [  # (condition, VCC, scaled value, which operand is scaled: None = whichever S0 is)
        (en - ed >= gap, True, up, is_d),  # quotient near overflow: scale the denominator up
        (d_tiny, False, up, None),  # denormal denominator: scale both
        (rcp_tiny & quot_tiny, True, down, is_d),  # huge denominator, tiny quotient: scale the denominator down
        (rcp_tiny, False, down, None),  # huge denominator: scale both down
        (quot_tiny, True, up, is_n),  # tiny quotient: scale the numerator up
        (en <= tiny_exp, False, up, None),  # tiny numerator: scale both
    ]
    for cond, sets_vcc, value, which in steps:
        hit = ~done & cond
        if sets_vcc:
            vcc |= hit
        res = np.where(hit & (True if which is None else which), value, res)
        done |= hit
    return res, vcc


def _div_fmas(w: Waves, a: Any, b: Any, c: Any, vcc: np.ndarray) -> Any:
    """V_DIV_FMAS_F32/F64: fma, and where VCC is set the quotient's post-scale folded in before the one rounding:
    up (2**64 for float32, 2**128 for float64) when the scaled quotient S2 is at least 1 (V_DIV_SCALE scaled the
    denominator up for a huge quotient), else down by the same factor (it scaled the numerator up, or the
    denominator down, for a tiny one). The reference writes a fixed 2**32 (2**64), which restores neither case."""
    a, b, c = np.broadcast_arrays(np.asarray(a), np.asarray(b), np.asarray(c))
    dt = a.dtype
    scale = _DIV_LIMITS[dt][1]
    if dt == F64:  # exact product and sum, then scale and round once (the scale is exact in the rational)
        res = fl.fma(a, b, c)
        where = np.nonzero(vcc & np.isfinite(res) & (res != 0))
        for k in zip(*where):
            value = Fraction(float(a[k])) * Fraction(float(b[k])) + Fraction(float(c[k]))
            value *= Fraction(2) ** (scale if abs(c[k]) >= 1 else -scale)
            try:
                res[k] = float(value)
            except OverflowError:
                res[k] = np.inf if value > 0 else -np.inf
        return res
    exact = fl.round_to_odd_f64(a.astype(F64) * b.astype(F64), c.astype(F64))
    if not vcc.any():  # no post-scale anywhere
        return fl.nan_fix(exact.astype(F32), a, b, c)
    shift = np.where(np.abs(c) >= 1, scale, -scale)
    scaled = np.where(vcc, np.ldexp(exact, np.where(vcc, shift, 0)), exact)
    return fl.nan_fix(scaled.astype(F32), a, b, c)


def _cvt_pk(f: Callable[[Any], Any]) -> Callable[..., Any]:
    def run(w: Waves, a: Any, b: Any) -> Any:
        lo = np.asarray(f(a)).view(U16).astype(U32)
        hi = np.asarray(f(b)).view(U16).astype(U32)
        return lo | (hi << U32(16))

    return run


def _f16_bits(x: Any) -> Any:
    return fl.nan_fix(np.asarray(x).astype(F16), x)


def _sat_int(lo: int, hi: int, dt: type) -> Callable[[Any], Any]:
    return lambda x: np.clip(np.asarray(x).astype(I64), lo, hi).astype(dt)


def _cndmask(w: Waves, a: Any, b: Any, mask: np.ndarray) -> Any:
    return np.where(mask, b, a)


def _add_co(w: Waves, a: Any, b: Any) -> tuple[Any, Any]:
    a, b = np.asarray(a, U32), np.asarray(b, U32)
    t = a + b  # wraps modulo 2**32: it carried out exactly when the sum came out below an addend
    return t, t < a


def _sub_co(w: Waves, a: Any, b: Any) -> tuple[Any, Any]:
    return (np.asarray(a).astype(U32) - np.asarray(b).astype(U32)).astype(U32), np.asarray(b) > np.asarray(a)


def _add_co_ci(w: Waves, a: Any, b: Any, cin: np.ndarray) -> tuple[Any, Any]:
    a, b = np.asarray(a, U32), np.asarray(b, U32)
    t = a + b + cin.astype(U32)  # modulo 2**32; with a carry-in, b + 1 in [1, 2**32] wraps iff t <= a
    return t, np.where(cin, t <= a, t < a)


def _sub_co_ci(w: Waves, a: Any, b: Any, cin: np.ndarray) -> tuple[Any, Any]:
    t = np.asarray(a).astype(U64) - np.asarray(b).astype(U64) - cin.astype(U64)
    return t.astype(U32), np.asarray(b).astype(U64) + cin.astype(U64) > np.asarray(a).astype(U64)


def _mad_u64(w: Waves, a: Any, b: Any, c: Any) -> tuple[Any, Any]:
    """V_MAD_U64_U32: a*b + c in 65 bits; D1 = bit 64 (the carry-out)."""
    p = np.asarray(a).astype(U64) * np.asarray(b).astype(U64)  # < 2**64, exact
    t = p + np.asarray(c).astype(U64)
    return t, t < p


def _mad_i64(w: Waves, a: Any, b: Any, c: Any) -> tuple[Any, Any]:
    """V_MAD_I64_I32: 65-bit signed a*b + c; D1 = bit 64 of the two's-complement sum (the carry-out)."""
    p = np.asarray(a).astype(I32).astype(I64) * np.asarray(b).astype(I32).astype(I64)  # fits in 63 bits
    c64 = np.asarray(c).astype(I64)
    t = (p.view(U64) + c64.view(U64)).astype(U64)
    # sign-extend both to 65 bits and add: bit 64 = sign(p) + sign(c) + carry of the low 64 bits (mod 2)
    carry = t < p.view(U64)
    bit64 = (p < 0).astype(np.int8) + (c64 < 0).astype(np.int8) + carry.astype(np.int8)
    return t, (bit64 & 1).astype(bool)


# ---------------------------------------------------------------- VOP2 (also VOP3 0x100 + op)
VOP2: dict[int, VOp] = {
    1: _op("v_cndmask_b32", "f32", "f32 f32", _cndmask, "cndmask", float_mode=False),
    2: _op("v_dot2acc_f32_f16", "f32", "b32 b32", lambda w, a, b, d: _dot2_f16(w, a, b, d), "mac", float_mode=False),
    3: _op("v_add_f32", "f32", "f32 f32", _arith("add")),
    4: _op("v_sub_f32", "f32", "f32 f32", _arith("subtract")),
    5: _op("v_subrev_f32", "f32", "f32 f32", lambda w, a, b: fl.arith("subtract")(b, a)),
    6: _op("v_fmac_dx9_zero_f32", "f32", "f32 f32", None, "mac"),
    7: _op("v_mul_dx9_zero_f32", "f32", "f32 f32", None),
    8: _op("v_mul_f32", "f32", "f32 f32", _arith("multiply")),
    9: _op("v_mul_i32_i24", "i32", "i32 i32", lambda w, a, b: (_sext24(a) * _sext24(b)).astype(I32)),
    10: _op("v_mul_hi_i32_i24", "i32", "i32 i32", lambda w, a, b: ((_sext24(a) * _sext24(b)) >> I64(32)).astype(I32)),
    11: _op("v_mul_u32_u24", "u32", "u32 u32", lambda w, a, b: (_u24(a) * _u24(b)).astype(U32)),
    12: _op("v_mul_hi_u32_u24", "u32", "u32 u32", lambda w, a, b: ((_u24(a) * _u24(b)) >> U64(32)).astype(U32)),
    15: _op("v_min_f32", "f32", "f32 f32", _minmax(False)),
    16: _op("v_max_f32", "f32", "f32 f32", _minmax(True)),
    17: _op("v_min_i32", "i32", "i32 i32", lambda w, a, b: np.minimum(a, b)),
    18: _op("v_max_i32", "i32", "i32 i32", lambda w, a, b: np.maximum(a, b)),
    19: _op("v_min_u32", "u32", "u32 u32", lambda w, a, b: np.minimum(a, b)),
    20: _op("v_max_u32", "u32", "u32 u32", lambda w, a, b: np.maximum(a, b)),
    24: _op("v_lshlrev_b32", "b32", "u32 b32", _lshl(32, U32)),
    25: _op("v_lshrrev_b32", "b32", "u32 b32", _lshr(32, U32)),
    26: _op("v_ashrrev_i32", "i32", "u32 i32", _ashr(32, I32)),
    27: _op("v_and_b32", "b32", "b32 b32", lambda w, a, b: a & b),
    28: _op("v_or_b32", "b32", "b32 b32", lambda w, a, b: a | b),
    29: _op("v_xor_b32", "b32", "b32 b32", lambda w, a, b: a ^ b),
    30: _op("v_xnor_b32", "b32", "b32 b32", lambda w, a, b: ~(a ^ b)),
    32: _op("v_add_co_ci_u32", "u32", "u32 u32", _add_co_ci, "carry_in"),
    33: _op("v_sub_co_ci_u32", "u32", "u32 u32", _sub_co_ci, "carry_in"),
    34: _op("v_subrev_co_ci_u32", "u32", "u32 u32", lambda w, a, b, c: _sub_co_ci(w, b, a, c), "carry_in"),
    37: _op("v_add_nc_u32", "u32", "u32 u32", lambda w, a, b: _wide(a) + _wide(b), "sat", wrap=_wrap("+", U32)),
    38: _op("v_sub_nc_u32", "u32", "u32 u32", lambda w, a, b: _wide(a) - _wide(b), "sat", wrap=_wrap("-", U32)),
    39: _op("v_subrev_nc_u32", "u32", "u32 u32", lambda w, a, b: _wide(b) - _wide(a), "sat", wrap=_wrap("r-", U32)),
    43: _op("v_fmac_f32", "f32", "f32 f32", _fma, "mac"),
    44: _op("v_fmamk_f32", "f32", "f32 f32 f32", _fma, "fmamk"),
    45: _op("v_fmaak_f32", "f32", "f32 f32 f32", _fma, "fmaak"),
    47: _op("v_cvt_pk_rtz_f16_f32", "b32", "f32 f32", _cvt_pk(fl.f32_to_f16_rtz)),
    50: _op("v_add_f16", "f16", "f16 f16", _arith("add")),
    51: _op("v_sub_f16", "f16", "f16 f16", _arith("subtract")),
    52: _op("v_subrev_f16", "f16", "f16 f16", lambda w, a, b: fl.arith("subtract")(b, a)),
    53: _op("v_mul_f16", "f16", "f16 f16", _arith("multiply")),
    54: _op("v_fmac_f16", "f16", "f16 f16", _fma, "mac"),
    55: _op("v_fmamk_f16", "f16", "f16 f16 f16", _fma, "fmamk"),
    56: _op("v_fmaak_f16", "f16", "f16 f16 f16", _fma, "fmaak"),
    57: _op("v_max_f16", "f16", "f16 f16", _minmax(True)),
    58: _op("v_min_f16", "f16", "f16 f16", _minmax(False)),
    59: _op("v_ldexp_f16", "f16", "f16 i16", _ldexp),
    60: _op("v_pk_fmac_f16", "b32", "b32 b32", None, "mac"),
}

# ---------------------------------------------------------------- VOP1 (also VOP3 0x180 + op)
VOP1: dict[int, VOp] = {
    0: _op("v_nop", None, "", lambda w: None),
    1: _op("v_mov_b32", "f32", "f32", lambda w, a: a, float_mode=False),
    2: _op("v_readfirstlane_b32", "b32", "b32", None, "lane"),
    3: _op("v_cvt_i32_f64", "i32", "f64", _cvt_int(-(2**31), 2**31 - 1, I32)),
    4: _op("v_cvt_f64_i32", "f64", "i32", _to_float(F64)),
    5: _op("v_cvt_f32_i32", "f32", "i32", _to_float(F32)),
    6: _op("v_cvt_f32_u32", "f32", "u32", _to_float(F32)),
    7: _op("v_cvt_u32_f32", "u32", "f32", _cvt_int(0, 2**32 - 1, U32)),
    8: _op("v_cvt_i32_f32", "i32", "f32", _cvt_int(-(2**31), 2**31 - 1, I32)),
    10: _op("v_cvt_f16_f32", "f16", "f32", _f_to_f(F16)),
    11: _op("v_cvt_f32_f16", "f32", "f16", _f_to_f(F32)),
    12: _op("v_cvt_nearest_i32_f32", "i32", "f32", _cvt_int(-(2**31), 2**31 - 1, I32, "nearest")),
    13: _op("v_cvt_floor_i32_f32", "i32", "f32", _cvt_int(-(2**31), 2**31 - 1, I32, "floor")),
    14: _op("v_cvt_off_f32_i4", "f32", "u32", None),
    15: _op("v_cvt_f32_f64", "f32", "f64", _f_to_f(F32)),
    16: _op("v_cvt_f64_f32", "f64", "f32", _f_to_f(F64)),
    17: _op("v_cvt_f32_ubyte0", "f32", "u32", _ubyte(0)),
    18: _op("v_cvt_f32_ubyte1", "f32", "u32", _ubyte(1)),
    19: _op("v_cvt_f32_ubyte2", "f32", "u32", _ubyte(2)),
    20: _op("v_cvt_f32_ubyte3", "f32", "u32", _ubyte(3)),
    21: _op("v_cvt_u32_f64", "u32", "f64", _cvt_int(0, 2**32 - 1, U32)),
    22: _op("v_cvt_f64_u32", "f64", "u32", _to_float(F64)),
    23: _op("v_trunc_f64", "f64", "f64", _rounding("trunc")),
    24: _op("v_ceil_f64", "f64", "f64", _rounding("ceil")),
    25: _op("v_rndne_f64", "f64", "f64", _rounding("rndne")),
    26: _op("v_floor_f64", "f64", "f64", _rounding("floor")),
    27: _op("v_pipeflush", None, "", lambda w: None),
    28: _op("v_mov_b16", "f16", "f16", lambda w, a: a, float_mode=False),
    32: _op("v_fract_f32", "f32", "f32", _fract),
    33: _op("v_trunc_f32", "f32", "f32", _rounding("trunc")),
    34: _op("v_ceil_f32", "f32", "f32", _rounding("ceil")),
    35: _op("v_rndne_f32", "f32", "f32", _rounding("rndne")),
    36: _op("v_floor_f32", "f32", "f32", _rounding("floor")),
    37: _op("v_exp_f32", "f32", "f32", _trans("exp"), "trans"),
    39: _op("v_log_f32", "f32", "f32", _trans("log"), "trans"),
    42: _op("v_rcp_f32", "f32", "f32", _trans("rcp"), "trans"),
    43: _op("v_rcp_iflag_f32", "f32", "f32", _trans("rcp"), "trans"),
    46: _op("v_rsq_f32", "f32", "f32", _trans("rsq"), "trans"),
    47: _op("v_rcp_f64", "f64", "f64", _trans("rcp"), "trans"),
    49: _op("v_rsq_f64", "f64", "f64", _trans("rsq"), "trans"),
    51: _op("v_sqrt_f32", "f32", "f32", _trans("sqrt"), "trans"),
    52: _op("v_sqrt_f64", "f64", "f64", _trans("sqrt"), "trans"),
    53: _op("v_sin_f32", "f32", "f32", _trans("sin"), "trans"),
    54: _op("v_cos_f32", "f32", "f32", _trans("cos"), "trans"),
    55: _op("v_not_b32", "b32", "b32", lambda w, a: ~a),
    56: _op("v_bfrev_b32", "b32", "b32", _bfrev),
    57: _op("v_clz_i32_u32", "i32", "u32", _clz),
    58: _op("v_ctz_i32_b32", "i32", "b32", _ctz),
    59: _op("v_cls_i32", "i32", "i32", _cls),
    60: _op("v_frexp_exp_i32_f64", "i32", "f64", _frexp_exp),
    61: _op("v_frexp_mant_f64", "f64", "f64", _frexp_mant),
    62: _op("v_fract_f64", "f64", "f64", _fract),
    63: _op("v_frexp_exp_i32_f32", "i32", "f32", _frexp_exp),
    64: _op("v_frexp_mant_f32", "f32", "f32", _frexp_mant),
    66: _op("v_movreld_b32", "b32", "b32", None, "lane"),
    67: _op("v_movrels_b32", "b32", "b32", None, "lane"),
    68: _op("v_movrelsd_b32", "b32", "b32", None, "lane"),
    72: _op("v_movrelsd_2_b32", "b32", "b32", None, "lane"),
    80: _op("v_cvt_f16_u16", "f16", "u16", _to_float(F16)),
    81: _op("v_cvt_f16_i16", "f16", "i16", _to_float(F16)),
    82: _op("v_cvt_u16_f16", "u16", "f16", _cvt_int(0, 2**16 - 1, U16)),
    83: _op("v_cvt_i16_f16", "i16", "f16", _cvt_int(-(2**15), 2**15 - 1, I16)),
    84: _op("v_rcp_f16", "f16", "f16", _trans("rcp"), "trans"),
    85: _op("v_sqrt_f16", "f16", "f16", _trans("sqrt"), "trans"),
    86: _op("v_rsq_f16", "f16", "f16", _trans("rsq"), "trans"),
    87: _op("v_log_f16", "f16", "f16", _trans("log"), "trans"),
    88: _op("v_exp_f16", "f16", "f16", _trans("exp"), "trans"),
    89: _op("v_frexp_mant_f16", "f16", "f16", _frexp_mant),
    90: _op("v_frexp_exp_i16_f16", "i16", "f16", lambda w, a: _frexp_exp(w, a).astype(I16)),
    91: _op("v_floor_f16", "f16", "f16", _rounding("floor")),
    92: _op("v_ceil_f16", "f16", "f16", _rounding("ceil")),
    93: _op("v_trunc_f16", "f16", "f16", _rounding("trunc")),
    94: _op("v_rndne_f16", "f16", "f16", _rounding("rndne")),
    95: _op("v_fract_f16", "f16", "f16", _fract),
    96: _op("v_sin_f16", "f16", "f16", _trans("sin"), "trans"),
    97: _op("v_cos_f16", "f16", "f16", _trans("cos"), "trans"),
    98: _op("v_sat_pk_u8_i16", "b16", "b32", None),
    99: _op("v_cvt_norm_i16_f16", "i16", "f16", None),
    100: _op("v_cvt_norm_u16_f16", "u16", "f16", None),
    101: _op("v_swap_b32", "b32", "b32", None, "lane"),
    103: _op("v_permlane64_b32", "b32", "b32", None, "lane"),
    104: _op("v_swaprel_b32", "b32", "b32", None, "lane"),
    105: _op("v_not_b16", "b16", "b16", lambda w, a: ~a),
    106: _op("v_cvt_i32_i16", "i32", "i16", lambda w, a: np.asarray(a).astype(I32)),
    107: _op("v_cvt_u32_u16", "u32", "u16", lambda w, a: np.asarray(a).astype(U32)),
}

# ---------------------------------------------------------------- VOP3-only opcodes
VOP3: dict[int, VOp] = {
    0x209: _op("v_fma_dx9_zero_f32", "f32", "f32 f32 f32", None),
    0x20A: _op("v_mad_i32_i24", "i32", "i32 i32 i32", lambda w, a, b, c: _sext24(a) * _sext24(b) + _wide(c), "sat"),
    0x20B: _op("v_mad_u32_u24", "u32", "u32 u32 u32", lambda w, a, b, c: _u24(a) * _u24(b) + _wide(c).astype(U64)),
    0x20C: _op("v_cubeid_f32", "f32", "f32 f32 f32", None),
    0x20D: _op("v_cubesc_f32", "f32", "f32 f32 f32", None),
    0x20E: _op("v_cubetc_f32", "f32", "f32 f32 f32", None),
    0x20F: _op("v_cubema_f32", "f32", "f32 f32 f32", None),
    0x210: _op("v_bfe_u32", "u32", "u32 u32 u32", _bfe(False)),
    0x211: _op("v_bfe_i32", "i32", "u32 u32 u32", _bfe(True)),
    0x212: _op("v_bfi_b32", "b32", "b32 b32 b32", lambda w, a, b, c: (a & b) | (~a & c)),
    0x213: _op("v_fma_f32", "f32", "f32 f32 f32", _fma),
    0x214: _op("v_fma_f64", "f64", "f64 f64 f64", _fma),
    0x215: _op("v_lerp_u8", "u32", "u32 u32 u32", None),
    0x216: _op("v_alignbit_b32", "b32", "b32 b32 u32", _alignbit),
    0x217: _op("v_alignbyte_b32", "b32", "b32 b32 u32", _alignbyte),
    0x218: _op("v_mullit_f32", "f32", "f32 f32 f32", None),
    0x222: _op("v_sad_u8", "u32", "u32 u32 u32", None),
    0x223: _op("v_sad_hi_u8", "u32", "u32 u32 u32", None),
    0x224: _op("v_sad_u16", "u32", "u32 u32 u32", None),
    0x225: _op("v_sad_u32", "u32", "u32 u32 u32", None),
    0x226: _op("v_cvt_pk_u8_f32", "b32", "f32 u32 u32", None),
    0x227: _op("v_div_fixup_f32", "f32", "f32 f32 f32", _div_fixup),
    0x228: _op("v_div_fixup_f64", "f64", "f64 f64 f64", _div_fixup),
    0x237: _op("v_div_fmas_f32", "f32", "f32 f32 f32", _div_fmas, "div_fmas"),
    0x238: _op("v_div_fmas_f64", "f64", "f64 f64 f64", _div_fmas, "div_fmas"),
    0x239: _op("v_msad_u8", "u32", "u32 u32 u32", None),
    0x23A: _op("v_qsad_pk_u16_u8", "b64", "b64 b32 b64", None),
    0x23B: _op("v_mqsad_pk_u16_u8", "b64", "b64 b32 b64", None),
    0x23D: _op("v_mqsad_u32_u8", "b64", "b64 b32 b64", None),
    0x240: _op("v_xor3_b32", "b32", "b32 b32 b32", lambda w, a, b, c: a ^ b ^ c),
    0x241: _op("v_mad_u16", "u16", "u16 u16 u16", lambda w, a, b, c: _wide(a) * _wide(b) + _wide(c), "sat"),
    0x244: _op("v_perm_b32", "b32", "b32 b32 b32", _perm),
    0x245: _op("v_xad_u32", "u32", "u32 u32 u32", lambda w, a, b, c: (a ^ b) + c),
    0x246: _op("v_lshl_add_u32", "u32", "u32 u32 u32", lambda w, a, b, c: (a << (b & U32(31))) + c),
    0x247: _op("v_add_lshl_u32", "u32", "u32 u32 u32", lambda w, a, b, c: (a + b) << (c & U32(31))),
    0x248: _op("v_fma_f16", "f16", "f16 f16 f16", _fma),
    0x253: _op("v_mad_i16", "i16", "i16 i16 i16", lambda w, a, b, c: _wide(a) * _wide(b) + _wide(c), "sat"),
    0x254: _op("v_div_fixup_f16", "f16", "f16 f16 f16", _div_fixup),
    0x255: _op("v_add3_u32", "u32", "u32 u32 u32", _add3, "sat", wrap=_wrap("+", U32)),
    0x256: _op("v_lshl_or_b32", "b32", "b32 u32 b32", lambda w, a, b, c: (a << (b & U32(31))) | c),
    0x257: _op("v_and_or_b32", "b32", "b32 b32 b32", lambda w, a, b, c: (a & b) | c),
    0x258: _op("v_or3_b32", "b32", "b32 b32 b32", lambda w, a, b, c: a | b | c),
    0x259: _op("v_mad_u32_u16", "u32", "u16 u16 u32", lambda w, a, b, c: _wide(a) * _wide(b) + _wide(c), "sat"),
    0x25A: _op("v_mad_i32_i16", "i32", "i16 i16 i32", lambda w, a, b, c: _wide(a) * _wide(b) + _wide(c), "sat"),
    0x25B: _op("v_permlane16_b32", "b32", "b32 b32 b32", None, "lane"),
    0x25C: _op("v_permlanex16_b32", "b32", "b32 b32 b32", None, "lane"),
    0x25D: _op("v_cndmask_b16", "f16", "f16 f16", _cndmask, "cndmask", float_mode=False),
    0x25E: _op("v_maxmin_f32", "f32", "f32 f32 f32", _minmax3(True, False)),
    0x25F: _op("v_minmax_f32", "f32", "f32 f32 f32", _minmax3(False, True)),
    0x260: _op("v_maxmin_f16", "f16", "f16 f16 f16", _minmax3(True, False)),
    0x261: _op("v_minmax_f16", "f16", "f16 f16 f16", _minmax3(False, True)),
    0x262: _op("v_maxmin_u32", "u32", "u32 u32 u32", lambda w, a, b, c: np.minimum(np.maximum(a, b), c)),
    0x263: _op("v_minmax_u32", "u32", "u32 u32 u32", lambda w, a, b, c: np.maximum(np.minimum(a, b), c)),
    0x264: _op("v_maxmin_i32", "i32", "i32 i32 i32", lambda w, a, b, c: np.minimum(np.maximum(a, b), c)),
    0x265: _op("v_minmax_i32", "i32", "i32 i32 i32", lambda w, a, b, c: np.maximum(np.minimum(a, b), c)),
    0x266: _op("v_dot2_f16_f16", "f16", "b32 b32 f16", None),
    0x267: _op("v_dot2_bf16_bf16", "b16", "b32 b32 b16", None),
    0x2FC: _op("v_div_scale_f32", "f32", "f32 f32 f32", _div_scale, "carry"),
    0x2FD: _op("v_div_scale_f64", "f64", "f64 f64 f64", _div_scale, "carry"),
    0x2FE: _op("v_mad_u64_u32", "u64", "u32 u32 u64", _mad_u64, "carry"),
    0x2FF: _op("v_mad_i64_i32", "i64", "i32 i32 i64", _mad_i64, "carry"),
    0x300: _op("v_add_co_u32", "u32", "u32 u32", _add_co, "carry"),
    0x301: _op("v_sub_co_u32", "u32", "u32 u32", _sub_co, "carry"),
    0x302: _op("v_subrev_co_u32", "u32", "u32 u32", lambda w, a, b: _sub_co(w, b, a), "carry"),
    0x303: _op("v_add_nc_u16", "u16", "u16 u16", lambda w, a, b: _wide(a) + _wide(b), "sat"),
    0x304: _op("v_sub_nc_u16", "u16", "u16 u16", lambda w, a, b: _wide(a) - _wide(b), "sat"),
    0x305: _op("v_mul_lo_u16", "u16", "u16 u16", lambda w, a, b: _wide(a) * _wide(b), "sat"),
    0x306: _op("v_cvt_pk_i16_f32", "b32", "f32 f32", _cvt_pk(lambda x: fl.f32_to_int(x, -(2**15), 2**15 - 1, I16))),
    0x307: _op("v_cvt_pk_u16_f32", "b32", "f32 f32", _cvt_pk(lambda x: fl.f32_to_int(x, 0, 2**16 - 1, U16))),
    0x309: _op("v_max_u16", "u16", "u16 u16", lambda w, a, b: np.maximum(a, b)),
    0x30A: _op("v_max_i16", "i16", "i16 i16", lambda w, a, b: np.maximum(a, b)),
    0x30B: _op("v_min_u16", "u16", "u16 u16", lambda w, a, b: np.minimum(a, b)),
    0x30C: _op("v_min_i16", "i16", "i16 i16", lambda w, a, b: np.minimum(a, b)),
    0x30D: _op("v_add_nc_i16", "i16", "i16 i16", lambda w, a, b: _wide(a) + _wide(b), "sat"),
    0x30E: _op("v_sub_nc_i16", "i16", "i16 i16", lambda w, a, b: _wide(a) - _wide(b), "sat"),
    0x311: _op("v_pack_b32_f16", "b32", "f16 f16", _cvt_pk(lambda x: x), float_mode=False),
    0x312: _op("v_cvt_pk_norm_i16_f16", "b32", "f16 f16", None),
    0x313: _op("v_cvt_pk_norm_u16_f16", "b32", "f16 f16", None),
    0x31C: _op("v_ldexp_f32", "f32", "f32 i32", _ldexp),
    0x31D: _op("v_bfm_b32", "b32", "u32 u32", lambda w, a, b: ((U32(1) << (a & U32(31))) - U32(1)) << (b & U32(31))),
    0x31E: _op("v_bcnt_u32_b32", "u32", "b32 u32", lambda w, a, b: _popcount32(a) + b),
    0x31F: _op("v_mbcnt_lo_u32_b32", "u32", "b32 u32", _mbcnt(False)),
    0x320: _op("v_mbcnt_hi_u32_b32", "u32", "b32 u32", _mbcnt(True)),
    0x321: _op("v_cvt_pknorm_i16_f32", "b32", "f32 f32", None),
    0x322: _op("v_cvt_pknorm_u16_f32", "b32", "f32 f32", None),
    0x323: _op("v_cvt_pk_u16_u32", "b32", "u32 u32", _cvt_pk(lambda x: np.minimum(x, U32(0xFFFF)).astype(U16))),
    0x324: _op("v_cvt_pk_i16_i32", "b32", "i32 i32", _cvt_pk(_sat_int(-(2**15), 2**15 - 1, I16))),
    0x325: _op("v_sub_nc_i32", "i32", "i32 i32", lambda w, a, b: _wide(a) - _wide(b), "sat", wrap=_wrap("-", I32)),
    0x326: _op("v_add_nc_i32", "i32", "i32 i32", lambda w, a, b: _wide(a) + _wide(b), "sat", wrap=_wrap("+", I32)),
    0x327: _op("v_add_f64", "f64", "f64 f64", _arith("add")),
    0x328: _op("v_mul_f64", "f64", "f64 f64", _arith("multiply")),
    0x329: _op("v_min_f64", "f64", "f64 f64", _minmax(False)),
    0x32A: _op("v_max_f64", "f64", "f64 f64", _minmax(True)),
    0x32B: _op("v_ldexp_f64", "f64", "f64 i32", _ldexp),
    0x32C: _op("v_mul_lo_u32", "u32", "u32 u32", lambda w, a, b: (np.asarray(a) * np.asarray(b)).astype(U32)),
    0x32D: _op(
        "v_mul_hi_u32", "u32", "u32 u32", lambda w, a, b: (_wide(a).astype(U64) * _wide(b).astype(U64)) >> U64(32)
    ),
    0x32E: _op("v_mul_hi_i32", "i32", "i32 i32", lambda w, a, b: (_wide(a) * _wide(b)) >> I64(32)),
    0x32F: _op("v_trig_preop_f64", "f64", "f64 u32", None),
    0x338: _op("v_lshlrev_b16", "b16", "u16 b16", _lshl(16, U16)),
    0x339: _op("v_lshrrev_b16", "b16", "u16 b16", _lshr(16, U16)),
    0x33A: _op("v_ashrrev_i16", "i16", "u16 i16", _ashr(16, I16)),
    0x33C: _op("v_lshlrev_b64", "b64", "u32 b64", _lshl(64, U64)),
    0x33D: _op("v_lshrrev_b64", "b64", "u32 b64", _lshr(64, U64)),
    0x33E: _op("v_ashrrev_i64", "i64", "u32 i64", _ashr(64, I64)),
    0x360: _op("v_readlane_b32", "b32", "b32 u32", None, "lane"),
    0x361: _op("v_writelane_b32", "b32", "b32 u32", None, "lane"),
    0x362: _op("v_and_b16", "b16", "b16 b16", lambda w, a, b: a & b),
    0x363: _op("v_or_b16", "b16", "b16 b16", lambda w, a, b: a | b),
    0x364: _op("v_xor_b16", "b16", "b16 b16", lambda w, a, b: a ^ b),
}

# three-input min/max/median: the same opcode layout for 32-bit (from 0x219) and 16-bit (from 0x249) operands
_THREE: list[tuple[str, Callable[..., Any], Callable[..., Any]]] = [
    ("min3", _minmax3(False, False), lambda w, a, b, c: np.minimum(np.minimum(a, b), c)),
    ("max3", _minmax3(True, True), lambda w, a, b, c: np.maximum(np.maximum(a, b), c)),
    ("med3", _med3_f, _med3_i),
]
for _first, _bits in ((0x219, 32), (0x249, 16)):
    for _k, (_nm, _ffn, _ifn) in enumerate(_THREE):
        for _j, _t in enumerate("fiu"):
            _ty = f"{_t}{_bits}"
            VOP3[_first + 3 * _k + _j] = _op(f"v_{_nm}_{_ty}", _ty, f"{_ty} {_ty} {_ty}", _ffn if _t == "f" else _ifn)

# ---------------------------------------------------------------- VOPC (also VOP3 0x000-0x0ff)
_FCMP: list[tuple[str, Callable[[Any, Any], Any]]] = [
    ("f", lambda a, b: np.zeros(np.broadcast(a, b).shape, bool)),
    ("lt", np.less),
    ("eq", np.equal),
    ("le", np.less_equal),
    ("gt", np.greater),
    ("lg", lambda a, b: np.less(a, b) | np.greater(a, b)),
    ("ge", np.greater_equal),
    ("o", lambda a, b: ~np.isnan(a) & ~np.isnan(b)),
    ("u", lambda a, b: np.isnan(a) | np.isnan(b)),
    ("nge", lambda a, b: ~np.greater_equal(a, b)),
    ("nlg", lambda a, b: ~(np.less(a, b) | np.greater(a, b))),
    ("ngt", lambda a, b: ~np.greater(a, b)),
    ("nle", lambda a, b: ~np.less_equal(a, b)),
    ("neq", lambda a, b: ~np.equal(a, b)),
    ("nlt", lambda a, b: ~np.less(a, b)),
    ("t", lambda a, b: np.ones(np.broadcast(a, b).shape, bool)),
]
_ICMP: list[tuple[str, Callable[[Any, Any], Any]]] = [
    ("f", _FCMP[0][1]),
    ("lt", np.less),
    ("eq", np.equal),
    ("le", np.less_equal),
    ("gt", np.greater),
    ("ne", np.not_equal),
    ("ge", np.greater_equal),
    ("t", _FCMP[15][1]),
]


def _class(w: Waves, a: Any, mask: Any) -> Any:
    """V_CMP_CLASS: bit k of the mask selects sNaN, qNaN, -inf, -normal, -denormal, -0, +0, +denormal, +normal,
    +inf (k = 0..9)."""
    a = np.asarray(a)
    m = np.asarray(mask).astype(U32)
    dt = a.dtype
    nan = np.isnan(a)
    quiet = (a.view(fl.BITS[dt]) & fl.QUIET[dt]) != 0
    neg = np.signbit(a)
    mag = np.abs(a)
    tiny = fl.TINY[dt]
    kinds = [
        nan & ~quiet,
        nan & quiet,
        np.isinf(a) & neg,
        neg & (mag >= tiny) & np.isfinite(a),
        neg & (mag < tiny) & (mag > 0),
        neg & (a == 0),
        ~neg & (a == 0),
        ~neg & (mag < tiny) & (mag > 0),
        ~neg & (mag >= tiny) & np.isfinite(a),
        np.isinf(a) & ~neg,
    ]
    out = np.zeros(np.broadcast(a, m).shape, dtype=bool)
    for k, hit in enumerate(kinds):
        out |= hit & (((m >> U32(k)) & U32(1)) != 0)
    return out


def _cmp_fn(f: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    return lambda w, a, b: f(a, b)


VOPC: dict[int, VOp] = {}
for _base, _ty, _ops in ((0x00, "f16", _FCMP), (0x10, "f32", _FCMP), (0x20, "f64", _FCMP)):
    for _k, (_nm, _f) in enumerate(_ops):
        for _x, _kind in ((0, "cmp"), (0x80, "cmpx")):
            _name = f"v_{_kind}_{_nm}_{_ty}"
            VOPC[_base + _k + _x] = VOp(_name, None, (_ty, _ty), _cmp_fn(_f), _kind, float_mode=False)
for _base, _ty in ((0x30, "i16"), (0x38, "u16"), (0x40, "i32"), (0x48, "u32"), (0x50, "i64"), (0x58, "u64")):
    for _k, (_nm, _f) in enumerate(_ICMP):
        if _ty.endswith("16") and _nm in ("f", "t"):
            continue
        for _x, _kind in ((0, "cmp"), (0x80, "cmpx")):
            VOPC[_base + _k + _x] = VOp(f"v_{_kind}_{_nm}_{_ty}", None, (_ty, _ty), _cmp_fn(_f), _kind)
for _op_, _ty in ((0x7D, "f16"), (0x7E, "f32"), (0x7F, "f64")):
    VOPC[_op_] = VOp(f"v_cmp_class_{_ty}", None, (_ty, "u32"), _class, "cmp", float_mode=False)
    VOPC[_op_ + 0x80] = VOp(f"v_cmpx_class_{_ty}", None, (_ty, "u32"), _class, "cmpx", float_mode=False)


# ---------------------------------------------------------------- VOP3P (packed 16-bit; sources are two halves)
def _pk_wrap(dt: type) -> Callable[..., Any]:
    return lambda f: lambda w, *xs: np.asarray(f(*[np.asarray(x).astype(I64) for x in xs])).astype(I64).astype(dt)


_i16, _u16 = _pk_wrap(I16), _pk_wrap(U16)


def _fma_mix(w: Waves, a: Any, b: Any, c: Any) -> Any:
    return fl.fma(np.asarray(a, F32), np.asarray(b, F32), np.asarray(c, F32))


def _dot2_f16(w: Waves, a: Any, b: Any, c: Any) -> Any:
    return _dot2_f32(lambda h: np.asarray(h).astype(U16).view(F16))(w, a, b, c)


def _dot2_f32(conv: Callable[[Any], Any]) -> Callable[..., Any]:
    def run(w: Waves, a: Any, b: Any, c: Any) -> Any:
        a = np.asarray(a).astype(U32)
        b = np.asarray(b).astype(U32)
        lo = conv(a & U32(0xFFFF)).astype(F64) * conv(b & U32(0xFFFF)).astype(F64)
        hi = conv(a >> U32(16)).astype(F64) * conv(b >> U32(16)).astype(F64)
        # the reference does not say how the three terms round: we round the exact sum once (a fused dot product)
        return fl.nan_fix(fl.round_to_odd_f64(lo + hi, np.asarray(c).astype(F64)).astype(F32), c)

    return run


def _packed_fields(x: Any, bits: int, signed: bool) -> list[Any]:
    """The 32 // bits fields of each 32-bit x, lowest first, zero- or sign-extended to int64."""
    x = np.asarray(x).astype(I64) & I64(0xFFFFFFFF)
    mask, out = I64((1 << bits) - 1), []
    for i in range(32 // bits):
        f = (x >> I64(i * bits)) & mask
        out.append(f - ((f >> I64(bits - 1)) << I64(bits)) if signed else f)
    return out


def dot_int(bits: int, signed_a: bool, signed_b: bool) -> Callable[..., Any]:
    """V_DOT4_*/V_DOT8_* (RDNA3 ISA 16.11): S2 plus the sum of the products of the packed `bits`-bit fields of S0
    and S1, computed exactly (int64); the destination wraps it to 32 bits, or saturates it under clamp ("sat"). The
    IU forms read each of S0 and S1 as signed where NEG[0] / NEG[1] is set (decode_vop3p binds the signedness)."""

    def run(w: Waves, a: Any, b: Any, c: Any) -> Any:
        acc = np.asarray(c).astype(I64)
        for x, y in zip(_packed_fields(a, bits, signed_a), _packed_fields(b, bits, signed_b)):
            acc = acc + x * y
        return acc

    return run


VOP3P: dict[int, VOp] = {
    0: _op("v_pk_mad_i16", "i16", "i16 i16 i16", _i16(lambda a, b, c: a * b + c), "packed"),
    1: _op("v_pk_mul_lo_u16", "u16", "u16 u16", _u16(lambda a, b: a * b), "packed"),
    2: _op("v_pk_add_i16", "i16", "i16 i16", _i16(lambda a, b: a + b), "packed"),
    3: _op("v_pk_sub_i16", "i16", "i16 i16", _i16(lambda a, b: a - b), "packed"),
    4: _op("v_pk_lshlrev_b16", "b16", "u16 b16", _u16(lambda s, v: v << (s & 15)), "packed"),
    5: _op("v_pk_lshrrev_b16", "b16", "u16 b16", _u16(lambda s, v: v >> (s & 15)), "packed"),
    6: _op("v_pk_ashrrev_i16", "i16", "u16 i16", _i16(lambda s, v: v >> (s & 15)), "packed"),
    7: _op("v_pk_max_i16", "i16", "i16 i16", _i16(np.maximum), "packed"),
    8: _op("v_pk_min_i16", "i16", "i16 i16", _i16(np.minimum), "packed"),
    9: _op("v_pk_mad_u16", "u16", "u16 u16 u16", _u16(lambda a, b, c: a * b + c), "packed"),
    10: _op("v_pk_add_u16", "u16", "u16 u16", _u16(lambda a, b: a + b), "packed"),
    11: _op("v_pk_sub_u16", "u16", "u16 u16", _u16(lambda a, b: a - b), "packed"),
    12: _op("v_pk_max_u16", "u16", "u16 u16", _u16(np.maximum), "packed"),
    13: _op("v_pk_min_u16", "u16", "u16 u16", _u16(np.minimum), "packed"),
    14: _op("v_pk_fma_f16", "f16", "f16 f16 f16", _fma, "packed"),
    15: _op("v_pk_add_f16", "f16", "f16 f16", _arith("add"), "packed"),
    16: _op("v_pk_mul_f16", "f16", "f16 f16", _arith("multiply"), "packed"),
    17: _op("v_pk_min_f16", "f16", "f16 f16", _minmax(False), "packed"),
    18: _op("v_pk_max_f16", "f16", "f16 f16", _minmax(True), "packed"),
    19: _op("v_dot2_f32_f16", "f32", "b32 b32 f32", _dot2_f16, float_mode=False),
    # the IU forms' fn reads both sources unsigned: decode_vop3p binds the signedness NEG[0]/NEG[1] select
    22: _op("v_dot4_i32_iu8", "i32", "b32 b32 i32", dot_int(8, False, False), "dot_iu"),
    23: _op("v_dot4_u32_u8", "u32", "b32 b32 u32", dot_int(8, False, False), "sat"),
    24: _op("v_dot8_i32_iu4", "i32", "b32 b32 i32", dot_int(4, False, False), "dot_iu"),
    25: _op("v_dot8_u32_u4", "u32", "b32 b32 u32", dot_int(4, False, False), "sat"),
    26: _op("v_dot2_f32_bf16", "f32", "b32 b32 f32", _dot2_f32(fl.bf16_to_f32), float_mode=False),
    32: _op("v_fma_mix_f32", "f32", "f32 f32 f32", _fma_mix, "mix"),
    33: _op("v_fma_mixlo_f16", "f16", "f32 f32 f32", lambda w, a, b, c: _f16_bits(_fma_mix(w, a, b, c)), "mix"),
    34: _op("v_fma_mixhi_f16", "f16", "f32 f32 f32", lambda w, a, b, c: _f16_bits(_fma_mix(w, a, b, c)), "mix"),
    64: _op("v_wmma_f32_16x16x16_f16", "f32", "b32 b32 f32", None),
    65: _op("v_wmma_f32_16x16x16_bf16", "f32", "b32 b32 f32", None),
    66: _op("v_wmma_f16_16x16x16_f16", "f16", "b32 b32 f16", None),
    67: _op("v_wmma_bf16_16x16x16_bf16", "b16", "b32 b32 b16", None),
    68: _op("v_wmma_i32_16x16x16_iu8", "i32", "b32 b32 i32", None),
    69: _op("v_wmma_i32_16x16x16_iu4", "i32", "b32 b32 i32", None),
}

# ---------------------------------------------------------------- VOPD (two VOP2-like ops in one instruction)
_VOPD_BASE = {
    0: ("fmac_f32", VOP2[43]),
    1: ("fmaak_f32", VOP2[45]),
    2: ("fmamk_f32", VOP2[44]),
    3: ("mul_f32", VOP2[8]),
    4: ("add_f32", VOP2[3]),
    5: ("sub_f32", VOP2[4]),
    6: ("subrev_f32", VOP2[5]),
    7: ("mul_dx9_zero_f32", VOP2[7]),
    8: ("mov_b32", VOP1[1]),
    9: ("cndmask_b32", VOP2[1]),
    10: ("max_f32", VOP2[16]),
    11: ("min_f32", VOP2[15]),
    12: ("dot2acc_f32_f16", VOP2[2]),
    13: ("dot2acc_f32_bf16", _op("v_dot2acc_f32_bf16", "f32", "b32 b32", None, "mac")),
}
VOPD_X: dict[int, VOp] = {}
for _k, (_n, _o) in _VOPD_BASE.items():
    VOPD_X[_k] = VOp(f"v_dual_{_n}", _o.dst, _o.srcs, _o.fn, _o.kind, _o.float_mode)
VOPD_Y: dict[int, VOp] = dict(VOPD_X)
VOPD_Y[16] = VOp("v_dual_add_nc_u32", "u32", ("u32", "u32"), VOP2[37].fn, "sat", wrap=VOP2[37].wrap)
VOPD_Y[17] = VOp("v_dual_lshlrev_b32", "b32", ("u32", "b32"), VOP2[24].fn)
VOPD_Y[18] = VOp("v_dual_and_b32", "b32", ("b32", "b32"), VOP2[27].fn)
