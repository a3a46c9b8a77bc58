"""Selection rules for CAST and BITCAST between the scalar dtypes (bool, 8..64-bit ints, float32, float64).

Exact semantics follow the reference interpreter (speck.codegen.numeric): int -> int wraps and sign/zero-extends by
the source's signedness, int -> bool and float -> bool test against 0 (NaN is true), int64/uint64 -> float32 rounds
through float64, uint64 -> float halves with a sticky bit when the top bit is set, and float -> int truncates toward
zero wrapping modulo 2**64 with NaN/inf giving 0 (a fast cvtt path; the exact slow path only when cvtt reports the
"integer indefinite" value). The rules are functions of (selector, uop), registered in
speck.codegen.x86.select.SELECTION_TABLE.
"""

from __future__ import annotations

from speck.codegen.regalloc import VReg
from speck.codegen.x86.operands import Imm
from speck.codegen.x86.ops import X86Op as O
from speck.codegen.x86.select_api import SelectorAPI
from speck.codegen.x86.select_common import FLOAT_OPS, ROUND_TRUNC, is_cconst, osize
from speck.uop import DType, UOp, dtypes


def sel_cast(sel: SelectorAPI, u: UOp) -> None:
    if is_cconst(u):
        return
    x = u.src[0]
    fr, to = x.dtype.scalar(), u.dtype.scalar()
    if fr == to:
        sel.val[u] = sel.reg(x)
    elif to == dtypes.bool:
        sel.val[u] = to_bool(sel, x)
    elif dtypes.is_float(to):
        sel.val[u] = float_from_float(sel, x, to) if dtypes.is_float(fr) else float_from_int(sel, x, to)
    elif dtypes.is_float(fr):
        sel.val[u] = int_convert(sel, float_to_int64(sel, x), dtypes.int64, to)
    else:
        sel.val[u] = int_convert(sel, sel.reg(x), fr, to)


def to_bool(sel: SelectorAPI, x: UOp) -> VReg:
    if dtypes.is_float(x.dtype):
        n = x.dtype.itemsize
        z = sel.vec()
        sel.emit(FLOAT_OPS[("xor", n)], z, z, z)
        sel.emit(FLOAT_OPS[("ucomi", n)], sel.reg(x), z)
        t, p = sel.gpr(), sel.gpr()
        sel.emit(O.SETNE, t.sized(1))
        sel.emit(O.SETP, p.sized(1))
        sel.emit(O.OR, t.sized(1), p.sized(1))
        sel.emit(O.MOVZX, t.sized(4), t.sized(1))
        return t
    r = sel.reg(x)
    size = osize(x.dtype)
    sel.emit(O.TEST, r.sized(size), r.sized(size))
    return sel.setcc(O.SETNE)


def int_convert(sel: SelectorAPI, r: VReg, fr: DType, to: DType) -> VReg:
    """Integer/bool r of dtype fr as dtype to (wrap, sign- or zero-extend)."""
    d = sel.gpr()
    if to.itemsize == 8:
        if fr.itemsize == 8:
            sel.copy(d, r)
        elif dtypes.is_unsigned(fr) or fr == dtypes.bool:
            sel.emit(O.MOV, d.sized(4), r.sized(4))
        else:
            sel.emit(O.MOVSXD, d, r.sized(4))
    elif to.itemsize == 4:
        sel.emit(O.MOV, d.sized(4), r.sized(4))
    else:
        op = O.MOVZX if dtypes.is_unsigned(to) else O.MOVSX
        sel.emit(op, d.sized(4), r.sized(to.itemsize))
    return d


def float_from_float(sel: SelectorAPI, x: UOp, to: DType) -> VReg:
    r = sel.reg(x)
    d = sel.vec()
    sel.emit(O.VCVTSS2SD if to == dtypes.float64 else O.VCVTSD2SS, d, r, r)
    return d


def float_from_int(sel: SelectorAPI, x: UOp, to: DType) -> VReg:
    fr = x.dtype.scalar()
    r = sel.reg(x)
    d = sel.vec()
    sel.emit(O.VXORPS, d, d, d)  # breaks the dependency on d's old upper lanes
    if fr.itemsize < 8:
        src = r.sized(8) if fr == dtypes.uint32 else r.sized(4)  # uint32 is zero-extended: convert as int64
        sel.emit(FLOAT_OPS[("cvtsi", to.itemsize)], d, d, src)
        return d
    # 64-bit sources convert to float64 first; float32 then rounds from it, as the interpreter does
    if fr == dtypes.uint64:
        big, done = sel.label(), sel.label()
        sel.emit(O.TEST, r, r)
        sel.emit(O.JS, big)
        sel.emit(O.VCVTSI2SD, d, d, r)
        sel.emit(O.JMP, done)
        sel.items.append(big)
        h, lo = sel.gpr(), sel.gpr()  # halve with the dropped bit kept sticky, convert, double: rounds once
        sel.copy(h, r)
        sel.emit(O.SHR, h, Imm(1))
        sel.emit(O.MOV, lo.sized(4), r.sized(4))
        sel.emit(O.AND, lo.sized(4), Imm(1))
        sel.emit(O.OR, h, lo)
        sel.emit(O.VCVTSI2SD, d, d, h)
        sel.emit(O.VADDSD, d, d, d)
        sel.items.append(done)
    else:
        sel.emit(O.VCVTSI2SD, d, d, r)
    if to == dtypes.float32:
        f = sel.vec()
        sel.emit(O.VCVTSD2SS, f, d, d)
        return f
    return d


