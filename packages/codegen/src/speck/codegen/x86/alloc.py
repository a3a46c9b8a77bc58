"""Register allocation for x86-64 instruction lists: operand roles, rewriting to physical registers, stack frame.

Instruction selection produces `Inst`s whose register operands are `VReg`s, plus `Label`s and `LoopBegin`/`LoopEnd`
markers. `allocate_function` describes each item to the target-independent allocator (which operands are read and
written), then rewrites the list: virtual registers become physical ones, spill stores and reloads are inserted, and a
System V prologue/epilogue saves the callee-saved registers used and reserves the spill area with rsp kept 16-byte
aligned at calls. `build_object` runs allocation, encoding and the ELF writer in one go.

Contract for instruction selection:
- two-address ALU ops read and write operand 0 (`add d, b` reads d): emit `mov d, a` first when d is a fresh value;
  `xor v, v` (and vxorps/vpxor v, v, v) only writes v;
- fixed registers are short-lived `VReg(..., fixed="rax")` values: copy into them right before the instruction and out
  right after; registers an instruction touches without naming them go in `implicit_uses`/`implicit_defs` (cqo, idiv);
  a call carries `clobbers=CALL_CLOBBERS`; incoming arguments are `arg_vreg(k, ...)` (k < 6) or `IncomingStackArg(k)`;
- loops: `LoopBegin()` right before the header label, `LoopEnd()` right after the back-edge jump;
- SETcc writes only the low byte: zero-extend (movzx) before using the value wider.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from speck.codegen.errors import CodegenValueError
from speck.codegen.regalloc import Allocation, RAInstr, VReg, allocate, instr_view
from speck.codegen.x86.assembler import Assembled, assemble
from speck.codegen.x86.elf_object import write_elf_object
from speck.codegen.x86.operands import (
    RSP,
    Imm,
    IncomingStackArg,
    Inst,
    Label,
    Mem,
    Operand,
    Reg,
    _set_roles,
    plain_inst,
)
from speck.codegen.x86.ops import CMOVCC_OPS, JCC_OPS, X86Op
from speck.codegen.x86.regs import X86_64_SYSV, SizedRegs, phys, sized_regs


@dataclass(frozen=True)
class LoopBegin:
    """Marks the point just before a loop's header label: code placed before it runs once per entry to the loop."""


@dataclass(frozen=True)
class LoopEnd:
    """Marks the point just after a loop's back-edge branch."""


Item = Inst | Label | LoopBegin | LoopEnd

# ops tested per instruction, as module constants: in Python 3.11 each `X86Op.X` goes through the enum metaclass's
# __getattr__ hook, several times the cost of reading a global
_MOV, _IMUL = X86Op.MOV, X86Op.IMUL

# Role of operand 0 when it is a register (operands 1.. are always read; a memory operand 0 is a store).
READS_ONLY = frozenset({X86Op.CMP, X86Op.TEST, X86Op.PUSH, X86Op.VUCOMISS, X86Op.VUCOMISD, X86Op.IDIV, X86Op.DIV,
                        X86Op.MUL, X86Op.JMP, X86Op.CALL} | JCC_OPS)  # fmt: skip
READS_AND_WRITES = frozenset({
    X86Op.ADD, X86Op.SUB, X86Op.AND, X86Op.OR, X86Op.XOR, X86Op.NOT, X86Op.NEG, X86Op.INC, X86Op.DEC, X86Op.SHL,
    X86Op.SHR, X86Op.SAR, X86Op.ROL, X86Op.ROR, X86Op.VFMADD231SS, X86Op.VFMADD231SD, X86Op.VFMADD231PS,
    X86Op.VFMADD231PD,
} | CMOVCC_OPS)  # fmt: skip
ZEROING_IDIOMS = frozenset({X86Op.XOR, X86Op.SUB, X86Op.VXORPS, X86Op.VXORPD, X86Op.VPXOR})
# the role of a register operand 0 by op, from the sets above (one lookup per instruction); imul by operand count:
# `imul r` reads it (rdx:rax = rax * r), `imul d, s` reads and writes d, `imul d, s, imm` only writes d
_READ, _WRITTEN, _READ_WRITTEN = "read", "written", "read+written"
_FIRST_OPERAND = {**dict.fromkeys(READS_ONLY, _READ), **dict.fromkeys(READS_AND_WRITES, _READ_WRITTEN)}
_IMUL_FIRST_OPERAND = {1: _READ, 2: _READ_WRITTEN, 3: _WRITTEN}


def _vregs(o: Operand) -> list[VReg]:
    if isinstance(o, VReg):
        return [o]
    if isinstance(o, Mem):
        return [r for r in (o.base, o.index) if isinstance(r, VReg)]
    return []


def operand_roles(inst: Inst) -> tuple[tuple[VReg, ...], tuple[VReg, ...]]:
    """(defs, uses) of an instruction, including its implicit registers."""
    view = ra_view(inst)
    return view.defs, view.uses


