"""Selection rules for scalar float32/float64 ops in the low lane of an xmm register: the VEX three-operand ALU
(vaddss/vaddsd..., the second source a register, a .rodata literal or a folded load), a*b+c as one vfmadd231 under
fp_contract (also for float32 vectors: select_vector.py), NEG (xor with the sign bit), SQRT, TRUNC, MAX with NaN
propagation (vmax + vcmpunord + vblendv), comparisons (vucomis + setcc, NaN compares unequal) and WHERE (a lane mask
from the bool, vblendv). The rules are functions of (selector, uop), registered in
speck.codegen.x86.select.SELECTION_TABLE under the "float" class.
"""

from __future__ import annotations

from speck.codegen.x86.operands import Imm, Operand
from speck.codegen.x86.ops import X86Op as O
from speck.codegen.x86.select_api import SelectorAPI
from speck.codegen.x86.select_common import FLOAT_OPS, ROUND_TRUNC, VCMP_UNORD, is_cconst, vec_bytes
from speck.uop import GroupOp, Ops, UOp

FLOAT_ALU: dict[tuple[Ops, int], O] = {
    (Ops.ADD, 4): O.VADDSS, (Ops.ADD, 8): O.VADDSD, (Ops.SUB, 4): O.VSUBSS, (Ops.SUB, 8): O.VSUBSD,
    (Ops.MUL, 4): O.VMULSS, (Ops.MUL, 8): O.VMULSD, (Ops.FDIV, 4): O.VDIVSS, (Ops.FDIV, 8): O.VDIVSD,
}  # fmt: skip
"""Three-operand VEX scalar float ops (dst, src1, src2/mem)."""


def fsrc(sel: SelectorAPI, u: UOp) -> Operand:
    """A float source operand: a register, the literal in .rodata, or a load folded into a memory operand."""
    if u in sel.mem_operands:
        return sel.mem_operand(u)
    return sel.fconst(u) if is_cconst(u) else sel.reg(u)


def sel_fma(sel: SelectorAPI, u: UOp) -> None:
    """acc + b*c as `vmovaps d, acc; vfmadd231 d, b, c` (c may be a memory operand); the copy folds away when d
    is copied on into acc's register (an accumulator update)."""
    acc, m = sel.fma[u]
    b, c = m.src
    if b in sel.mem_operands or is_cconst(b) or b in sel.bcast_stacks:
        b, c = c, b
    n = u.dtype.count
    if n > 1:
        d = sel.vec(vec_bytes(n))
        src: Operand = (sel.mem_operand(c) if c in sel.mem_operands else
                        sel.bcast_operand(c) if c in sel.bcast_stacks else sel.reg(c))  # fmt: skip
        op = O.VFMADD231PS
    else:
        d = sel.vec()
        src = fsrc(sel, c)
        op = O.VFMADD231SS if u.dtype.itemsize == 4 else O.VFMADD231SD
    sel.copy(d, sel.reg(acc))
    sel.emit(op, d, sel.reg(b), src)
    sel.val[u] = d


def sel_float_binary(sel: SelectorAPI, u: UOp) -> None:
    if u in sel.fma:
        sel_fma(sel, u)
        return
    a, b = u.src
    if a in sel.mem_operands and u.op in GroupOp.Commutative:
        a, b = b, a
    d = sel.vec()
    sel.emit(FLOAT_ALU[(u.op, u.dtype.itemsize)], d, sel.reg(a), fsrc(sel, b))
    sel.val[u] = d


def sel_float_unary(sel: SelectorAPI, u: UOp) -> None:
    n = u.dtype.itemsize
    x = sel.reg(u.src[0])
    d = sel.vec()
    if u.op is Ops.NEG:
        mask = sel.rconst("<4I", *([0x80000000] * 4)) if n == 4 else sel.rconst("<2Q", 1 << 63, 1 << 63)
        sel.emit(FLOAT_OPS[("xor", n)], d, x, mask.with_size(16))
    elif u.op is Ops.SQRT:
        sel.emit(FLOAT_OPS[("sqrt", n)], d, x, x)
    elif u.op is Ops.TRUNC:
        sel.emit(FLOAT_OPS[("round", n)], d, x, x, Imm(ROUND_TRUNC))
    else:
        raise sel.fail(u)
    sel.val[u] = d


def sel_float_max(sel: SelectorAPI, u: UOp) -> None:
    # numpy.maximum: (b > a ? b : a), except a NaN b wins. vmax(b, a) = b > a ? b : a; then blend b where b is NaN
    n = u.dtype.itemsize
    ra, rb = sel.reg(u.src[0]), sel.reg(u.src[1])
    t, m, d = sel.vec(), sel.vec(), sel.vec()
    sel.emit(FLOAT_OPS[("max", n)], t, rb, ra)
    sel.emit(FLOAT_OPS[("cmp", n)], m, rb, rb, Imm(VCMP_UNORD))
    sel.emit(FLOAT_OPS[("blend", n)], d, t, rb, m)
    sel.val[u] = d


def sel_float_cmp(sel: SelectorAPI, u: UOp) -> None:
    a, b = u.src
    n = a.dtype.itemsize
    ucomi = FLOAT_OPS[("ucomi", n)]
    if u.op is Ops.CMPLT:  # a < b <=> b > a (unordered sets CF: false)
        sel.emit(ucomi, sel.reg(b), fsrc(sel, a))
        sel.val[u] = sel.setcc(O.SETA)
        return
    sel.emit(ucomi, sel.reg(a), fsrc(sel, b))
    t, p = sel.gpr(), sel.gpr()
    if u.op is Ops.CMPEQ:  # equal and ordered
        sel.emit(O.SETE, t.sized(1))
        sel.emit(O.SETNP, p.sized(1))
        sel.emit(O.AND, t.sized(1), p.sized(1))
    else:  # not equal, or unordered
        sel.emit(O.SETNE, t.sized(1))
        sel.emit(O.SETP, p.sized(1))
        sel.emit(O.OR, t.sized(1), p.sized(1))
    sel.emit(O.MOVZX, t.sized(4), t.sized(1))
    sel.val[u] = t


def sel_float_where(sel: SelectorAPI, u: UOp) -> None:
    c, a, b = u.src
    n = u.dtype.itemsize
    g = sel.reg(c)
    k, m, d = sel.gpr(), sel.vec(), sel.vec()
    # a bool condition compared against 0, as a lane mask: 0/1 -> 0/-1 (sign bit set where true)
    sel.emit(O.MOV, k.sized(4), g.sized(4))
    sel.emit(O.NEG, k.sized(n))
    sel.emit(O.VMOVD if n == 4 else O.VMOVQ, m, k.sized(n))
    sel.emit(FLOAT_OPS[("blend", n)], d, sel.reg(b), sel.reg(a), m)
    sel.val[u] = d
