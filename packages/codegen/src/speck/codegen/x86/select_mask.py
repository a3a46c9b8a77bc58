"""Selection rules for bool vectors, held as lane masks: a bool vector of n lanes lives in an xmm (n <= 4) or ymm
register whose 32-bit lane i is all ones where lane i is true and zero where it is false - what vcmpps produces and
vblendvps consumes, lane for lane with the float32 vectors they come from and select between.

- comparisons of float32 vectors: vcmpps with the predicate of the interpreter's semantics (CMPNE is true for NaN,
  CMPLT and CMPEQ false); comparisons of masks: vxorps (!=), vpcmpeqd (==), vandnps (a < b is !a & b);
- AND/OR/XOR (bool ADD/MUL/MAX/SUB are legalized to these): vandps/vorps/vxorps;
- WHERE on masks, CAST to float32 (mask & 1.0) and from float32 (x != 0, NaN true);
- STACK of scalar bools (0/1 in general registers): negated and inserted lane by lane;
- GEP of one lane to a scalar bool: vmovmskps, then the lane's bit;
- LOAD/STORE of bool buffers (one byte per bool): 4 or 8 lanes widen with vpmovzxbd / narrow with vpackssdw,
  vpacksswb, vpabsb; other lane counts go byte by byte through general registers.
The rules are functions of (selector, uop), registered in speck.codegen.x86.select.SELECTION_TABLE under "bvec".
"""

from __future__ import annotations

from speck.codegen.regalloc import VReg
from speck.codegen.x86.operands import Imm, Mem
from speck.codegen.x86.ops import X86Op as O
from speck.codegen.x86.select_api import SelectorAPI
from speck.codegen.x86.select_common import is_cconst, mem_at, vec_bytes
from speck.uop import Ops, UOp, dtypes

FLOAT_CMP_PREDICATE = {Ops.CMPLT: 1, Ops.CMPEQ: 0, Ops.CMPNE: 4}
"""vcmpps imm8 per comparison: LT_OS, EQ_OQ (false on NaN), NEQ_UQ (true on NaN), as the interpreter compares."""
MASK_LOGIC = {Ops.AND: O.VANDPS, Ops.OR: O.VORPS, Ops.XOR: O.VXORPS}


def is_mask(u: UOp) -> bool:
    """A bool vector (held as a lane mask)."""
    return u.dtype.count > 1 and u.dtype.scalar() == dtypes.bool