def _operand_roles(inst: Inst) -> tuple[tuple[VReg, ...], tuple[VReg, ...]]:
    # plain loops and exact type tests (VReg and Mem have no subclasses): this runs for every selected instruction
    ops = inst.operands
    if not ops:
        return _implicit(inst.implicit_defs), _implicit(inst.implicit_uses)
    first = ops[0]
    rest: list[VReg] = []
    for o in ops[1:] if len(ops) > 1 else ():
        t = type(o)
        if t is VReg:
            rest.append(o)  # type: ignore[arg-type]
        elif t is Mem:
            b, x = o.base, o.index  # type: ignore[union-attr]
            if type(b) is VReg:
                rest.append(b)
            if type(x) is VReg:
                rest.append(x)
    ft = type(first)
    if ft is VReg:
        op = inst.op
        fid = first.id  # type: ignore[union-attr]
        if op in ZEROING_IDIOMS and len(ops) >= 2 and all(v.id == fid for v in rest):
            uses = [v for v in (*_implicit(inst.implicit_uses), *rest) if v.id != fid]
            return (*_implicit(inst.implicit_defs), first), tuple(uses)  # type: ignore[arg-type]
        role = _FIRST_OPERAND.get(op, _WRITTEN) if op is not _IMUL else _IMUL_FIRST_OPERAND[min(len(ops), 3)]
        if role is not _WRITTEN:
            rest.append(first)  # type: ignore[arg-type]
        defs: tuple[VReg, ...] = (first,) if role is not _READ else ()  # type: ignore[assignment]
    else:
        if ft is Mem:
            b, x = first.base, first.index  # type: ignore[union-attr]
            if type(b) is VReg:
                rest.append(b)
            if type(x) is VReg:
                rest.append(x)
        defs = ()
    if inst.implicit_uses or inst.implicit_defs:  # (division, cqo, calls: rare)
        return _implicit(inst.implicit_defs) + defs, _implicit(inst.implicit_uses) + tuple(rest)
    return defs, tuple(rest)


def _implicit(regs: tuple[Operand, ...]) -> tuple[VReg, ...]:
    return tuple([v for v in regs if isinstance(v, VReg)]) if regs else ()


def ra_view(item: Item) -> RAInstr:
    """Describe one item to the register allocator."""
    if type(item) is Inst:
        # asked by the copy-folding peephole and again by allocation for the same instruction objects: an Inst is
        # immutable, so the answer is kept in its private `_roles` slot (a cache, not part of its value)
        view = item._roles
        if view is None:
            defs, uses = _operand_roles(item)
            op = item.op
            copy = (op is _MOV or op in FULL_COPIES) and len(item.operands) == 2 and _is_copy(item)
            view = instr_view(defs, uses, item.clobbers, copy)
            _set_roles(item, view)
        return view
    if isinstance(item, LoopBegin):
        return _RA_LOOP_BEGIN
    if isinstance(item, LoopEnd):
        return _RA_LOOP_END
    return _RA_NOTHING  # a label


# RAInstr is immutable: the register-free items share one description each
_RA_LOOP_BEGIN = RAInstr(marker="loop_begin")
_RA_LOOP_END = RAInstr(marker="loop_end")
_RA_NOTHING = RAInstr()


FULL_COPIES = frozenset({X86Op.VMOVAPS, X86Op.VMOVUPS, X86Op.VMOVAPD, X86Op.VMOVUPD, X86Op.VMOVDQU})


def _is_copy(inst: Inst) -> bool:
    """A whole-register copy (a 64-bit mov or a vector move between registers); 32-bit movs zero-extend, so are not."""
    ops = inst.operands
    if len(ops) != 2 or (inst.op is not _MOV and inst.op not in FULL_COPIES):
        return False
    dst, src = ops
    if not isinstance(dst, _REG_TYPES) or not isinstance(src, _REG_TYPES):
        return False
    op = inst.op
    return (op is _MOV and dst.size == src.size == 8) or (op in FULL_COPIES and dst.size == src.size)


_REG_TYPES = (VReg, Reg)
_FRAME_OPS = frozenset({X86Op.CALL, X86Op.RET})  # the ops allocate_function adds code around
_KEPT = frozenset({Reg, Imm, Label})  # operands allocation leaves as they are (exact types: no subclasses)


@dataclass(frozen=True)
class AllocatedFunction:
    """The physical instruction list (prologue and epilogues included) and the allocation it came from."""

    items: list[Inst | Label]
    allocation: Allocation
    frame_bytes: int
    pushed: tuple[str, ...]


