"""Selection rules for scalar integer and bool ALU ops: two-address ALU (add/sub/imul/and/or/xor, a memory or
immediate second operand), NEG, MAX (cmp + cmov), comparisons (cmp + setcc), WHERE (test + cmov), CDIV/CMOD (idiv/div
with a guard for a divisor of 0 or -1, or a multiply by the magic number for an int32 constant) and shifts (an
out-of-range count gives 0, or -1 for >> of a negative).

Values follow select.py's conventions: 1-, 2- and 4-byte values compute in 32 bits, re-extended after an op that can
leave the narrow type (`WRAPS`). The rules are functions of (selector, uop), registered in
speck.codegen.x86.select.SELECTION_TABLE under the "int" and "bool" classes.
"""

from __future__ import annotations

from speck.codegen.errors import CodegenValueError
from speck.codegen.renderer.common import divisor_safe, shift_safe
from speck.codegen.x86.operands import Imm, Mem
from speck.codegen.x86.ops import X86Op as O
from speck.codegen.x86.select_api import SelectorAPI
from speck.codegen.x86.select_common import is_cconst, osize
from speck.uop import Ops, UOp, dtypes

_MUL, _SUB = Ops.MUL, Ops.SUB  # (module constants: an enum member read through the class is slower, see select.py)

INT_ALU: dict[Ops, O] = {Ops.ADD: O.ADD, Ops.SUB: O.SUB, Ops.MUL: O.IMUL, Ops.AND: O.AND, Ops.OR: O.OR,
                         Ops.XOR: O.XOR}  # fmt: skip
"""Two-address integer ALU ops (reg, reg/imm32)."""
WRAPS = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.NEG, Ops.SHL})
"""Integer ops whose 32-bit result may leave a narrow (8/16-bit) type: the result is re-extended."""
# condition codes of integer comparisons: (signed, unsigned)
INT_CMP: dict[Ops, tuple[O, O]] = {Ops.CMPLT: (O.SETL, O.SETB), Ops.CMPNE: (O.SETNE, O.SETNE),
                                   Ops.CMPEQ: (O.SETE, O.SETE)}  # fmt: skip
SWAPPED_SET = {O.SETL: O.SETG, O.SETB: O.SETA, O.SETNE: O.SETNE, O.SETE: O.SETE}


def sel_int_binary(sel: SelectorAPI, u: UOp) -> None:
    a, b = u.src
    size = osize(u.dtype)
    if (is_cconst(a) or a in sel.mem_operands) and u.op is not _SUB:
        a, b = b, a
    d = sel.gpr()
    src = sel.mem_operand(b) if b in sel.mem_operands else sel.ioperand(b, size)
    if u.op is _MUL and isinstance(src, Imm):  # three-operand imul: no copy first
        sel.emit(O.IMUL, sel.at_size(d, size), sel.at_size(sel.reg(a), size), src)
    else:
        sel.copy(d, sel.reg(a))
        sel.emit(INT_ALU[u.op], sel.at_size(d, size), src)
    if u.op in WRAPS:
        sel.extend(d, u.dtype)
    sel.val[u] = d


def sel_int_neg(sel: SelectorAPI, u: UOp) -> None:
    d = sel.gpr()
    sel.copy(d, sel.reg(u.src[0]))
    if u.dtype == dtypes.bool:
        sel.emit(O.XOR, d.sized(4), Imm(1))
    else:
        sel.emit(O.NEG, d.sized(osize(u.dtype)))
        sel.extend(d, u.dtype)
    sel.val[u] = d


def sel_int_max(sel: SelectorAPI, u: UOp) -> None:
    a, b = u.src
    size = osize(u.dtype)
    ra, rb = sel.reg(a), sel.reg(b)
    d = sel.gpr()
    sel.copy(d, ra)
    sel.emit(O.CMP, ra.sized(size), rb.sized(size))
    sel.emit(O.CMOVB if dtypes.is_unsigned(u.dtype) else O.CMOVL, d.sized(size), rb.sized(size))
    sel.val[u] = d


