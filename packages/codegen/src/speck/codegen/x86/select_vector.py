"""Selection rules for float32 vectors (2..8 lanes in an xmm/ymm register; AVX/AVX2, no AVX-512).

The X86Renderer gives float32 and bool 8 lanes and every other dtype 1 (`max_vec_lanes`), so the pipeline leaves
only float32 vectors and bool vectors (lane masks, select_mask.py): contiguous LOAD/STORE (vmovups; 2, 3, 5, 6, 7
lanes put together from pieces), packed ALU (vaddps...; with fp_contract a*b+c as vfmadd231ps), MAX with NaN
propagation (vmaxps + vcmpunordps + vblendvps), STACK (vbroadcastss for one repeated value, a .rodata constant for
literals, vinsertps/vinsertf128 lane inserts otherwise), GEP (vinsertps/vextractf128 lane extracts; one lane in
every lane is vbroadcastss, straight from memory when the vector is a load read only that way), and WHERE on a lane
mask (vblendvps). The rules are functions of (selector, uop), registered in speck.codegen.x86.select.SELECTION_TABLE
under the "fvec" class.
"""

from __future__ import annotations

import struct

from speck.codegen.regalloc import VReg
from speck.codegen.x86.operands import Imm, Operand, rodata
from speck.codegen.x86.ops import X86Op as O
from speck.codegen.x86.select_api import SelectorAPI
from speck.codegen.x86.select_common import is_cconst, mem_at, vec_bytes
from speck.codegen.x86.select_float import sel_fma
from speck.codegen.x86.select_mask import float_from_mask, is_mask, mask, mask_lane
from speck.uop import Ops, UOp, dtypes

PACKED: dict[Ops, O] = {Ops.ADD: O.VADDPS, Ops.SUB: O.VSUBPS, Ops.MUL: O.VMULPS, Ops.FDIV: O.VDIVPS}
_COMMUTATIVE = frozenset({Ops.ADD, Ops.MUL})  # (a set: Ops compare slowly with ==, see select._ARGUMENTS)
"""Packed float32 ALU ops (dst, src1, src2/mem), xmm or ymm by the operands' width."""


def _width(count: int) -> int:
    return vec_bytes(count)


def sel_vec_binary(sel: SelectorAPI, u: UOp) -> None:
    if u in sel.fma:
        sel_fma(sel, u)
        return
    a, b = u.src
    if (a in sel.mem_operands or a in sel.bcast_stacks) and u.op in _COMMUTATIVE:
        a, b = b, a
    d = sel.vec(_width(u.dtype.count))
    src = sel.mem_operand(b) if b in sel.mem_operands else sel.bcast_operand(b) if b in sel.bcast_stacks else sel.reg(b)
    sel.emit(PACKED[u.op], d, sel.reg(a), src)
    sel.val[u] = d