def mask(sel: SelectorAPI, u: UOp) -> VReg:
    """The lane mask of bool vector u: its register, or for a literal the all-ones/zero constant."""
    if is_cconst(u):
        w = vec_bytes(u.dtype.count)
        bit = -1 if sel.const_value(u) else 0
        d = sel.vec(w)
        sel.emit(O.VMOVUPS, d, sel.rconst(f"<{w // 4}i", *([bit] * (w // 4)), align=32).with_size(None))
        return d
    return sel.reg(u)


def ones(sel: SelectorAPI, width: int) -> Mem:
    """An all-ones .rodata vector of `width` bytes."""
    return sel.rconst(f"<{width // 4}i", *([-1] * (width // 4)), align=32).with_size(width)


def sel_fvec_cmp(sel: SelectorAPI, u: UOp) -> None:
    a, b = u.src
    d = sel.vec(vec_bytes(u.dtype.count))
    sel.emit(O.VCMPPS, d, sel.reg(a), sel.reg(b), Imm(FLOAT_CMP_PREDICATE[u.op]))
    sel.val[u] = d


def sel_mask_cmp(sel: SelectorAPI, u: UOp) -> None:
    a, b = mask(sel, u.src[0]), mask(sel, u.src[1])
    d = sel.vec(a.size)
    if u.op is Ops.CMPNE:
        sel.emit(O.VXORPS, d, a, b)
    elif u.op is Ops.CMPEQ:
        sel.emit(O.VPCMPEQD, d, a, b)
    else:  # a < b for bools: !a & b
        sel.emit(O.VANDNPS, d, a, b)
    sel.val[u] = d


def sel_mask_logic(sel: SelectorAPI, u: UOp) -> None:
    a, b = mask(sel, u.src[0]), mask(sel, u.src[1])
    d = sel.vec(a.size)
    sel.emit(MASK_LOGIC[u.op], d, a, b)
    sel.val[u] = d


def sel_mask_not(sel: SelectorAPI, u: UOp) -> None:
    """NEG of a bool vector is its logical not."""
    a = mask(sel, u.src[0])
    d = sel.vec(a.size)
    sel.emit(O.VXORPS, d, a, ones(sel, a.size))
    sel.val[u] = d


def sel_mask_where(sel: SelectorAPI, u: UOp) -> None:
    c, a, b = u.src
    d = sel.vec(vec_bytes(u.dtype.count))
    sel.emit(O.VBLENDVPS, d, mask(sel, b), mask(sel, a), mask(sel, c))
    sel.val[u] = d


def sel_mask_from_float(sel: SelectorAPI, u: UOp) -> None:
    """CAST float32 vector -> bool vector: x != 0 (NaN is true)."""
    x = sel.reg(u.src[0])
    z, d = sel.vec(x.size), sel.vec(x.size)
    sel.emit(O.VXORPS, z, z, z)
    sel.emit(O.VCMPPS, d, x, z, Imm(FLOAT_CMP_PREDICATE[Ops.CMPNE]))
    sel.val[u] = d


def float_from_mask(sel: SelectorAPI, u: UOp) -> None:
    """CAST bool vector -> float32 vector: the mask ANDed with 1.0 in every lane."""
    m = mask(sel, u.src[0])
    d = sel.vec(m.size)
    one = sel.rconst(f"<{m.size // 4}f", *([1.0] * (m.size // 4)), align=32).with_size(m.size)
    sel.emit(O.VANDPS, d, m, one)
    sel.val[u] = d


def sel_mask_stack(sel: SelectorAPI, u: UOp) -> None:
    """A STACK of scalar bools (0/1 in general registers) as a lane mask: each negated to 0/-1 and inserted."""
    halves = []
    for h in range(0, u.dtype.count, 4):
        part = sel.vec(16)
        for i, b in enumerate(u.src[h : h + 4]):
            k = sel.gpr()
            if is_cconst(b):
                sel.emit(O.MOV, k.sized(4), Imm(-1 if sel.const_value(b) else 0))
            else:
                sel.emit(O.MOV, k.sized(4), sel.reg(b).sized(4))
                sel.emit(O.NEG, k.sized(4))  # 0/1 -> 0/-1
            if i == 0:
                sel.emit(O.VMOVD, part, k.sized(4))
            else:
                sel.emit(O.VPINSRD, part, part, k.sized(4), Imm(i))
        halves.append(part)
    if len(halves) == 1:
        sel.val[u] = halves[0]
        return
    d = sel.vec(32)
    sel.emit(O.VINSERTF128, d, halves[0].sized(32), halves[1], Imm(1))
    sel.val[u] = d


def mask_lane(sel: SelectorAPI, m: VReg, k: int) -> VReg:
    """Lane k of a lane mask as a scalar bool (0/1 in a general register): bit k of vmovmskps."""
    d = sel.gpr()
    sel.emit(O.VMOVMSKPS, d.sized(4), m)
    if k:
        sel.emit(O.SHR, d.sized(4), Imm(k))
    sel.emit(O.AND, d.sized(4), Imm(1))
    return d


def load_mask(sel: SelectorAPI, mem: Mem, count: int) -> VReg:
    """`count` bools (bytes 0/1) from memory as a lane mask."""
    w = vec_bytes(count)
    if count in (4, 8):
        t, z, d = sel.vec(w), sel.vec(w), sel.vec(w)
        sel.emit(O.VPMOVZXBD, t, mem.with_size(count))
        sel.emit(O.VPXOR, z, z, z)
        sel.emit(O.VPSUBD, d, z, t)  # 0/1 -> 0/-1
        return d
    halves = []
    for h in range(0, count, 4):
        part = sel.vec(16)
        for i in range(h, min(h + 4, count)):
            k = sel.gpr()
            sel.emit(O.MOVZX, k.sized(4), mem_at(mem, i, 1))
            sel.emit(O.NEG, k.sized(4))
            if i == h:
                sel.emit(O.VMOVD, part, k.sized(4))
            else:
                sel.emit(O.VPINSRD, part, part, k.sized(4), Imm(i - h))
        halves.append(part)
    if len(halves) == 1:
        return halves[0]
    d = sel.vec(32)
    sel.emit(O.VINSERTF128, d, halves[0].sized(32), halves[1], Imm(1))
    return d


def store_mask(sel: SelectorAPI, mem: Mem, m: VReg, count: int) -> None:
    """Store lanes 0..count-1 of lane mask m as `count` bools (bytes 0/1), writing exactly those bytes."""
    if count in (4, 8):
        lo = m.sized(16)
        hi = lo
        if count == 8:
            hi = sel.vec(16)
            sel.emit(O.VEXTRACTF128, hi, m.sized(32), Imm(1))
        w, b, one = sel.vec(16), sel.vec(16), sel.vec(16)
        sel.emit(O.VPACKSSDW, w, lo, hi)  # dword masks -> word masks (-1 stays -1)
        sel.emit(O.VPACKSSWB, b, w, w)  # -> byte masks
        sel.emit(O.VPABSB, one, b)  # -1 -> 1
        sel.emit(O.VMOVD if count == 4 else O.VMOVQ, mem.with_size(count), one)
        return
    bits = sel.gpr()
    sel.emit(O.VMOVMSKPS, bits.sized(4), m)
    for i in range(count):
        k = sel.gpr()
        sel.emit(O.MOV, k.sized(4), bits.sized(4))
        if i:
            sel.emit(O.SHR, k.sized(4), Imm(i))
        sel.emit(O.AND, k.sized(4), Imm(1))
        sel.emit(O.MOV, mem_at(mem, i, 1), k.sized(1))


__all__ = [
    "FLOAT_CMP_PREDICATE", "float_from_mask", "is_mask", "load_mask", "mask", "mask_lane", "sel_fvec_cmp",
    "sel_mask_cmp", "sel_mask_from_float", "sel_mask_logic", "sel_mask_not", "sel_mask_stack", "sel_mask_where",
    "store_mask",
]  # fmt: skip