def float_to_int64(sel: SelectorAPI, x: UOp) -> VReg:
    """Truncate float x to int64 wrapping modulo 2**64 (NaN/inf -> 0), the bits of any integer target."""
    n = x.dtype.itemsize
    xr = sel.reg(x)
    r = sel.gpr()
    done = sel.label()
    sel.emit(FLOAT_OPS[("cvtt", n)], r, xr)
    # the "integer indefinite" 0x8000000000000000 marks NaN, inf and |x| >= 2**63 (and x == -2**63 itself):
    # only then take the exact slow path; r - 1 overflows exactly when r is that value
    sel.emit(O.CMP, r, Imm(1))
    sel.emit(O.JNO, done)
    dx = xr
    if n == 4:
        dx = sel.vec()
        sel.emit(O.VCVTSS2SD, dx, xr, xr)
    absmask = sel.rconst("<2Q", (1 << 63) - 1, (1 << 63) - 1).with_size(16)
    a, t, y, z = sel.vec(), sel.vec(), sel.vec(), sel.vec()
    big, sign = sel.label(), sel.label()
    sel.emit(O.XOR, r.sized(4), r.sized(4))
    sel.emit(O.VUCOMISD, dx, dx)
    sel.emit(O.JP, done)
    sel.emit(O.VANDPD, a, dx, absmask)
    sel.emit(O.VUCOMISD, a, sel.rconst("<d", float("inf"), align=8))
    sel.emit(O.JE, done)
    # y = x - 2**64 * trunc(x / 2**64): exact, in (-2**64, 2**64)
    sel.emit(O.VMULSD, t, dx, sel.rconst("<d", 2.0**-64, align=8))
    sel.emit(O.VROUNDSD, t, t, t, Imm(ROUND_TRUNC))
    sel.emit(O.VMULSD, t, t, sel.rconst("<d", 2.0**64, align=8))
    sel.emit(O.VSUBSD, y, dx, t)
    sel.emit(O.VANDPD, a, y, absmask)
    two63 = sel.rconst("<d", 2.0**63, align=8)
    sel.emit(O.VUCOMISD, a, two63)
    sel.emit(O.JAE, big)
    sel.emit(O.VCVTTSD2SI, r, a)
    sel.emit(O.JMP, sign)
    sel.items.append(big)
    sel.emit(O.VSUBSD, a, a, two63)
    sel.emit(O.VCVTTSD2SI, r, a)
    hb = sel.gpr()
    sel.emit(O.MOVABS, hb, Imm(1 << 63))
    sel.emit(O.XOR, r, hb)
    sel.items.append(sign)
    sel.emit(O.VXORPD, z, z, z)
    sel.emit(O.VUCOMISD, z, y)
    sel.emit(O.JBE, done)
    sel.emit(O.NEG, r)
    sel.items.append(done)
    return r


def sel_bitcast(sel: SelectorAPI, u: UOp) -> None:
    x = u.src[0]
    fr, to = x.dtype.scalar(), u.dtype.scalar()
    if fr.itemsize != to.itemsize:
        raise sel.fail(u, f"source {fr} has another size")
    r = sel.reg(x)
    if dtypes.is_float(fr) and dtypes.is_float(to):
        sel.val[u] = r
    elif dtypes.is_float(fr):
        d = sel.gpr()
        sel.emit(O.VMOVD if fr.itemsize == 4 else O.VMOVQ, d.sized(fr.itemsize), r)
        sel.val[u] = int_convert(sel, d, dtypes.uint32 if fr.itemsize == 4 else dtypes.uint64, to) \
            if to.itemsize < 4 else d  # fmt: skip
    elif dtypes.is_float(to):
        d = sel.vec()
        sel.emit(O.VMOVD if to.itemsize == 4 else O.VMOVQ, d, r.sized(to.itemsize))
        sel.val[u] = d
    else:
        sel.val[u] = int_convert(sel, r, fr, to)