def sel_vec_unary(sel: SelectorAPI, u: UOp) -> None:
    w = _width(u.dtype.count)
    x = sel.reg(u.src[0])
    d = sel.vec(w)
    if u.op is Ops.NEG:
        mask = sel.rconst(f"<{w // 4}I", *([0x80000000] * (w // 4)), align=32)
        sel.emit(O.VXORPS, d, x, mask.with_size(w))
    elif u.op is Ops.SQRT:
        sel.emit(O.VSQRTPS, d, x)
    elif u.op is Ops.TRUNC:
        sel.emit(O.VROUNDPS, d, x, Imm(3))
    else:
        raise sel.fail(u)
    sel.val[u] = d


def sel_vec_max(sel: SelectorAPI, u: UOp) -> None:
    # numpy.maximum lane by lane: vmaxps(b, a) = b > a ? b : a, then b wherever b is NaN
    w = _width(u.dtype.count)
    ra, rb = sel.reg(u.src[0]), sel.reg(u.src[1])
    t, m, d = sel.vec(w), sel.vec(w), sel.vec(w)
    sel.emit(O.VMAXPS, t, rb, ra)
    sel.emit(O.VCMPPS, m, rb, rb, Imm(3))
    sel.emit(O.VBLENDVPS, d, t, rb, m)
    sel.val[u] = d


def _join(sel: SelectorAPI, halves: list[VReg]) -> VReg:
    if len(halves) == 1:
        return halves[0]
    d = sel.vec(32)
    sel.emit(O.VINSERTF128, d, halves[0].sized(32), halves[1], Imm(1))
    return d


def sel_vec_where(sel: SelectorAPI, u: UOp) -> None:
    c, a, b = u.src
    m = mask(sel, c)
    d = sel.vec(_width(u.dtype.count))
    sel.emit(O.VBLENDVPS, d, sel.reg(b), sel.reg(a), m)
    sel.val[u] = d


def sel_stack(sel: SelectorAPI, u: UOp) -> None:
    n = u.dtype.count
    w = _width(n)
    srcs = u.src
    if all(is_cconst(s) for s in srcs):  # a vector literal: one .rodata constant
        vals = [float(sel.const_value(s)) for s in srcs]
        vals += [0.0] * (w // 4 - n)
        raw = struct.pack(f"<{w // 4}f", *vals)
        d = sel.vec(w)
        sel.emit(O.VMOVUPS, d, rodata(sel.pool.add(raw, 32), w))
        sel.val[u] = d
        return
    if all(s is srcs[0] for s in srcs):  # one value in every lane
        d = sel.vec(w)
        src: Operand = sel.fconst(srcs[0]).with_size(4) if is_cconst(srcs[0]) else sel.reg(srcs[0])
        sel.emit(O.VBROADCASTSS, d, src)
        sel.val[u] = d
        return
    sel.val[u] = _join(sel, xmm_quarters(sel, srcs[:n]))


def _lane(sel: SelectorAPI, x: VReg, k: int) -> VReg:
    """Lane k of vector x in lane 0 of a fresh xmm (other lanes zero)."""
    src = x.sized(16)
    if k >= 4:
        hi = sel.vec(16)
        sel.emit(O.VEXTRACTF128, hi, x, Imm(1))
        src, k = hi, k - 4
    d = sel.vec(16)
    sel.emit(O.VINSERTPS, d, src, src, Imm((k << 6) | 0b1110))
    return d


def sel_vec_cast(sel: SelectorAPI, u: UOp) -> None:
    """CAST to a float32 vector: only bool vectors (lane masks) reach here; other vectors are scalars on x86."""
    if not is_mask(u.src[0]):
        raise sel.fail(u, f"only bool vectors cast to float32 vectors (got {u.src[0].dtype})")
    float_from_mask(sel, u)


def xmm_quarters(sel: SelectorAPI, srcs: tuple[UOp, ...]) -> list[VReg]:
    """Scalars gathered four at a time into xmm registers (vinsertps), for a wider vector to join."""
    parts = []
    for h in range(0, len(srcs), 4):
        part = sel.vec(16)
        sel.emit(O.VMOVAPS, part, sel.reg(srcs[h]))
        for i, s in enumerate(srcs[h + 1 : h + 4], start=1):
            sel.emit(O.VINSERTPS, part, part, sel.reg(s), Imm(i << 4))
        parts.append(part)
    return parts


def sel_gep(sel: SelectorAPI, u: UOp) -> None:
    x = u.src[0]
    if x.dtype.scalar() not in (dtypes.float32, dtypes.bool):
        raise sel.fail(u, "only float32 and bool vectors have vector registers")
    lanes = tuple(u.arg)
    if len(lanes) == 1 and x.dtype.scalar() == dtypes.bool:  # a scalar bool from a lane mask
        sel.val[u] = mask_lane(sel, mask(sel, x), lanes[0])
        return
    if x in sel.bcast_loads:  # the lane straight from memory
        lane = mem_at(sel.address(x.src[0]), 4 * lanes[0], 4)
        d = sel.vec(_width(len(lanes)))
        sel.emit(O.VBROADCASTSS if len(lanes) > 1 else O.VMOVSS, d, lane)
        sel.val[u] = d
        return
    r = mask(sel, x) if is_mask(x) else sel.reg(x)
    if len(lanes) == 1:
        sel.val[u] = _lane(sel, r, lanes[0])
        return
    if len(set(lanes)) == 1:  # one lane in every lane
        sel.val[u] = _broadcast_lane(sel, r, lanes[0], _width(len(lanes)))
        return
    if lanes == tuple(range(len(lanes))) and len(lanes) <= 4:  # the low lanes: the xmm half
        d = sel.vec(16)
        sel.emit(O.VMOVAPS, d, r.sized(16))
        sel.val[u] = d
        return
    if lanes == (4, 5, 6, 7):
        d = sel.vec(16)
        sel.emit(O.VEXTRACTF128, d, r, Imm(1))
        sel.val[u] = d
        return
    halves = []
    for h in range(0, len(lanes), 4):
        part = _lane(sel, r, lanes[h])
        for i, k in enumerate(lanes[h + 1 : h + 4], start=1):
            sel.emit(O.VINSERTPS, part, part, _lane(sel, r, k), Imm(i << 4))
        halves.append(part)
    sel.val[u] = _join(sel, halves)


def _broadcast_lane(sel: SelectorAPI, x: VReg, k: int, width: int) -> VReg:
    """Lane k of vector x in every lane of a fresh register of `width` bytes: vbroadcastss from lane 0 of an xmm
    (AVX2), after vpermilps brings lane k there."""
    src = x.sized(16)
    if k >= 4:
        hi = sel.vec(16)
        sel.emit(O.VEXTRACTF128, hi, x, Imm(1))
        src, k = hi, k - 4
    if k:
        t = sel.vec(16)
        sel.emit(O.VPERMILPS, t, src, Imm(k * 0b01010101))
        src = t
    d = sel.vec(width)
    sel.emit(O.VBROADCASTSS, d, src)
    return d


__all__ = [
    "PACKED",
    "sel_gep",
    "sel_vec_cast",
    "sel_stack",
    "sel_vec_binary",
    "sel_vec_max",
    "xmm_quarters",
    "sel_vec_unary",
    "sel_vec_where",
]