def sel_int_cmp(sel: SelectorAPI, u: UOp) -> None:
    a, b = u.src
    size = osize(a.dtype)
    signed, unsigned = INT_CMP[u.op]
    cc = unsigned if dtypes.is_unsigned(a.dtype) or a.dtype == dtypes.bool else signed
    if is_cconst(a) and not is_cconst(b):
        a, b, cc = b, a, SWAPPED_SET[cc]
    ra = sel.reg(a)
    sel.emit(O.CMP, ra.sized(size), sel.ioperand(b, size))
    sel.val[u] = sel.setcc(cc)


def sel_int_where(sel: SelectorAPI, u: UOp) -> None:
    c, a, b = u.src
    size = osize(u.dtype)
    d = sel.gpr()
    sel.copy(d, sel.reg(b))
    ra = sel.reg(a)
    g = sel.reg(c)
    sel.emit(O.TEST, g.sized(4), g.sized(4))  # a bool condition compared against 0
    sel.emit(O.CMOVNE, d.sized(size), ra.sized(size))
    sel.val[u] = d


def sel_int_divmod(sel: SelectorAPI, u: UOp) -> None:
    a, b = u.src
    dt = u.dtype.scalar()
    if dt == dtypes.int32 and is_cconst(b) and sel.int_bits(b) >= 2:
        div_by_constant(sel, u, sel.int_bits(b))
        return
    size = osize(dt)
    unsigned = dtypes.is_unsigned(dt)
    rax, rdx = sel.pinned("rax"), sel.pinned("rdx")
    safe = divisor_safe(a, b)
    rb = sel.reg(b)
    t = rb
    if not safe:  # divide by 1 instead when b is 0 (or -1, which could trap on MIN / -1); fixed up below
        t, one = sel.gpr(), sel.gpr()
        sel.copy(t, rb)
        sel.emit(O.MOV, one.sized(4), Imm(1))
        if unsigned:
            sel.emit(O.TEST, t.sized(size), t.sized(size))
            sel.emit(O.CMOVE, t.sized(size), one.sized(size))
        else:
            k = sel.gpr()
            sel.emit(O.LEA, k.sized(size), Mem(t, disp=1))
            sel.emit(O.CMP, k.sized(size), Imm(1))
            sel.emit(O.CMOVBE, t.sized(size), one.sized(size))
    sel.emit(O.MOV, rax.sized(size), sel.reg(a).sized(size))
    if unsigned:
        sel.emit(O.XOR, rdx.sized(4), rdx.sized(4))
        sel.emit(O.DIV, t.sized(size), implicit_uses=(rax, rdx), implicit_defs=(rax, rdx))
    else:
        sel.emit(O.CQO if size == 8 else O.CDQ, implicit_uses=(rax,), implicit_defs=(rdx,))
        sel.emit(O.IDIV, t.sized(size), implicit_uses=(rax, rdx), implicit_defs=(rax, rdx))
    d = sel.gpr()
    sel.emit(O.MOV, d.sized(size), (rax if u.op is Ops.CDIV else rdx).sized(size))
    if not safe and u.op is Ops.CDIV:
        z = sel.gpr()
        sel.emit(O.XOR, z.sized(4), z.sized(4))
        if not unsigned:  # b == -1: the quotient is -a (wrapping)
            n = sel.gpr()
            sel.copy(n, d)
            sel.emit(O.NEG, n.sized(size))
            sel.emit(O.CMP, rb.sized(size), Imm(-1))
            sel.emit(O.CMOVE, d.sized(size), n.sized(size))
        sel.emit(O.TEST, rb.sized(size), rb.sized(size))
        sel.emit(O.CMOVE, d.sized(size), z.sized(size))
    sel.extend(d, dt)
    sel.val[u] = d


