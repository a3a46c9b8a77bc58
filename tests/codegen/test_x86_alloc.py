"""x86 glue for register allocation: operand roles, System V register roles, frame layout and spill code."""

from __future__ import annotations

import pytest

from speck.codegen.regalloc import VReg
from speck.codegen.x86 import allocate_function
from speck.codegen.x86.alloc import LoopBegin, LoopEnd, operand_roles, ra_view
from speck.codegen.x86.operands import RSP, Imm, IncomingStackArg, Inst, Label, Mem, Sym, gpr, xmm, ymm
from speck.codegen.x86.ops import X86Op as O
from speck.codegen.x86.regs import CALL_CLOBBERS, CALLEE_SAVED, X86_64_SYSV, arg_vreg, phys


def G(i: int, size: int = 8) -> VReg:
    return VReg(i, "gpr", size)


def V(i: int, size: int = 32) -> VReg:
    return VReg(i, "vec", size)


def ids(vs: tuple[VReg, ...]) -> list[int]:
    return sorted(v.id for v in vs)


@pytest.mark.parametrize(
    ("inst", "defs", "uses"),
    [
        (Inst(O.MOV, (G(1), G(2))), [1], [2]),
        (Inst(O.ADD, (G(1), G(2))), [1], [1, 2]),
        (Inst(O.CMP, (G(1), G(2))), [], [1, 2]),
        (Inst(O.MOV, (Mem(G(1), G(2), 4), G(3))), [], [1, 2, 3]),  # store: address registers are read
        (Inst(O.LEA, (G(1), Mem(G(2), G(3), 8, 16))), [1], [2, 3]),
        (Inst(O.XOR, (G(1), G(1))), [1], []),  # zeroing idiom: no read of the old value
        (Inst(O.VXORPS, (V(1), V(1), V(1))), [1], []),
        (Inst(O.VADDPS, (V(1), V(2), Mem(G(3)))), [1], [2, 3]),
        (Inst(O.VFMADD231PS, (V(1), V(2), V(3))), [1], [1, 2, 3]),
        (Inst(O.IMUL, (G(1), G(2))), [1], [1, 2]),
        (Inst(O.IMUL, (G(1), G(2), Imm(3))), [1], [2]),
        (Inst(O.CMOVL, (G(1), G(2))), [1], [1, 2]),  # the old value survives when the condition fails
        (Inst(O.IDIV, (G(3),), implicit_uses=(G(4), G(5)), implicit_defs=(G(6), G(7))), [6, 7], [3, 4, 5]),
        (Inst(O.VMOVUPS, (Mem(G(1)), V(2))), [], [1, 2]),
    ],
)
def test_operand_roles(inst: Inst, defs: list[int], uses: list[int]) -> None:
    d, u = operand_roles(inst)
    assert (ids(d), ids(u)) == (defs, uses)


def test_ra_view_markers_and_copies() -> None:
    assert ra_view(LoopBegin()).marker == "loop_begin" and ra_view(LoopEnd()).marker == "loop_end"
    assert ra_view(Label("x")).defs == ()
    assert ra_view(Inst(O.MOV, (G(1), G(2)))).copy
    assert not ra_view(Inst(O.MOV, (G(1, 4), G(2, 4)))).copy  # a 32-bit mov zero-extends: not a plain copy
    assert ra_view(Inst(O.VMOVAPS, (V(1), V(2)))).copy


def test_register_names() -> None:
    assert phys("rax", 4) == gpr("eax") and phys("r12", 1) == gpr("r12b") and phys("xmm9", 32) == ymm(9)
    assert phys("xmm3", 16) == xmm(3)
    with pytest.raises(ValueError, match="unknown x86-64 register"):
        phys("eax", 4)
    with pytest.raises(ValueError, match="IncomingStackArg"):
        arg_vreg(6, 1)
    assert arg_vreg(0, 1).fixed == "rdi" and arg_vreg(5, 1).fixed == "r9"
    # the allocator never hands out rsp, and the call clobber set excludes exactly the callee-saved registers
    for cls in X86_64_SYSV.classes.values():
        assert "rsp" not in cls.allocatable + cls.scratch
    assert not CALL_CLOBBERS & CALLEE_SAVED and "r11" in CALL_CLOBBERS and "xmm15" in CALL_CLOBBERS


def pressure(n: int) -> list[Inst | Label | LoopBegin | LoopEnd]:
    vs = [G(k) for k in range(n)]
    return (
        [Inst(O.MOV, (v, Imm(k))) for k, v in enumerate(vs)] + [Inst(O.ADD, (vs[0], v)) for v in vs[1:]] + [Inst(O.RET)]
    )


@pytest.mark.parametrize("n", [1, 8, 15, 16, 30])
def test_frame_keeps_rsp_aligned_and_saves_callee_saved(n: int) -> None:
    fn = allocate_function(pressure(n))
    assert (8 + 8 * len(fn.pushed) + fn.frame_bytes) % 16 == 0
    assert fn.frame_bytes >= fn.allocation.frame_size
    pushes = [i.operands[0] for i in fn.items if isinstance(i, Inst) and i.op is O.PUSH]
    pops = [i.operands[0] for i in fn.items if isinstance(i, Inst) and i.op is O.POP]
    assert pushes == pops[::-1] == [phys(r, 8) for r in fn.pushed]
    assert set(fn.pushed) <= CALLEE_SAVED
    slots = [o for i in fn.items if isinstance(i, Inst) for o in i.operands if isinstance(o, Mem) and o.base == RSP]
    assert all(0 <= m.disp < fn.allocation.frame_size for m in slots)
    assert bool(slots) == (n > 15)  # 15 registers without spills (13 + the 2 scratch), fewer once spilling


def test_incoming_stack_argument_offset() -> None:
    v = G(1)
    fn = allocate_function([Inst(O.MOV, (v, IncomingStackArg(7))), Inst(O.MOV, (Mem(RSP), v)), Inst(O.RET)])
    load = next(i for i in fn.items if isinstance(i, Inst) and i.op is O.MOV)
    mem = load.operands[1]
    assert isinstance(mem, Mem)
    # above the frame: pushed registers, the return address, then argument 6, argument 7
    assert mem.base == RSP and mem.disp == fn.frame_bytes + 8 * len(fn.pushed) + 8 + 8
    with pytest.raises(ValueError, match="arrive in registers"):
        allocate_function([Inst(O.MOV, (v, IncomingStackArg(2))), Inst(O.RET)])


def test_vzeroupper_before_calls_and_return_when_ymm_used() -> None:
    body = [
        Inst(O.VXORPS, (V(1), V(1), V(1))),
        Inst(O.VMOVUPS, (Mem(arg_vreg(0, 2)), V(1))),
        Inst(O.CALL, (Sym("f"),), clobbers=CALL_CLOBBERS),
        Inst(O.RET),
    ]
    ops = [i.op for i in allocate_function(body).items if isinstance(i, Inst)]
    assert ops[ops.index(O.CALL) - 1] is O.VZEROUPPER and ops[-2:] == [O.VZEROUPPER, O.RET]
    plain = [Inst(O.CALL, (Sym("f"),), clobbers=CALL_CLOBBERS), Inst(O.RET)]
    assert O.VZEROUPPER not in [i.op for i in allocate_function(plain).items if isinstance(i, Inst)]
