"""AVX-512 (EVEX) encodings: every form of EVEX_TABLE, at zmm/ymm/xmm width, over all 32 vector registers and the 8
opmask registers, memory operands with displacements on and off the disp8*N grid, embedded broadcasts, and write
masking ({k}, {k}{z}), plus kmovw, round-trips through binutils
objdump (which decodes EVEX on any host): the encoder's listing equals objdump's text at the same offsets.

This host has no AVX-512 (no avx512f in /proc/cpuinfo), so these encodings are checked as bytes and text only; no test
here executes them.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from speck.codegen.x86.assembler import assemble
from speck.codegen.x86.encoder import EVEX_TABLE, EncodingError, encode
from speck.codegen.x86.objdump import disassemble_raw, normalise
from speck.codegen.x86.operands import Imm, Inst, Mem, Operand, Opmask, Reg, gpr, kreg, rodata, xmm, ymm, zmm
from speck.codegen.x86.ops import X86Op

# displacements around the disp8 edges, in units of the two compression scales (4 and 64 bytes) and off them
DISPS = (0, 1, -1, 4, -4, 60, 64, -64, 127, 128, -128, 508, 512, -512, 8128, 8192, -8192, -8256, 2**31 - 1, -(2**31))


def _mem(rnd: random.Random, broadcast: bool) -> Mem:
    if rnd.random() < 0.08:
        return Mem(disp=rnd.randrange(4096), symbol=".rodata", broadcast=broadcast)
    base = None if rnd.random() < 0.15 else gpr(rnd.choice(("rax", "rbp", "rsp", "r12", "r13", "rdi", "r9", "r15")))
    index = None if rnd.random() < 0.5 else Reg("gpr", rnd.choice([n for n in range(16) if n != 4]), 8)
    if base is None and index is None:
        base = gpr("rsi")
    disp = rnd.choice(DISPS) if rnd.random() < 0.6 else rnd.randint(-(2**31), 2**31 - 1) >> rnd.randrange(32)
    return Mem(base, index, rnd.choice((1, 2, 4, 8)), disp, None, None, broadcast)


def _vec(rnd: random.Random, width: int) -> Reg:
    return Reg("vec", rnd.randrange(32), width)


def _random_insts(rnd: random.Random) -> list[Inst]:
    insts = []
    for op, forms in EVEX_TABLE.items():
        for f in forms:
            for width in (64, 64, 32, 16):
                if f.openc in ("PRT", "INS"):
                    width = 64  # parts of a zmm register
                dst = _vec(rnd, width)
                rm: Reg | Mem
                if f.openc == "BC":  # vbroadcastss: an xmm or a 32-bit element
                    rm = xmm(rnd.randrange(32)) if rnd.random() < 0.5 else _mem(rnd, False)
                elif f.openc in ("PRT", "INS"):
                    rm = Reg("vec", rnd.randrange(32), f.part) if rnd.random() < 0.4 else _mem(rnd, False)
                elif f.openc == "VMI" and width < 64:  # (a narrow shift from memory would take the VEX path)
                    rm = Reg("vec", rnd.randrange(16, 32), width)
                else:
                    rm = _vec(rnd, width) if rnd.random() < 0.3 else _mem(rnd, f.broadcast and rnd.random() < 0.5)
                k = kreg(rnd.randrange(8))
                ops: tuple[Operand, ...] = {
                    "RVM": (dst, _vec(rnd, width), rm),
                    "KVM": (k, _vec(rnd, width), rm),
                    "RM": (dst, rm),
                    "BC": (dst, rm),
                    "MR": (_mem(rnd, False), dst),
                    "VMI": (dst, rm),
                    "PRT": (rm, dst),
                    "INS": (dst, _vec(rnd, 64), rm),
                }[f.openc]
                if f.openc == "VMI" or op in IMM_OPS:
                    top = {X86Op.VCMPPS: 32, X86Op.VPCMPD: 8}.get(op, 256)
                    ops += (Imm(rnd.randrange(top)),)
                if rnd.random() < 0.4:  # write masking: {z} only where the destination is a register
                    zero = rnd.random() < 0.5 and isinstance(ops[0], Reg) and ops[0].kind == "vec"
                    ops += (Opmask(rnd.randrange(1, 8), zero),)
                insts.append(Inst(op, ops))
    for _ in range(4):  # opmask <-> general register
        g = Reg("gpr", rnd.randrange(16), 4)
        k = kreg(rnd.randrange(8))
        insts.append(Inst(X86Op.KMOVW, (k, g) if rnd.random() < 0.5 else (g, k)))
    return insts


IMM_OPS = frozenset(
    {X86Op.VCMPPS, X86Op.VPCMPD, X86Op.VRNDSCALEPS, X86Op.VEXTRACTF64X4, X86Op.VINSERTF64X4, X86Op.VEXTRACTF32X4}
)


@settings(max_examples=max(4, settings.default.max_examples // 5), phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(seed=st.integers(0, 2**64 - 1))
def test_every_evex_form_matches_objdump(seed: int) -> None:
    insts = _random_insts(random.Random(seed))
    asm = assemble(insts)
    got = [(line.offset, normalise(line.text)) for line in asm.lines]
    want = disassemble_raw(asm.code)
    assert len(want) == len(got)
    for g, w, inst in zip(got, want, insts):
        assert g == w, f"{inst!r}: listing {g} but objdump decodes {w}"


def test_disp8_is_scaled_by_the_access() -> None:
    # a full zmm access stores 0x40 as disp8 1; a broadcast element stores 0x40 as 16; 0x44 is off the zmm grid
    rax = gpr("rax")
    assert encode(Inst(X86Op.VADDPS, (zmm(0), zmm(1), Mem(rax, disp=0x40)))).raw[-1:] == b"\x01"
    assert encode(Inst(X86Op.VADDPS, (zmm(0), zmm(1), Mem(rax, disp=0x40, broadcast=True)))).raw[-1:] == b"\x10"
    assert (
        len(encode(Inst(X86Op.VADDPS, (zmm(0), zmm(1), Mem(rax, disp=0x44)))).raw) == 10
    )  # 62 P0 P1 P2, op, modrm, disp32


def test_relocation_of_a_rip_relative_evex_operand() -> None:
    enc = encode(Inst(X86Op.VMULPS, (zmm(2), zmm(3), rodata(32))))
    assert enc.reloc is not None and enc.reloc.symbol == ".rodata"
    assert enc.reloc.addend == 32 - (len(enc.raw) - enc.reloc.offset)


@pytest.mark.parametrize(
    "inst, fragment",
    [
        (Inst(X86Op.VPXOR, (zmm(0), zmm(1), zmm(2))), "has none"),  # no EVEX form in the table
        (Inst(X86Op.VADDPS, (ymm(1), ymm(2), Reg("vec", 17, 16))), "mix widths"),
        (Inst(X86Op.VMOVUPS, (zmm(1), Mem(gpr("rax"), broadcast=True))), "no embedded-broadcast"),
        (Inst(X86Op.VADDSS, (xmm(1), xmm(2), xmm(20))), "has none"),  # a VEX-only op never gets a wrong VEX byte
        (Inst(X86Op.VBROADCASTSS, (zmm(1), ymm(2))), "xmm register"),
        (Inst(X86Op.VMOVUPS, (Mem(gpr("rax")), zmm(1), Opmask(1, True))), "merge masking only"),
        (Inst(X86Op.VCMPPS, (zmm(1), zmm(2), zmm(3), Imm(1))), "opmask register"),
        (Inst(X86Op.VCMPPS, (kreg(1), zmm(2), zmm(3))), "takes imm8"),
        (Inst(X86Op.VEXTRACTF64X4, (xmm(1), zmm(2), Imm(1))), "256-bit part"),
        (Inst(X86Op.KMOVW, (kreg(1), gpr("rax"))), "32-bit general register"),
    ],
)
def test_bad_evex_operands_raise(inst: Inst, fragment: str) -> None:
    with pytest.raises(EncodingError, match=fragment):
        encode(inst)


def test_register_numbers() -> None:
    assert zmm(31).name == "zmm31" and Reg("vec", 16, 32).name == "ymm16"
    with pytest.raises(ValueError, match="0..15"):
        Reg("gpr", 16, 8)
    with pytest.raises(ValueError, match="0..31"):
        Reg("vec", 32, 64)
    assert kreg(7).name == "k7"
    with pytest.raises(ValueError, match="k0 encodes"):
        Opmask(0)
