"""Selection rules for 16-lane vectors in zmm registers (AVX-512F): float32 vectors and bool vectors.

A float32.vec(16) value lives in a zmm register of class "zvec" (zmm16..31, which only EVEX can name), so it never
meets a VEX-only instruction: every instruction touching it is a 512-bit EVEX form (AVX-512F alone, no VL/DQ/BW),
and its parts move to the VEX world through vextractf64x4/vextractf32x4 into ordinary ("vec") registers.

A bool.vec(16) is held like the AVX2 lane masks: a zmm whose 32-bit lanes are all ones (true) or zero. Opmask
registers carry a mask only between two adjacent instructions (a compare into k1, then the masked
instruction using it), so they need no allocation: k1 is written and read by consecutive instructions of one rule.

- arithmetic: vaddps/vsubps/vmulps/vdivps/vfmadd231ps (select_vector's rules at zmm width), vsqrtps, vrndscaleps
  (TRUNC), vpxord with a broadcast sign mask (NEG), MAX as vmaxps + vcmpunordps k1 + vblendmps (NaN propagation);
- compares: vcmpps k1 then vmovups zmm{k1}{z} of all-ones; WHERE: vpcmpneqd k1 of the mask, vblendmps;
  mask logic vpandd/vpord/vpxord/vpandnd; CAST bool -> float: vpandd with a broadcast 1.0;
- LOAD/STORE of 16 contiguous float32s: vmovups; a gated load (scalar gate) as vmovups zmm{k1}{z} with k1 all
  ones or all zero (masked-off lanes never fault); a gated store (the pipeline splits those into lanes; a whole one
  would take the AVX2 path's address select into the 64-byte red-zone scratch slot);
- STACK: a .rodata literal, vbroadcastss of one value, or four xmm quarters joined by vinsertf128/vinsertf64x4;
- GEP: lanes of a zmm through vextractf32x4/vextractf64x4, then the xmm/ymm rules; 16 lanes of a narrower vector (a
  row operand broadcast over a column block) as a zmm too: vbroadcastss, or xmm quarters joined.
`zmm_refusal` says up front which 16-lane forms these rules do not take (the renderer refuses such a kernel, and the
registry renders it for AVX2 instead).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from speck.codegen.regalloc import VReg
from speck.codegen.x86.operands import Imm, Mem, Opmask, kreg
from speck.codegen.x86.ops import X86Op as O
from speck.codegen.x86.select_common import is_cconst
from speck.codegen.x86.select_vector import _broadcast_lane, _lane, sel_gep, sel_stack, xmm_quarters
from speck.uop import GroupOp, Ops, UOp, dtypes

if TYPE_CHECKING:
    from speck.codegen.x86.select import Selector

ZMM_LANES = 16
K1 = kreg(1)
ON_K1, ON_K1_ZERO = Opmask(1), Opmask(1, True)
SIGN_BIT, ONE_F32, ALL_ONES = 0x80000000, 0x3F800000, 0xFFFFFFFF
FLOAT_CMP_PREDICATE = {Ops.CMPLT: 1, Ops.CMPEQ: 0, Ops.CMPNE: 4}  # as select_mask: LT_OS, EQ_OQ, NEQ_UQ
MASK_LOGIC = {Ops.AND: O.VPANDD, Ops.OR: O.VPORD, Ops.XOR: O.VPXORD}


def is_wide(u: UOp) -> bool:
    """A float32 or bool vector of more than 8 lanes (a zmm value)."""
    return u.dtype.count > 8 and u.dtype.scalar() in (dtypes.float32, dtypes.bool)


def bcast_const(sel: Selector, bits: int) -> Mem:
    """A 32-bit .rodata constant read as an embedded broadcast ({1to16}): one element for the whole vector."""
    m = sel.rconst("<I", bits, align=4)
    return Mem(m.base, m.index, m.scale, m.disp, None, m.symbol, True)


def zmask(sel: Selector, u: UOp) -> VReg:
    """The lane mask (zmm of 0/-1 dwords) of a 16-lane bool vector."""
    if is_cconst(u):
        d = sel.vec(64)
        if sel.const_value(u):
            sel.emit(O.VMOVUPS, d, sel.rconst("<16I", *([ALL_ONES] * 16), align=64).with_size(None))
        else:
            sel.emit(O.VPXORD, d, d, d)
        return d
    return sel.reg(u)


def from_k1(sel: Selector) -> VReg:
    """k1 as a lane mask in a fresh zmm (all-ones lanes where k1 is set, zero elsewhere)."""
    d = sel.vec(64)
    sel.emit(O.VMOVUPS, d, sel.rconst("<16I", *([ALL_ONES] * 16), align=64).with_size(None), ON_K1_ZERO)
    return d


def to_k1(sel: Selector, m: VReg) -> None:
    """k1 = the lanes of mask m that are set (dword != 0)."""
    sel.emit(O.VPCMPD, K1, m, bcast_const(sel, 0), Imm(4))


def gate_to_k1(sel: Selector, gate: UOp) -> None:
    """k1 = all 16 lanes when the scalar bool gate is true, none when false."""
    g = sel.reg(gate)
    t = sel.gpr()
    sel.emit(O.MOV, t.sized(4), g.sized(4))
    sel.emit(O.NEG, t.sized(4))  # 0/1 -> 0/-1: the low 16 bits are the lane bits
    sel.emit(O.KMOVW, K1, t.sized(4))


# ---- float32 vectors ---------------------------------------------------------------------------------------------
def sel_zunary(sel: Selector, u: UOp) -> None:
    x = sel.reg(u.src[0])
    d = sel.vec(64)
    if u.op is Ops.NEG:
        sel.emit(O.VPXORD, d, x, bcast_const(sel, SIGN_BIT))
    elif u.op is Ops.SQRT:
        sel.emit(O.VSQRTPS, d, x)
    elif u.op is Ops.TRUNC:
        sel.emit(O.VRNDSCALEPS, d, x, Imm(3))  # scale 0, round toward zero
    else:
        raise sel.fail(u)
    sel.val[u] = d


def splat_value(sel: Selector, u: UOp) -> float | None:
    """The value of a literal with one value in every lane (a casted const, or a STACK of equal ones), else None."""
    if is_cconst(u):
        return float(sel.const_value(u))
    if u.op is Ops.STACK and all(is_cconst(s) for s in u.src):
        vals = {float(sel.const_value(s)) for s in u.src}
        return vals.pop() if len(vals) == 1 else None
    return None


def sel_zmax(sel: Selector, u: UOp) -> None:
    # numpy.maximum lane by lane: vmaxps(b, a) = b > a ? b : a, then b wherever b is NaN
    a, b = u.src
    if splat_value(sel, a) is not None and splat_value(sel, b) is None:
        a, b = b, a
    if (v := splat_value(sel, b)) is not None and v == v:  # a literal that is not NaN (relu's 0)
        d = sel.vec(64)
        sel.emit(O.VMAXPS, d, sel.reg(b), sel.reg(a))  # a NaN a is the second operand: vmaxps returns it
        sel.val[u] = d
        return
    ra, rb = sel.reg(a), sel.reg(b)
    t, d = sel.vec(64), sel.vec(64)
    sel.emit(O.VMAXPS, t, rb, ra)
    sel.emit(O.VCMPPS, K1, rb, rb, Imm(3))
    sel.emit(O.VBLENDMPS, d, t, rb, ON_K1)
    sel.val[u] = d


def fused_compares(uops: list[UOp], users: dict[UOp, list[UOp]]) -> set[UOp]:
    """16-lane float32 compares whose one user is a WHERE reading them as its condition: the WHERE emits the
    compare into k1 right before its vblendmps, so the mask never becomes a register."""
    out: set[UOp] = set()
    for u in uops:
        if u.op in GroupOp.Comparison and u.src[0].dtype == dtypes.float32.vec(ZMM_LANES):
            us = users.get(u, [])
            if len(us) == 1 and us[0].op is Ops.WHERE and us[0].src[0] is u and u not in us[0].src[1:]:
                out.add(u)
    return out


def sel_zwhere(sel: Selector, u: UOp) -> None:
    c, a, b = u.src
    if c in sel.kfused:
        sel.emit(O.VCMPPS, K1, sel.reg(c.src[0]), sel.reg(c.src[1]), Imm(FLOAT_CMP_PREDICATE[c.op]))
    else:
        to_k1(sel, zmask(sel, c))
    d = sel.vec(64)
    sel.emit(O.VBLENDMPS, d, zmask(sel, b) if is_wide_bool(u) else sel.reg(b),
             zmask(sel, a) if is_wide_bool(u) else sel.reg(a), ON_K1)  # fmt: skip
    sel.val[u] = d


def is_wide_bool(u: UOp) -> bool:
    return u.dtype.scalar() == dtypes.bool


def sel_zcmp(sel: Selector, u: UOp) -> None:
    """A comparison of two float32 vectors: vcmpps into k1, then the lane mask."""
    a, b = u.src
    sel.emit(O.VCMPPS, K1, sel.reg(a), sel.reg(b), Imm(FLOAT_CMP_PREDICATE[u.op]))
    sel.val[u] = from_k1(sel)


def sel_zcast(sel: Selector, u: UOp) -> None:
    """CAST to float32.vec(16): only from a bool vector (the mask ANDed with 1.0)."""
    if u.src[0].dtype.scalar() != dtypes.bool:
        raise sel.fail(u, f"only bool vectors cast to float32 vectors (got {u.src[0].dtype})")
    d = sel.vec(64)
    sel.emit(O.VPANDD, d, zmask(sel, u.src[0]), bcast_const(sel, ONE_F32))
    sel.val[u] = d


def sel_zstack(sel: Selector, u: UOp) -> None:
    srcs = u.src
    if all(is_cconst(s) for s in srcs) or all(s is srcs[0] for s in srcs):
        sel_stack(sel, u)  # a literal (.rodata) or one value in every lane (vbroadcastss): any width
        return
    sel.val[u] = join(sel, xmm_quarters(sel, srcs[:ZMM_LANES]))


def join(sel: Selector, quarters: list[VReg]) -> VReg:
    """Four xmm quarters (lanes 0-3, 4-7, 8-11, 12-15) as one zmm."""
    halves = []
    for lo, hi in (quarters[0:2], quarters[2:4]):
        h = sel.vec(32)
        sel.emit(O.VINSERTF128, h, lo.sized(32), hi, Imm(1))
        halves.append(h)
    d = sel.vec(64)
    sel.emit(O.VINSERTF64X4, d, halves[0].sized(64), halves[1], Imm(1))
    return d


def quarter(sel: Selector, x: VReg, q: int) -> VReg:
    """Lanes 4q..4q+3 of zmm x in a fresh xmm."""
    d = sel.vec(16)
    sel.emit(O.VEXTRACTF32X4, d, x, Imm(q))
    return d


def half(sel: Selector, x: VReg, h: int) -> VReg:
    """Lanes 8h..8h+7 of zmm x in a fresh ymm."""
    d = sel.vec(32)
    sel.emit(O.VEXTRACTF64X4, d, x, Imm(h))
    return d


def sel_any_gep(sel: Selector, u: UOp) -> None:
    """GEP of any vector: lanes of a zmm here, 16 lanes of a ymm/xmm here too (widened into a zmm), other lanes of a
    ymm/xmm (or a broadcast load) in select_vector."""
    if u.src[0] in sel.bcast_loads:
        sel_gep(sel, u)
    elif u.src[0].dtype.count > 8:
        sel_zgep(sel, u)
    elif u.dtype.count > 8:
        sel_zgep_narrow(sel, u)
    else:
        sel_gep(sel, u)


def sel_zgep_narrow(sel: Selector, u: UOp) -> None:
    """16 lanes of a float32 vector of at most 8 lanes (an xmm/ymm; an upcast axis broadcast over a wider one): one
    lane everywhere is a vbroadcastss into the zmm, else each distinct quarter is built in an xmm (the low half as
    it is, the high half by vextractf128, one repeated lane by vbroadcastss, else vinsertps lane by lane) and the
    quarters are joined. The result is always a zmm: every user of a 16-lane value reads one."""
    x = u.src[0]
    if x.dtype.scalar() != dtypes.float32:
        raise sel.fail(u, f"16 lanes are taken from float32 vectors only (got {x.dtype})")
    lanes = tuple(u.arg)
    if len(lanes) != ZMM_LANES:
        raise sel.fail(u, f"a zmm holds 16 lanes, not {len(lanes)}")
    r = sel.reg(x)
    if len(set(lanes)) == 1:
        sel.val[u] = _broadcast_lane(sel, r, lanes[0], 64)
        return
    halves: dict[int, VReg] = {0: r.sized(16)}

    def half_of(k: int) -> VReg:  # the xmm holding lane k of x (lanes 4..7 extracted once)
        if k // 4 not in halves:
            hi = halves[1] = sel.vec(16)
            sel.emit(O.VEXTRACTF128, hi, r.sized(32), Imm(1))
        return halves[k // 4]

    built: dict[tuple[int, ...], VReg] = {}
    quarters = []
    for q in range(0, ZMM_LANES, 4):
        ls = lanes[q : q + 4]
        if ls not in built:
            if ls[0] % 4 == 0 and ls == tuple(range(ls[0], ls[0] + 4)):
                built[ls] = half_of(ls[0])
            elif len(set(ls)) == 1:
                built[ls] = _broadcast_lane(sel, r, ls[0], 16)
            else:
                part = _lane(sel, r, ls[0])
                for i, k in enumerate(ls[1:], start=1):  # vinsertps: source lane in imm[7:6], target in imm[5:4]
                    sel.emit(O.VINSERTPS, part, part, half_of(k), Imm(((k % 4) << 6) | (i << 4)))
                built[ls] = part
        quarters.append(built[ls])
    sel.val[u] = join(sel, quarters)


def sel_zgep(sel: Selector, u: UOp) -> None:
    """Lanes of a 16-lane float32 vector (or one lane of a bool vector, as a scalar bool)."""
    x = u.src[0]
    lanes = tuple(u.arg)
    if x.dtype.scalar() == dtypes.bool:
        if len(lanes) != 1:
            raise sel.fail(u, "lanes of a 16-lane bool vector are taken one at a time")
        to_k1(sel, zmask(sel, x))
        d = sel.gpr()
        sel.emit(O.KMOVW, d.sized(4), K1)
        if lanes[0]:
            sel.emit(O.SHR, d.sized(4), Imm(lanes[0]))
        sel.emit(O.AND, d.sized(4), Imm(1))
        sel.val[u] = d
        return
    r = sel.reg(x)
    n = len(lanes)
    cache: dict[int, VReg] = {}

    def lane(k: int) -> VReg:
        if k // 4 not in cache:
            cache[k // 4] = quarter(sel, r, k // 4)
        return _lane(sel, cache[k // 4], k % 4)

    if n == 1:
        sel.val[u] = lane(lanes[0])
        return
    if n == 8 and lanes in (tuple(range(8)), tuple(range(8, 16))):
        sel.val[u] = half(sel, r, lanes[0] // 8)
        return
    if n == 4 and lanes[0] % 4 == 0 and lanes == tuple(range(lanes[0], lanes[0] + 4)):
        sel.val[u] = quarter(sel, r, lanes[0] // 4)
        return
    if len(set(lanes)) == 1:  # one lane in every lane: broadcast it from its quarter
        sel.val[u] = _broadcast_lane(sel, quarter(sel, r, lanes[0] // 4), lanes[0] % 4, 16 if n <= 4 else 32 if n <= 8
                                     else 64)  # fmt: skip
        return
    parts = []
    for h in range(0, n, 4):
        part = lane(lanes[h])
        for i, k in enumerate(lanes[h + 1 : h + 4], start=1):
            sel.emit(O.VINSERTPS, part, part, lane(k), Imm(i << 4))
        parts.append(part)
    if n <= 4:
        sel.val[u] = parts[0]
    elif n <= 8:
        d = sel.vec(32)
        sel.emit(O.VINSERTF128, d, parts[0].sized(32), parts[1], Imm(1))
        sel.val[u] = d
    else:
        sel.val[u] = join(sel, parts)


# ---- bool vectors (lane masks) -------------------------------------------------------------------------------------
def sel_kcmp_float(sel: Selector, u: UOp) -> None:
    sel_zcmp(sel, u)


def sel_klogic(sel: Selector, u: UOp) -> None:
    a, b = zmask(sel, u.src[0]), zmask(sel, u.src[1])
    d = sel.vec(64)
    if u.op is Ops.CMPNE:
        sel.emit(O.VPXORD, d, a, b)
    elif u.op is Ops.CMPLT:  # a < b for bools: !a & b
        sel.emit(O.VPANDND, d, a, b)
    else:
        sel.emit(MASK_LOGIC[u.op], d, a, b)
    sel.val[u] = d


def sel_knot(sel: Selector, u: UOp) -> None:
    d = sel.vec(64)
    sel.emit(O.VPXORD, d, zmask(sel, u.src[0]), bcast_const(sel, ALL_ONES))
    sel.val[u] = d


def sel_kstack(sel: Selector, u: UOp) -> None:
    """A STACK of 16 scalar bools (0/1 in general registers): bit i of a general register is lane i, moved to k1
    (kmovw) and widened to a lane mask."""
    bits = sel.gpr()
    const_bits = sum(1 << i for i, b in enumerate(u.src) if is_cconst(b) and sel.const_value(b))
    sel.emit(O.MOV, bits.sized(4), Imm(const_bits))
    for i, b in enumerate(u.src):
        if is_cconst(b):
            continue
        t = sel.gpr()
        sel.emit(O.MOV, t.sized(4), sel.reg(b).sized(4))
        if i:
            sel.emit(O.SHL, t.sized(4), Imm(i))
        sel.emit(O.OR, bits.sized(4), t.sized(4))
    sel.emit(O.KMOVW, K1, bits.sized(4))
    sel.val[u] = from_k1(sel)


def sel_kfrom_float(sel: Selector, u: UOp) -> None:
    """CAST float32.vec(16) -> bool: x != 0 (NaN is true)."""
    z = sel.vec(64)
    sel.emit(O.VPXORD, z, z, z)
    sel.emit(O.VCMPPS, K1, sel.reg(u.src[0]), z, Imm(FLOAT_CMP_PREDICATE[Ops.CMPNE]))
    sel.val[u] = from_k1(sel)


# ---- memory ---------------------------------------------------------------------------------------------------------
def gated_load(sel: Selector, mem: Mem, gate: UOp, alt: UOp | None) -> VReg:
    """16 float32s from mem where the scalar gate holds, else the alternative value (zero when None)."""
    gate_to_k1(sel, gate)
    d = sel.vec(64)
    sel.emit(O.VMOVUPS, d, mem.with_size(None), ON_K1_ZERO)
    if alt is None or all(is_cconst(x) and sel.const_value(x) == 0 and not _negative_zero(sel, x)
                          for x in (alt.src if alt.op is Ops.STACK else (alt,))):  # fmt: skip
        return d  # {z} already put +0.0 in the gated-off lanes
    out = sel.vec(64)
    other = sel.reg(alt)
    sel.emit(O.VBLENDMPS, out, other, d, ON_K1)
    return out


def _negative_zero(sel: Selector, u: UOp) -> bool:
    v = sel.const_value(u)
    return isinstance(v, float) and str(v).startswith("-")


# ---- what the rules above take ---------------------------------------------------------------------------------------
# (before legalization: RECIPROCAL becomes FDIV, bool ADD/MAX/MUL/SUB become OR/AND/XOR)
_FLOAT_OPS = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.NEG, Ops.SQRT, Ops.TRUNC, Ops.MAX, Ops.WHERE,
                        Ops.LOAD, Ops.STACK, Ops.GEP, Ops.CAST, Ops.CONST, Ops.RECIPROCAL})  # fmt: skip
_BOOL_OPS = frozenset({Ops.AND, Ops.OR, Ops.XOR, Ops.NEG, Ops.WHERE, Ops.CAST, Ops.CONST, Ops.STACK, Ops.ADD,
                       Ops.MAX, Ops.MUL, Ops.SUB, *GroupOp.Comparison})  # fmt: skip
_USERS = frozenset({Ops.GEP, Ops.STORE, Ops.CAST, Ops.WHERE, Ops.INDEX, Ops.LOAD, Ops.NOOP, *GroupOp.ALU})
# ops zmm_refusal tests per UOp, as module constants: in Python 3.11 each `Ops.X` goes through the enum metaclass's
# __getattr__ hook, several times the cost of reading a global
_INDEX, _WHERE, _CAST, _CMPEQ, _STORE, _GEP, _LOAD = (
    Ops.INDEX, Ops.WHERE, Ops.CAST, Ops.CMPEQ, Ops.STORE, Ops.GEP, Ops.LOAD)  # fmt: skip


def zmm_refusal(uops: list[UOp]) -> tuple[UOp, str] | None:
    """The first UOp of a program with a 16-lane form the zmm rules do not take, and why; None when they take all
    of it. Checked by the AVX-512 renderer before any work, so the kernel can be rendered for AVX2 instead."""
    for u in uops:
        if u.dtype.count <= 8:  # (most UOps: nothing here has more than 8 lanes, so nothing is a zmm value)
            for s in u.src:
                if s.dtype.count > 8:
                    break
            else:
                continue
        wide_srcs = [s for s in u.src if is_wide(s) and s.op is not _INDEX]
        if is_wide(u):
            if u.dtype.count != ZMM_LANES:
                return u, f"{u.dtype.count} lanes (only 8 or 16 fit a register)"
            if u.op is _WHERE and not is_wide(u.src[0]):
                return u, "a WHERE of 16-lane values takes a 16-lane condition"
            if u.dtype.scalar() == dtypes.float32:
                if u.op not in _FLOAT_OPS and u.op not in GroupOp.Comparison:
                    return u, "no zmm rule"
                if u.op is _CAST and u.src[0].dtype.scalar() != dtypes.bool:
                    return u, "only bool vectors cast to float32 vectors"
            else:
                if u.op not in _BOOL_OPS:
                    return u, "16-lane bool vectors are computed, not loaded or stored"
                if u.op in GroupOp.Comparison and u.src[0].dtype.scalar() == dtypes.bool and u.op is _CMPEQ:
                    return u, "no == of bool vectors on zmm"
                if u.op is _CAST and u.src[0].dtype.scalar() != dtypes.float32:
                    return u, "bool vectors come from float32 vectors only"
        for s in wide_srcs:
            if s.dtype.count != ZMM_LANES:
                return u, f"{s.dtype.count} lanes (only 8 or 16 fit a register)"
            if u.op not in _USERS:
                return u, f"{u.op.name} of a 16-lane vector"
            if s.dtype.scalar() == dtypes.bool and u.op is _STORE:
                return u, "stores of 16-lane bool vectors"
            if u.op is _GEP and s.dtype.scalar() == dtypes.bool and (len(u.arg) != 1):
                return u, "lanes of a 16-lane bool vector are taken one at a time"
        if u.op is _LOAD and is_wide(u) and len(u.src[0].src) > 2 and u.src[0].src[2].dtype.count != 1:
            return u, "a gate per lane"
        if u.op is _STORE and is_wide(u.src[1]) and len(u.src[0].src) > 2 and u.src[0].src[2].dtype.count != 1:
            return u, "a gate per lane"
    return None


__all__ = [
    "gated_load", "is_wide", "sel_any_gep", "sel_kcmp_float", "sel_kfrom_float", "sel_klogic", "sel_knot",
    "sel_kstack", "sel_zcast", "sel_zcmp", "sel_zgep", "sel_zgep_narrow", "sel_zmax", "sel_zstack", "sel_zunary",
    "sel_zwhere", "zmask", "zmm_refusal",
]  # fmt: skip