def div_by_constant(sel: SelectorAPI, u: UOp, d: int) -> None:
    """int32 n / d and n % d for a constant d >= 2 without idiv: q = mulhs(n, M) (+ n) >> s, plus 1 when n is
    negative (truncation), with the magic number M and shift s of Hacker's Delight section 10-4."""
    magic, shift = signed_magic32(d)
    n = sel.reg(u.src[0])
    q = sel.gpr()
    sel.emit(O.MOVSXD, q, n.sized(4))
    sel.emit(O.IMUL, q, q, Imm(magic))  # the 64-bit product of sign-extended n and M: mulhs is its high half
    if magic < 0:  # M was reduced by 2**32: add n back after taking the high half
        sel.emit(O.SAR, q, Imm(32))
        sel.emit(O.ADD, q.sized(4), n.sized(4))
        if shift:
            sel.emit(O.SAR, q.sized(4), Imm(shift))
    else:
        sel.emit(O.SAR, q, Imm(32 + shift))
    t = sel.gpr()
    sel.emit(O.MOV, t.sized(4), n.sized(4))
    sel.emit(O.SHR, t.sized(4), Imm(31))
    sel.emit(O.ADD, q.sized(4), t.sized(4))
    if u.op is Ops.CMOD:  # n - q * d
        r = sel.gpr()
        sel.emit(O.IMUL, q.sized(4), q.sized(4), Imm(d))
        sel.emit(O.MOV, r.sized(4), n.sized(4))
        sel.emit(O.SUB, r.sized(4), q.sized(4))
        q = r
    sel.val[u] = q


def sel_int_shift(sel: SelectorAPI, u: UOp) -> None:
    a, b = u.src
    dt = u.dtype.scalar()
    size = osize(dt)
    bits = 8 * size
    op = O.SHL if u.op is Ops.SHL else (O.SHR if dtypes.is_unsigned(dt) else O.SAR)
    d = sel.gpr()
    sel.copy(d, sel.reg(a))
    if is_cconst(b):
        n = sel.int_bits(b)
        if 0 <= n < 8 * dt.itemsize or (0 <= n < bits):
            sel.emit(op, d.sized(size), Imm(n))
        elif op is O.SAR:
            sel.emit(op, d.sized(size), Imm(bits - 1))
        else:
            sel.emit(O.XOR, d.sized(4), d.sized(4))
    else:
        rb = sel.reg(b)
        cx = sel.pinned("rcx")
        sel.emit(O.MOV, cx.sized(4), rb.sized(4))
        sel.emit(op, d.sized(size), cx.sized(1))
        if not shift_safe(b, bits):
            fill = sel.gpr()
            if op is O.SAR:
                sel.copy(fill, sel.reg(a))
                sel.emit(O.SAR, fill.sized(size), Imm(bits - 1))
            else:
                sel.emit(O.XOR, fill.sized(4), fill.sized(4))
            sel.emit(O.CMP, rb.sized(osize(b.dtype)), Imm(bits))
            sel.emit(O.CMOVAE, d.sized(size), fill.sized(size))
    if u.op in WRAPS:
        sel.extend(d, dt)
    sel.val[u] = d


def signed_magic32(d: int) -> tuple[int, int]:
    """(M, s) with trunc(n / d) == (mulhs(n, M) [+ n when M < 0]) >> s, plus 1 for negative n, for every int32 n;
    d >= 2 (Hacker's Delight, "Signed Division by Divisors >= 2"). M is returned as a signed 32-bit value."""
    if d < 2 or d >= 2**31:
        raise CodegenValueError(f"signed_magic32: divisor must be in [2, 2**31), got {d}")
    two31 = 2**31
    anc = two31 - 1 - two31 % d
    p = 31
    q1, r1 = divmod(two31, anc)
    q2, r2 = divmod(two31, d)
    while True:
        p += 1
        q1, r1 = 2 * q1, 2 * r1
        if r1 >= anc:
            q1, r1 = q1 + 1, r1 - anc
        q2, r2 = 2 * q2, 2 * r2
        if r2 >= d:
            q2, r2 = q2 + 1, r2 - d
        delta = d - r2
        if not (q1 < delta or (q1 == delta and r1 == 0)):
            break
    m = q2 + 1
    return (m - 2**32 if m >= 2**31 else m), p - 32