def allocate_function(items: Sequence[Item]) -> AllocatedFunction:
    """Allocate registers for a whole function body and add the System V prologue/epilogue (at every RET)."""
    views = [ra_view(it) for it in items]
    alloc = allocate(views, X86_64_SYSV)
    pushed = alloc.callee_saved
    frame = alloc.frame_size + (-(8 + 8 * len(pushed) + alloc.frame_size) % 16)
    uses_ymm = any(isinstance(o, _REG_TYPES) and o.size >= 32 for it in items if isinstance(it, Inst)
                   for o in it.operands)  # fmt: skip
    uses_ymm = uses_ymm or any(rl.vreg.cls != "gpr" for rls in alloc.reloads.values() for rl in rls)

    def slot(offset: int, size: int | None) -> Mem:
        return Mem(RSP, disp=offset, size=size)

    moves: dict[tuple[bool, str, str, int], Inst] = {}  # the same reload or spill recurs (instructions are immutable)

    def move(load: bool, cls: str, reg: str, offset: int) -> Inst:
        key = (load, cls, reg, offset)
        if (inst := moves.get(key)) is None:
            if cls != "gpr":  # the whole ymm (zmm for class zvec): the slot holds any vector width
                r = phys(reg, 64 if cls == "zvec" else 32)
                inst = Inst(X86Op.VMOVUPS, (r, slot(offset, None)) if load else (slot(offset, None), r))
            else:
                r = phys(reg, 8)
                inst = Inst(X86Op.MOV, (r, slot(offset, 8)) if load else (slot(offset, 8), r))
            moves[key] = inst
        return inst

    def sub(o: Operand, regs: dict[int, SizedRegs]) -> Operand:
        if isinstance(o, Mem):
            b, x = o.base, o.index
            if isinstance(b, VReg) or isinstance(x, VReg):
                base = regs[b.id][8] if isinstance(b, VReg) else b
                index = regs[x.id][8] if isinstance(x, VReg) else x
                return Mem(base, index, o.scale, o.disp, o.size, o.symbol, o.broadcast)
            return o
        if isinstance(o, IncomingStackArg):
            if o.index < 6:
                raise CodegenValueError(f"IncomingStackArg({o.index}): arguments 0..5 arrive in registers")
            return Mem(RSP, disp=frame + 8 * len(pushed) + 8 + 8 * (o.index - 6), size=o.size)
        return o

    out: list[Inst | Label] = [Inst(X86Op.PUSH, (phys(r, 8),)) for r in pushed]
    if frame:
        out.append(Inst(X86Op.SUB, (RSP, Imm(frame))))
    append = out.append
    # each value's register at every width it is named at (one table per register): instructions name values in
    # their homes except where a spilled value is reloaded (alloc.at)
    home = {vid: sized_regs(loc) for vid, loc in alloc.home.items() if isinstance(loc, str)}
    at, reloads, spills = alloc.at, alloc.reloads, alloc.spills
    # the instructions with spill code around them or a reload register in them (none in most kernels): the others
    # take the plain path, one set test each
    special = reloads.keys() | at.keys() | spills.keys()
    for i, (item, view) in enumerate(zip(items, views)):
        if i in special and i in reloads:
            for rl in reloads[i]:
                append(move(True, rl.vreg.cls, rl.reg, rl.slot))
        if type(item) is not Inst:
            if isinstance(item, Label):
                append(item)
            continue
        op = item.op
        if op in _FRAME_OPS:
            if op is X86Op.CALL and uses_ymm:
                # avoid the AVX-SSE transition penalty in callees; no vector value survives a call: this loses nothing
                append(Inst(X86Op.VZEROUPPER))
            if op is X86Op.RET:
                if frame:
                    append(Inst(X86Op.ADD, (RSP, Imm(frame))))
                out += [Inst(X86Op.POP, (phys(r, 8),)) for r in reversed(pushed)]
                if uses_ymm:
                    append(Inst(X86Op.VZEROUPPER))
        if i not in special:
            regs = home
        elif i in at:
            regs = {v.id: sized_regs(alloc.reg(i, v.id)) for v in view.defs + view.uses}
        else:
            regs = home
        # register operands (the common case) are rewritten inline, memory and stack arguments through `sub`
        ops = tuple([regs[o.id][o.size] if type(o) is VReg else o if type(o) in _KEPT else sub(o, regs)
                     for o in item.operands])  # fmt: skip
        if not (view.copy and ops[0] == ops[1]):  # a copy whose ends got one register disappears
            append(plain_inst(op, ops))
        if i in special and i in spills:
            for sp in spills[i]:
                append(move(False, sp.vreg.cls, sp.reg, sp.slot))
    return AllocatedFunction(out, alloc, frame, pushed)


def build_object(name: str, items: Sequence[Item], rodata: bytes = b"") -> tuple[bytes, Assembled]:
    """Allocate, encode and wrap a function body as an ELF relocatable object; returns (object bytes, assembly)."""
    fn = allocate_function(items)
    asm = assemble(fn.items)
    return write_elf_object(name, asm.code, asm.relocations, rodata), asm
