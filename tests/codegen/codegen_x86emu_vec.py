"""Vector (VEX/EVEX) and opmask semantics of the x86-64 emulator, registered into codegen_x86emu_ops.RULES.

Model (Intel SDM vol. 1 ch. 15, vol. 2 "EVEX" 2.7): a vector register is 64 bytes; an instruction works on its low
VL bytes (16 xmm, 32 ymm, 64 zmm) and writes zeros above VL (VEX and EVEX both). EVEX write masks: lane i of the
destination takes the result only when bit i of k is set; otherwise it keeps its old value ({k}, merge) or becomes
zero ({k}{z}). A masked memory operand reads/writes only the enabled lanes (masked-off lanes are never touched, so
they cannot fault). An embedded broadcast ({1toN}, objdump's `DWORD BCST`) reads one element and repeats it.

Floating point: numpy's IEEE float32/float64 arithmetic in round-to-nearest (MXCSR's default; no DAZ/FTZ), plus the
x86 rules numpy does not share: a NaN result is the first NaN source, quietened (QNaN bit set), and an invalid
operation with no NaN source gives the "default NaN" (sign set, e.g. 0xFFC00000); max/min return the second source
when either is NaN or both are zero; truncating conversions give the "integer indefinite" (0x80000000...) when the
value is NaN or out of range.
FMA is computed with one rounding: float32 as the exact product (float64 holds a 24x24-bit product exactly) plus the
addend with the float64 sum rounded to odd (TwoSum gives the exact error; an inexact sum with an even last bit moves to
its odd neighbour), then one rounding to float32 - round-to-odd at 53 >= 2*24+2 bits makes that second rounding
equal to the correct single rounding. float64 FMA is exact rational arithmetic per lane (fractions.Fraction).
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

import numpy as np

from codegen_x86emu_ops import (
    M64,
    MASK,
    RULES,
    Decoded,
    EmulationError,
    Gpr,
    Imm,
    KReg,
    Machine,
    Mem,
    Run,
    VecReg,
    rule,
)

U8 = np.dtype(np.uint8)
UINT = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}
SINT = {1: np.dtype(np.int8), 2: np.dtype(np.int16), 4: np.dtype(np.int32), 8: np.dtype(np.int64)}
FLT = {4: np.dtype(np.float32), 8: np.dtype(np.float64)}
QUIET = {4: np.uint32(0x0040_0000), 8: np.uint64(1 << 51)}
DEFAULT_NAN = {4: np.uint32(0xFFC0_0000), 8: np.uint64(0xFFF8_0000_0000_0000)}
Loader = Callable[[Machine, "int | None"], np.ndarray]
Storer = Callable[[Machine, np.ndarray, "int | None"], None]


def lanes(kb: int, n: int) -> np.ndarray:
    """The write-mask bits 0..n-1 of `kb` as a bool array."""
    return np.unpackbits(np.array([kb], "<u8").view(np.uint8), bitorder="little")[:n].astype(bool)


def to_bits(b: np.ndarray) -> int:
    """Bool lanes as an opmask value (lane i -> bit i)."""
    return int.from_bytes(np.packbits(b, bitorder="little").tobytes(), "little")


def kbits(m: Machine, d: Decoded) -> int | None:
    return m.k[d.mask] if d.mask else None


def vec_width(d: Decoded, o: object) -> int:
    if isinstance(o, VecReg):
        return o.size
    if isinstance(o, Mem) and o.size and not o.bcast:
        return o.size
    raise d.fail("cannot tell the vector length")


def vsrc(d: Decoded, o: object, nbytes: int, es: int) -> Loader:
    """A loader of `nbytes` of vector operand `o` (register, memory or broadcast element) honouring the write mask."""
    if isinstance(o, VecReg):
        if o.size < nbytes:
            raise d.fail(f"a {o.size}-byte register where {nbytes} bytes are read")
        n = o.num
        return lambda m, kb: m.vec[n, :nbytes].copy()
    if not isinstance(o, Mem):
        raise d.fail(f"expected a vector register or memory operand, got {type(o).__name__}")
    if o.bcast:
        if o.size != es:
            raise d.fail(f"a {o.size}-byte broadcast element where the instruction's elements are {es} bytes")
        reps = nbytes // es

        def load_bcast(m: Machine, kb: int | None) -> np.ndarray:
            if kb is not None and not kb & ((1 << reps) - 1):
                return np.zeros(nbytes, U8)  # every lane masked off: no access at all
            return np.tile(m.mem.read(o.ea(m), es), reps)

        return load_bcast
    if o.size is not None and o.size != nbytes:
        raise d.fail(f"a {o.size}-byte memory operand where {nbytes} bytes are read")
    n_lanes = nbytes // es
    full = (1 << n_lanes) - 1

    def load(m: Machine, kb: int | None) -> np.ndarray:
        ea = o.ea(m)
        if kb is None or kb & full == full:
            return m.mem.read(ea, nbytes)
        out = np.zeros(nbytes, U8)  # fault suppression: only enabled lanes are read
        for i in np.flatnonzero(lanes(kb, n_lanes)):
            out[i * es : (i + 1) * es] = m.mem.read(ea + int(i) * es, es)
        return out

    return load


def vdst(d: Decoded, o: object, nbytes: int, es: int) -> Storer:
    """A writer of an `nbytes` result (uint8) into vector register or memory `o`, with EVEX merge/zero masking."""
    n_lanes, dt, zero = nbytes // es, UINT.get(es, U8), d.zero  # (es 16: whole-xmm writes, never masked)
    if isinstance(o, VecReg):
        n = o.num

        def store(m: Machine, r: np.ndarray, kb: int | None) -> None:
            row = m.vec[n]
            if kb is not None:
                old = np.zeros(n_lanes, dt) if zero else row[:nbytes].view(dt)
                r = np.where(lanes(kb, n_lanes), r.view(dt), old).view(U8)
            row[:nbytes] = r
            row[nbytes:] = 0

        return store
    if not isinstance(o, Mem) or o.bcast:
        raise d.fail("expected a vector register or memory destination")
    if zero:
        raise d.fail("zero-masking a memory destination is invalid")
    if o.size is not None and o.size != nbytes:
        raise d.fail(f"a {o.size}-byte memory destination for a {nbytes}-byte result")

    def store_mem(m: Machine, r: np.ndarray, kb: int | None) -> None:
        ea = o.ea(m)
        if kb is None:
            m.mem.write(ea, r)
            return
        for i in np.flatnonzero(lanes(kb, n_lanes)):
            m.mem.write(ea + int(i) * es, r[i * es : (i + 1) * es])

    return store_mem


def fix_nan(r: np.ndarray, *srcs: np.ndarray) -> np.ndarray:
    """x86 NaN results: the first NaN source quietened, else the default NaN (for invalid operations)."""
    nan = np.isnan(r)
    if not nan.any():
        return r
    es = r.dtype.itemsize
    ui = UINT[es]
    out = np.where(nan, DEFAULT_NAN[es], r.view(ui))
    for s in reversed(srcs):
        out = np.where(nan & np.isnan(s), s.view(ui) | QUIET[es], out)
    return out.view(r.dtype)


def operands(d: Decoded, *counts: int) -> list:
    if len(d.ops) not in counts:
        raise d.fail(f"{d.mn} with {len(d.ops)} operands (expected {' or '.join(map(str, counts))})")
    return d.ops


# ---------------------------------------------------------------------------------------------------------------------
# lane-wise packed and scalar arithmetic (rules as data: stem -> (numpy function on float lanes, NaN fix-up))


def _fmax(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(a > b, a, b)  # SDM MAXPS: the second source unless src1 > src2 (NaN, +-0 included)


def _fmin(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(a < b, a, b)


FLOAT_BINARY: dict[str, tuple[Callable[[np.ndarray, np.ndarray], np.ndarray], bool]] = {
    "add": (np.add, True), "sub": (np.subtract, True), "mul": (np.multiply, True), "div": (np.divide, True),
    "max": (_fmax, False), "min": (_fmin, False),
}  # fmt: skip
BITWISE: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor, "andn": lambda a, b: ~a & b,
}  # fmt: skip


def _packed(fn: Callable[..., np.ndarray], dt: np.dtype, nan: bool, unary: bool = False) -> Callable[[Decoded], Run]:
    es = dt.itemsize

    def build(d: Decoded) -> Run:
        ops = operands(d, 2 if unary else 3)
        w = vec_width(d, ops[0])
        srcs = [vsrc(d, o, w, es) for o in ops[1:]]
        st = vdst(d, ops[0], w, es)

        def run(m: Machine) -> None:
            kb = kbits(m, d)
            xs = [s(m, kb).view(dt) for s in srcs]
            r = fn(*xs)  # (the run loop holds np.errstate(all="ignore"): IEEE results, no warnings)
            st(m, (fix_nan(r, *xs) if nan else r).view(U8), kb)

        return run

    return build


def _scalar(fn: Callable[..., np.ndarray], dt: np.dtype, nan: bool, unary: bool = False) -> Callable[[Decoded], Run]:
    """op ss/sd xmm1, xmm2, xmm3/m: low element = fn(xmm2, xmm3) (unary: fn(xmm3)), bits 127:es from xmm2."""
    es = dt.itemsize

    def build(d: Decoded) -> Run:
        dst, a, b = operands(d, 3)
        la, lb, st = vsrc(d, a, 16, es), vsrc(d, b, es, es), vdst(d, dst, 16, 16)
        if not isinstance(dst, VecReg) or dst.size != 16:
            raise d.fail("scalar ops write an xmm register")
        n = dst.num

        def run(m: Machine) -> None:
            kb = kbits(m, d)
            r, y = la(m, None), lb(m, kb)[:es].view(dt)
            x = r[:es].view(dt)
            v = fn(y) if unary else fn(x, y)
            v = (fix_nan(v, y) if unary else fix_nan(v, x, y)) if nan else v
            if kb is not None and not kb & 1:
                v = np.zeros(1, dt) if d.zero else m.vec[n, :es].view(dt).copy()
            r[:es] = v.view(U8)
            st(m, r, None)

        return run

    return build


for _stem, (_fn, _nan) in FLOAT_BINARY.items():
    for _sfx, _dt in (("ps", FLT[4]), ("pd", FLT[8])):
        RULES[f"v{_stem}{_sfx}"] = _packed(_fn, _dt, _nan)
    for _sfx, _dt in (("ss", FLT[4]), ("sd", FLT[8])):
        RULES[f"v{_stem}{_sfx}"] = _scalar(_fn, _dt, _nan)
for _sfx, _dt in (("ps", FLT[4]), ("pd", FLT[8])):
    RULES[f"vsqrt{_sfx}"] = _packed(np.sqrt, _dt, True, unary=True)
for _sfx, _dt in (("ss", FLT[4]), ("sd", FLT[8])):
    RULES[f"vsqrt{_sfx}"] = _scalar(np.sqrt, _dt, True, unary=True)
for _stem, _fn in BITWISE.items():
    RULES[f"v{_stem}ps"] = RULES[f"vp{_stem}d"] = _packed(_fn, UINT[4], False)
    RULES[f"v{_stem}pd"] = RULES[f"vp{_stem}q"] = _packed(_fn, UINT[8], False)
    RULES[f"vp{_stem}"] = _packed(_fn, UINT[8], False)  # VEX vpand/vpor/...: no element size (no masking)

INT_BINARY: dict[str, tuple[Callable[[np.ndarray, np.ndarray], np.ndarray], int, bool]] = {
    "vpaddd": (np.add, 4, True), "vpaddq": (np.add, 8, True), "vpsubd": (np.subtract, 4, True),
    "vpsubq": (np.subtract, 8, True), "vpmulld": (np.multiply, 4, True), "vpmullq": (np.multiply, 8, True),
    "vpmaxsd": (np.maximum, 4, True), "vpminsd": (np.minimum, 4, True), "vpmaxud": (np.maximum, 4, False),
    "vpminud": (np.minimum, 4, False), "vpsllvd": (lambda a, b: np.where(b < 32, a << (b & 31), 0), 4, False),
    "vpsrlvd": (lambda a, b: np.where(b < 32, a >> (b & 31), 0), 4, False),
    "vpsravd": (lambda a, b: a >> np.minimum(b.view(np.uint32), 31).astype(np.int32), 4, True),
    "vpaddb": (np.add, 1, False), "vpaddw": (np.add, 2, False), "vpsubb": (np.subtract, 1, False),
    "vpsubw": (np.subtract, 2, False), "vpmullw": (np.multiply, 2, True), "vpmaxsb": (np.maximum, 1, True),
    "vpminsb": (np.minimum, 1, True), "vpmaxub": (np.maximum, 1, False), "vpminub": (np.minimum, 1, False),
    "vpmaxsw": (np.maximum, 2, True), "vpminsw": (np.minimum, 2, True),
}  # fmt: skip
for _mn, (_fn, _es, _signed) in INT_BINARY.items():
    RULES[_mn] = _packed(_fn, (SINT if _signed else UINT)[_es], False)
RULES["vpabsd"] = _packed(np.abs, SINT[4], False, unary=True)
RULES["vpabsb"] = _packed(np.abs, SINT[1], False, unary=True)
RULES["vpabsw"] = _packed(np.abs, SINT[2], False, unary=True)


def _shift_imm(kind: str, es: int) -> Callable[[Decoded], Run]:
    """vpslld/vpsrld/vpsrad by an imm8 or by the low 64 bits of an xmm: counts >= the element width give 0
    (arithmetic: the sign fill)."""
    dt, bits = (SINT if kind == "sra" else UINT)[es], es * 8

    def build(d: Decoded) -> Run:
        dst, src, cnt = operands(d, 3)
        w = vec_width(d, dst)
        ls, st = vsrc(d, src, w, es), vdst(d, dst, w, es)
        lc = None if isinstance(cnt, Imm) else vsrc(d, cnt, 16, 16)

        def run(m: Machine) -> None:
            kb = kbits(m, d)
            c = cnt.value if isinstance(cnt, Imm) else int(lc(m, None)[:8].view(np.uint64)[0])  # type: ignore[misc]
            x = ls(m, kb).view(dt)
            if kind == "sra":
                r = x >> min(c, bits - 1)
            elif c >= bits:
                r = np.zeros_like(x)
            else:
                r = (x << c) if kind == "sll" else (x >> c)
            st(m, r.astype(dt).view(U8), kb)

        return run

    return build


for _k in ("sll", "srl", "sra"):
    RULES[f"vp{_k}w"] = _shift_imm(_k, 2)
    RULES[f"vp{_k}d"] = _shift_imm(_k, 4)
    if _k != "sra":
        RULES[f"vp{_k}q"] = _shift_imm(_k, 8)


# ---------------------------------------------------------------------------------------------------------------------
# comparisons: vector masks (VEX) or opmask bits (EVEX k destination)

CMP_PREDICATES = ("eq", "lt", "le", "unord", "neq", "nlt", "nle", "ord", "eq_uq", "nge", "ngt", "false", "neq_oq",
                  "ge", "gt", "true", "eq_os", "lt_oq", "le_oq", "unord_s", "neq_us", "nlt_uq", "nle_uq", "ord_s",
                  "eq_us", "nge_uq", "ngt_uq", "false_os", "neq_os", "ge_oq", "gt_oq", "true_us")  # fmt: skip


def float_predicate(imm: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """VCMPPS imm8 (SDM table 3-1); bit 4 only selects signalling vs quiet, which does not change the result."""
    un = np.isnan(a) | np.isnan(b)
    return [a == b, a < b, a <= b, un, ~(a == b), ~(a < b), ~(a <= b), ~un, (a == b) | un, ~(a >= b), ~(a > b),
            np.zeros(a.shape, bool), (a != b) & ~un, a >= b, a > b, np.ones(a.shape, bool)][imm & 15]  # fmt: skip


INT_PREDICATES = ("eq", "lt", "le", "false", "neq", "nlt", "nle", "true")


def int_predicate(imm: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return [a == b, a < b, a <= b, np.zeros(a.shape, bool), a != b, a >= b, a > b, np.ones(a.shape, bool)][imm & 7]


def _compare(pred: Callable[[int, np.ndarray, np.ndarray], np.ndarray], dt: np.dtype, imm: int | None,
             scalar: bool = False) -> Callable[[Decoded], Run]:  # fmt: skip
    es = dt.itemsize

    def build(d: Decoded) -> Run:
        ops = list(operands(d, 3, 4))
        p = imm
        if len(ops) == 4:
            if p is not None or not isinstance(ops[3], Imm):
                raise d.fail("unexpected predicate operand")
            p = ops.pop().value  # type: ignore[union-attr]
        if p is None:
            raise d.fail("comparison without a predicate")
        dst, a, b = ops
        w = 16 if scalar else vec_width(d, a)
        n_lanes = 1 if scalar else w // es
        la, lb = vsrc(d, a, w, es), vsrc(d, b, es if scalar else w, es)
        if isinstance(dst, KReg):
            kn = dst.num

            def run_k(m: Machine) -> None:
                kb = kbits(m, d)
                x, y = la(m, kb).view(dt)[:n_lanes], lb(m, kb).view(dt)[:n_lanes]
                m.k[kn] = to_bits(pred(p, x, y)) & (kb if kb is not None else M64)

            return run_k
        st = vdst(d, dst, w, es)

        def run_vec(m: Machine) -> None:
            kb = kbits(m, d)
            x, y = la(m, kb).view(dt), lb(m, kb).view(dt)
            if scalar:
                r = x.copy().view(UINT[es])
                r[0] = UINT[es].type(MASK[es]) if pred(p, x[:1], y[:1])[0] else 0
            else:
                r = np.where(pred(p, x, y), UINT[es].type(MASK[es]), UINT[es].type(0))
            st(m, r.view(U8), kb)

        return run_vec

    return build


for _i, _p in enumerate(CMP_PREDICATES):
    for _sfx, _dt, _sc in (("ps", FLT[4], False), ("pd", FLT[8], False), ("ss", FLT[4], True), ("sd", FLT[8], True)):
        RULES[f"vcmp{_p}{_sfx}"] = _compare(float_predicate, _dt, _i, _sc)
for _sfx, _dt, _sc in (("ps", FLT[4], False), ("pd", FLT[8], False), ("ss", FLT[4], True), ("sd", FLT[8], True)):
    RULES[f"vcmp{_sfx}"] = _compare(float_predicate, _dt, None, _sc)
for _u, _tab in (("", SINT), ("u", UINT)):
    for _sfx, _es in (("d", 4), ("q", 8)):
        RULES[f"vpcmp{_u}{_sfx}"] = _compare(int_predicate, _tab[_es], None)
        for _i, _p in enumerate(INT_PREDICATES):
            if _p not in ("false", "true"):
                RULES[f"vpcmp{_p}{_u}{_sfx}"] = _compare(int_predicate, _tab[_es], _i)
RULES["vpcmpgtd"] = _compare(int_predicate, SINT[4], 6)
RULES["vpcmpeqb"], RULES["vpcmpgtb"] = _compare(int_predicate, SINT[1], 0), _compare(int_predicate, SINT[1], 6)
RULES["vpcmpeqw"], RULES["vpcmpgtw"] = _compare(int_predicate, SINT[2], 0), _compare(int_predicate, SINT[2], 6)
RULES["vpcmpgtq"] = _compare(int_predicate, SINT[8], 6)


@rule("vucomiss", "vucomisd", "vcomiss", "vcomisd")
def _ucomi(d: Decoded) -> Run:
    a, b = operands(d, 2)
    es = 4 if d.mn.endswith("s") else 8
    dt = FLT[es]
    la, lb = vsrc(d, a, es, es), vsrc(d, b, es, es)

    def run(m: Machine) -> None:
        x, y = float(la(m, None).view(dt)[0]), float(lb(m, None).view(dt)[0])
        if x != x or y != y:
            m.zf = m.pf = m.cf = True
        else:
            m.zf, m.pf, m.cf = x == y, False, x < y
        m.of = m.sf = False

    return run


@rule("vmovmskps", "vmovmskpd")
def _movmsk(d: Decoded) -> Run:
    dst, src = operands(d, 2)
    if not isinstance(dst, Gpr) or not isinstance(src, VecReg):
        raise d.fail("vmovmsk takes a GPR destination and a vector register")
    es = 4 if d.mn.endswith("ps") else 8
    w = src.size

    def run(m: Machine) -> None:
        signs = (m.vec[src.num, :w].view(UINT[es]) >> (es * 8 - 1)).astype(np.uint64)
        dst.set(m, int((signs << np.arange(len(signs), dtype=np.uint64)).sum()))

    return run


# ---------------------------------------------------------------------------------------------------------------------
# blends, selects, FMA


@rule("vblendvps", "vblendvpd")
def _blendv(d: Decoded) -> Run:
    dst, a, b, sel = operands(d, 4)
    es = 4 if d.mn.endswith("ps") else 8
    w = vec_width(d, dst)
    la, lb, ls, st = vsrc(d, a, w, es), vsrc(d, b, w, es), vsrc(d, sel, w, es), vdst(d, dst, w, es)
    dt = SINT[es]

    def run(m: Machine) -> None:
        st(m, np.where(ls(m, None).view(dt) < 0, lb(m, None).view(dt), la(m, None).view(dt)).view(U8), None)

    return run


@rule("vblendmps", "vblendmpd", "vpblendmd", "vpblendmq")
def _blendm(d: Decoded) -> Run:
    """dest = k ? src2 : src1 per lane (merge-masking selects src1; {z} zeroes the unselected lanes)."""
    dst, a, b = operands(d, 3)
    es = 8 if d.mn.endswith(("pd", "q")) else 4
    w = vec_width(d, dst)
    la, lb, st, dt, n = vsrc(d, a, w, es), vsrc(d, b, w, es), vdst(d, dst, w, es), UINT[es], w // es

    def run(m: Machine) -> None:
        kb = kbits(m, d)
        x, y = la(m, None).view(dt), lb(m, kb).view(dt)
        sel = lanes(kb, n) if kb is not None else np.ones(n, bool)
        st(m, np.where(sel, y, np.zeros_like(x) if d.zero else x).view(U8), None)

    return run


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """a*b + c in float32 with one rounding (see the module docstring: exact product, sum rounded to odd)."""
    p = a.astype(np.float64) * b.astype(np.float64)
    c64 = c.astype(np.float64)
    with np.errstate(all="ignore"):
        s = p + c64
        bb = s - p
        err = (p - (s - bb)) + (c64 - bb)  # TwoSum: s + err == p + c exactly (finite s)
        odd_fix = np.isfinite(s) & (err != 0) & ((s.view(np.uint64) & np.uint64(1)) == 0)
        if odd_fix.any():
            s = np.where(odd_fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
        return s.astype(np.float32)


def _fma64_lane(x: float, y: float, z: float) -> float:
    if not all(np.isfinite(v) for v in (x, y, z)):
        return x * y + z  # infinities and NaNs: no rounding involved
    exact = Fraction(x) * Fraction(y) + Fraction(z)
    if exact == 0:
        return x * y + z  # an exact zero: the float sum has the right sign (x*y is +-0 or cancels exactly)
    try:
        return float(exact)  # int/int true division: correctly rounded
    except OverflowError:
        return float("inf") if exact > 0 else float("-inf")


def fma64(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    return np.array([_fma64_lane(float(x), float(y), float(z)) for x, y, z in zip(a, b, c)], np.float64)


def _fma(order: str, neg_prod: bool, sub: bool, dt: np.dtype, scalar: bool) -> Callable[[Decoded], Run]:
    """vf[n]madd/vf[n]msub{132,213,231}: operands 1,2,3 = (dest, vvvv, r/m); order gives which multiply and which
    is added (231: op2*op3 + op1). A NaN result is the first NaN of multiplicand, multiplier, addend, quietened
    and not negated (SDM vol. 1 table 14-17 "FMA Numeric Behavior")."""
    es = dt.itemsize
    i, j, k = (int(c) - 1 for c in order)
    fma = fma32 if es == 4 else fma64

    def build(d: Decoded) -> Run:
        ops = operands(d, 3)
        w = 16 if scalar else vec_width(d, ops[0])
        loads = [vsrc(d, ops[0], w, es), vsrc(d, ops[1], w, es), vsrc(d, ops[2], es if scalar else w, es)]
        st = vdst(d, ops[0], w, es)
        n = 1 if scalar else w // es

        def run(m: Machine) -> None:
            kb = kbits(m, d)
            raw = [ld(m, kb) for ld in loads]
            xs = [r.view(dt)[:n] for r in raw]
            x, y, z = xs[i], xs[j], xs[k]
            r = fix_nan(fma(-x if neg_prod else x, y, -z if sub else z), x, y, z)
            if scalar:
                if kb is not None and not kb & 1:
                    r = np.zeros(1, dt) if d.zero else xs[0][:1]
                out = raw[0].copy()
                out[:es] = r.view(U8)
                st(m, out, None)
            else:
                st(m, r.view(U8), kb)

        return run

    return build


for _name, (_neg, _sub) in {"fmadd": (False, False), "fmsub": (False, True), "fnmadd": (True, False),
                            "fnmsub": (True, True)}.items():  # fmt: skip
    for _order in ("132", "213", "231"):
        for _sfx, _dt, _sc in (("ps", FLT[4], False), ("pd", FLT[8], False), ("ss", FLT[4], True),
                               ("sd", FLT[8], True)):  # fmt: skip
            RULES[f"v{_name}{_order}{_sfx}"] = _fma(_order, _neg, _sub, _dt, _sc)


# ---------------------------------------------------------------------------------------------------------------------
# moves


def _move_es(mn: str) -> int:
    for suffix, es in (("dqu8", 1), ("dqu16", 2), ("32", 4), ("64", 8), ("pd", 8), ("ps", 4)):
        if mn.endswith(suffix):
            return es
    return 4  # VEX vmovdqu/vmovdqa: no write mask, the element size is irrelevant


@rule("vmovups", "vmovaps", "vmovupd", "vmovapd", "vmovdqu", "vmovdqa", "vmovdqu8", "vmovdqu16", "vmovdqu32",
      "vmovdqu64", "vmovdqa32", "vmovdqa64")  # fmt: skip
def _move(d: Decoded) -> Run:
    dst, src = operands(d, 2)
    w = vec_width(d, src if isinstance(src, VecReg) else dst)
    es, aligned = _move_es(d.mn), "mova" in d.mn or "dqa" in d.mn
    ld, st = vsrc(d, src, w, es), vdst(d, dst, w, es)
    mem = dst if isinstance(dst, Mem) else src if isinstance(src, Mem) else None

    def run(m: Machine) -> None:
        if aligned and mem is not None and mem.ea(m) % w:
            raise EmulationError(f"{d.mn}: {mem.ea(m):#x} is not {w}-byte aligned (#GP)")
        kb = kbits(m, d)
        st(m, ld(m, kb), kb)

    return run


@rule("vmovss", "vmovsd")
def _move_scalar(d: Decoded) -> Run:
    es = 4 if d.mn == "vmovss" else 8
    ops = operands(d, 2, 3)
    if len(ops) == 3:  # reg-reg merge: low element from src2, bits 127:es from src1
        dst, a, b = ops
        la, lb, st = vsrc(d, a, 16, 16), vsrc(d, b, 16, 16), vdst(d, dst, 16, 16)

        def run3(m: Machine) -> None:
            kb = kbits(m, d)
            r = la(m, None)
            if kb is None or kb & 1:
                r[:es] = lb(m, None)[:es]
            else:
                r[:es] = 0 if d.zero else m.vec[dst.num, :es]  # type: ignore[union-attr]
            st(m, r, None)

        return run3
    dst, src = ops
    if isinstance(dst, Mem):
        ld = vsrc(d, src, es, es)

        def run_store(m: Machine) -> None:
            kb = kbits(m, d)
            if kb is None or kb & 1:
                m.mem.write(dst.ea(m), ld(m, None)[:es])

        return run_store
    if not isinstance(dst, VecReg) or not isinstance(src, Mem):
        raise d.fail(f"unsupported {d.mn} form")
    ld, st = vsrc(d, src, es, es), vdst(d, dst, 16, 16)

    def run_load(m: Machine) -> None:
        kb = kbits(m, d)
        r = np.zeros(16, U8)  # a load zeroes bits 127:es
        if kb is None or kb & 1:
            r[:es] = ld(m, None)
        elif not d.zero:
            r[:es] = m.vec[dst.num, :es]
        st(m, r, None)

    return run_load


@rule("vmovd", "vmovq")
def _move_gpr(d: Decoded) -> Run:
    es = 4 if d.mn == "vmovd" else 8
    dst, src = operands(d, 2)
    if isinstance(dst, VecReg):
        st = vdst(d, dst, 16, 16)
        if isinstance(src, (Gpr, Mem)) and not (isinstance(src, Mem) and src.size not in (None, es)):
            size_src = Mem(src.base, src.index, src.scale, src.disp, es, src.rip, False) if isinstance(src, Mem) \
                else src  # fmt: skip

            def run_in(m: Machine) -> None:
                r = np.zeros(16, U8)
                r[:es] = np.frombuffer((size_src.get(m) & MASK[es]).to_bytes(es, "little"), U8)
                st(m, r, None)

            return run_in
        if isinstance(src, VecReg) and es == 8:
            n = src.num

            def run_q(m: Machine) -> None:
                r = np.zeros(16, U8)
                r[:8] = m.vec[n, :8]
                st(m, r, None)

            return run_q
    elif isinstance(src, VecReg) and isinstance(dst, (Gpr, Mem)):
        n = src.num
        put = dst.set if isinstance(dst, Gpr) else Mem(dst.base, dst.index, dst.scale, dst.disp, es, dst.rip, False).set

        def run_out(m: Machine) -> None:
            put(m, int.from_bytes(m.vec[n, :es].tobytes(), "little"))

        return run_out
    raise d.fail(f"unsupported {d.mn} form")


# ---------------------------------------------------------------------------------------------------------------------
# conversions


def trunc_to_int(x: np.ndarray, bits: int, unsigned: bool = False, rint: bool = False) -> np.ndarray:
    """Truncating (or round-to-nearest-even) float -> int; NaN/out of range give the integer indefinite value
    (signed: the minimum; unsigned AVX-512 forms: all ones)."""
    with np.errstate(all="ignore"):
        t = np.rint(x) if rint else np.trunc(x)
        lo, hi = (0, 2.0**bits) if unsigned else (-(2.0 ** (bits - 1)), 2.0 ** (bits - 1))
        ok = (t >= lo) & (t < hi)
        dt = (UINT if unsigned else SINT)[bits // 8]
        out = np.where(ok, t, 0).astype(dt)
    out[~ok] = MASK[bits // 8] if unsigned else -(1 << (bits - 1))
    return out


_PACKED_CVT: dict[str, tuple[int, int, Callable[[np.ndarray], np.ndarray], np.dtype]] = {
    # mnemonic: (source element size, result element size, function, source dtype)
    "vcvtdq2ps": (4, 4, lambda x: x.astype(np.float32), SINT[4]),
    "vcvtudq2ps": (4, 4, lambda x: x.astype(np.float32), UINT[4]),
    "vcvttps2dq": (4, 4, lambda x: trunc_to_int(x, 32), FLT[4]),
    "vcvtps2dq": (4, 4, lambda x: trunc_to_int(x, 32, rint=True), FLT[4]),
    "vcvttps2udq": (4, 4, lambda x: trunc_to_int(x, 32, unsigned=True), FLT[4]),
    "vcvtps2pd": (4, 8, lambda x: x.astype(np.float64), FLT[4]),
    "vcvtpd2ps": (8, 4, lambda x: x.astype(np.float32), FLT[8]),
    "vcvtdq2pd": (4, 8, lambda x: x.astype(np.float64), SINT[4]),
    "vcvttpd2dq": (8, 4, lambda x: trunc_to_int(x, 32), FLT[8]),
}


def _packed_cvt(d: Decoded) -> Run:
    ses, des, fn, sdt = _PACKED_CVT[d.mn]
    dst, src = operands(d, 2)
    w = vec_width(d, dst)
    sw = w * ses // des
    ld, st = vsrc(d, src, sw, ses), vdst(d, dst, w, des)
    if isinstance(src, VecReg) and src.size != max(sw, 16):
        raise d.fail(f"{d.mn}: a {src.size}-byte source for a {w}-byte result")

    def run(m: Machine) -> None:
        kb = kbits(m, d)
        st(m, fn(ld(m, kb).view(sdt)).view(U8), kb)

    return run


for _mn in _PACKED_CVT:
    RULES[_mn] = _packed_cvt


@rule("vcvtsi2ss", "vcvtsi2sd", "vcvtusi2ss", "vcvtusi2sd")
def _cvt_int_to_scalar(d: Decoded) -> Run:
    dst, a, src = operands(d, 3)
    dt = FLT[4] if d.mn.endswith("ss") else FLT[8]
    if not isinstance(src, (Gpr, Mem)) or not src.size:
        raise d.fail(f"{d.mn}: the integer source needs a size")
    size, unsigned = src.size, "usi" in d.mn
    la, st = vsrc(d, a, 16, 16), vdst(d, dst, 16, 16)

    def run(m: Machine) -> None:
        v = src.get(m)
        iv = np.array([v], UINT[size]) if unsigned else np.array([v], UINT[size]).view(SINT[size])
        r = la(m, None)
        r[: dt.itemsize] = iv.astype(dt).view(U8)  # numpy's int -> float cast rounds once (to nearest even)
        st(m, r, None)

    return run


@rule("vcvttss2si", "vcvttsd2si", "vcvtss2si", "vcvtsd2si", "vcvttss2usi", "vcvttsd2usi")
def _cvt_scalar_to_int(d: Decoded) -> Run:
    dst, src = operands(d, 2)
    if not isinstance(dst, Gpr) or dst.size not in (4, 8):
        raise d.fail(f"{d.mn} writes a 32/64-bit GPR")
    es = 4 if "ss2" in d.mn else 8
    ld, bits, unsigned, rint = vsrc(d, src, es, es), dst.size * 8, "usi" in d.mn, "cvtt" not in d.mn

    def run(m: Machine) -> None:
        v = trunc_to_int(ld(m, None)[:es].view(FLT[es]), bits, unsigned, rint)
        dst.set(m, int(v.view(UINT[bits // 8])[0]))

    return run


@rule("vcvtss2sd", "vcvtsd2ss")
def _cvt_scalar_float(d: Decoded) -> Run:
    dst, a, b = operands(d, 3)
    ses, des = (4, 8) if d.mn == "vcvtss2sd" else (8, 4)
    la, lb, st = vsrc(d, a, 16, 16), vsrc(d, b, ses, ses), vdst(d, dst, 16, 16)

    def run(m: Machine) -> None:
        kb = kbits(m, d)
        r = la(m, None)
        if kb is None or kb & 1:
            with np.errstate(all="ignore"):
                r[:des] = lb(m, None)[:ses].view(FLT[ses]).astype(FLT[des]).view(U8)
        else:
            r[:des] = 0 if d.zero else m.vec[dst.num, :des]  # type: ignore[union-attr]
        st(m, r, None)

    return run


def round_imm(x: np.ndarray, imm: int) -> np.ndarray:
    """VROUNDPS/VRNDSCALEPS imm8: bits 1:0 the mode (nearest-even, down, up, truncate) unless bit 2 (MXCSR: nearest);
    bits 7:4 keep that many fraction bits (VRNDSCALE's M). NaN inputs come back quietened."""
    mode = 0 if imm & 4 else imm & 3
    fn = (np.rint, np.floor, np.ceil, np.trunc)[mode]
    scale = imm >> 4
    with np.errstate(all="ignore"):
        r = fn(x * x.dtype.type(2.0**scale)) / x.dtype.type(2.0**scale) if scale else fn(x)
    integral = np.abs(x) >= 2.0 ** (np.finfo(x.dtype).nmant - scale)  # no fraction bits left (and x*2**M may overflow)
    r = np.where(np.isinf(x) | (x == 0) | integral, x, r)  # those, infinities and zeros (signed) pass through
    return fix_nan(r.astype(x.dtype), x)


def _round(dt: np.dtype, scalar: bool) -> Callable[[Decoded], Run]:
    es = dt.itemsize

    def build(d: Decoded) -> Run:
        ops = operands(d, 4 if scalar else 3)
        imm = ops[-1]
        if not isinstance(imm, Imm):
            raise d.fail("rounding needs an imm8")
        if scalar:
            dst, a, b = ops[:3]
            la, lb, st = vsrc(d, a, 16, 16), vsrc(d, b, es, es), vdst(d, dst, 16, 16)

            def run_s(m: Machine) -> None:
                kb = kbits(m, d)
                r = la(m, None)
                if kb is None or kb & 1:
                    r[:es] = round_imm(lb(m, None)[:es].view(dt), imm.value).view(U8)
                else:
                    r[:es] = 0 if d.zero else m.vec[dst.num, :es]  # type: ignore[union-attr]
                st(m, r, None)

            return run_s
        dst, src = ops[:2]
        w = vec_width(d, dst)
        ld, st = vsrc(d, src, w, es), vdst(d, dst, w, es)

        def run(m: Machine) -> None:
            kb = kbits(m, d)
            st(m, round_imm(ld(m, kb).view(dt), imm.value).view(U8), kb)

        return run

    return build


for _sfx, _dt, _sc in (("ps", FLT[4], False), ("pd", FLT[8], False), ("ss", FLT[4], True), ("sd", FLT[8], True)):
    RULES[f"vround{_sfx}"] = RULES[f"vrndscale{_sfx}"] = _round(_dt, _sc)
